"""Turns a scheduler plan into one forward pass: batch tensors, model, logits, sampling.

State ownership: the runner owns the model and the KV cache tensors (on the model's
device, one ``[2, num_blocks, block_size, n_kv_heads, head_dim]`` tensor per layer, in the
model dtype). Batch tensors are built on the host (:func:`build_batch`, a pure function),
moved to the device once per step, and dropped after the step. Block ids come from the
sequences' block tables (host state owned by the block manager).

Sampling: the sampler gets the logits of each sequence's last scheduled token (processors,
sampling, logprobs: :meth:`Sampler.forward`). Sequences that asked for prompt logprobs also
get the logits of their prompt positions, in slices of ``PROMPT_LOGPROB_ROWS`` rows, and
the runner appends the results to ``Sequence.prompt_logprobs`` (the one place it writes to
a sequence). Those must compute every prompt position: a prompt served from a prefix cache
has no logits to read.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from jacana_engine.config import EngineConfig
from jacana_engine.core.outputs import TokenLogprob
from jacana_engine.core.scheduler import ScheduledSequence
from jacana_engine.kv_cache import sizing
from jacana_engine.loader import torch_dtype
from jacana_engine.models.base import CausalLM, ModelConfig
from jacana_engine.pooling.methods import pool_step
from jacana_engine.sample.device_sampling import DeviceSampler
from jacana_engine.sample.logits_processors import PendingTokens
from jacana_engine.sample.sampler import (
    RawLogprobs,
    RowLogprobs,
    Sampler,
    logprobs_by_row,
    token_logprobs,
)
from jacana_engine.tuning.cache import TuningCache
from jacana_engine.tuning.decode_gemm import (
    SKINNY_MAX_ROWS,
    tune_decode_gemms,
)
from jacana_engine.tuning.graph_picks import tune_one_row_in_graph
from jacana_engine.worker.attention_metadata import AttentionMetadata, kv_slots
from jacana_engine.worker.decode_graphs import (
    DecodeGraphs,
    capture_sizes,
    padded_size,
    query_widths,
)
from jacana_engine.worker.decode_overlap import LaunchedStep
from jacana_engine.worker.host_to_device import index_on
from jacana_engine.worker.prefill_graphs import PrefillGraphs, prefill_buckets
from jacana_engine.worker.row_buckets import pad_rows, padded_rows, row_buckets, warm_row_buckets

log = logging.getLogger(__name__)

# Decode graphs of at most this many tokens launch their Triton kernels dependently (with
# ``EngineConfig.pdl``): the rows the skinny GEMMs serve. On an H200 that took Qwen3-8B's
# one-row decode graph from 4.21 to 3.94 ms, while the 64-row graph, whose GEMMs are
# cuBLAS's, went from 5.83 to 5.98 ms.
PDL_MAX_TOKENS = SKINNY_MAX_ROWS
# KV tokens each sequence of a start-up timing graph attends (a mid-length decode step)
TUNING_CONTEXT = 320
SCREEN_REPLAYS = 5  # replays that screen a one-row choice in the in-graph search
# seconds of back-to-back replays that time a batch-1 graph under sustained load: an H200
# reaches its power cap within ~0.5 s of batch-1 decode (layers/graph_picks.py)
SUSTAIN_SECONDS = 1.2

PROMPT_LOGPROB_ROWS = 256  # prompt positions per logits slice: [256, V] float32 at a time


@dataclass
class StepOutput:
    """What one step sampled, in batch order of the sampling sequences.

    token_ids: the sampled token of each.
    logprobs: its :class:`TokenLogprob` when the sequence asked for logprobs, else None.
    """

    token_ids: list[int]
    logprobs: list[TokenLogprob | None]
    # Tokens gained by each verifying chunk (speculative decoding), in batch order.
    verified: list[list[int]] = dataclasses.field(default_factory=list)


@dataclass
class Batch:
    """Host tensors of one step.

    input_ids / positions: [T] int64, the scheduled tokens of every sequence end to end.
    meta: attention metadata (host copy).
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata


