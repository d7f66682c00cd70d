"""Programmatic dependent launch (``EngineConfig.pdl``, ``kernels/_pdl.py``): the kernels
start early but wait for their inputs, so outputs keep their bits."""

from __future__ import annotations

import pytest
import torch


def test_only_cuda_launches_are_dependent():
    from jacana_engine.kernels._pdl import pdl_launch

    assert pdl_launch(True, torch.device("cuda", 0)) == {"PDL": True, "launch_pdl": True}
    assert pdl_launch(False, torch.device("cuda", 0)) == {"PDL": False}
    assert pdl_launch(True, torch.device("cpu")) == {"PDL": False}


def test_the_installed_triton_has_the_device_calls():
    """The Triton that the CPU suite installs has them (as 3.6 on the H200 does);
    the runner turns dependent launches off where it has not."""
    from jacana_engine.kernels._pdl import triton_has_dependent_launch

    assert triton_has_dependent_launch()


@pytest.mark.parametrize(
    ("tokens", "runner_on", "during"),
    [(1, True, True), (16, True, True), (17, True, False), (1, False, False)],
)
def test_graphs_of_few_tokens_capture_dependent_launches(tokens, runner_on, during):
    """The forward that decode graphs capture turns dependent launches on for steps of at
    most PDL_MAX_TOKENS tokens, and off again after (eager steps launch plainly), even
    when the forward fails."""
    from types import SimpleNamespace

    from jacana_engine.worker.model_runner import PDL_MAX_TOKENS, ModelRunner

    assert PDL_MAX_TOKENS == 16
    state = {"on": False}
    seen = []

    def run_model(ids, positions, meta):
        seen.append(state["on"])
        if meta == "fail":
            raise RuntimeError("forward failed")
        return ids

    runner = SimpleNamespace(
        dependent_launch=runner_on,
        model=SimpleNamespace(use_dependent_launch=lambda on: state.update(on=on)),
        _run_model=run_model,
    )
    ids = torch.zeros(tokens, dtype=torch.int64)
    assert ModelRunner._graph_forward(runner, ids, ids, "ok") is ids
    with pytest.raises(RuntimeError):
        ModelRunner._graph_forward(runner, ids, ids, "fail")
    assert seen == [during, during] and not state["on"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_dependent_launches_keep_every_token_on_the_gpu(peaked_qwen3):
    """A random Qwen3 (q/k norm, GQA) with CUDA graphs and cuBLAS GEMMs, so that only the
    launches differ: the norms, q/k-norm RoPE + KV store, attention and activation
    launched with PDL give the same greedy and seeded outputs as plain launches, in
    batches that shrink as requests end."""
    from gpu_engines import assert_same_outputs, small_cuda_engine

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    plain, dependent = (
        small_cuda_engine(str(peaked_qwen3), tokenizer=None, decode_gemm="torch", pdl=pdl)
        for pdl in (False, True)
    )
    assert dependent.runner.dependent_launch and not plain.runner.dependent_launch
    # only the captured graphs keep dependent launches; eager steps launch plainly
    assert not dependent.runner.model.backend.dependent_launch
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in range(3, 90, 11)]
    assert_same_outputs(dependent, plain, prompts)
    assert dependent.runner.graphs.replays > 0
