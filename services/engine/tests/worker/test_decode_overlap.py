"""Overlapped decoding (``decode_overlap.py``): launching step n + 1 before step n's
tokens are read back changes no output, loses no KV block, and survives aborts, stops and
arrivals mid-run."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from jacana_engine.sample.params import SamplingParams

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [[5, 9, 13], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40], [11, 12, 13, 14, 15]]


def _drive(
    engine,
    requests: dict[str, tuple[list[int], SamplingParams]],
    before_step=None,
    read=lambda o: o.new_token_ids,
):
    """Run ``requests`` to completion with ``step()``; per request id what ``read`` takes
    from each of its outputs (default: the output ids), concatenated.
    ``before_step(engine, n)`` may add or abort requests before step call ``n``."""
    for rid, (prompt, sp) in requests.items():
        engine.add_request(rid, prompt, sp)
    out: dict[str, list] = {}
    finished: set[str] = set()
    n = 0
    while engine.has_unfinished_requests():
        if before_step is not None:
            before_step(engine, n)
        for o in engine.step():
            assert o.request_id not in finished, "output after the final one"
            out.setdefault(o.request_id, []).extend(read(o))
            if o.finished:
                finished.add(o.request_id)
        n += 1
    return out


def _assert_no_blocks_held(engine):
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_total_blocks


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.9, top_p=0.9, seed=7, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=40),  # the toy samples EOS now and then
    ],
    ids=["greedy", "seeded", "eos"],
)
def test_overlap_changes_no_output(toy, params):
    lengths = [3, 24, 11, 17]  # requests leave at different steps
    requests = {
        f"r{i}": (p, SamplingParams(**{**params.__dict__, "max_tokens": min(n, params.max_tokens)}))
        for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))
    }
    off = toy.engine(overlap_decode=False)
    on = toy.engine(overlap_decode=True)
    expected = _drive(off, requests)
    assert _drive(on, requests) == expected
    assert on.overlapped_steps_total > 10 and off.overlapped_steps_total == 0
    assert on.stats().overlapped_steps_total == on.overlapped_steps_total
    if params.greedy and params.ignore_eos:
        for i, (prompt, _) in enumerate(requests.values()):
            assert expected[f"r{i}"] == toy.greedy(prompt, lengths[i])
    _assert_no_blocks_held(on)


def test_an_eos_in_flight_drops_its_follow_up_row(toy):
    """A request that stops on EOS was already planned into the next step: that row is
    computed and dropped, and nothing after EOS reaches the caller."""
    prompt = next(
        [a, b] for a in range(90) for b in range(90) if toy.LM.EOS in toy.greedy([a, b], 12)[2:]
    )
    reference = toy.greedy(prompt, 12)
    stop = reference.index(toy.LM.EOS)
    engine = toy.engine(overlap_decode=True)
    out = _drive(
        engine,
        {
            "stops": (prompt, SamplingParams(temperature=0.0, max_tokens=12)),
            "goes_on": ([7, 7, 7], SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)),
        },
    )
    assert out["stops"] == reference[:stop]
    assert out["goes_on"] == toy.greedy([7, 7, 7], 20)
    assert engine.overlapped_steps_total > 0
    _assert_no_blocks_held(engine)


def test_abort_and_arrival_while_a_step_is_in_flight(toy):
    engine = toy.engine(overlap_decode=True)
    sp = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)

    def meddle(engine, n):
        if n == 6:
            assert engine._in_flight is not None  # the abort lands mid-flight
            assert engine.abort_request("b")
        if n == 9:
            engine.add_request("c", [3, 1, 4, 1, 5], sp)

    out = _drive(engine, {"a": ([2, 7, 1], sp), "b": ([8, 2, 8], sp)}, before_step=meddle)
    assert out["a"] == toy.greedy([2, 7, 1], 30)
    assert out["c"] == toy.greedy([3, 1, 4, 1, 5], 30)
    assert out["b"] == toy.greedy([8, 2, 8], 30)[: len(out["b"])] and len(out["b"]) < 30
    _assert_no_blocks_held(engine)


def _tokens_and_logprobs(o) -> list:
    """An output's (token, its logprob entry) pairs; None entries where none was asked."""
    return list(zip(o.new_token_ids, o.logprobs or [None] * len(o.new_token_ids), strict=True))


