"""gRPC front of the engine: proto messages in, :class:`AsyncEngine` calls, deltas out.

Owns no model state: tokenization and chat-template rendering happen here (on a worker
thread, so a 200k-character prompt does not stall the event loop); everything else is
the engine's. A cancelled ``Generate`` call (client gone, deadline passed) closes the
output iterator, which aborts the request inside the engine and frees its KV blocks.
``n`` > 1 runs as ``n`` engine requests (:mod:`jacana_engine.core.choices`) on one call; the
servicer remembers each call's ``n`` so ``Abort`` reaches every choice. ``Embed`` runs
each input as a prefill-only engine request (:mod:`jacana_engine.pooling.requests`) and
packs the pooled vectors as little-endian float32. With :class:`EngineMetrics`, each
``Generate`` call's latency is observed for Prometheus (the counters and gauges come
from the engine's stats, :mod:`jacana_engine.entrypoints.metrics`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid

import grpc

from jacana_common.errors import grpc_details
from jacana_common.metrics import RequestTimer
from jacana_common.pb.jacana.engine.v1 import engine_pb2, engine_pb2_grpc
from jacana_engine.core.choices import choice_request_id, generate_choices
from jacana_engine.core.errors import InvalidRequestError
from jacana_engine.core.outputs import FinishReason
from jacana_engine.entrypoints.logprob_messages import TokenBytes, to_pb
from jacana_engine.entrypoints.metrics import EngineMetrics
from jacana_engine.pooling.inputs import EmbedInput, prepare_texts, prepare_token_ids
from jacana_engine.pooling.requests import MAX_EMBED_INPUTS
from jacana_engine.sample.params import SamplingParams
from jacana_engine.sample.structured_output import Guide

log = logging.getLogger(__name__)

_FINISH_TO_PB = {
    None: engine_pb2.FINISH_REASON_UNSPECIFIED,
    FinishReason.STOP: engine_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: engine_pb2.FINISH_REASON_LENGTH,
    FinishReason.ABORT: engine_pb2.FINISH_REASON_ABORT,
}


def sampling_from_pb(pb: engine_pb2.SamplingParams) -> SamplingParams:
    """Proto sampling fields -> engine SamplingParams (proto zeros mean 'unset')."""
    return SamplingParams(
        temperature=pb.temperature,
        top_p=pb.top_p if pb.top_p > 0 else 1.0,
        top_k=pb.top_k,
        min_p=pb.min_p,
        seed=pb.seed if pb.HasField("seed") else None,
        max_tokens=pb.max_tokens or None,
        stop=tuple(pb.stop),
        stop_token_ids=tuple(pb.stop_token_ids),
        ignore_eos=pb.ignore_eos,
        presence_penalty=pb.presence_penalty,
        frequency_penalty=pb.frequency_penalty,
        repetition_penalty=pb.repetition_penalty or 1.0,
        logit_bias=dict(pb.logit_bias),
        min_tokens=pb.min_tokens,
        logprobs=pb.logprobs if pb.HasField("logprobs") else None,
        prompt_logprobs=pb.prompt_logprobs if pb.HasField("prompt_logprobs") else None,
        guide=guide_from_pb(pb.guide) if pb.HasField("guide") else None,
    )


def guide_from_pb(pb: engine_pb2.Guide) -> Guide:
    """Proto guide -> engine Guide (a kind left unset is an error naming its param)."""
    param = pb.param or "guide"
    kind = pb.WhichOneof("kind")
    if kind is None:
        raise InvalidRequestError("the guide names no kind", param)
    value = "" if kind == "json_object" else getattr(pb, kind)
    return Guide(kind, value, param)


class EngineServicer(engine_pb2_grpc.EngineServicer):
    """Implements ``jacana.engine.v1.Engine`` over one :class:`AsyncEngine`."""

    def __init__(self, engine, metrics: EngineMetrics | None = None) -> None:
        # engine: jacana_engine.core.async_engine.AsyncEngine
        self.engine = engine
        self.metrics = metrics
        self.tokenizer = engine.tokenizer
        self.info = engine.model_info
        self.token_bytes = TokenBytes(self.tokenizer)
        self._num_choices: dict[str, int] = {}  # request id -> n, while its call runs
        self.max_request_tokens = engine.engine.max_request_tokens

    def _prompt_token_ids(self, request: engine_pb2.GenerateRequest) -> list[int]:
        """Tokenize whichever input the request carries; raises InvalidRequestError."""
        kind = request.WhichOneof("input")
        if kind == "prompt_token_ids":
            ids = list(request.prompt_token_ids.ids)
            vocab = self.info.vocab_size
            if any(i >= vocab for i in ids):
                raise InvalidRequestError(f"token ids must be < vocab size {vocab}", "prompt")
            return ids
        if self.tokenizer is None:
            raise InvalidRequestError(
                "this model has no tokenizer: send prompt_token_ids", "prompt"
            )
        if kind == "prompt":
            return self.tokenizer.encode(request.prompt)
        if kind == "chat":
            from jacana_engine.text.chat_template import (
                apply_chat_template,
                chat_messages,
                chat_tools,
                check_tool_calls_render,
            )

            tools = chat_tools(request.chat.tools, self.tokenizer)
            messages = chat_messages(request.chat.messages)
            check_tool_calls_render(messages, self.tokenizer)
            text = apply_chat_template(
                self.tokenizer,
                messages,
                add_generation_prompt=request.chat.add_generation_prompt,
                **({"tools": tools} if tools is not None else {}),
            )
            return self.tokenizer.encode(text, add_special_tokens=False)
        raise InvalidRequestError("request has no input (prompt, chat or token ids)", "prompt")

    def _clamped(self, sampling: SamplingParams, prompt_len: int) -> SamplingParams:
        """Lower max_tokens to what the engine leaves after the prompt (the context window,
        or the KV pool when that is smaller). A prompt that leaves nothing is passed on
        unchanged, for the engine to reject with the limit in its message."""
        room = self.max_request_tokens - prompt_len
        if room < 1:
            return sampling
        limit = room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        return dataclasses.replace(sampling, max_tokens=limit)

    async def Generate(self, request, context):
        request_id = request.request_id or uuid.uuid4().hex
        n = max(request.sampling.n, 1)
        registered = False
        timer = None
        if self.metrics is not None:
            timer = RequestTimer(self.metrics.latency, (self.metrics.model,))
        try:
            if request_id in self._num_choices:
                raise InvalidRequestError(f"request id {request_id!r} is in use", "request_id")
            prompt_ids = await asyncio.to_thread(self._prompt_token_ids, request)
            sampling = sampling_from_pb(request.sampling)
            if request.sampling.clamp_max_tokens:
                sampling = self._clamped(sampling, len(prompt_ids))
            echo = None
            if request.sampling.echo and self.tokenizer is not None:
                echo = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
            self._num_choices[request_id] = n
            registered = True
            started: set[int] = set()
            async for index, out in generate_choices(
                self.engine,
                request_id,
                prompt_ids,
                sampling,
                n,
                priority=request.priority,
                cache_salt=request.cache_salt or None,
                speculative=not request.disable_speculation,
            ):
                msg = self._message(index, out)
                if timer is not None:
                    timer.tokens(index, len(msg.token_ids))
                if index not in started:
                    started.add(index)
                    if echo is not None:
                        msg.prompt_text = echo
                yield msg
            if timer is not None:
                timer.finish()
        except InvalidRequestError as exc:
            # a chat's prompt is its messages (what the client sent)
            chat = request.WhichOneof("input") == "chat"
            param = "messages" if chat and exc.param == "prompt" else exc.param
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, grpc_details(exc.message, param, exc.code)
            )
        finally:
            if registered:
                del self._num_choices[request_id]

    def _message(self, index: int, out) -> engine_pb2.GenerateResponse:
        """One engine output (of choice ``index``) as a stream message."""
        msg = engine_pb2.GenerateResponse(
            token_ids=out.new_token_ids,
            text=out.new_text,
            finish_reason=_FINISH_TO_PB[out.finish_reason],
            index=index,
        )
        if out.logprobs:
            msg.logprobs.extend(to_pb(out.logprobs, self.token_bytes))
        if out.prompt_logprobs:
            msg.prompt_logprobs.extend(to_pb(out.prompt_logprobs, self.token_bytes))
        if out.finished:
            msg.usage.CopyFrom(
                engine_pb2.Usage(
                    prompt_tokens=out.num_prompt_tokens,
                    completion_tokens=out.num_output_tokens,
                    cached_prompt_tokens=out.num_cached_tokens,
                )
            )
            if out.matched_stop is not None:
                msg.matched_stop = str(out.matched_stop)
        return msg

    async def Embed(self, request, context):
        request_id = request.request_id or uuid.uuid4().hex
        try:
            if self.info.pooling is None:
                raise InvalidRequestError(
                    f"The model '{self.info.model_id}' does not support embeddings.", "model"
                )
            dim = self.info.hidden_size
            if request.HasField("dimensions") and request.dimensions != dim:
                raise InvalidRequestError(
                    f"The model '{self.info.model_id}' does not support 'dimensions' other "
                    f"than its own {dim} (it was not trained for Matryoshka truncation).",
                    "dimensions",
                )
            inputs = await asyncio.to_thread(self._embed_inputs, request)
            outputs = await self.engine.embed(
                request_id, [x.ids for x in inputs], priority=request.priority
            )
        except InvalidRequestError as exc:
            code = (
                grpc.StatusCode.FAILED_PRECONDITION
                if exc.param == "model"
                else grpc.StatusCode.INVALID_ARGUMENT
            )
            await context.abort(code, grpc_details(exc.message, exc.param, exc.code))
        num_tokens = sum(len(x.ids) for x in inputs)
        return engine_pb2.EmbedResponse(
            embeddings=[
                engine_pb2.PackedEmbedding(
                    packed=out.embedding.numpy().astype("<f4").tobytes(),
                    num_tokens=len(x.ids),
                    truncated=x.truncated,
                )
                for x, out in zip(inputs, outputs, strict=True)
            ],
            dimension=dim,
            usage=engine_pb2.EmbedUsage(prompt_tokens=num_tokens, total_tokens=num_tokens),
        )

    def _embed_inputs(self, request: engine_pb2.EmbedRequest) -> list[EmbedInput]:
        """The request's inputs as token ids (worker thread); raises InvalidRequestError."""
        kind = request.WhichOneof("input")
        if kind == "texts":
            return prepare_texts(
                list(request.texts.texts),
                self.tokenizer,
                self.max_request_tokens,
                truncate=request.truncate,
            )
        if kind == "token_ids":
            return prepare_token_ids(
                [list(t.ids) for t in request.token_ids.inputs],
                self.info.vocab_size,
                self.max_request_tokens,
                truncate=request.truncate,
            )
        raise InvalidRequestError("request has no input (texts or token ids)", "input")

    async def Abort(self, request, context):
        n = self._num_choices.get(request.request_id, 1)
        found = False
        for i in range(n):
            rid = choice_request_id(request.request_id, i, n)
            found = await self.engine.abort(rid) or found
        return engine_pb2.AbortResponse(found=found)

    async def GetModelInfo(self, request, context):
        i = self.info
        info = engine_pb2.ModelInfo(
            model_id=i.model_id,
            architecture=i.architecture,
            max_model_len=i.max_model_len,
            vocab_size=i.vocab_size,
            dtype=i.dtype,
            has_chat_template=i.has_chat_template,
            device=i.device,
            eos_token_id=i.eos_token_id or 0,
        )
        if i.pooling is not None:
            info.embedding.CopyFrom(
                engine_pb2.EmbeddingInfo(
                    pooling=i.pooling.method,
                    normalized=i.pooling.normalize,
                    dimension=i.hidden_size,
                    max_input_tokens=self.max_request_tokens,
                    max_inputs_per_request=MAX_EMBED_INPUTS,
                )
            )
        return info

    async def GetStats(self, request, context):
        s = self.engine.stats()
        now = time.monotonic()  # rates are evaluated now, not when the snapshot was taken
        return engine_pb2.EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_total=s.kv_blocks_total,
            kv_blocks_free=s.kv_blocks_free,
            prompt_tokens_total=s.prompt_tokens_total,
            generation_tokens_total=s.generation_tokens_total,
            requests_finished_total=s.requests_finished_total,
            steps_total=s.steps_total,
            overlapped_steps_total=s.overlapped_steps_total,
            preemptions_total=s.preemptions_total,
            kv_blocks_used=s.kv_blocks_used,
            kv_blocks_cached=s.kv_blocks_cached,
            prefix_cache_queries_total=s.prefix_cache_queries_total,
            prefix_cache_hits_total=s.prefix_cache_hits_total,
            prefix_cache_hit_rate=s.prefix_cache_hit_rate,
            prompt_tokens_per_s=s.prompt_tokens_per_s(now),
            generation_tokens_per_s=s.generation_tokens_per_s(now),
            speculative=[
                engine_pb2.SpeculativeStats(
                    proposer=name,
                    proposals=p.proposals,
                    draft_tokens=p.draft_tokens,
                    accepted_tokens=p.accepted_tokens,
                    acceptance_rate=p.acceptance_rate,
                    mean_accepted_length=p.mean_accepted_length,
                )
                for name, p in sorted(s.speculative.items())
            ],
        )
