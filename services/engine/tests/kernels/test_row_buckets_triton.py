"""Padding rows (``row_buckets.py``) through the Triton attention path, on the CPU under
the interpreter: a padded forward gives the real rows' hidden states and writes the KV
cache only at the real tokens' slots, for the target's steps and the draft model's."""

from __future__ import annotations

import pytest
import torch
from tiny_decoder import tiny_qwen3

from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.model_runner import build_batch
from jacana_engine.row_buckets import pad_rows, row_buckets
from jacana_engine.sampling_params import SamplingParams
from jacana_engine.scheduler import ScheduledSequence
from jacana_engine.sequence import Sequence
from jacana_engine.spec.draft_model import DraftModelProposer
from jacana_engine.spec.proposer import DraftRequest

BLOCK = 4
NUM_BLOCKS = 16


def _model(seed: int, device: torch.device):
    from jacana_engine.models.registry import build_model

    model = build_model(
        tiny_qwen3(), device=device, dtype=torch.float32, attention_backend="triton"
    )
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3, generator=gen)
    return model


def _caches(model, device: torch.device) -> list[torch.Tensor]:
    cfg = model.config
    shape = (2, NUM_BLOCKS, BLOCK, cfg.num_key_value_heads, cfg.head_dim)
    return [torch.zeros(shape, device=device) for _ in range(cfg.num_hidden_layers)]


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
