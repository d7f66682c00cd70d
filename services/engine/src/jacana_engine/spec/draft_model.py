"""Draft-model proposer: a small LM sharing the target's tokenizer drafts greedily.

Ownership: the proposer owns the draft model's own paged KV cache (one
``[2, num_blocks, block_size, n_kv_heads, head_dim]`` tensor per layer, on the draft
model's device) and, per request, its block list and the tokens whose K/V that cache
holds (host-side). It runs in the engine thread (in-process transport) or in the drafter
service (remote transport), never sharing blocks with the target.

Each call, per request: the cached tokens that still agree with the request's history
are kept (so rejected drafts roll back by truncation), the rest of the history is
computed as one chunk, and its last logits give draft 1; drafts 2..k are one-token
decode steps, batched across requests. Drafts are greedy (argmax): a deterministic
draft is verified exactly by the target's greedy or rejection-sampling rule.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.spec.proposer import DraftRequest, Proposer
from jacana_engine.worker.attention_metadata import AttentionMetadata
from jacana_engine.worker.row_buckets import pad_rows, padded_rows, row_buckets, warm_row_buckets


@dataclass
class _DraftState:
    tokens: list[int] = field(default_factory=list)  # tokens whose K/V the cache holds
    blocks: list[int] = field(default_factory=list)

    # What cuda_graphs.DecodeStaging reads of a sequence: blocks are only ever appended
    # while a state lives (truncated tokens keep theirs), so the epoch never moves.
    block_table_epoch = 0
    spec_token_ids: tuple[int, ...] = ()

    @property
    def block_table(self) -> list[int]:
        return self.blocks

    def token_slice(self, start: int, end: int) -> list[int]:
        return self.tokens[start:end]


class DraftModelProposer(Proposer):
    """Greedy drafts from ``model`` (a ``CausalLM``) over its own paged KV cache."""

    name = "draft_model"

    def __init__(
        self,
        model,
        num_blocks: int = 256,
        block_size: int = 16,
        max_batch: int = 64,
        max_draft: int = 8,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        cfg = model.config
        self.model = model
        self.block_size = block_size
        weight = next(iter(model.parameters())) if hasattr(model, "parameters") else None
        self.device = weight.device if weight is not None else torch.device("cpu")
        dtype = weight.dtype if weight is not None else torch.float32
        shape = (2, num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        # kv_caches[layer]: [2 (K, V), num_blocks, block_size, n_kv_heads, head_dim]
        self.kv_caches = [
            torch.zeros(shape, dtype=dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        self._free = list(range(num_blocks - 1, -1, -1))
        self._states: dict[str, _DraftState] = {}
        self.max_len = cfg.max_position_embeddings
        # the most tokens one request's (or one step's) K/V can reach in this cache
        self.capacity = min(self.max_len, num_blocks * block_size)
        self.max_batch, self.max_draft = max_batch, max_draft
        self.graphs = self._capture_graphs(max_batch, max_draft)
        # Eager steps (catch-ups that the graphs do not hold) pad their rows as the
        # target's do (``row_buckets.py``), where the graphs run: their padding is safe.
        self.row_buckets = row_buckets(self.capacity) if self.graphs is not None else []

    # ---- interface -------------------------------------------------------------------------

    def propose(self, requests: Sequence[DraftRequest]) -> list[list[int]]:
        drafts: list[list[int]] = [[] for _ in requests]
        chunks: list[tuple[int, _DraftState, list[int]]] = []  # (index, state, new tokens)
        for i, r in enumerate(requests):
            state = self._states.setdefault(r.request_id, _DraftState())
            history = list(r.token_ids)
            keep = _common_prefix(state.tokens, history, len(history) - 1)
            del state.tokens[keep:]
            need = len(history) + r.max_draft - 1
            if need > self.max_len or not self._grow(state, need):
                continue  # no room in the draft cache: this request drafts nothing now
            chunks.append((i, state, history[keep:]))
        if not chunks:
            return drafts
        with torch.inference_mode():
            nxt = self._step([(s, new) for _, s, new in chunks])
            for (i, _, _), tok in zip(chunks, nxt, strict=True):
                drafts[i].append(tok)
            for _ in range(max(requests[i].max_draft for i, _, _ in chunks) - 1):
                live = [(i, s) for i, s, _ in chunks if len(drafts[i]) < requests[i].max_draft]
                if not live:
                    break
                nxt = self._step([(s, [drafts[i][-1]]) for i, s in live])
                for (i, _), tok in zip(live, nxt, strict=True):
                    drafts[i].append(tok)
        return drafts

    def finish(self, request_id: str, token_ids: Sequence[int], num_prompt_tokens: int) -> None:
        state = self._states.pop(request_id, None)
        if state is not None:
            self._free.extend(state.blocks)

    def warm_up(self) -> float:
        """Draft for ``warm_up.warm_up_prompt_groups`` (one ``propose`` a group: a short
        prompt, two, many with a long one, within this cache and batch), so the prefill
        kernels' variants compile now, then finish them all (every block back); then meet
        the GEMM shapes of every row bucket (``row_buckets.warm_row_buckets``)."""
        from jacana_engine.worker.warm_up import WarmUpLimits, warm_up_prompt_groups

        started = time.perf_counter()
        capacity = min(self.max_len, len(self._free) * self.block_size)
        limits = WarmUpLimits(
            vocab_size=self.model.config.vocab_size,
            max_num_seqs=self.max_batch,
            max_num_batched_tokens=capacity,
            max_request_tokens=capacity - self.max_draft,
        )
        for g, prompts in enumerate(warm_up_prompt_groups(limits)):
            requests = [
                DraftRequest(f"warm-up-{g}-{i}", prompt, len(prompt), self.max_draft)
                for i, prompt in enumerate(prompts)
            ]
            self.propose(requests)
            for r in requests:
                self.finish(r.request_id, r.token_ids, r.num_prompt_tokens)
        if self.row_buckets:
            warm_row_buckets(self.model, self.row_buckets, self.max_batch)
        return time.perf_counter() - started

    # ---- the draft model's forward passes ------------------------------------------------

    def _grow(self, state: _DraftState, num_tokens: int) -> bool:
        want = -(-num_tokens // self.block_size) - len(state.blocks)
        if want > len(self._free):
            return False
        for _ in range(max(0, want)):
            state.blocks.append(self._free.pop())
        return True

    def _capture_graphs(self, max_batch: int, max_draft: int):
        """CUDA graphs (CUDA with a graph-safe attention backend; None otherwise) for the
        one-token draft steps and for the catch-up chunks that start each call (the
        tokens accepted since the last one: at most ``max_draft + 1``), bounded by what
        the draft cache can hold."""
        backend = getattr(self.model, "backend", None)
        if self.device.type != "cuda" or not getattr(backend, "graph_safe", False):
            return None
        from jacana_engine.kernels.decode_attention import choose_num_splits
        from jacana_engine.worker.decode_graphs import DecodeGraphs, capture_sizes, query_widths

        max_len = self.capacity
        n_kv = self.model.config.num_key_value_heads
        graphs = DecodeGraphs(
            lambda ids, positions, meta: self.model.forward(ids, positions, self.kv_caches, meta),
            sizes=capture_sizes(max_batch),
            block_size=self.block_size,
            max_blocks=-(-max_len // self.block_size),
            max_model_len=max_len,
            num_splits=lambda padded: choose_num_splits(padded, n_kv, max_len, self.device),
            device=self.device,
            query_widths=query_widths(max_draft),
        )
        graphs.capture()
        return graphs

    def _step_graph(self, chunks: list[tuple[_DraftState, list[int]]]) -> list[int] | None:
        """The step through the captured graphs; None (nothing appended) when it does
        not fit them (a long catch-up chunk, too many requests)."""
        if self.graphs is None:
            return None
        plan = []
        for state, new in chunks:
            plan.append(ScheduledSequence(state, len(state.tokens), len(new), True))
            state.tokens.extend(new)
        width = self.graphs.query_width(plan)
        if width is None:
            for (state, _), s in zip(chunks, plan, strict=True):
                del state.tokens[s.start :]
            return None
        hidden = self.graphs.run(plan, width)  # [T, hidden], chunks end to end
        ends = torch.tensor([len(new) for _, new in chunks]).cumsum(0) - 1  # [B]
        last = hidden.index_select(0, ends.to(self.device))  # [B, hidden]
        return self.model.compute_logits(last).argmax(dim=-1).tolist()

    def _step(self, chunks: list[tuple[_DraftState, list[int]]]) -> list[int]:
        """Append ``new`` tokens to each state's cache; the argmax after each chunk."""
        replayed = self._step_graph(chunks)
        if replayed is not None:
            return replayed
        bs = self.block_size
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        for state, new in chunks:
            start = len(state.tokens)
            for p, tok in enumerate(new, start):
                ids.append(tok)
                positions.append(p)
                slots.append(state.blocks[p // bs] * bs + p % bs)
            state.tokens.extend(new)
            qsl.append(qsl[-1] + len(new))
            seq_lens.append(len(state.tokens))
        width = max(len(s.blocks) for s, _ in chunks)
        tables = [s.blocks + [0] * (width - len(s.blocks)) for s, _ in chunks]
        meta = AttentionMetadata(
            query_start_loc=torch.tensor(qsl, dtype=torch.int32),  # [B + 1]
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32),  # [B]
            block_tables=torch.tensor(tables, dtype=torch.int32),  # [B, width]
            slot_mapping=torch.tensor(slots, dtype=torch.int64),  # [T]
            query_lens_cpu=[len(new) for _, new in chunks],
            seq_lens_cpu=seq_lens,
            block_size=bs,
        )
        input_ids = torch.tensor(ids, dtype=torch.int64)  # [T]
        input_positions = torch.tensor(positions, dtype=torch.int64)  # [T]
        if self.row_buckets and len(ids) > len(chunks):  # a catch-up: rows T.. pad it
            rows = padded_rows(len(ids), self.row_buckets)
            input_ids, input_positions, meta = pad_rows(input_ids, input_positions, meta, rows)
        hidden = self.model.forward(
            input_ids.to(self.device),
            input_positions.to(self.device),
            self.kv_caches,
            meta.to(self.device),
        )  # [rows, hidden]
        last = torch.tensor([q - 1 for q in qsl[1:]], device=self.device)  # [B]
        return self.model.compute_logits(hidden[last]).argmax(dim=-1).tolist()


def _common_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
