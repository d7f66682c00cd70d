"""Turns a scheduler plan into one forward pass: batch tensors, model, logits, sampling.

State ownership: the runner owns the model and the KV cache tensors (on the model's
device, one ``[2, num_blocks, block_size, n_kv_heads, head_dim]`` tensor per layer, in the
model dtype), the captured decode and prefill graphs, and the decode-GEMM picks it tunes
at start-up. Batch tensors are built on the host (``worker/batch.py``, pure), moved to the
device once per step, and dropped after the step. Block ids come from the sequences'
block tables (host state owned by the block manager).

Sampling: each sequence's last scheduled token's logits go to ``StepSampler``
(``worker/step_sampling.py``: the CUDA fast path or the full sampler, per row); prompt
logprobs are collected by ``worker/prompt_logprobs.py``.
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
from jacana_engine.sample.sampler import (
    RawLogprobs,
    Sampler,
    logprobs_by_row,
)
from jacana_engine.tuning.cache import TuningCache
from jacana_engine.tuning.decode_gemm import (
    SKINNY_MAX_ROWS,
    tune_decode_gemms,
)
from jacana_engine.tuning.graph_picks import tune_one_row_in_graph
from jacana_engine.worker.attention_metadata import AttentionMetadata
from jacana_engine.worker.batch import Batch, build_batch
from jacana_engine.worker.decode_graphs import (
    DecodeGraphs,
    capture_sizes,
    padded_size,
    query_widths,
)
from jacana_engine.worker.decode_overlap import LaunchedStep
from jacana_engine.worker.host_to_device import index_on
from jacana_engine.worker.prefill_graphs import PrefillGraphs, prefill_buckets
from jacana_engine.worker.prompt_logprobs import collect_prompt_logprobs
from jacana_engine.worker.row_buckets import pad_rows, padded_rows, row_buckets, warm_row_buckets
from jacana_engine.worker.step_sampling import StepSampler

log = logging.getLogger(__name__)

# Decode graphs of at most this many tokens launch their Triton kernels dependently (with
# ``EngineConfig.pdl``): the rows the skinny GEMMs serve. On an H200 dependent launches save
# ~0.27 ms of Qwen3-8B's one-row decode graph and cost ~0.15 ms of its 64-row one, whose
# GEMMs are cuBLAS's.
PDL_MAX_TOKENS = SKINNY_MAX_ROWS
# KV tokens each sequence of a start-up timing graph attends (a mid-length decode step)
TUNING_CONTEXT = 320
SCREEN_REPLAYS = 5  # replays that screen a one-row choice in the in-graph search
# seconds of back-to-back replays that time a batch-1 graph under sustained load: an H200
# reaches its power cap within ~0.5 s of batch-1 decode (tuning/graph_picks.py)
SUSTAIN_SECONDS = 1.2


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
        device_sampler = DeviceSampler(cfg.vocab_size) if self.device.type == "cuda" else None
        self.sampling = StepSampler(sampler, device_sampler)
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
        collect_prompt_logprobs(self.model, hidden, scheduled, query_start)
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
        ids, found = self.sampling.rows(logits, sampling)
        out = StepOutput(ids.tolist(), logprobs_by_row(found, len(sampling)))
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
        ids, found = self.sampling.rows(logits, sampling, steps, in_flight)
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
