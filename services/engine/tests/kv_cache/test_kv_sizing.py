"""KV pool sizing: block count, byte budget or memory fraction; the start-up log line; and
requests that could never fit the pool are refused at the door, not queued forever."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
import torch

from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.kv_cache import sizing
from jacana_engine.sample.params import SamplingParams

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
# The toy model's block: 2 (K, V) x 2 layers x 4 slots x 1 head x 2 dims x 4 bytes.
TOY_BLOCK_BYTES = 128


def plan(**kw) -> sizing.KVCachePlan:
    return sizing.plan_kv_cache(block_bytes=1000, block_size=16, **kw)


def test_block_bytes_count_k_and_v_of_every_layer():
    assert sizing.kv_block_bytes(30, 3, 64, 16, torch.float32) == 2 * 30 * 16 * 3 * 64 * 4
    assert sizing.kv_block_bytes(30, 3, 64, 16, torch.bfloat16) == 2 * 30 * 16 * 3 * 64 * 2


def test_precedence_count_then_bytes_then_fraction_then_default(monkeypatch):
    monkeypatch.setattr(sizing, "available_host_memory", lambda: 1_000_000)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (2_000_000, 9_000_000))
    assert plan(device=CPU, num_blocks=7, memory_bytes=10**9).num_blocks == 7
    assert plan(device=CPU, memory_bytes=25_999).num_blocks == 25
    got = plan(device=CPU, fraction=0.5)
    assert got.num_blocks == 500 and "0.5 of" in got.source
    assert plan(device=CUDA, fraction=0.25).num_blocks == 500  # of free device memory
    assert plan(device=CUDA).num_blocks == 1800  # default: 0.9 of free device memory
    default_cpu = plan(device=CPU)
    assert default_cpu.num_blocks == sizing.DEFAULT_CPU_BYTES // 1000
    assert "default CPU budget" in default_cpu.source


def test_impossible_budgets_are_errors():
    with pytest.raises(ValueError, match="not both"):
        plan(device=CPU, memory_bytes=10**6, fraction=0.5)
    with pytest.raises(ValueError, match="holds no block"):
        plan(device=CPU, memory_bytes=999)
    with pytest.raises(ValueError, match="fraction"):
        plan(device=CPU, fraction=1.5)


def test_host_memory_probe_is_sane_and_honours_a_cgroup_limit(monkeypatch):
    available = sizing.available_host_memory()
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert 0 < available <= total
    monkeypatch.setattr(sizing, "_cgroup_room", lambda: 12345)
    assert sizing.available_host_memory() == min(12345, sizing._meminfo_available())


def test_describe_names_blocks_tokens_bytes_and_concurrency():
    p = sizing.KVCachePlan(num_blocks=512, block_size=16, block_bytes=2048, source="x")
    line = p.describe(max_model_len=2048, device="cpu")
    assert "512 blocks x 16 tokens = 8192 tokens" in line
    assert "1.0 MiB on cpu" in line and "max_model_len 2048: 4.00x" in line
    assert p.max_concurrency(4096) == 2.0


def test_engine_sizes_its_pool_from_a_budget_and_logs_it(toy, caplog):
    caplog.set_level(logging.INFO, logger="jacana_engine.worker.model_runner")
    budget = 50 * TOY_BLOCK_BYTES + 5  # far below the served minimum (1 MiB)
    engine = toy.engine(num_kv_blocks=None, kv_cache_memory=budget, unchecked=True)
    assert engine.stats().kv_blocks_total == 50
    line = next(r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage())
    assert "50 blocks x 4 tokens = 200 tokens" in line
    assert "max concurrency at max_model_len 512: 0.39x" in line


def test_engine_sizes_its_pool_from_a_fraction_of_free_memory(toy, monkeypatch):
    monkeypatch.setattr(sizing, "available_host_memory", lambda: 1000 * TOY_BLOCK_BYTES)
    engine = toy.engine(num_kv_blocks=None, kv_cache_fraction=0.3)
    assert engine.stats().kv_blocks_total == 300


def test_requests_beyond_the_pool_are_refused_and_clamped_ones_fit(toy):
    engine = toy.engine(num_kv_blocks=8)  # 32 tokens, under max_model_len 512
    assert engine.max_request_tokens == 32
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("a", [1] * 20, SamplingParams(max_tokens=13))
    assert info.value.param == "max_tokens" and "32" in info.value.message
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("b", [1] * 32, SamplingParams(max_tokens=None))
    assert info.value.param == "prompt" and "32" in info.value.message
    assert not engine.has_unfinished_requests()
    sp = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)
    assert engine.generate([[1] * 20], sp) == [toy.greedy([1] * 20, 12)]


def test_settings_take_one_budget_and_bound_the_fraction(monkeypatch, tmp_path):
    from jacana_common.settings import SettingsError
    from jacana_engine.entrypoints.settings import EngineSettings

    model = tmp_path / "m.gguf"
    model.write_bytes(b"")
    monkeypatch.setenv("JACANA_ENGINE_MODEL", str(model))
    monkeypatch.setenv("JACANA_ENGINE_KV_CACHE_FRACTION", "0.4")
    cfg = EngineSettings.load().engine_config()
    assert cfg.kv_cache_fraction == 0.4 and cfg.kv_cache_memory is None
    assert cfg.enable_prefix_caching and cfg.priority_aging_s == 10.0
    monkeypatch.setenv("JACANA_ENGINE_KV_CACHE_MEMORY", str(1 << 30))
    with pytest.raises(SettingsError, match="KV_CACHE_MEMORY or JACANA_ENGINE_KV_CACHE_FRACTION"):
        EngineSettings.load()
    monkeypatch.delenv("JACANA_ENGINE_KV_CACHE_MEMORY")
    monkeypatch.setenv("JACANA_ENGINE_KV_CACHE_FRACTION", "1.5")
    with pytest.raises(SettingsError, match="JACANA_ENGINE_KV_CACHE_FRACTION"):
        EngineSettings.load()
    monkeypatch.delenv("JACANA_ENGINE_KV_CACHE_FRACTION")
    monkeypatch.setenv("JACANA_ENGINE_ENABLE_PREFIX_CACHING", "false")
    monkeypatch.setenv("JACANA_ENGINE_PRIORITY_AGING_S", "0")
    cfg = EngineSettings.load().engine_config()
    assert not cfg.enable_prefix_caching and cfg.priority_aging_s == 0.0
    assert cfg.kv_cache_memory is None and cfg.kv_cache_fraction is None


# ------------------------------------------------------------------------------------------
# CUDA: the pool is a fraction of the device memory left free by the weights
# ------------------------------------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("fraction", [0.05, None])
def test_cuda_pool_is_a_fraction_of_the_memory_free_after_the_weights(tmp_path, caplog, fraction):
    import json

    from gpu_engines import TINY_LLAMA

    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    caplog.set_level(logging.INFO, logger="jacana_engine.worker.model_runner")
    # Engines of earlier tests must be gone first: memory they free while this engine is
    # built would count as free after the weights but not before.
    gc.collect()
    torch.cuda.empty_cache()
    free_before = torch.cuda.mem_get_info()[0]
    engine = LLMEngine(
        EngineConfig(
            model=str(tmp_path / "config.json"),
            load_format="dummy",
            device="cuda",
            dtype="bfloat16",
            kv_cache_fraction=fraction,
        )
    )
    try:
        plan = engine.runner.kv_plan
        share = sizing.DEFAULT_CUDA_FRACTION if fraction is None else fraction
        weights = sum(p.numel() * p.element_size() for p in engine.model.parameters())
        allocated = sum(t.numel() * t.element_size() for t in engine.runner.kv_caches)
        assert allocated == plan.num_bytes
        # Sized from what was free once the weights were on the device (minus allocator
        # slack), never from what was free before. Up to 64 MiB may come free meanwhile
        # (blocks cached by earlier tests' graph pools, seen on the H200: 0.8–16 MiB).
        assert plan.num_bytes <= share * (free_before - weights + 64 * 2**20)
        assert plan.num_bytes >= share * (free_before - weights) - share * 2**30 - plan.block_bytes
        line = next(r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage())
        assert f"{plan.num_blocks} blocks x 16 tokens" in line and "free" in line
        assert "max concurrency at max_model_len 4096" in line
        sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        assert len(engine.generate([[1, 2, 3]], sp)[0]) == 8
    finally:
        del engine
        torch.cuda.empty_cache()
