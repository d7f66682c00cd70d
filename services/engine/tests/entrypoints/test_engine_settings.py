"""Engine settings beyond speculation: env variables reach EngineConfig; bad values fail."""

from __future__ import annotations

import pytest

from jacana_common.settings import SettingsError
from jacana_engine.entrypoints.settings import EngineSettings


def test_env_reaches_the_engine_config(monkeypatch):
    monkeypatch.setenv("JACANA_ENGINE_STREAM_INTERVAL", "4")
    monkeypatch.setenv("JACANA_ENGINE_DECODE_GEMM", "torch")
    monkeypatch.setenv("JACANA_ENGINE_PDL", "false")
    monkeypatch.setenv("JACANA_ENGINE_FUSE_ROPE_ATTENTION", "false")
    monkeypatch.setenv("JACANA_ENGINE_TUNE_IN_GRAPH", "false")
    monkeypatch.setenv("JACANA_ENGINE_PREFILL_GRAPH_TOKENS", "1024")
    monkeypatch.setenv("JACANA_ENGINE_WARM_UP", "false")
    config = EngineSettings.load().engine_config()
    assert (config.stream_interval, config.decode_gemm) == (4, "torch")
    assert (config.pdl, config.fuse_rope_attention) == (False, False)
    assert config.tune_in_graph is False
    assert config.prefill_graph_tokens == 1024
    assert config.warm_up is False


def test_defaults_are_the_measured_gpu_path():
    config = EngineSettings.load().engine_config()
    assert (config.stream_interval, config.decode_gemm) == (1, "auto")
    assert (config.pdl, config.fuse_rope_attention) == (True, True)
    assert config.tune_in_graph is True
    assert config.prefill_graph_tokens == 2048
    assert config.warm_up is None  # on CUDA only
    assert config.tuning_cache == "~/.cache/jacana/decode_gemm_tuning.json"


def test_an_empty_tuning_cache_setting_times_at_every_start(monkeypatch):
    monkeypatch.setenv("JACANA_ENGINE_TUNING_CACHE", "")
    assert EngineSettings.load().engine_config().tuning_cache is None


@pytest.mark.parametrize(
    "name,value",
    [("STREAM_INTERVAL", "0"), ("DECODE_GEMM", "skinny"), ("PREFILL_GRAPH_TOKENS", "1"),
     ("PREFILL_GRAPH_TOKENS", "-2")],
)  # fmt: skip
def test_bad_values_name_their_variable(monkeypatch, name, value):
    monkeypatch.setenv(f"JACANA_ENGINE_{name}", value)
    with pytest.raises(SettingsError, match=f"JACANA_ENGINE_{name}"):
        EngineSettings.load()


def test_rope_folds_into_attention_except_for_float16():
    from jacana_engine.config import EngineConfig
    from jacana_engine.worker.model_runner import rope_folds_into_attention

    def folds(**fields) -> bool:
        return rope_folds_into_attention(EngineConfig(model="m", **fields))

    assert folds(fuse_rope_attention=True, dtype="bfloat16")
    assert folds(fuse_rope_attention=True, dtype="float32")
    assert not folds(fuse_rope_attention=True, dtype="float16")
    assert not folds(fuse_rope_attention=False, dtype="bfloat16")
