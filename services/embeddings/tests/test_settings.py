"""Settings: defaults, environment parsing and start-up errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from jacana_common.settings import SettingsError
from jacana_embeddings.settings import DEFAULT_MODEL_ID, EmbeddingsSettings, default_model_path


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("JACANA_EMBEDDINGS_"):
            monkeypatch.delenv(name)


def test_defaults_serve_minilm():
    s = EmbeddingsSettings.load()
    assert s.model_id == DEFAULT_MODEL_ID == "all-minilm-l6-v2"
    config = s.embedder_config()
    assert config.model_dir == Path(default_model_path())
    assert (config.model_dir / "model.safetensors").is_file()
    assert config.pooling is None and config.normalize is None and config.matryoshka_dims is None
    assert config.linear_backend == "auto"
    b = s.batcher_config()
    assert (b.max_batch_tokens, b.max_wait_ms, s.max_inputs_per_request) == (2048, 2.0, 2048)


def test_environment_is_read(monkeypatch, tmp_path):
    (tmp_path / "config.json").write_text("{}")
    monkeypatch.setenv("JACANA_EMBEDDINGS_MODEL", str(tmp_path))
    monkeypatch.setenv("JACANA_EMBEDDINGS_POOLING", "cls+max")
    monkeypatch.setenv("JACANA_EMBEDDINGS_NORMALIZE", "false")
    monkeypatch.setenv("JACANA_EMBEDDINGS_MATRYOSHKA_DIMS", "[256, 128]")
    monkeypatch.setenv("JACANA_EMBEDDINGS_MAX_WAIT_MS", "0")
    monkeypatch.setenv("JACANA_EMBEDDINGS_LINEAR_BACKEND", "torch")
    s = EmbeddingsSettings.load()
    assert s.embedder_config().linear_backend == "torch"
    config = s.embedder_config()
    assert config.model_dir == tmp_path and config.pooling == ("cls", "max")
    assert config.normalize is False and config.matryoshka_dims == (256, 128)
    assert s.batcher_config().max_wait_ms == 0


def test_gpu_choices_follow_the_device(monkeypatch):
    cpu = EmbeddingsSettings.load()
    assert (cpu.embedder_config().dtype, cpu.embedder_config().graph_tokens) == ("float32", 0)
    b = cpu.batcher_config()
    assert (b.max_batch_tokens, b.max_batch_size, b.batches_in_flight) == (2048, 256, 1)
    monkeypatch.setenv("JACANA_EMBEDDINGS_DEVICE", "cuda:0")
    monkeypatch.setenv("JACANA_EMBEDDINGS_DTYPE", "")  # as docker-compose passes an unset one
    gpu = EmbeddingsSettings.load()
    # the padded grid may double a batch's cells
    assert (gpu.embedder_config().dtype, gpu.embedder_config().graph_tokens) == ("float16", 131072)
    b = gpu.batcher_config()
    assert (b.max_batch_tokens, b.max_batch_size, b.batches_in_flight) == (65536, 4096, 2)


@pytest.mark.parametrize("cores, expected", [(2, 0), (8, 2), (16, 4), (64, 4)])
def test_tokenizer_processes_default_to_a_share_of_a_gpu_hosts_cores(monkeypatch, cores, expected):
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    assert EmbeddingsSettings.load().resolved_tokenizer_processes() == 0  # CPU: threads
    monkeypatch.setenv("JACANA_EMBEDDINGS_DEVICE", "cuda")
    assert EmbeddingsSettings.load().resolved_tokenizer_processes() == expected
    monkeypatch.setenv("JACANA_EMBEDDINGS_TOKENIZER_PROCESSES", "1")
    assert EmbeddingsSettings.load().resolved_tokenizer_processes() == 1


def test_explicit_settings_override_the_device_defaults(monkeypatch):
    monkeypatch.setenv("JACANA_EMBEDDINGS_CUDA_GRAPHS", "true")
    monkeypatch.setenv("JACANA_EMBEDDINGS_MAX_BATCH_TOKENS", "4096")
    cpu = EmbeddingsSettings.load()
    assert cpu.embedder_config().graph_tokens == 0  # graphs are a CUDA matter
    monkeypatch.setenv("JACANA_EMBEDDINGS_DEVICE", "cuda:0")
    assert EmbeddingsSettings.load().embedder_config().graph_tokens == 8192
    monkeypatch.setenv("JACANA_EMBEDDINGS_CUDA_GRAPHS", "false")
    monkeypatch.setenv("JACANA_EMBEDDINGS_DTYPE", "bfloat16")
    monkeypatch.setenv("JACANA_EMBEDDINGS_MAX_BATCH_SIZE", "64")
    monkeypatch.setenv("JACANA_EMBEDDINGS_BATCHES_IN_FLIGHT", "3")
    gpu = EmbeddingsSettings.load()
    assert (gpu.embedder_config().graph_tokens, gpu.embedder_config().dtype) == (0, "bfloat16")
    b = gpu.batcher_config()
    assert (b.max_batch_tokens, b.max_batch_size, b.batches_in_flight) == (4096, 64, 3)


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("MAX_WAIT_MS", "-1", "greater than or equal"),
        ("MAX_BATCH_TOKENS", "8", "greater than or equal"),
        ("MAX_INPUTS_PER_REQUEST", "0", "greater than or equal"),
        ("DEVICE", "tpu", "pattern"),
        ("DTYPE", "int8", "float32"),
        ("LINEAR_BACKEND", "blas", "onednn"),
        ("POOLING", "median", "unknown pooling"),
        ("MATRYOSHKA_DIMS", "[0]", "positive"),
        ("MODEL", "/nonexistent/model", "not a model directory"),
        ("MODEL_ID", "has space", "pattern"),
    ],
)
def test_invalid_values_fail_with_the_variable_name(monkeypatch, name, value, message):
    monkeypatch.setenv(f"JACANA_EMBEDDINGS_{name}", value)
    with pytest.raises(SettingsError) as exc:
        EmbeddingsSettings.load()
    text = str(exc.value)
    assert f"JACANA_EMBEDDINGS_{name}" in text and message in text


def test_every_field_is_documented():
    for name, field in EmbeddingsSettings.model_fields.items():
        assert field.description, name
