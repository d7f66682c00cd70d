"""Pure-torch references for the Triton kernels of this package.

Each function states the contract its kernel must meet and computes it the plain way:
per-sequence loops, float64 arithmetic (or float32 where said), rounding to the input
dtype only where the HF modules round. They are the oracles of the kernel tests; they
sync with the host freely and are not meant to be fast. Nothing here imports Triton.
"""

from __future__ import annotations

import math

import torch

# ---------------------------------------------------------------- KV cache + attention


def kv_cache_write_reference(
    k: torch.Tensor,  # [T, n_kv, head_dim]
    v: torch.Tensor,  # [T, n_kv, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64; < 0 = padding, skipped
) -> torch.Tensor:
    """A copy of ``kv_cache`` with token t's K/V at flat slot ``slot_mapping[t]``."""
    out = kv_cache.clone()
    flat = out.view(2, -1, *out.shape[3:])  # [2, num_blocks * block_size, n_kv, head_dim]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    flat[0, slots] = k[keep].to(out.dtype)
    flat[1, slots] = v[keep].to(out.dtype)
    return out


def paged_attention_reference(
    q: torch.Tensor,  # [T, n_heads, head_dim]
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    query_start_loc: torch.Tensor,  # [B + 1] int32
    seq_lens: torch.Tensor,  # [B] int32
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    scale: float,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:  # [T, n_heads, head_dim] in compute_dtype
    """Causal attention of each sequence's queries over its paged K/V.

    Sequence i has ``n = qsl[i+1] - qsl[i]`` queries at positions ``seq_lens[i] - n ..
    seq_lens[i] - 1``; the first ``seq_lens[i] - n`` keys are its cached prefix. Query at
    position p sees keys ``0..p``. GQA: query head h reads KV head ``h // (n_heads/n_kv)``.
    Decode is the case n = 1.
    """
    block_size = kv_cache.shape[2]
    n_heads, n_kv = q.shape[1], kv_cache.shape[3]
    group = n_heads // n_kv
    out = torch.empty(q.shape, dtype=compute_dtype, device=q.device)
    qsl = query_start_loc.tolist()
    for i, seq_len in enumerate(seq_lens.tolist()):
        start, end = qsl[i], qsl[i + 1]
        n_blocks = -(-seq_len // block_size)
        blocks = block_tables[i, :n_blocks].long()
        # k, v: [seq_len, n_heads, head_dim]
        k = kv_cache[0, blocks].reshape(-1, n_kv, kv_cache.shape[4])[:seq_len]
        v = kv_cache[1, blocks].reshape(-1, n_kv, kv_cache.shape[4])[:seq_len]
        k = k.to(compute_dtype).repeat_interleave(group, dim=1)
        v = v.to(compute_dtype).repeat_interleave(group, dim=1)
        qi = q[start:end].to(compute_dtype)  # [n, n_heads, head_dim]
        scores = torch.einsum("qhd,khd->hqk", qi, k) * scale  # [n_heads, n, seq_len]
        q_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device)
        k_pos = torch.arange(seq_len, device=q.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[start:end] = torch.einsum("hqk,khd->qhd", scores.softmax(dim=-1), v)
    return out


# ---------------------------------------------------------------- norms, RoPE, activation


def rms_norm_reference(
    x: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> torch.Tensor:  # [T, hidden] in x's dtype
    """HF Llama/Qwen RMSNorm: statistics in float64 here, rounded to x's dtype before
    the weight, and the product rounded again."""
    x64 = x.double()
    normed = (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (weight.double() * normed.double()).to(x.dtype)


def transformers_rms_norm(
    x: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
    mean: torch.Tensor | None = None,  # [T] float32: replaces the mean of squares
) -> torch.Tensor:  # [T, hidden] in x's dtype
    """transformers' Llama/Qwen RMSNorm as its forward writes it, run by torch in float32
    on x's device (on the GPU, the bits our norm kernels must give)."""
    h = x.float()
    variance = h.pow(2).mean(-1, keepdim=True) if mean is None else mean[:, None]
    return weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)


def thread_partials(sq: torch.Tensor, width: int, vec: int, pattern: str) -> torch.Tensor:
    """sq [R, N] float32 -> [R, width]: each thread's own sum. "vector": thread t loads
    elements vec * (t + width * p) + i (i < vec) into accumulator i, pass p after pass;
    "strided": element t + width * (vec * j + i) goes to accumulator i. The accumulators
    are then added left to right."""
    rows, n = sq.shape
    if pattern == "vector":
        if n % vec:
            raise ValueError("a row that is not whole vectors")
        passes = math.ceil(n // vec / width)
        padded = torch.zeros(rows, passes * width * vec, device=sq.device)
        padded[:, :n] = sq
        lanes = padded.view(rows, passes, width, vec)  # [R, pass, thread, i]
    else:
        passes = math.ceil(n / (width * vec))
        padded = torch.zeros(rows, passes * vec * width, device=sq.device)
        padded[:, :n] = sq
        lanes = padded.view(rows, passes, vec, width).transpose(2, 3)  # [R, pass, thread, i]
    acc = lanes[:, 0]
    for p in range(1, passes):
        acc = acc + lanes[:, p]  # adding a padded zero is exact
    out = acc[..., 0]
    for i in range(1, vec):
        out = out + acc[..., i]
    return out


def halving_sum(partials: torch.Tensor) -> torch.Tensor:
    """[R, W] -> [R]: lane t takes lane t + W/2's partial, then t + W/4's, ... down to
    one (through shared memory while more than a warp is left, then warp shuffles with
    falling offsets: read off torch's kernel with ``--reveal``)."""
    while partials.shape[1] > 1:
        half = partials.shape[1] // 2
        partials = partials[:, :half] + partials[:, half:]
    return partials[:, 0]


def torch_cuda_row_sum_reference(
    sq: torch.Tensor,  # [R, N] float32
    width: int,  # threads a row (kernels._row_sum_order.RowSumOrder.width)
    vector: bool,  # 4 consecutive values a load, else strided
) -> torch.Tensor:  # [R] float32
    """Each row's sum in the order torch's CUDA ``mean`` adds it (float32, each addition
    rounded): ``thread_partials`` then ``halving_sum``."""
    return halving_sum(thread_partials(sq, width, 4, "vector" if vector else "strided"))


def mma_fragment_row_sum(
    tiles: list[torch.Tensor],  # each [R, N] float32 (N a multiple of 8): a tile's p
    alphas: list[torch.Tensor],  # each [R] float32: the rescale before that tile
) -> torch.Tensor:  # [R] float32
    """The online softmax's row sum in the order cuDNN adds it (on an H200, of the orders
    tried against torch's SDPA, the one that gives its bits): lane q of a row's quad keeps a
    partial sum across tiles; before each tile it is multiplied by that tile's alpha, then
    the tile's columns 8 i + 2 q + j are added one at a time (i = 0, 1, ..., j = 0, 1
    within i); at the end the quad's partials are added as (a0 + a1) + (a2 + a3). Each
    operation rounds to float32 on its own."""
    rows = tiles[0].shape[0]
    part = torch.zeros(rows, 4, dtype=torch.float32, device=tiles[0].device)
    for tile, alpha in zip(tiles, alphas, strict=True):
        part = part * alpha[:, None]
        lanes = tile.view(rows, tile.shape[1] // 8, 4, 2)  # [R, i, q, j]
        for i in range(lanes.shape[1]):
            for j in range(2):
                part = part + lanes[:, i, :, j]
    return (part[:, 0] + part[:, 1]) + (part[:, 2] + part[:, 3])


def fused_add_rms_norm_reference(
    x: torch.Tensor,  # [T, hidden]
    residual: torch.Tensor,  # [T, hidden]
    weight: torch.Tensor,  # [hidden]
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, new_residual), both [T, hidden]
    """``new_residual = x + residual`` rounded to x's dtype; ``normed = rms_norm(new_residual)``."""
    new_residual = (x.double() + residual.double()).to(x.dtype)
    return rms_norm_reference(new_residual, weight, eps), new_residual


def build_cos_sin_cache(
    inv_freq: torch.Tensor,  # [rotary_dim // 2] float32
    max_positions: int,
    attention_scaling: float = 1.0,
) -> torch.Tensor:  # [max_positions, rotary_dim] float32: cos half, then sin half
    """The position table the RoPE kernels read, with HF's float32 angles.

    Row p is ``cat(cos(p * inv_freq), sin(p * inv_freq)) * attention_scaling``. The
    angles are one float32 product each, exactly as HF computes them, so a table built on
    the same device gives bit-identical cos/sin.
    """
    positions = torch.arange(max_positions, device=inv_freq.device).float()
    freqs = positions[:, None] * inv_freq.float()[None, :]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1) * attention_scaling


def rope_reference(
    x: torch.Tensor,  # [T, n_heads, head_dim]
    positions: torch.Tensor,  # [T] int
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] float32
) -> torch.Tensor:  # [T, n_heads, head_dim] in x's dtype
    """HF "rotate half" RoPE on the first ``rotary_dim`` dims; the rest pass through.

    Rounds like HF's ``apply_rotary_pos_emb`` in x's dtype: cos/sin are cast to x's dtype,
    each product is rounded, then their sum.
    """
    rot = cos_sin_cache.shape[1]
    half = rot // 2
    table = cos_sin_cache[positions.long()]  # [T, rotary_dim]
    cos = table[:, None, :half].to(x.dtype).double()
    sin = table[:, None, half:].to(x.dtype).double()
    x1, x2 = x[..., :half].double(), x[..., half:rot].double()
    o1 = ((x1 * cos).to(x.dtype).double() - (x2 * sin).to(x.dtype).double()).to(x.dtype)
    o2 = ((x2 * cos).to(x.dtype).double() + (x1 * sin).to(x.dtype).double()).to(x.dtype)
    return torch.cat((o1, o2, x[..., rot:]), dim=-1)


def qk_norm_rope_reference(
    x: torch.Tensor,  # [T, n_heads, head_dim]
    weight: torch.Tensor,  # [head_dim]
    eps: float,
    positions: torch.Tensor,  # [T] int
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] float32
) -> torch.Tensor:  # [T, n_heads, head_dim] in x's dtype
    """Qwen3: RMSNorm over each head's ``head_dim`` (HF rounding), then RoPE."""
    normed = rms_norm_reference(x.reshape(-1, x.shape[-1]), weight, eps).view_as(x)
    return rope_reference(normed, positions, cos_sin_cache)


def rope_kv_store_reference(
    q: torch.Tensor,  # [T, n_heads, head_dim]
    k: torch.Tensor,  # [T, n_kv, head_dim]
    v: torch.Tensor,  # [T, n_kv, head_dim]
    positions: torch.Tensor,  # [T] int
    cos_sin_cache: torch.Tensor,  # [max_positions, rotary_dim] float32
    kv_cache: torch.Tensor,  # [2, num_blocks, block_size, n_kv, head_dim]
    slot_mapping: torch.Tensor,  # [T] int64; < 0 = padding, skipped
    q_weight: torch.Tensor | None = None,  # [head_dim] Qwen3 q/k norm weights, or None
    k_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (q, k rotated; a new cache)
    """RoPE (after the q/k norm when weights are given) fused with the KV store: the
    rotated k, rounded to k's dtype, and v as given land in a copy of ``kv_cache``."""
    if q_weight is None:
        q_rot = rope_reference(q, positions, cos_sin_cache)
        k_rot = rope_reference(k, positions, cos_sin_cache)
    else:
        q_rot = qk_norm_rope_reference(q, q_weight, eps, positions, cos_sin_cache)
        k_rot = qk_norm_rope_reference(k, k_weight, eps, positions, cos_sin_cache)
    return q_rot, k_rot, kv_cache_write_reference(k_rot, v, kv_cache, slot_mapping)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2 * I] -> ``silu(x[:, :I]) * x[:, I:]``: [T, I], silu rounded to x's dtype
    before the product, as HF's ``act_fn(gate) * up``."""
    gate, up = x.double().chunk(2, dim=-1)
    act = torch.nn.functional.silu(gate).to(x.dtype).double()
    return (act * up).to(x.dtype)


# ---------------------------------------------------------------- sampling


def sampling_probs_reference(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N] float32; 0 = greedy
    top_k: torch.Tensor,  # [N] int; 0 = off
    top_p: torch.Tensor,  # [N] float32; 1 = off
    min_p: torch.Tensor,  # [N] float32; 0 = off
) -> torch.Tensor:  # [N, V] float64
    """The distribution each row's token is drawn from.

    Greedy rows: all mass on the first argmax. Other rows, over ``p = softmax(logits / T)``:
    top-k keeps tokens whose value is >= the k-th largest (ties kept); top-p then keeps
    token i iff the top-k-renormalized mass of tokens strictly more likely than i is
    < top_p; min-p keeps tokens with ``p_i >= min_p * max(p)``. The three masks intersect
    and the kept probabilities are renormalized.
    """
    n, vocab = logits.shape
    probs = torch.zeros(n, vocab, dtype=torch.float64, device=logits.device)
    for i in range(n):
        row = logits[i].double()
        t = float(temperature[i])
        if t == 0.0:
            probs[i, int(row.argmax())] = 1.0
            continue
        p = torch.softmax(row / t, dim=-1)
        keep = torch.ones(vocab, dtype=torch.bool, device=logits.device)
        k = int(top_k[i])
        if 0 < k < vocab:
            keep &= p >= p.topk(k).values[-1]
        if float(top_p[i]) < 1.0:  # at 1 nothing is cut (rounding must not drop the tail)
            pk = torch.where(keep, p, 0.0)
            pk = pk / pk.sum()
            # mass of tokens strictly more likely than each token, within the top-k set
            ascending = pk.sort().values
            at_most = ascending.cumsum(0)[torch.searchsorted(ascending, pk, right=True) - 1]
            above = ascending.sum() - at_most
            keep &= above < float(top_p[i])
        keep &= p >= float(min_p[i]) * p.max()
        kept = torch.where(keep, p, 0.0)
        probs[i] = kept / kept.sum()
    return probs


_PHILOX_ROUND_A = 0xD2511F53
_PHILOX_ROUND_B = 0xCD9E8D57
_PHILOX_KEY_A = 0x9E3779B9
_PHILOX_KEY_B = 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def philox_reference(
    seeds: torch.Tensor,  # [N] int64
    steps: torch.Tensor,  # [N] int64
    counters: torch.Tensor,  # [V] int
    rounds: int = 10,
) -> torch.Tensor:  # [N, V] int64 holding uint32 values
    """Philox-4x32 first output word for counter ``(c, step_lo, step_hi, 0)`` under key
    ``(seed_lo, seed_hi)``: the stream the sampling kernel draws for vocabulary index
    ``c`` of a row with that seed and step. int64 arithmetic masked to 32 bits (products
    of two 32-bit words wrap in int64, but their low 64 bits are exact)."""
    c0 = (counters.long() & _MASK32)[None, :]
    c1 = (steps.long() & _MASK32)[:, None]
    c2 = ((steps.long() >> 32) & _MASK32)[:, None]
    c3 = torch.zeros_like(c1)
    k0 = (seeds.long() & _MASK32)[:, None]
    k1 = ((seeds.long() >> 32) & _MASK32)[:, None]
    for _ in range(rounds):
        prod_b = _PHILOX_ROUND_B * c2
        prod_a = _PHILOX_ROUND_A * c0
        c0, c1, c2, c3 = (
            ((prod_b >> 32) & _MASK32) ^ c1 ^ k0,
            prod_b & _MASK32,
            ((prod_a >> 32) & _MASK32) ^ c3 ^ k1,
            prod_a & _MASK32,
        )
        k0 = (k0 + _PHILOX_KEY_A) & _MASK32
        k1 = (k1 + _PHILOX_KEY_B) & _MASK32
    return c0


def sample_reference(
    logits: torch.Tensor,  # [N, V] float32
    temperature: torch.Tensor,  # [N]
    top_k: torch.Tensor,  # [N]
    top_p: torch.Tensor,  # [N]
    min_p: torch.Tensor,  # [N]
    seeds: torch.Tensor,  # [N] int64
    steps: torch.Tensor,  # [N] int64
    probs: torch.Tensor | None = None,  # [N, V] from sampling_probs_reference, if at hand
) -> torch.Tensor:  # [N] int64
    """The sampling kernel's draws recomputed in float64: first argmax for greedy rows,
    else ``argmax_j logit_j / T - log(E_j)`` over the tokens that
    ``sampling_probs_reference`` keeps, with ``E_j = -log(u_j)`` and ``u_j`` from
    ``philox_reference`` mapped to ``(bits + 0.5) / 2**32``."""
    if probs is None:
        probs = sampling_probs_reference(logits, temperature, top_k, top_p, min_p)
    counters = torch.arange(logits.shape[1], device=logits.device)
    bits = philox_reference(seeds, steps, counters)  # [N, V]
    e = -torch.log((bits.double() + 0.5) * 2.0**-32)
    temp = temperature.double().clamp_min(1e-30)[:, None]
    score = torch.where(probs > 0, logits.double() / temp - torch.log(e), float("-inf"))
    greedy = temperature == 0
    return torch.where(greedy, probs.argmax(dim=-1), score.argmax(dim=-1))