def test_logprobs_travel_with_overlapped_tokens(toy):
    """Rows asking for logprobs run ahead beside rows that do not: every token and every
    logprob entry (the token's, its top alternatives) is what serial steps give."""
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3)
    seeded = SamplingParams(temperature=0.9, seed=5, max_tokens=16, ignore_eos=True, logprobs=0)
    plain = SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True)
    requests = {"greedy": (PROMPTS[0], greedy), "seeded": (PROMPTS[1], seeded)}
    requests["plain"] = (PROMPTS[2], plain)
    off = toy.engine(overlap_decode=False)
    on = toy.engine(overlap_decode=True)
    expected = _drive(off, requests, read=_tokens_and_logprobs)
    assert _drive(on, requests, read=_tokens_and_logprobs) == expected
    assert on.overlapped_steps_total > 5
    assert [len(e.top) for _, e in expected["greedy"]] == [3] * 12
    assert all(e.top == () and e.logprob <= 0 for _, e in expected["seeded"])
    assert all(e is None for _, e in expected["plain"])
    _assert_no_blocks_held(on)


@pytest.mark.parametrize(
    "extra",
    [
        # strong enough to move the argmax off the toy's one-hot logits, so whether the
        # token in flight counts as seen shows in the next token: repeats lifted, or
        # (logits lifted off zero by the bias) seen tokens pushed under unseen ones
        {"presence_penalty": -2.0, "frequency_penalty": -2.0},
        {"repetition_penalty": 4.0, "logit_bias": tuple((t, 2.0) for t in range(97))},
        {"logit_bias": ((3, 5.0), (50, -5.0))},
    ],
    ids=["frequency-presence", "repetition", "bias"],
)
def test_edited_logits_overlap_and_count_the_token_in_flight(toy, extra):
    """Rows whose logits the processors edit run ahead beside plain rows, and give what
    serial steps give: the penalties count each row's token still in flight."""
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, **extra)
    seeded = SamplingParams(temperature=0.9, seed=11, max_tokens=24, ignore_eos=True, **extra)
    plain = SamplingParams(temperature=0.0, max_tokens=22, ignore_eos=True)
    requests = {"greedy": (PROMPTS[0], greedy), "seeded": (PROMPTS[1], seeded)}
    requests["plain"] = (PROMPTS[3], plain)
    off = toy.engine(overlap_decode=False)
    on = toy.engine(overlap_decode=True)
    expected = _drive(off, requests)
    assert _drive(on, requests) == expected
    assert on.overlapped_steps_total > 10
    defaults = {k: getattr(SamplingParams(), k) for k in extra}
    # the same requests without the edits: these changed something
    unedited = {
        name: (p, dataclasses.replace(sp, **defaults)) for name, (p, sp) in requests.items()
    }
    assert _drive(toy.engine(overlap_decode=False), unedited) != expected
    _assert_no_blocks_held(on)


def test_min_tokens_counts_the_token_in_flight(toy):
    """EOS is masked until ``min_tokens`` tokens are out, the one in flight included: a
    request whose greedy EOS falls exactly at ``min_tokens`` stops there, overlapped too."""
    prompt, at = next(
        (p, toy.greedy(p, 16).index(toy.LM.EOS))
        for p in ([a, b] for a in range(90) for b in range(90))
        if toy.LM.EOS in toy.greedy(p, 16)[4:] and toy.LM.EOS not in toy.greedy(p, 16)[:4]
    )
    sp = SamplingParams(temperature=0.0, max_tokens=16, min_tokens=at)
    engine = toy.engine(overlap_decode=True)
    out = _drive(engine, {"a": (prompt, sp), "b": ([7, 7, 7], sp)})
    assert out["a"] == toy.greedy(prompt, 16)[:at]
    assert engine.overlapped_steps_total > 0
    _assert_no_blocks_held(engine)


def test_steps_with_prompt_logprobs_do_not_overlap(toy):
    engine = toy.engine(overlap_decode=True)
    sp = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, prompt_logprobs=1)
    _drive(engine, {"a": ([1, 2, 3], sp)})
    assert engine.overlapped_steps_total == 0