def build_batch(scheduled: Seq[ScheduledSequence], block_size: int) -> Batch:
    """Flatten a step's chunks into model inputs. Pure: reads sequences, writes nothing."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start = [0]
    seq_lens: list[int] = []
    for s in scheduled:
        start, end = s.start, s.start + s.num_new_tokens
        table = s.seq.block_table
        input_ids.extend(s.known_token_ids())  # drafts to verify included
        positions.extend(range(start, end))
        slots.extend(kv_slots(table, start, end, block_size))
        query_start.append(query_start[-1] + s.num_new_tokens)
        seq_lens.append(end)

    max_blocks = max((len(s.seq.block_table) for s in scheduled), default=0)
    # One tensor from zero-padded rows (a tensor per row costs ~5 µs each).
    block_tables = torch.tensor(
        [t + [0] * (max_blocks - len(t)) for t in (s.seq.block_table for s in scheduled)],
        dtype=torch.int32,
    ).reshape(len(scheduled), max_blocks)
    meta = AttentionMetadata(
        query_start_loc=torch.tensor(query_start, dtype=torch.int32),  # [B + 1]
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),  # [B]
        block_tables=block_tables,  # [B, max_blocks]
        slot_mapping=torch.tensor(slots, dtype=torch.int64),  # [T]
        query_lens_cpu=[s.num_new_tokens for s in scheduled],
        seq_lens_cpu=seq_lens,
        block_size=block_size,
    )
    return Batch(
        input_ids=torch.tensor(input_ids, dtype=torch.int64),  # [T]
        positions=torch.tensor(positions, dtype=torch.int64),  # [T]
        meta=meta,
    )


def rope_folds_into_attention(config: EngineConfig) -> bool:
    """Whether decode attention does the rope kernel's work (``fuse_rope_attention``).
    Never for float16 activations: the attention kernel is compiled with FMA contraction,
    and only bfloat16's rotation products are rounded where no FMA can reach them
    (``kernels/rope.rounded_product``)."""
    if config.fuse_rope_attention and torch_dtype(config.dtype) == torch.float16:
        log.info("RoPE stays in its own kernel for float16 activations")
        return False
    return config.fuse_rope_attention


def kv_block_bytes(cfg: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes one KV block takes across all layers (K and V)."""
    return sizing.kv_block_bytes(
        cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.head_dim, block_size, dtype
    )


def plan_kv_cache(config: EngineConfig, model_config: ModelConfig) -> sizing.KVCachePlan:
    """Pool size from ``config`` (block count, byte budget or memory fraction)."""
    return sizing.plan_kv_cache(
        block_bytes=kv_block_bytes(model_config, config.block_size, torch_dtype(config.dtype)),
        block_size=config.block_size,
        device=torch.device(config.device),
        num_blocks=config.num_kv_blocks,
        memory_bytes=config.kv_cache_memory,
        fraction=config.kv_cache_fraction,
    )


