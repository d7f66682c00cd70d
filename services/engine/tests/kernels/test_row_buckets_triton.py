"""Padding rows (``row_buckets.py``) through the Triton attention path, on the CPU under
the interpreter: a padded forward gives the real rows' hidden states and writes the KV
cache only at the real tokens' slots, for the target's steps and the draft model's."""

from __future__ import annotations

import pytest
import torch
from tiny_decoder import random_triton_qwen3, zero_kv_caches

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.core.sequence import Sequence
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.sample.params import SamplingParams
from jacana_engine.spec.draft_model import DraftModelProposer
from jacana_engine.spec.proposer import DraftRequest
from jacana_engine.worker.batch import build_batch
from jacana_engine.worker.row_buckets import pad_rows, row_buckets

BLOCK = 4
NUM_BLOCKS = 16


def _model(seed: int, device: torch.device):
    return random_triton_qwen3(seed, device)


def _caches(model, device: torch.device) -> list[torch.Tensor]:
    return zero_kv_caches(model, NUM_BLOCKS, BLOCK, device)


def _forward(model, caches, batch, rows: int, device: torch.device) -> torch.Tensor:
    ids, positions, meta = pad_rows(batch.input_ids, batch.positions, batch.meta, rows)
    return model.forward(ids.to(device), positions.to(device), caches, meta.to(device))


def test_a_padded_step_computes_the_real_rows_and_writes_only_their_kv(device, seed):
    if device.type == "cuda":
        pytest.skip("on a GPU: test_row_buckets.py serves whole engines")
    model = _model(seed, device)
    bm = BlockManager(NUM_BLOCKS, BLOCK)

    def sequence(name: str, length: int) -> Sequence:
        seq = Sequence(
            name, [(7 * i + len(name)) % 64 for i in range(length)], SamplingParams(), 64
        )
        bm.allocate(seq, length + 1)
        return seq

    a, b = sequence("a", 6), sequence("b", 11)
    plain, padded = _caches(model, device), _caches(model, device)
    prefill = build_batch(
        [ScheduledSequence(s, 0, s.num_prompt_tokens, True) for s in (a, b)], BLOCK
    )
    with torch.inference_mode():
        want = _forward(model, plain, prefill, 17, device)  # [17, hidden]: no padding
        got = _forward(model, padded, prefill, 32, device)  # [32, hidden]: 15 padding rows
        assert got.shape[0] == 32
        torch.testing.assert_close(got[:17], want, rtol=1e-5, atol=1e-5)
        # a mixed step: a decode of "a" beside a new prompt (6 rows, padded to 16)
        a.output_token_ids.append(3)
        c = sequence("c", 5)
        mixed = build_batch(
            [ScheduledSequence(a, 6, 1, True), ScheduledSequence(c, 0, 5, True)], BLOCK
        )
        torch.testing.assert_close(
            _forward(model, padded, mixed, 16, device)[:6],
            _forward(model, plain, mixed, 6, device),
            rtol=1e-5,
            atol=1e-5,
        )
    for a, b in zip(plain, padded, strict=True):
        assert torch.equal(a == 0, b == 0), "padding rows wrote the KV cache"
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)


def test_the_draft_models_padded_catch_ups_draft_what_unpadded_ones_do(device, seed):
    if device.type == "cuda":
        pytest.skip("on a GPU the proposer pads where its graphs run")
    model = _model(seed, device)
    plain = DraftModelProposer(model, num_blocks=NUM_BLOCKS, block_size=BLOCK, max_draft=3)
    padded = DraftModelProposer(model, num_blocks=NUM_BLOCKS, block_size=BLOCK, max_draft=3)
    assert plain.row_buckets == []  # no graphs on the CPU: no padding by default
    padded.row_buckets = row_buckets(NUM_BLOCKS * BLOCK)
    history = {"r0": [5, 9, 2, 7, 1, 3], "r1": [11, 4, 8, 6, 2, 9, 10, 12, 1]}
    for _ in range(2):  # a catch-up of 15 rows (padded to 16), then the accepted tokens'
        requests = [DraftRequest(r, h, 4, 3) for r, h in history.items()]
        drafts = plain.propose(requests)
        assert padded.propose(requests) == drafts and all(len(d) == 3 for d in drafts)
        for r, d in zip(history, drafts, strict=True):
            history[r] = history[r] + d[:2]  # two drafts accepted
    for a, b in zip(plain.kv_caches, padded.kv_caches, strict=True):
        assert torch.equal(a == 0, b == 0), "padding rows wrote the draft cache"


def _tiny_qwen3_dir(tmp_path):
    import json

    config = dict(
        architectures=["Qwen3ForCausalLM"], hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path / "config.json")


def test_an_engine_padding_its_eager_steps_serves_what_one_without_does(device, tmp_path):
    """Prompts arriving while others decode (mixed steps), served by the model runner with
    its eager steps' rows padded to buckets and without: the same tokens and logprobs."""
    if device.type == "cuda":
        pytest.skip("on a GPU: test_row_buckets.py serves whole engines")
    from jacana_engine.config import EngineConfig
    from jacana_engine.core.engine import LLMEngine

    config = EngineConfig(
        model=_tiny_qwen3_dir(tmp_path), load_format="dummy", dtype="float32", device="cpu",
        attention_backend="triton", block_size=4, num_kv_blocks=64, max_num_seqs=4,
        max_model_len=128, max_num_batched_tokens=64, seed=1, warm_up=False,
    )  # fmt: skip
    plain, padded = LLMEngine(config, tokenizer=None), LLMEngine(config, tokenizer=None)
    assert padded.runner.row_buckets == []  # no graphs on the CPU: no padding by default
    padded.runner.row_buckets = row_buckets(64)
    widths = []
    forward = padded.runner._run_model

    def spy(input_ids, positions, meta):
        widths.append((input_ids.shape[0], meta.num_seqs))
        return forward(input_ids, positions, meta)

    padded.runner._run_model = spy
    params = SamplingParams(temperature=0.0, max_tokens=5, logprobs=2, ignore_eos=True)
    prompts = [[5, 9, 2, 7, 1], [11, 4, 8, 6, 2, 9, 10, 12, 1], [3, 1, 4]]

    def serve(engine) -> list:
        engine.add_request("a", prompts[0], params)
        outs = engine.step() + engine.step()  # "a" prefilled, then one decode
        engine.add_request("b", prompts[1], params)
        engine.add_request("c", prompts[2], params)
        while engine.has_unfinished_requests():  # "b" and "c" prefill beside "a"'s decode
            outs += engine.step()
        return [(o.request_id, o.new_token_ids, o.logprobs) for o in outs]

    got, want = serve(padded), serve(plain)
    # Tokens and their ranking are exact. The logprob values are equal to float32 rounding
    # only: the CPU's GEMM library may block 16 rows differently from 13 (on an AMD EPYC an
    # alternative's logprob moved by 5e-7).
    assert [(rid, ids) for rid, ids, _ in got] == [(rid, ids) for rid, ids, _ in want]
    for (_, _, ours), (_, _, theirs) in zip(got, want, strict=True):
        assert [[t for t, _ in lp.top] for lp in ours] == [[t for t, _ in lp.top] for lp in theirs]
        values = [[v for _, v in lp.top] for lp in ours]
        torch.testing.assert_close(
            values, [[v for _, v in lp.top] for lp in theirs], rtol=0, atol=1e-5
        )
    assert (16, 1) in widths and (16, 3) in widths  # 5 rows; then 1 + 9 + 3 rows, padded
