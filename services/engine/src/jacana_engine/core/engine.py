"""The synchronous engine core: requests in, one scheduled forward pass per ``step()``.

State ownership: ``LLMEngine`` owns the tokenizer (host), the scheduler and block
manager (host bookkeeping), the model runner (model weights and KV cache on
``config.device``) and the running counters behind :meth:`stats`. It is not thread-safe:
one thread drives it (``AsyncEngine`` runs it on a dedicated thread).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence as Seq
from typing import Literal

from jacana_engine.config import EngineConfig
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.model_info import ModelInfo
from jacana_engine.core.outputs import FinishReason, RequestOutput, TokenLogprob
from jacana_engine.core.request_checks import check_token_ids, resolve_max_tokens
from jacana_engine.core.scheduler import Scheduler
from jacana_engine.core.sequence import Sequence, SequenceStatus
from jacana_engine.core.stats import EngineStats, ThroughputMeter
from jacana_engine.core.stop_rules import apply_token
from jacana_engine.kv_cache.block_manager import BlockManager
from jacana_engine.models.base import CausalLM
from jacana_engine.pooling.requests import (
    EmbeddingOutput,
    embedding_outputs,
    embedding_sequence,
    finished_embeddings,
)
from jacana_engine.pooling.spec import resolve_pooling
from jacana_engine.sample.logits_processors import LogitsProcessors
from jacana_engine.sample.params import SamplingParams
from jacana_engine.sample.sampler import RequestRng, Sampler
from jacana_engine.sample.structured_output import GuideCompiler
from jacana_engine.spec.speculator import Speculator
from jacana_engine.text.detokenizer import Detokenizer
from jacana_engine.text.tokenizer import Tokenizer
from jacana_engine.worker.decode_overlap import LaunchedStep, overlappable, plan_followup
from jacana_engine.worker.model_runner import ModelRunner

log = logging.getLogger(__name__)


class LLMEngine:
    """Continuous-batching engine over one model.

    ``model`` / ``tokenizer`` may be passed in (tests, benchmarks); by default
    (``tokenizer="auto"``) both are loaded from ``config.model``. ``tokenizer=None`` runs on
    token ids only (no text, no stop strings); dummy weights without tokenizer files get
    that automatically. Raises ``ValueError`` for a configuration that cannot run.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        model: CausalLM | None = None,
        tokenizer: Tokenizer | Literal["auto"] | None = "auto",
    ) -> None:
        self.config = config
        if model is None:
            from jacana_engine.loader import load_model

            model = load_model(config)
        self.model = model
        self.tokenizer = _load_tokenizer(config) if isinstance(tokenizer, str) else tokenizer
        cfg = model.config
        self.vocab_size = cfg.vocab_size
        self.max_model_len = config.max_model_len or cfg.max_position_embeddings
        if not 1 < self.max_model_len <= cfg.max_position_embeddings:
            raise ValueError(
                f"max_model_len must be in [2, {cfg.max_position_embeddings}] (the model's "
                f"context), got {self.max_model_len}"
            )
        eos = set(cfg.eos_token_ids)
        if self.tokenizer is not None:
            eos |= set(self.tokenizer.eos_token_ids)
        self.eos_token_ids = frozenset(eos)
        self.pooling = resolve_pooling(config.model, config.pooling, config.embed_normalize)

        self.sampler = Sampler(processors=LogitsProcessors(self.vocab_size, self.eos_token_ids))
        self.guides = (
            GuideCompiler(self.tokenizer.backend, self.vocab_size, self.eos_token_ids)
            if self.tokenizer is not None
            else None
        )
        self.runner = ModelRunner(model, config, self.sampler, self.max_model_len)
        self.speculator = Speculator(config.speculative) if config.speculative.enabled else None
        self.runner.speculator = self.speculator
        self._reset_bookkeeping()
        pool = self.block_manager.num_total_slots
        if pool < self.max_model_len:
            log.warning(
                "the KV pool holds %d tokens, less than max_model_len %d: longer requests "
                "are rejected",
                pool,
                self.max_model_len,
            )

        main_eos = sorted(cfg.eos_token_ids) or sorted(self.eos_token_ids)
        self.model_info = ModelInfo(
            model_id=config.model_id,
            architecture=cfg.architecture,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            dtype=config.dtype,
            device=config.device,
            eos_token_ids=tuple(main_eos + sorted(self.eos_token_ids - set(main_eos))),
            has_chat_template=self.tokenizer is not None and bool(self.tokenizer.chat_template),
            pooling=self.pooling,
            hidden_size=cfg.hidden_size,
        )
        self.warm_up_seconds = 0.0
        if config.warm_up if config.warm_up is not None else self.runner.device.type == "cuda":
            self.warm_up()

    def _reset_bookkeeping(self) -> None:
        """Fresh host state: block pool (no cached prefix), scheduler, seed source and
        counters, as a newly built engine has (the weights and KV tensors stay)."""
        config = self.config
        self.block_manager = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            enable_prefix_caching=config.enable_prefix_caching,
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            priority_aging_s=config.priority_aging_s,
        )
        # Seeds for sampled requests that bring none: reproducible from ``config.seed``.
        self._request_rng = RequestRng(config.seed, Sampler.generator_device(config.device))
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._requests_finished_total = 0
        self._steps_total = 0
        # wall seconds of each part of the steps that ran (see EngineStats.step_seconds_total)
        self._step_seconds = {"schedule": 0.0, "execute": 0.0, "outputs": 0.0}
        self._generate_calls = 0
        self._throughput = ThroughputMeter()
        # The decode step launched but not read back yet (``decode_overlap.py``).
        self._in_flight: LaunchedStep | None = None
        self.overlapped_steps_total = 0  # steps launched before the previous one's tokens

    def warm_up(self) -> float:
        """Serve ``warm_up.WARM_UP_GROUPS`` so the kernel variants that only traffic
        reaches compile now, run the GEMMs of every eager row bucket
        (``ModelRunner.warm_row_buckets``), then reset the bookkeeping
        (``_reset_bookkeeping``); the speculator sits out (its gate would learn from dummy
        prompts; a remote drafter may not be up yet), but its proposer warms up on its own
        (``Proposer.warm_up``: a draft model's kernels). Needs an idle engine;
        returns (and keeps in ``warm_up_seconds``) the wall seconds it took."""
        from jacana_engine.worker.warm_up import WarmUpLimits, warm_up

        if self.has_unfinished_requests():  # the reset below would drop them
            raise RuntimeError("warm_up() needs an idle engine")
        limits = WarmUpLimits(
            vocab_size=self.vocab_size,
            max_num_seqs=self.config.max_num_seqs,
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_request_tokens=self.max_request_tokens,
        )
        speculator, self.speculator = self.speculator, None
        self.runner.speculator = None
        try:
            self.warm_up_seconds = warm_up(self.generate, limits)
            self.warm_up_seconds += self.runner.warm_row_buckets()
            if speculator is not None:  # a draft model of its own compiles too (remote: no-op)
                self.warm_up_seconds += speculator.proposer.warm_up()
        finally:
            self.speculator = self.runner.speculator = speculator
            self._reset_bookkeeping()
        log.info("warm-up served its requests in %.2fs", self.warm_up_seconds)
        return self.warm_up_seconds

    # ---- requests -----------------------------------------------------------------------

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        sampling_params: SamplingParams,
        *,
        priority: int = 0,
        cache_salt: str | None = None,
        speculative: bool = True,
    ) -> None:
        """Validate and queue a request; raises :class:`InvalidRequestError`.

        priority: lower is served first (FCFS among equals); waiting ages it, see
            :mod:`jacana_engine.core.scheduler`.
        cache_salt: the request shares cached prefix blocks only with requests that bring
            the same salt (None and "" are the same, shared, namespace).
        speculative: False opts this request out of speculative decoding.
        """
        prompt = list(prompt_token_ids)
        self._check_new_id(request_id)
        check_token_ids(
            prompt,
            self.vocab_size,
            param="prompt",
            empty="the prompt is empty",
            noun="prompt token ids",
        )
        sampling_params.validate(self.vocab_size)
        if sampling_params.stop and self.tokenizer is None:
            raise InvalidRequestError("stop strings need a tokenizer; this model has none", "stop")
        max_tokens = resolve_max_tokens(
            len(prompt), sampling_params.max_tokens, self.max_model_len, self.max_request_tokens
        )

        guide = None
        if sampling_params.guide is not None:
            if self.guides is None:
                raise InvalidRequestError(
                    "structured output needs a tokenizer; this model has none",
                    sampling_params.guide.param,
                )
            guide = self.guides.state(sampling_params.guide)
        generator = None
        if not sampling_params.greedy:
            generator = self._request_rng.generator(sampling_params.seed)
        detok = None
        if self.tokenizer is not None:
            detok = Detokenizer(self.tokenizer, sampling_params.stop)
        seq = Sequence(
            request_id,
            prompt,
            sampling_params,
            max_tokens=max_tokens,
            generator=generator,
            detokenizer=detok,
            priority=priority,
            cache_salt=cache_salt or None,
            speculative=speculative,
            guide=guide,
        )
        if sampling_params.prompt_logprobs is not None:
            # Every prompt position needs its logits: a unique salt keeps the prefix cache
            # from serving this prompt from another request's blocks.
            seq.cache_salt = f"{seq.cache_salt or ''}/prompt-logprobs/{uuid.uuid4().hex}"
        self.scheduler.add(seq)

    def add_embed_request(
        self, request_id: str, prompt_token_ids: Seq[int], *, priority: int = 0
    ) -> None:
        """Queue an embedding request (prefill only, pooled by ``self.pooling``); its one
        output is an :class:`EmbeddingOutput`. Raises :class:`InvalidRequestError`."""
        if self.pooling is None:
            raise InvalidRequestError(
                f"The model '{self.config.model_id}' does not support embeddings.", "model"
            )
        prompt = list(prompt_token_ids)
        self._check_new_id(request_id)
        check_token_ids(
            prompt, self.vocab_size, param="input", empty="an input is empty", noun="token ids"
        )
        if len(prompt) > self.max_request_tokens:
            raise InvalidRequestError(
                f"an input has {len(prompt)} tokens; this model embeds at most "
                f"{self.max_request_tokens}",
                "input",
            )
        self.scheduler.add(embedding_sequence(request_id, prompt, self.pooling, priority=priority))

    @property
    def max_request_tokens(self) -> int:
        """Most prompt + output tokens one request may have: the context window, or the
        KV pool when that is smaller (a request must fit the pool alone)."""
        return min(self.max_model_len, self.block_manager.num_total_slots)

    def _check_new_id(self, request_id: str) -> None:
        if self.scheduler.get(request_id) is not None:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", "request_id")

    def abort_request(self, request_id: str) -> bool:
        """Drop an unfinished request and free its blocks. False if it is not unfinished."""
        seq = self.scheduler.abort(request_id)
        if seq is None:
            return False
        self._requests_finished_total += 1
        return True

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished()

    # ---- the step -----------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Run one scheduled forward pass; one output per request that got a token.

        With ``overlap_decode`` a decode step may return before its tokens are known
        (an empty list) and deliver them with the next call (``decode_overlap.py``)."""
        if self._in_flight is not None:
            return self._step_overlapped()
        started = time.perf_counter()
        if self.speculator is not None:
            self.speculator.propose(self.scheduler.running)
        plan = self.scheduler.schedule()
        if plan.is_empty:
            return []
        scheduled_at = time.perf_counter()
        if self._may_overlap(plan.scheduled):
            self._in_flight = self.runner.launch_decode(plan.scheduled)
            self.scheduler.update(plan.scheduled)
            self._count_step(scheduled_at - started, time.perf_counter() - scheduled_at, 0.0)
            return []
        result = self.runner.execute(plan.scheduled)
        executed_at = time.perf_counter()
        self.scheduler.update(plan.scheduled)
        self._record_throughput(
            plan.scheduled, len(result.token_ids) + sum(len(v) for v in result.verified)
        )
        sampled = [s.seq for s in plan.scheduled if s.samples]
        outputs = [
            self._append_token(seq, tok, lp)
            for seq, tok, lp in zip(sampled, result.token_ids, result.logprobs, strict=True)
        ]
        if result.verified:
            outputs += self.speculator.commit(
                plan.scheduled, result.verified, self._append_token, self.block_manager.trim
            )
        if self.speculator is not None:
            self.speculator.observe(time.perf_counter() - started, plan.scheduled, result.verified)
        outputs += self._finish_embeddings(plan.scheduled)
        self._count_step(
            scheduled_at - started, executed_at - scheduled_at, time.perf_counter() - executed_at
        )
        return outputs

    def _may_run_ahead(self) -> bool:
        """Overlapping is on and no proposer needs the coming step's tokens first."""
        spec = self.speculator
        return self.config.overlap_decode and (spec is None or spec.drafting_paused())

    def _may_overlap(self, scheduled) -> bool:
        return self._may_run_ahead() and overlappable(scheduled)

    def _step_overlapped(self) -> list[RequestOutput]:
        """Launch the follow-up of the step in flight (when one may run ahead), then wait
        for the step in flight and hand out its tokens."""
        started = time.perf_counter()
        done = self._in_flight
        follow = None
        if self._may_run_ahead():
            follow = plan_followup(done, self.scheduler, self.block_manager)
        planned_at = time.perf_counter()
        self._in_flight = self.runner.launch_decode(follow, done) if follow else None
        self.overlapped_steps_total += bool(follow)
        launched_at = time.perf_counter()
        outputs = [
            self._append_token(s.seq, tok, lp)
            for s, tok, lp in zip(done.scheduled, done.token_ids(), done.logprobs(), strict=True)
            if s.seq.status is SequenceStatus.RUNNING  # not aborted, not stopped a step ago
        ]
        self._record_throughput(done.scheduled, len(outputs))
        if follow:
            self.scheduler.update(follow)  # skips those that just finished
        if self.speculator is not None:  # the gate counts (and times) every decode step
            self.speculator.observe(time.perf_counter() - started, done.scheduled, [])
            if any(o.finished for o in outputs):  # no proposal runs while steps overlap
                self.speculator.forget_finished()  # free the proposer's state of those
        self._count_step(
            planned_at - started,
            launched_at - planned_at,
            time.perf_counter() - launched_at,
            ran=bool(follow),
        )
        return outputs

    def _record_throughput(self, scheduled, generated: int) -> None:
        self._throughput.record(
            sum(
                max(0, min(s.start + s.num_new_tokens, s.seq.num_prompt_tokens) - s.start)
                for s in scheduled
            ),
            generated,
        )

    def _count_step(
        self, schedule_s: float, execute_s: float, outputs_s: float, ran: bool = True
    ) -> None:
        """Add a call's wall time to the step parts; ``ran``: it launched a forward pass."""
        self._steps_total += ran
        seconds = self._step_seconds
        seconds["schedule"] += schedule_s
        seconds["execute"] += execute_s
        seconds["outputs"] += outputs_s

    def _finish_embeddings(self, scheduled) -> list[EmbeddingOutput]:
        """Outputs of the embedding requests whose prompt this step completed."""
        done = finished_embeddings(scheduled)
        outputs = embedding_outputs(done)
        for seq in done:
            self._prompt_tokens_total += seq.num_prompt_tokens - seq.num_cached_tokens
            self.scheduler.finish(seq, FinishReason.STOP)
            self._requests_finished_total += 1
        return outputs

    def _append_token(
        self, seq: Sequence, token_id: int, logprob: TokenLogprob | None = None
    ) -> RequestOutput:
        """Add a sampled token to ``seq``, apply the stop rules, release finished text."""
        self._generation_tokens_total += 1
        first = seq.num_output_tokens == 0
        if first:  # the prompt is done: count what was computed of it, once
            self._prompt_tokens_total += seq.num_prompt_tokens - seq.num_cached_tokens
        out = apply_token(seq, token_id, logprob, self.eos_token_ids, first)
        if out.finished:
            self.scheduler.finish(seq, out.finish_reason)
            self._requests_finished_total += 1
        return out

    # ---- conveniences -------------------------------------------------------------------

    def generate(
        self,
        prompts: Seq[Seq[int]],
        sampling_params: SamplingParams | Seq[SamplingParams],
    ) -> list[list[int]]:
        """Run ``prompts`` to completion on an otherwise idle engine; output ids per prompt."""
        if self.has_unfinished_requests():
            raise RuntimeError("generate() needs an idle engine; drive step() instead")
        if isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params] * len(prompts)
        if len(sampling_params) != len(prompts):
            raise ValueError("one SamplingParams per prompt, or a single one for all")
        self._generate_calls += 1
        ids = [f"generate-{self._generate_calls}-{i}" for i in range(len(prompts))]
        results: dict[str, list[int]] = {rid: [] for rid in ids}
        try:
            for rid, prompt, sp in zip(ids, prompts, sampling_params, strict=True):
                self.add_request(rid, prompt, sp)
            while self.has_unfinished_requests():
                for out in self.step():
                    results[out.request_id].extend(out.new_token_ids)
        finally:
            for rid in ids:
                self.abort_request(rid)
        return [results[rid] for rid in ids]

    def embed(self, inputs: Seq[Seq[int]]) -> list:
        """Embed token id lists on an otherwise idle engine, all queued at once (so they
        batch together); one [hidden] float32 tensor per input."""
        if self.has_unfinished_requests():
            raise RuntimeError("embed() needs an idle engine; drive step() instead")
        self._generate_calls += 1
        ids = [f"embed-{self._generate_calls}-{i}" for i in range(len(inputs))]
        results = {}
        try:
            for rid, prompt in zip(ids, inputs, strict=True):
                self.add_embed_request(rid, prompt)
            while self.has_unfinished_requests():
                for out in self.step():
                    results[out.request_id] = out.embedding
        finally:
            for rid in ids:
                self.abort_request(rid)
        return [results[rid] for rid in ids]

    def stats(self) -> EngineStats:
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_blocks_total=self.block_manager.num_total_blocks,
            kv_blocks_free=self.block_manager.num_free_blocks,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            requests_finished_total=self._requests_finished_total,
            steps_total=self._steps_total,
            preemptions_total=self.scheduler.num_preemptions_total,
            kv_blocks_cached=self.block_manager.num_free_cached_blocks,
            prefix_cache_queries_total=self.block_manager.prefix_queries_total,
            prefix_cache_hits_total=self.block_manager.prefix_hits_total,
            recent=self._throughput.snapshot(),
            speculative=self.speculator.stats() if self.speculator is not None else {},
            step_seconds_total=dict(self._step_seconds),
            overlapped_steps_total=self.overlapped_steps_total,
        )


def _load_tokenizer(config: EngineConfig) -> Tokenizer | None:
    """The model's tokenizer; None for dummy weights that come without one."""
    try:
        return Tokenizer.from_path(config.model)
    except (OSError, ValueError, NotImplementedError) as exc:
        if config.load_format != "dummy":
            raise
        log.warning("no tokenizer at %s (%s): serving token ids only", config.model, exc)
        return None