def test_a_full_kv_pool_stops_planning_ahead_instead_of_preempting(toy):
    """Two requests that together need the whole pool: the follow-up step is not planned
    when its slots do not fit, and the normal step (with preemption) takes over."""
    engine = toy.engine(overlap_decode=True, num_kv_blocks=12, block_size=4)
    sp = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    out = _drive(engine, {"a": ([1, 2, 3, 4], sp), "b": ([5, 6, 7, 8], sp)})
    assert out["a"] == toy.greedy([1, 2, 3, 4], 20)
    assert out["b"] == toy.greedy([5, 6, 7, 8], 20)
    assert engine.overlapped_steps_total > 0
    _assert_no_blocks_held(engine)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_overlapped_graph_decoding_matches_serial_decoding_on_the_gpu(tmp_path):
    """SmolLM2 with CUDA graphs: greedy and seeded (device-sampled) outputs are the same
    whether decode steps overlap or not, in batches that shrink as requests end. The two
    engines share one tuning cache, so they run the same decode GEMMs: each timing its
    own may pick another config for a near-equal pair, which changes low bits and, at a
    near-tie, a seeded draw (seen on an H200 with another test process beside it)."""
    from gpu_engines import SMOL_PROMPTS, assert_same_outputs, engines_differing_in, smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        pytest.skip("SmolLM2 GGUF not available (set JACANA_SMOLLM2_GGUF)")
    serial, overlapped = engines_differing_in(
        "overlap_decode", (False, True), str(gguf), tmp_path, load_format="gguf"
    )
    prompts = [serial.tokenizer.encode(p) for p in SMOL_PROMPTS]
    assert_same_outputs(overlapped, serial, prompts)
    assert overlapped.overlapped_steps_total > 0 and overlapped.runner.graphs.replays > 0


def test_steps_overlap_while_the_speculation_gate_is_shut(toy):
    """Speculation on, drafting that only costs: once the gate shuts, decode steps
    overlap (and still count towards its cooldown); output unchanged."""
    from spec_doubles import SlowWrongProposer

    from jacana_engine.spec.config import SpeculativeConfig
    from jacana_engine.spec.speculator import Speculator

    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=4, dynamic_k=True)
    engine = toy.engine(speculative=cfg, overlap_decode=True)
    proposer = SlowWrongProposer(97)
    engine.speculator = engine.runner.speculator = Speculator(cfg, proposer)
    gate = engine.speculator.gate
    gate.cooldown = 20  # reopens within the run: drafting steps must stop overlapping
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    sp = SamplingParams(temperature=0.0, max_tokens=80, ignore_eos=True)
    assert engine.generate([prompt], sp) == [toy.greedy(prompt, 80)]
    assert gate.shut_total >= 2  # shut, cooled down over overlapped steps, measured, shut
    assert engine.overlapped_steps_total >= 20
    assert proposer.calls > gate.window  # it drafted again after the cooldown


def test_requests_ending_in_overlapped_steps_are_forgotten_by_the_proposer(toy):
    """While the gate keeps drafting paused no proposal runs, so the overlapped steps
    themselves tell the proposer which requests ended (a draft model frees their KV)."""
    from spec_doubles import SlowWrongProposer

    from jacana_engine.spec.config import SpeculativeConfig
    from jacana_engine.spec.speculator import Speculator

    class Recording(SlowWrongProposer):
        def __init__(self, vocab: int) -> None:
            super().__init__(vocab)
            self.finished: list[str] = []

        def finish(self, request_id, token_ids, num_prompt_tokens) -> None:
            self.finished.append(request_id)

    cfg = SpeculativeConfig(proposer="ngram", num_speculative_tokens=4, dynamic_k=True)
    engine = toy.engine(speculative=cfg, overlap_decode=True)
    proposer = Recording(97)
    engine.speculator = engine.runner.speculator = Speculator(cfg, proposer)
    engine.speculator.gate.cooldown = 10_000  # shut for good after the first verdict
    sp = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in (30, 60, 90)]
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6, 5, 3], [5, 8, 9, 7, 9]]
    assert engine.generate(prompts, sp) == [
        toy.greedy(p, s.max_tokens) for p, s in zip(prompts, sp, strict=True)
    ]
    assert engine.overlapped_steps_total > 50
    assert len(proposer.finished) == 3  # each told once, the first two mid-run


