"""Triton kernels of the engine, each beside a pure-torch reference (``reference.py``).

Entry points (import the module you need; importing this package loads no Triton code):

- ``kv_cache_write.kv_cache_write(k, v, kv_cache, slot_mapping)``
- ``decode_attention.paged_decode_attention(q, kv_cache, seq_lens, block_tables, scale, *,
  num_splits=None, max_seq_len=None, out=None, fused_merge=True)``: the last split
  program of each (sequence, KV head) merges the splits (no second launch)
- ``prefill_attention.paged_prefill_attention(q, kv_cache, query_start_loc, seq_lens,
  block_tables, scale, *, max_query_len, out=None)``
- ``rmsnorm.rms_norm(x, weight, eps, *, out=None)`` and
  ``rmsnorm.fused_add_rms_norm(x, residual, weight, eps, *, out=None, residual_out=None)``
- ``rope.rope(positions, q, k, cos_sin_cache, *, q_out=None, k_out=None, store=None)`` and
  ``rope.qk_norm_rope(positions, q, k, q_weight, k_weight, eps, cos_sin_cache, *, ...)``;
  ``store=rope.KVStore(v, kv_cache, slot_mapping)`` also does ``kv_cache_write``'s job
- ``activation.silu_and_mul(x, *, out=None)``
- ``sampling.sample(logits, temperature, top_k, top_p, min_p, seeds, steps, *, plan=None,
  out=None)`` with ``sampling_filters.plan_filters`` for the host-side plan

All launchers take device tensors and never read them back on the host. On a machine
without a GPU they run under Triton's interpreter when ``TRITON_INTERPRET=1`` is set
before these modules are imported.
"""
