"""The head of the plain-decode graphs (``DecodeGraphs(head=...)``): the lm_head and the
greedy argmax replay inside the graph, and give what running them after it gives."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_the_graph_head_writes_the_logits_and_tokens_of_its_hidden_states(peaked_qwen3, tmp_path):
    """Greedy decoding with graphs, overlapped (so each step's tokens came from the graph's
    own argmax) and serial (the sampler's argmax of the graph's logits), gives the same
    outputs, and seeded sampling too; the last replay's head outputs equal the lm_head run
    on that replay's hidden states, bit for bit, and their argmax. The engines share one
    tuning cache, so they run the same decode GEMMs: an eager engine, or one timing its own
    picks, may round differently and part ways at one of this model's near-ties."""
    from gpu_engines import assert_same_outputs, engines_differing_in

    from jacana_engine.sample.params import SamplingParams

    serial, overlapped = engines_differing_in(
        "overlap_decode", (False, True), str(peaked_qwen3), tmp_path, tokenizer=None
    )
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in range(5, 69, 8)]
    assert_same_outputs(overlapped, serial, prompts)
    assert overlapped.overlapped_steps_total > 0 and serial.overlapped_steps_total == 0
    # most follow-ups found their tokens staged by the graph's argmax; those after a row
    # dropped mid-batch were patched on the device
    graphs = overlapped.runner.graphs
    assert 0 < graphs.tokens_in_place_runs < overlapped.overlapped_steps_total
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    overlapped.generate(prompts[:3], params)  # the last replay: three rows, padded
    runner, graphs = overlapped.runner, overlapped.runner.graphs
    padded = graphs.padded_size(3)
    logits, tokens = graphs.head_outputs(padded)
    with torch.inference_mode():
        expected = runner.model.logits_in_model_dtype(graphs.output(padded))
    assert logits.shape == (padded, runner.model.config.vocab_size)
    assert torch.equal(logits, expected)
    assert torch.equal(tokens, expected.float().argmax(dim=-1))


def test_graphs_for_timing_have_no_head(peaked_qwen3):
    """The graphs a benchmark or the start-up search captures run the forward alone."""
    from gpu_engines import small_cuda_engine

    engine = small_cuda_engine(str(peaked_qwen3), tokenizer=None)
    graphs = engine.runner.decode_graphs([1])
    graphs.capture()
    graphs.replay_seconds(1, 16, replays=2)
    assert graphs.head_outputs(1) is None