def test_inputs_stay_in_place_only_for_the_leading_rows_of_a_graph_step():
    """A follow-up finds its tokens already staged only when the step before was the
    graphs' head (its argmax wrote them) and it keeps that step's leading rows in order,
    each pending: a dropped row at the end keeps them in place, one in the middle does not."""
    import dataclasses
    from types import SimpleNamespace

    from jacana_engine.core.scheduler import ScheduledSequence
    from jacana_engine.worker.decode_overlap import LaunchedStep

    seqs = [SimpleNamespace(name=n) for n in "abc"]
    step = [ScheduledSequence(s, 4, 1, True) for s in seqs]

    def follow(*rows):
        return [dataclasses.replace(step[r], start=5, pending_token=True) for r in rows]

    ids = torch.tensor([7, 8, 9])
    graph = LaunchedStep.from_graph(step, ids, ids.clone(), None)
    copied = LaunchedStep.start(step, ids)
    assert graph.inputs_in_place(follow(0, 1, 2)) and graph.inputs_in_place(follow(0, 1))
    assert not graph.inputs_in_place(follow(0, 2)) and not graph.inputs_in_place(follow(1, 2))
    assert not copied.inputs_in_place(follow(0, 1, 2))
    unpending = [dataclasses.replace(f, pending_token=False) for f in follow(0, 1)]
    assert not graph.inputs_in_place(unpending)
    assert graph.token_ids() == [7, 8, 9]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_overlapped_logprobs_and_penalties_match_serial_steps_on_the_gpu(peaked_qwen3, tmp_path):
    """With CUDA graphs and the device sampler: requests asking for logprobs (greedy and
    seeded, with and without alternatives) and requests with penalties (the full
    sampler's rows, counting the token in flight on the device) beside plain ones get the
    same tokens and logprob entries, bit for bit, whether decode steps overlap or not."""
    from gpu_engines import engines_differing_in

    serial, overlapped = engines_differing_in(
        "overlap_decode", (False, True), str(peaked_qwen3), tmp_path, tokenizer=None
    )
    gen = torch.Generator().manual_seed(3)
    lengths = (5, 40, 17, 90, 33, 8)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in lengths]
    penalties = {"presence_penalty": -1.5, "frequency_penalty": -1.0}  # repeats lifted
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=3),
        SamplingParams(temperature=0.8, seed=4, max_tokens=20, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True),
        SamplingParams(temperature=0.8, top_k=40, seed=9, max_tokens=24, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=18, ignore_eos=True, **penalties),
        SamplingParams(temperature=0.7, seed=2, max_tokens=22, repetition_penalty=1.3),
    ]
    requests = {f"r{i}": pair for i, pair in enumerate(zip(prompts, params, strict=True))}
    expected = _drive(serial, requests, read=_tokens_and_logprobs)
    assert _drive(overlapped, requests, read=_tokens_and_logprobs) == expected
    assert overlapped.overlapped_steps_total > 5
    assert [len(e.top) for _, e in expected["r0"]] == [3] * 12


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_greedy_logprobs_ride_the_graph_head_on_the_gpu(peaked_qwen3, tmp_path):
    """Greedy batches where some rows ask for logprobs keep the decode graphs' own argmax
    and its token hand-off (the inputs of the next step stay in place): the logprobs come
    from the head's logits. Tokens and entries equal serial steps', bit for bit, as rows
    end one by one."""
    from gpu_engines import engines_differing_in

    serial, overlapped = engines_differing_in(
        "overlap_decode", (False, True), str(peaked_qwen3), tmp_path, tokenizer=None
    )
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 2048, (n,), generator=gen).tolist() for n in (7, 30, 12, 51)]
    asks = (5, None, 0, 2)
    params = [
        SamplingParams(temperature=0.0, max_tokens=10 + 6 * i, ignore_eos=True, logprobs=k)
        for i, k in enumerate(asks)
    ]
    requests = {f"r{i}": pair for i, pair in enumerate(zip(prompts, params, strict=True))}
    expected = _drive(serial, requests, read=_tokens_and_logprobs)
    assert _drive(overlapped, requests, read=_tokens_and_logprobs) == expected
    assert overlapped.runner.graphs.tokens_in_place_runs > 10
    assert [len(e.top) for _, e in expected["r0"]] == [5] * 10
    assert all(e is None for _, e in expected["r1"])
    assert all(e.top == () and e.logprob <= 0 for _, e in expected["r2"])