class ModelRunner:
    """Owns the model and its paged KV cache; runs one planned step at a time."""

    def __init__(
        self, model: CausalLM, config: EngineConfig, sampler: Sampler, max_model_len: int
    ) -> None:
        self.model = model
        self.sampler = sampler
        self.device = torch.device(config.device)
        self.dtype = torch_dtype(config.dtype)
        self.block_size = config.block_size
        cfg = model.config
        # Sized after the weights are on the device: a memory fraction sees what is left.
        self.kv_plan = plan_kv_cache(config, cfg)
        self.num_blocks = self.kv_plan.num_blocks
        shape = (2, self.num_blocks, self.block_size, cfg.num_key_value_heads, cfg.head_dim)
        # kv_caches[layer]: [2 (K, V), num_blocks, block_size, n_kv_heads, head_dim]
        self.kv_caches = [
            torch.zeros(shape, dtype=self.dtype, device=self.device)
            for _ in range(cfg.num_hidden_layers)
        ]
        log.info("%s", self.kv_plan.describe(max_model_len, str(self.device)))
        self.max_model_len = max_model_len
        if config.decode_gemm not in ("auto", "torch"):
            raise ValueError(f"decode_gemm must be 'auto' or 'torch', not {config.decode_gemm!r}")
        self.graphs = self._capture_graphs(config)
        self.prefill_graphs = self._capture_prefill_graphs(config)
        # Eager steps with prompt tokens pad their rows to these (``row_buckets.py``):
        # CUDA, with a backend that skips padding rows as the graphs' does.
        self.row_buckets: list[int] = []
        # the most rows an eager step projects to logits: each sequence's last, or with
        # speculation its last and its drafts (``spec.Speculator.verify``)
        spec = config.speculative
        self._logits_rows = config.max_num_seqs * (
            1 + spec.num_speculative_tokens if spec.enabled else 1
        )
        if config.eager_row_buckets and self._graph_sizes:
            self.row_buckets = row_buckets(config.max_num_batched_tokens)
        self.device_sampler = DeviceSampler(cfg.vocab_size) if self.device.type == "cuda" else None
        self.speculator = None  # spec.Speculator, set by the engine when speculation is on

    @torch.inference_mode()
    def execute(self, scheduled: Seq[ScheduledSequence]) -> StepOutput:
        """Run one step; returns the sampled token of each sampling sequence, in order."""
        if not scheduled:
            return StepOutput([], [])
        width = self.graphs.query_width(scheduled) if self.graphs is not None else None
        head = None  # (logits [B, vocab] model dtype, greedy tokens [B]) from the graph
        if width is not None:
            # Decode (and verify) steps: the graphs stage the step from the sequences
            # themselves (no Batch to build), replay, and hand back the real rows.
            hidden = self.graphs.run(scheduled, width)  # [T, hidden]
            head = self.graphs.head_outputs(len(scheduled))
            query_start = [0]
            for s in scheduled:
                query_start.append(query_start[-1] + s.num_new_tokens)
        elif self.prefill_graphs is not None and self.prefill_graphs.fits(scheduled):
            hidden, query_start = self.prefill_graphs.run(scheduled)  # [n, hidden]
        else:
            batch = build_batch(scheduled, self.block_size)
            hidden = self._forward(batch)  # [T, hidden]
            query_start = batch.meta.query_start_loc.tolist()  # [B + 1]
        pool_step(hidden, scheduled)  # embedding requests: fold in their final hidden states
        self._prompt_logprobs(hidden, scheduled, query_start)
        verified = self._verify(hidden, scheduled, query_start)
        sampling = [s.seq for s in scheduled if s.samples]
        if not sampling:
            return StepOutput([], [], verified)
        if len(sampling) == hidden.shape[0]:  # every token samples (decode): no gather
            last = hidden
        else:  # the row of each sampling chunk's last token
            head = None  # the graph's logits are every row's
            rows = [query_start[i + 1] - 1 for i, s in enumerate(scheduled) if s.samples]
            last = hidden[index_on(rows, self.device)]  # [N, hidden]
        logits = self._logits(head, last)  # [N, vocab] float32
        out = self._sample(logits, sampling)
        out.verified = verified
        return out

    @torch.inference_mode()
    def launch_decode(
        self, scheduled: list[ScheduledSequence], pending: LaunchedStep | None = None
    ) -> LaunchedStep:
        """Run a decode step that ``decode_overlap.overlappable`` accepts without waiting
        for it: forward, logits and sampling are queued on the device, the tokens come
        back through the returned handle. Chunks marked ``pending_token`` take their
        input from ``pending`` (the step still in flight) on the device."""
        sampling = [s.seq for s in scheduled]
        params = [seq.sampling_params for seq in sampling]
        # the tokens in flight, for rows whose logits are edited: copied out now, before
        # this step's forward (a graph head's replay rewrites the buffer they are in)
        edited = pending is not None and any(p.edits_logits for p in params)
        in_flight = pending.pending_tokens(scheduled) if edited else None
        width = self.graphs.query_width(scheduled) if self.graphs is not None else None
        in_place = width == 1 and pending is not None and pending.inputs_in_place(scheduled)
        patch = pending.patch_inputs(scheduled) if pending is not None and not in_place else None
        head = None
        if width == 1:
            hidden = self.graphs.run(scheduled, 1, token_patch=patch, tokens_in_place=in_place)
            head = self.graphs.head_outputs(len(scheduled))
        else:
            hidden = self._forward(build_batch(scheduled, self.block_size), token_patch=patch)
        if head is not None and all(p.greedy and not p.edits_logits for p in params):
            # the graph's own argmax: no sampling launch, no copy of the tokens; the rows
            # asking for logprobs read the head's logits, which nothing edits
            host, ready = self.graphs.tokens_on_host(len(scheduled))
            taken = RawLogprobs.take(head[0], params, copy=False)
            found = (taken.read(head[1]),) if taken is not None else ()
            return LaunchedStep.from_graph(scheduled, head[1], host, ready, found)
        logits = self._logits(head, hidden)  # [N, vocab] float32
        steps = [s.seq.num_output_tokens + s.pending_token for s in scheduled]
        ids, found = self._sample_rows(logits, sampling, steps, in_flight)
        return LaunchedStep.start(scheduled, ids, found)

    def _logits(self, head, hidden: torch.Tensor) -> torch.Tensor:
        """[N, vocab] float32: the float32 copy of the logits the graph's head wrote (its
        lm_head ran in the replay), else the lm_head run now on ``hidden`` [N, hidden]."""
        return head[0].float() if head is not None else self.model.compute_logits(hidden)

    def _verify(
        self, hidden: torch.Tensor, scheduled: Seq[ScheduledSequence], query_start: list[int]
    ):
        """Tokens gained by the chunks that carry drafts (``spec.Speculator.verify``)."""
        if self.speculator is None or not any(s.num_draft_tokens for s in scheduled):
            return []
        return self.speculator.verify(hidden, scheduled, query_start, self.model.compute_logits)

    # ---- forward: CUDA graphs or eager ----------------------------------------------------

    def _capture_graphs(self, config: EngineConfig) -> DecodeGraphs | None:
        """Capture the decode graphs at start-up (CUDA, a graph-safe backend, not eager).

        With a graph-safe backend on CUDA the decode split count is a function of the
        padded batch size whether or not graphs are on (``_decode_splits``), so eager and
        replayed decode steps compute the same attention sums."""
        backend = getattr(self.model, "backend", None)
        if backend is not None:  # before capture too: graphs keep the launches they see
            backend.fold_rope = rope_folds_into_attention(config)
            backend.exact_decode = config.exact_decode_attention
        self._graph_sizes: list[int] = []
        self.dependent_launch = False
        self.tuning_seconds = 0.0  # the decode-GEMM tuners' share of the start-up
        if self.device.type != "cuda" or not getattr(backend, "graph_safe", False):
            return None
        self._graph_sizes = capture_sizes(
            min(config.max_num_seqs, config.cuda_graph_max_batch_size)
        )
        if config.enforce_eager:
            log.info("CUDA graphs off (enforce_eager): decode steps run eagerly")
            return None
        spec = config.speculative
        widths = query_widths(spec.num_speculative_tokens) if spec.enabled else [1]
        # before tuning and capture: both keep the launches they see
        self.dependent_launch = config.pdl and self._gpu_takes_dependent_launch()
        if config.decode_gemm == "auto":  # before capture: the graphs keep the chosen kernels
            tuning_started = time.perf_counter()
            rows = {size * width for size in self._graph_sizes for width in widths}
            cache = TuningCache(config.tuning_cache) if config.tuning_cache else None
            tune_decode_gemms(
                self.model,
                sorted(r for r in rows if r <= SKINNY_MAX_ROWS),
                pdl=self.dependent_launch,
                cache=cache,
            )
            if config.tune_in_graph and 1 in self._graph_sizes:
                tune_one_row_in_graph(
                    self.model,
                    self.one_row_graph_seconds,
                    pdl=self.dependent_launch,
                    cache=cache,
                    screen_seconds=self.one_row_screen_seconds,
                    sustained_seconds=self.one_row_sustained_seconds,
                )
            self.tuning_seconds = time.perf_counter() - tuning_started
            log.info("decode GEMMs tuned in %.1f s", self.tuning_seconds)
        graphs = self.decode_graphs(self._graph_sizes, widths, head=True)
        graphs.capture()
        return graphs

    def _capture_prefill_graphs(self, config: EngineConfig) -> PrefillGraphs | None:
        """Capture the prefill graphs (``config.prefill_graph_tokens`` tokens over up to
        ``config.prefill_graph_seqs`` sequences) where the decode graphs were captured,
        with the launches the layers hold after them."""
        if config.prefill_graph_tokens < 0 or config.prefill_graph_tokens == 1:
            raise ValueError(
                f"prefill_graph_tokens must be 0 (off) or >= 2, got {config.prefill_graph_tokens}"
            )
        if config.prefill_graph_seqs < 0:
            raise ValueError(f"prefill_graph_seqs must be >= 0, got {config.prefill_graph_seqs}")
        if self.graphs is None or not config.prefill_graph_tokens:
            return None
        most = min(config.prefill_graph_tokens, config.max_num_batched_tokens, self.max_model_len)
        if most < 2:  # a step budget of one token: every step is a decode step's size
            return None
        from jacana_engine.kernels._common import num_sms  # CUDA only: Triton is there
        from jacana_engine.kernels.prefill_attention import prefill_block_m

        cfg = self.model.config
        n_heads, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        sms = num_sms(self.device)
        graphs = PrefillGraphs(
            self._graph_forward,
            buckets=prefill_buckets(most),
            max_seqs=min(config.prefill_graph_seqs or config.max_num_seqs, config.max_num_seqs),
            block_size=self.block_size,
            max_blocks=-(-self.max_model_len // self.block_size),
            max_model_len=self.max_model_len,
            block_m=lambda tokens: prefill_block_m(1, tokens, n_heads, n_kv, cfg.head_dim, sms),
            group=n_heads // n_kv,
            device=self.device,
        )
        graphs.capture()
        return graphs

    def decode_graphs(
        self, sizes: Seq[int], widths: Seq[int] = (1,), head: bool = False
    ) -> DecodeGraphs:
        """A set of decode graphs over this runner's model and KV caches for padded batch
        ``sizes`` and query ``widths``, not yet captured: the start-up set (``head``: the
        plain-decode graphs end with the lm_head and the greedy argmax), or (for a
        benchmark, or timing a launch config at start-up) the forward alone."""
        return DecodeGraphs(
            self._graph_forward,
            sizes=sizes,
            query_widths=widths,
            block_size=self.block_size,
            max_blocks=-(-self.max_model_len // self.block_size),
            max_model_len=self.max_model_len,
            num_splits=self._decode_splits,
            device=self.device,
            head=self._graph_head if head else None,
        )

    def _gpu_takes_dependent_launch(self) -> bool:
        """Whether the GPU has programmatic dependent launch (compute capability 9.0,
        Hopper, and later), Triton can emit it and the model can use it."""
        from jacana_engine.kernels._pdl import triton_has_dependent_launch

        major, _ = torch.cuda.get_device_capability(self.device)
        if major < 9 or not hasattr(self.model, "use_dependent_launch"):
            log.info("programmatic dependent launch needs compute capability 9.0: off")
            return False
        if not triton_has_dependent_launch():
            log.info("programmatic dependent launch needs a newer Triton: off")
            return False
        return True

    def _graph_forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden]
        """The forward that decode graphs capture. With ``pdl``, the Triton kernels of steps
        of at most ``PDL_MAX_TOKENS`` tokens launch dependently (kernels/_pdl.py); the
        graph keeps them so, and every other step launches plainly."""
        if not self.dependent_launch:
            return self._run_model(input_ids, positions, meta)
        self.model.use_dependent_launch(input_ids.shape[0] <= PDL_MAX_TOKENS)
        try:
            return self._run_model(input_ids, positions, meta)
        finally:
            self.model.use_dependent_launch(False)

    def _graph_head(self, hidden: torch.Tensor, copies) -> tuple[torch.Tensor, torch.Tensor]:
        """What a plain-decode graph runs after the forward: the logits [B, vocab] in the
        model dtype and their greedy argmax [B] (``kernels/argmax.py``, which reads them
        as they are: no float32 copy), the argmax launched dependently where the
        forward's kernels are, so it launches while the lm_head GEMV runs, and writing
        the tokens to ``copies`` (``TokenCopies``) too."""
        from jacana_engine.kernels.argmax import argmax_rows  # Triton: CUDA builds only

        logits = self.model.logits_in_model_dtype(hidden)
        pdl = self.dependent_launch and hidden.shape[0] <= PDL_MAX_TOKENS
        return logits, argmax_rows(logits, pdl=pdl, copies=copies)

    def one_row_screen_seconds(self, context: int = TUNING_CONTEXT) -> float:
        """``one_row_graph_seconds`` from one run of ``SCREEN_REPLAYS`` replays: the
        in-graph search's quick screen (~0.08 s a choice against ~0.3 s in full at
        Qwen3-8B, ~100 choices)."""
        return self.one_row_graph_seconds(context, replays=SCREEN_REPLAYS, reps=1)

    def one_row_sustained_seconds(self, context: int = TUNING_CONTEXT) -> float:
        """``one_row_graph_seconds`` once the card has run the graph back to back for
        ``SUSTAIN_SECONDS`` (its power and clock settled): the in-graph search's last
        word between its best and that best's lean twin."""
        return self.one_row_graph_seconds(context, sustain_s=SUSTAIN_SECONDS)

    def one_row_graph_seconds(
        self,
        context: int = TUNING_CONTEXT,
        replays: int = 20,
        reps: int = 3,
        head: bool = True,
        sustain_s: float = 0.0,
    ) -> float:
        """GPU seconds of one replay of a batch-1 decode graph captured now with the
        launch configs the layers hold now, over a ``context``-token context (at most
        ``max_model_len``, and at most the KV pool, whose first blocks it attends; median
        of ``reps`` runs of ``replays``; with ``sustain_s``, its pace after that many
        seconds back to back). ``head``: the lm_head and argmax in it, as serving
        captures it; off, the forward alone (the layers' launches only)."""
        pool_tokens = self.num_blocks * self.block_size
        graphs = self.decode_graphs([1], head=head)
        graphs.capture()
        return graphs.replay_seconds(
            1, min(context, self.max_model_len, pool_tokens), replays, reps, sustain_s
        )

    def _decode_splits(self, padded_batch: int) -> int:
        from jacana_engine.kernels.decode_attention import choose_num_splits

        n_kv = self.model.config.num_key_value_heads
        return choose_num_splits(padded_batch, n_kv, self.max_model_len, self.device)

    def _run_model(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:  # [T, hidden]
        return self.model.forward(input_ids, positions, self.kv_caches, meta)

    def _forward(self, batch: Batch, token_patch=None) -> torch.Tensor:  # [T, hidden]
        """Run a step eagerly (steps that a captured graph holds never get here).

        Eager decode batches that a graph could hold use the graph's split count, so
        graphs on and off compute the same attention sums. ``token_patch`` edits the
        input ids on the device (``DecodeGraphs.run``)."""
        meta, num_tokens = batch.meta, batch.input_ids.shape[0]
        input_ids, positions = batch.input_ids, batch.positions
        if num_tokens == meta.num_seqs and self._graph_sizes:
            size = padded_size(self._graph_sizes, num_tokens)
            if size is not None:
                meta = dataclasses.replace(meta, decode_num_splits=self._decode_splits(size))
        elif self.row_buckets:  # prompt (or draft) tokens: GEMM rows of a warmed count
            rows = padded_rows(num_tokens, self.row_buckets)
            input_ids, positions, meta = pad_rows(input_ids, positions, meta, rows)
        # Inputs from pageable memory: at a step's start the GPU has nothing queued to
        # wait for, and a pinned copy of each costs the host more (on an H200's host,
        # profiled: 325 against 137 µs for the six), on the step's critical path.
        non_blocking = self.device.type == "cuda"
        input_ids = input_ids.to(self.device, non_blocking=non_blocking)
        if token_patch is not None:
            token_patch(input_ids)
        hidden = self._run_model(
            input_ids, positions.to(self.device, non_blocking=non_blocking), meta.to(self.device)
        )
        return hidden[:num_tokens]  # padding rows dropped

    def warm_row_buckets(self) -> float:
        """Meet every GEMM shape a padded eager step runs (``row_buckets.warm_row_buckets``);
        the wall seconds (0 without buckets)."""
        if not self.row_buckets:
            return 0.0
        return warm_row_buckets(self.model, self.row_buckets, self._logits_rows)

    def _sample(self, logits: torch.Tensor, sampling: list) -> StepOutput:
        """``_sample_rows``, its tokens and logprobs read on the host."""
        ids, found = self._sample_rows(logits, sampling)
        return StepOutput(ids.tolist(), logprobs_by_row(found, len(sampling)))

    def _sample_rows(
        self,
        logits: torch.Tensor,
        sampling: list,
        steps: list[int] | None = None,
        pending: PendingTokens | None = None,
    ) -> tuple[torch.Tensor, list[RowLogprobs]]:
        """Sample each row on the CUDA fast path (``device_sampling``) when its own
        parameters are plain, else with the full sampler (processors, seeded generators):
        the token ids [N] on the device and the logprobs of the rows that ask for them, not
        yet read (nothing here waits for the device). ``steps``: each row's output position
        (``_sample_on_device``); ``pending``: the rows' tokens still in flight, which the
        processors count (an overlapped step).

        The path is chosen per row, from that row's parameters alone, so what a seeded
        request samples never depends on what else shares the batch. Logprobs play no
        part in the choice (both paths read them from the raw logits), so asking for
        them never changes the tokens."""
        generators = [seq.generator for seq in sampling]
        fast = [i for i, seq in enumerate(sampling) if self._on_device(seq.sampling_params)]
        if not fast:
            out = self.sampler.forward(logits, sampling, generators, pending)
            return out.token_ids, [out.found] if out.found is not None else []
        n = len(sampling)
        fast_rows = index_on(fast, logits.device) if len(fast) < n else None
        fast_logits = logits if fast_rows is None else logits[fast_rows]  # [F, V]
        fast_steps = [steps[i] for i in fast] if steps is not None else None
        fast_ids, found = self._sample_fast(fast_logits, [sampling[i] for i in fast], fast_steps)
        parts = [found.moved_to(fast)] if found is not None else []
        if len(fast) == n:
            return fast_ids, parts
        fast_set = set(fast)
        slow = [i for i in range(n) if i not in fast_set]
        slow_rows = index_on(slow, logits.device)
        out = self.sampler.forward(
            logits[slow_rows],
            [sampling[i] for i in slow],
            [generators[i] for i in slow],
            pending.select(slow) if pending is not None else None,
        )
        token_ids = torch.empty(n, dtype=torch.int64, device=logits.device)
        token_ids[fast_rows] = fast_ids
        token_ids[slow_rows] = out.token_ids
        if out.found is not None:
            parts.append(out.found.moved_to(slow))
        return token_ids, parts

    def _sample_fast(
        self, logits: torch.Tensor, sampling: list, steps: list[int] | None = None
    ) -> tuple[torch.Tensor, RowLogprobs | None]:
        """Rows that all sample on the CUDA fast path (``_sample_on_device``): their token
        ids [N] on the device, and the logprobs of those that ask for them, computed on the
        device from the raw logits (a copy taken before the kernel), not yet read."""
        params = [seq.sampling_params for seq in sampling]
        # the kernel edits the logits in place unless every row is greedy (an argmax)
        taken = RawLogprobs.take(logits, params, copy=not all(p.greedy for p in params))
        ids = self._sample_on_device(logits, sampling, steps)
        return ids, taken.read(ids) if taken is not None else None

    def _on_device(self, params) -> bool:
        """Whether a row with ``params`` samples in the CUDA kernel (logprobs do not count:
        they never change what is sampled)."""
        return self.device_sampler is not None and not params.edits_logits

    def _sample_on_device(
        self, logits: torch.Tensor, sampling: list, steps: list[int] | None = None
    ) -> torch.Tensor:
        """The CUDA fast path for rows that are all plain: token ids [N] on the device.
        ``steps``: the output position each row samples (default: after its output so
        far; an overlapped step's rows are one further, see ``launch_decode``)."""
        return self.device_sampler.sample(
            logits,
            [seq.sampling_params for seq in sampling],
            [seq.generator for seq in sampling],
            steps if steps is not None else [seq.num_output_tokens for seq in sampling],
        )

    def _prompt_logprobs(
        self, hidden: torch.Tensor, scheduled: Seq[ScheduledSequence], query_start: list[int]
    ) -> None:
        """Append the logprobs of the prompt tokens this step's logits predict.

        The logits at position p predict token p + 1, so a chunk ``[start, end)`` covers
        prompt tokens ``start + 1 .. end`` (the prompt's own, not the first sampled one).
        Positions already collected (a chunk recomputed after a preemption) are skipped.
        """
        rows: list[int] = []  # rows of ``hidden`` [T, hidden]
        targets: list[int] = []
        owners: list[tuple[list[TokenLogprob], int]] = []  # (destination, num_top) per row
        for i, s in enumerate(scheduled):
            seq = s.seq
            num_top = seq.sampling_params.prompt_logprobs
            if num_top is None:
                continue
            collected = seq.prompt_logprobs
            if not collected:  # nothing predicts the first token
                collected.append(TokenLogprob(seq.prompt_token_ids[0], None))
            first = max(len(collected), s.start + 1)
            last = min(s.start + s.num_new_tokens, seq.num_prompt_tokens - 1)
            if first > last:
                continue
            if first != len(collected):  # positions never computed here (a cache hit)
                log.error(
                    "%s: prompt logprobs lack positions %d..%d",
                    seq.request_id,
                    len(collected),
                    first - 1,
                )
                collected.extend(
                    TokenLogprob(t, None) for t in seq.prompt_token_ids[len(collected) : first]
                )
            for target in range(first, last + 1):
                rows.append(query_start[i] + target - 1 - s.start)
                targets.append(seq.prompt_token_ids[target])
                owners.append((collected, num_top))
        for lo in range(0, len(rows), PROMPT_LOGPROB_ROWS):
            hi = lo + PROMPT_LOGPROB_ROWS
            index = torch.tensor(rows[lo:hi], dtype=torch.int64).to(self.device)
            logits = self.model.compute_logits(hidden[index])  # [R, vocab]
            ids = torch.tensor(targets[lo:hi], dtype=torch.int64).to(self.device)
            found = token_logprobs(logits, ids, [k for _, k in owners[lo:hi]])
            for (collected, _), entry in zip(owners[lo:hi], found, strict=True):
                collected.append(entry)
