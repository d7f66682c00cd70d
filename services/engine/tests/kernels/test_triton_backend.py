"""The "triton" attention backend and layer ops against the torch ones, at tiny sizes.

On CPU the kernels run under Triton's interpreter (``conftest.py``), in float32; on a
GPU the same tests run on CUDA. Batches mix a fresh prefill, a chunk after a cached
prefix and decode rows; a second case is decode-only (the split-K kernel, with a fixed
split count as a CUDA graph would use). A decoder attention layer on the Triton ops and
backend stores K/V from its rope launch; that must change nothing, bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch

pytest.importorskip("triton")

from tiny_decoder import HEAD_DIM, N_HEADS, N_KV, random_triton_qwen3, tiny_config, tiny_qwen3

from jacana_engine.layers.attention_backend import (
    get_attention_backend,
    resolve_attention_backend,
)
from jacana_engine.layers.ops import get_layer_ops
from jacana_engine.layers.rotary import RotaryEmbedding
from jacana_engine.models.attention import DecoderAttention
from jacana_engine.models.base import ModelConfig
from jacana_engine.models.decoder import DecoderForCausalLM
from jacana_engine.worker.attention_metadata import AttentionMetadata

BLOCK = 4


def _batch(device, rng: random.Random, chunks: list[tuple[int, int]], num_blocks: int):
    """Metadata for sequences given as (cached prefix, new tokens), blocks scattered."""
    pool = list(range(num_blocks))
    rng.shuffle(pool)
    tables, slots, qsl, lens = [], [], [0], []
    for cached, new in chunks:
        total = cached + new
        table = [pool.pop() for _ in range(-(-total // BLOCK))]
        tables.append(table)
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(cached, total)]
        qsl.append(qsl[-1] + new)
        lens.append(total)
    width = max(len(t) for t in tables)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_lens_cpu=[new for _, new in chunks],
        seq_lens_cpu=lens,
        block_size=BLOCK,
    )
    return meta.to(device)


@pytest.mark.parametrize(
    ("chunks", "splits"),
    [
        ([(0, 9), (5, 1), (6, 7), (0, 1)], None),  # prefill, decode, chunk after prefix
        ([(10, 1), (3, 1), (17, 1)], 3),  # decode-only, fixed split-K as in a CUDA graph
    ],
)
def test_triton_backend_matches_torch(device, seed, chunks, splits):
    rng = random.Random(seed)
    num_blocks = 32
    meta = _batch(device, rng, chunks, num_blocks)
    if splits is not None:
        meta.decode_num_splits = splits
    t = sum(new for _, new in chunks)
    shape = (2, num_blocks, BLOCK, N_KV, HEAD_DIM)
    cache = torch.randn(shape, device=device)  # the cached prefixes' K/V
    qkv = torch.randn(t, (N_HEADS + 2 * N_KV) * HEAD_DIM, device=device)
    q, k, v = qkv.split([N_HEADS * HEAD_DIM, N_KV * HEAD_DIM, N_KV * HEAD_DIM], dim=-1)
    q = q.view(t, N_HEADS, HEAD_DIM)  # strided views of a fused projection, as in the model
    k = k.view(t, N_KV, HEAD_DIM)
    v = v.view(t, N_KV, HEAD_DIM)
    ref_cache, out_cache = cache.clone(), cache.clone()
    ref = get_attention_backend("torch").forward(q, k, v, ref_cache, meta, HEAD_DIM**-0.5)
    out = get_attention_backend("triton").forward(q, k, v, out_cache, meta, HEAD_DIM**-0.5)
    assert torch.equal(out_cache, ref_cache), f"seed {seed}: KV cache writes differ"
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def test_exact_decode_adds_short_sequences_in_one_pass(device, seed):
    """``exact_decode`` (``EngineConfig.exact_decode_attention``): at cuDNN's head sizes a
    decode sequence of up to 256 keys gets the bits of one pass whatever the step's split
    count (a CUDA graph's); without it the splits' merge rounds otherwise."""
    rng = random.Random(seed)
    chunks = [(99, 1), (200, 1), (255, 1)]  # 2 to 4 tiles of 64 keys
    num_blocks = 160
    q = torch.randn(len(chunks), N_HEADS, HEAD_DIM, device=device)
    kv = torch.zeros(len(chunks), N_KV, HEAD_DIM, device=device)
    cache = torch.randn(2, num_blocks, BLOCK, N_KV, HEAD_DIM, device=device)
    meta = _batch(device, rng, chunks, num_blocks)
    backend = get_attention_backend("triton")
    outs = {}
    for exact in (True, False):
        backend.exact_decode = exact
        for splits in (1, 8):
            meta.decode_num_splits = splits
            outs[exact, splits] = backend.forward(
                q, kv, kv, cache, meta, HEAD_DIM**-0.5, kv_written=True
            )
    backend.exact_decode = False
    assert torch.equal(outs[True, 1], outs[True, 8]), f"seed {seed}"
    assert not torch.equal(outs[False, 1], outs[False, 8]), f"seed {seed}"


def test_triton_backend_skips_written_kv(device, seed):
    """With ``kv_written`` the backend leaves the cache alone and reads what is there."""
    rng = random.Random(seed)
    meta = _batch(device, rng, [(3, 2), (0, 3)], 8)
    cache = torch.randn(2, 8, BLOCK, N_KV, HEAD_DIM, device=device)
    before = cache.clone()
    q = torch.randn(5, N_HEADS, HEAD_DIM, device=device)
    kv = torch.full((5, N_KV, HEAD_DIM), float("nan"), device=device)  # would poison a write
    backend = get_attention_backend("triton")
    out = backend.forward(q, kv, kv, cache, meta, HEAD_DIM**-0.5, kv_written=True)
    assert torch.equal(cache, before), f"seed {seed}"
    ref = get_attention_backend("torch").forward(q, kv, kv, cache, meta, HEAD_DIM**-0.5, True)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, msg=lambda m: f"seed {seed}: {m}")


def test_auto_backend_follows_the_device():
    assert resolve_attention_backend("auto", "cpu") == "torch"
    assert resolve_attention_backend("auto", "cuda:0") == "triton"
    assert resolve_attention_backend("torch", "cuda") == "torch"


def test_triton_ops_match_torch_ops(device, seed):
    torch_ops, triton_ops = get_layer_ops("torch"), get_layer_ops("triton")
    x = torch.randn(5, 48, device=device)
    r = torch.randn(5, 48, device=device)
    w = torch.randn(48, device=device)
    torch.testing.assert_close(triton_ops.rms_norm(x, w, 1e-6), torch_ops.rms_norm(x, w, 1e-6))
    want = torch_ops.add_rms_norm(x, r, w, 1e-6)
    got = triton_ops.add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    for g, ww in zip(got, want, strict=True):
        torch.testing.assert_close(g, ww)
    gu = torch.randn(5, 64, device=device)
    torch.testing.assert_close(triton_ops.silu_and_mul(gu), torch_ops.silu_and_mul(gu))

    rotary = RotaryEmbedding(HEAD_DIM, 10000.0, None, max_positions=64)
    rotary.reset_buffers(device)
    positions = torch.tensor([0, 3, 7, 63, 12], device=device)
    q = torch.randn(5, N_HEADS, HEAD_DIM, device=device)
    k = torch.randn(5, N_KV, HEAD_DIM, device=device)
    qw, kw = torch.randn(HEAD_DIM, device=device), torch.randn(HEAD_DIM, device=device)
    for norm in (None, (qw, kw)):
        qn, kn = norm if norm else (None, None)
        want = torch_ops.rotate(
            q, k, torch_ops.rope_tables(rotary, positions, q.dtype), qn, kn, 1e-6
        )
        got = triton_ops.rotate(
            q.clone(), k.clone(), triton_ops.rope_tables(rotary, positions, q.dtype), qn, kn, 1e-6
        )
        for g, ww in zip(got, want, strict=True):
            torch.testing.assert_close(g, ww, rtol=1e-5, atol=1e-5)


def test_model_on_triton_kernels_matches_torch(device, seed, paged_driver):
    """A whole tiny Qwen3 (q/k norm, GQA) on the Triton backend and ops: same greedy
    tokens and close logits as on the torch ones, through prefill and decode steps."""
    from jacana_engine.models.registry import build_model

    if device.type == "cuda":
        pytest.skip("the paged test driver builds host tensors (GPU parity: test_gpu_engine)")
    cfg = tiny_qwen3()
    models = {}
    for name in ("torch", "triton"):
        model = build_model(cfg, device=device, dtype=torch.float32, attention_backend=name)
        gen = torch.Generator(device=device).manual_seed(seed)
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0.0, 0.3, generator=gen)
        models[name] = model
    assert isinstance(models["triton"], DecoderForCausalLM)
    prompts = [[1, 5, 9, 13, 2, 7], [3, 4, 40, 2]]
    drivers = {n: paged_driver(m, block_size=BLOCK, num_blocks=16) for n, m in models.items()}
    logits = {n: d.step(list(enumerate(prompts))) for n, d in drivers.items()}
    for got, want in zip(logits["triton"], logits["torch"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    tokens = [int(lg[-1].argmax()) for lg in logits["torch"]]
    for _ in range(3):
        step = {n: d.step([(i, [tok]) for i, tok in enumerate(tokens)]) for n, d in drivers.items()}
        for got, want in zip(step["triton"], step["torch"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tokens = [int(lg[-1].argmax()) for lg in step["torch"]]


def test_decode_steps_on_skinny_kernels_with_the_activation_folded_match_the_plain_ones(
    device, seed, paged_driver
):
    """The same tiny Qwen3 twice on the Triton path, one copy with every projection on the
    skinny kernel for 1- and 2-row steps (as the tuner would set them), SiLU-and-mul
    folded into the down projection's loads. The prefill (10 rows) runs on the plain
    GEMMs in both; the decode steps' logits agree."""
    from jacana_engine.kernels.skinny_gemm import pick_config
    from jacana_engine.layers.linear import Linear

    if device.type == "cuda":
        pytest.skip("the paged test driver builds host tensors (GPU parity: test_gpu_engine)")
    models = [random_triton_qwen3(seed, device) for _ in range(2)]  # the same weights twice
    for module in models[1].modules():
        if isinstance(module, Linear):
            n, k = module.weight.shape
            module.skinny_configs = {m: pick_config(m, n, k) for m in (1, 2)}
    prompts = [[1, 5, 9, 13, 2, 7], [3, 4, 40, 2]]
    drivers = [paged_driver(m, block_size=BLOCK, num_blocks=16) for m in models]
    logits = [d.step(list(enumerate(prompts))) for d in drivers]
    tokens = [int(lg[-1].argmax()) for lg in logits[0]]
    for rows in (2, 1, 2):  # decode steps of both sequences, then of the first alone
        step = [d.step([(i, [tok]) for i, tok in enumerate(tokens[:rows])]) for d in drivers]
        for got, want in zip(step[1], step[0], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tokens = [int(lg[-1].argmax()) for lg in step[0]] + tokens[rows:]


def _tiny_llama() -> ModelConfig:
    return tiny_config("LlamaForCausalLM", 1, attention_bias=True)


@pytest.mark.parametrize("config", [tiny_qwen3, _tiny_llama], ids=["qwen3", "llama"])
@pytest.mark.parametrize(
    "chunks", [[(0, 6), (5, 1), (3, 4)], [(10, 1), (3, 1), (17, 1)]], ids=["mixed", "decode"]
)
def test_attention_layer_stores_kv_in_rope(device, seed, config, chunks):
    """DecoderAttention on the Triton ops and backend takes the fused rope + KV store; its
    output and cache equal, bit for bit, those of the unfused path (rope launch, then the
    backend's own write) and, on decode steps, of the rotation folded into the decode
    attention launch (``fold_rope``), and match the torch ops and backend."""
    cfg = config()
    rng = random.Random(seed)
    num_blocks = 16
    meta = _batch(device, rng, chunks, num_blocks)
    positions = torch.cat([torch.arange(c, c + n) for c, n in chunks]).to(device)
    t = positions.shape[0]
    x = torch.randn(t, cfg.hidden_size, device=device)
    cache = torch.randn(2, num_blocks, BLOCK, N_KV, HEAD_DIM, device=device)
    rotary = RotaryEmbedding(HEAD_DIM, cfg.rope_theta, None, max_positions=128)
    rotary.reset_buffers(device)

    layers, outs, caches = {}, {}, {}
    for name in ("fused", "unfused", "in attention", "torch"):
        kind = "torch" if name == "torch" else "triton"
        ops = get_layer_ops(kind)
        if name == "unfused":
            ops.fuses_kv_store = False  # this instance only: rotate, then backend write
        backend = get_attention_backend(kind)
        backend.fold_rope = name == "in attention"  # decode steps only; others as fused
        layer = DecoderAttention(cfg, backend, ops).to(device)
        if layers:
            layer.load_state_dict(layers["fused"].state_dict())
        else:
            gen = torch.Generator(device=device).manual_seed(seed)
            with torch.no_grad():
                for p in layer.parameters():
                    p.normal_(0.0, 0.3, generator=gen)
        layers[name] = layer
        caches[name] = cache.clone()
        with torch.no_grad():
            tables = ops.rope_tables(rotary, positions, x.dtype)
            outs[name] = layer(x, tables, caches[name], meta)
    for other in ("unfused", "in attention"):
        assert torch.equal(outs["fused"], outs[other]), f"seed {seed}: {other} output differs"
        assert torch.equal(caches["fused"], caches[other]), f"seed {seed}: {other} cache differs"
    decode = all(n == 1 for _, n in chunks)
    assert layers["in attention"].backend.rotates_decode(meta, t) == decode
    assert not torch.equal(caches["fused"], cache), f"seed {seed}: nothing was stored"
    close = {"rtol": 1e-4, "atol": 1e-4, "msg": lambda m: f"seed {seed}: {m}"}
    torch.testing.assert_close(outs["fused"], outs["torch"], **close)
    torch.testing.assert_close(caches["fused"], caches["torch"], **close)
