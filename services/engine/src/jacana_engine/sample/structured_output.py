"""Structured output: a request's output held to a grammar, token by token.

A :class:`Guide` (``SamplingParams.guide``) says what the output must match: a JSON schema,
any JSON object, a regular expression, one of a list of strings, a Lark grammar, or calls
of tools (a forced ``tool_choice``). The grammar library is
llguidance (the one behind vLLM's and SGLang's ``guidance`` backends): it compiles a guide
against the model's vocabulary and, at each step, says which token ids may come next.

- :class:`GuideCompiler` (one per engine, on the engine's tokenizer) checks a guide when
  its request is admitted and makes the request's :class:`GuideState`.
- :class:`GuideState` (on the ``Sequence``) follows the request's output: before each
  draw it catches up with the tokens appended since the last one and writes the mask of
  allowed ids. It follows the output rather than being told about each token, so a
  preempted and recomputed request, which keeps its output, needs nothing special.
- The ``structured_output`` logits processor (``logits_processors.py``) sets every other
  id's logit to -inf. It runs last, after bias and penalties.

Once the grammar is complete only the end-of-sequence ids remain allowed, so the request
ends with finish reason ``stop``; ``max_tokens`` may cut it off first (``length``), as
OpenAI's does. A row's mask needs the token before it on the host, so a guided request's
steps are never overlapped (``decode_overlap.overlappable``) and it never drafts (its
logits are edited: ``spec.speculator.can_speculate``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from jacana_common import tool_calls
from jacana_engine.core.errors import InvalidRequestError

log = logging.getLogger(__name__)

# Rust regex syntax's metacharacters (llguidance parses regexes with the ``regex`` crate):
# a choice's literal strings are escaped with exactly these, since an escaped space or
# letter is an error there.
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def _escape_regex(text: str) -> str:
    return "".join("\\" + c if c in _REGEX_META else c for c in text)


# A tag of a grammar: the item that matches it (a special token's name, or a string).
TagItem = Callable[[str], str]


def _quoted(text: str) -> str:
    return json.dumps(text)


def _json_schema_grammar(value: str, tag: TagItem) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_json_schema(value)


def _json_object_grammar(value: str, tag: TagItem) -> str:
    return _json_schema_grammar('{"type": "object"}', tag)


def _regex_grammar(value: str, tag: TagItem) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_regex(value)


def _choice_grammar(value: str, tag: TagItem) -> str:
    choices = json.loads(value)
    return _regex_grammar("|".join(f"({_escape_regex(c)})" for c in choices), tag)


def _lark_grammar(value: str, tag: TagItem) -> str:
    import llguidance

    return llguidance.LLMatcher.grammar_from_lark(value)


def _tool_calls_grammar(value: str, tag: TagItem) -> str:
    spec = json.loads(value)
    return _lark_grammar(tool_calls.lark_grammar(spec["functions"], spec["several"], tag), tag)


# kind -> the llguidance grammar for a value (``tag``: how the vocabulary spells a tag)
_GRAMMARS: dict[str, Callable[[str, TagItem], str]] = {
    "json_schema": _json_schema_grammar,
    "json_object": _json_object_grammar,
    "regex": _regex_grammar,
    "choice": _choice_grammar,
    "lark": _lark_grammar,
    "tool_calls": _tool_calls_grammar,
}


@dataclass(frozen=True)
class Guide:
    """What a request's output must match.

    kind: "json_schema" (value: the schema, as JSON text), "json_object" (any JSON
        object; value unused), "regex" (value: a Rust-syntax regular expression over the
        whole output), "choice" (value: a JSON array of the allowed outputs, strings),
        "lark" (value: an llguidance Lark grammar), "tool_calls" (value: JSON
        ``{"functions": [{"name", "parameters"}], "several": bool}``: one call, or one or
        more, in the Hermes format of :mod:`jacana_common.tool_calls`).
    param: the request field it came from, named in errors (e.g. ``response_format``).
    """

    kind: str
    value: str = ""
    param: str = "guide"

    def validate(self) -> None:
        """Raise :class:`InvalidRequestError` for what can be told without the vocabulary:
        an unknown kind, a value that is not JSON where JSON is expected, an empty choice."""
        if self.kind not in _GRAMMARS:
            raise InvalidRequestError(
                f"unknown guide kind {self.kind!r}; known: {', '.join(_GRAMMARS)}", self.param
            )
        if self.kind == "json_schema":
            schema = _json(self.value, "the JSON schema is not JSON", self.param)
            if not isinstance(schema, dict | bool):
                raise InvalidRequestError("a JSON schema must be an object", self.param)
        if self.kind == "tool_calls":
            _check_tool_calls(self.value, self.param)
        if self.kind == "choice":
            choices = _json(self.value, "the choices are not a JSON array", self.param)
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise InvalidRequestError(
                    "a choice must list one or more non-empty strings", self.param
                )

    def grammar(self, tag: TagItem = _quoted) -> str:
        """llguidance's grammar text for this guide (not yet checked against a vocabulary;
        ``tag``: the grammar item for a tag, a quoted string unless told otherwise)."""
        return _GRAMMARS[self.kind](self.value, tag)


def _check_tool_calls(value: str, param: str) -> None:
    try:
        spec = json.loads(value)
        names = [f["name"] for f in spec["functions"]]
        several = spec["several"]
    except (ValueError, KeyError, TypeError):
        raise InvalidRequestError(
            'a tool-call guide is {"functions": [{"name", "parameters"}], "several": bool}', param
        ) from None
    if not names or not all(isinstance(n, str) and n for n in names) or type(several) is not bool:
        raise InvalidRequestError("a tool-call guide names one or more functions", param)


def _json(value: str, not_json: str, param: str) -> Any:
    """``value`` parsed, or the request refused with ``not_json`` and the parser's reason."""
    try:
        return json.loads(value)
    except ValueError as exc:
        raise InvalidRequestError(f"{not_json}: {exc}", param) from None


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text


class GuideState:
    """One request's place in its grammar.

    ``mask(output_token_ids)`` catches up with the output (the tokens appended since the
    last call) and returns the allowed ids as a bool array [V]. Outputs only grow while a
    request runs; one that is shorter than what was consumed (rolled back) is replayed
    from the start.
    """

    def __init__(self, matcher: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._matcher = matcher  # llguidance.LLMatcher
        self._vocab_size = vocab_size
        self._eos = np.asarray(sorted(eos_token_ids), dtype=np.int64)
        self._consumed = 0
        self._reported = False  # whether the matcher's error was logged
        # llguidance writes 32 ids a word, bit i of word w for id 32 w + i
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    @property
    def consumed(self) -> int:
        return self._consumed

    def is_complete(self) -> bool:
        """Whether the output so far is a whole match: only end-of-sequence ids may follow
        (not so in the error state, which a rejected token leaves)."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    def advance(self, output_token_ids: Sequence[int]) -> None:
        """Consume the output's tokens past those already consumed."""
        if len(output_token_ids) < self._consumed:
            self._matcher.reset()
            self._consumed = 0
        for token in output_token_ids[self._consumed :]:
            # A token the grammar rejects can only come from outside the mask (e.g. a
            # stop id the mask allowed as EOS); the matcher stays in its error state and
            # the mask falls back to EOS (below), so the request ends.
            self._matcher.consume_token(int(token))
            self._consumed += 1

    def has_a_start(self) -> bool:
        """Whether some output can begin the match (a grammar no output matches has no
        first token; llguidance finds that computing the first mask)."""
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        return not self._matcher.is_error()

    def mask(self, output_token_ids: Sequence[int]) -> np.ndarray:  # [V] bool
        self.advance(output_token_ids)
        allowed = np.zeros(self._vocab_size, dtype=bool)
        if not self._matcher.is_error():
            self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        if self._matcher.is_error():  # (a limit of the library reached mid-output)
            if not self._reported:
                self._reported = True
                log.warning("a guide failed mid-output: %s", _first_line(self._matcher.get_error()))
            allowed[self._eos[self._eos < self._vocab_size]] = True
            return allowed
        bits = np.unpackbits(self._words.view(np.uint8), bitorder="little")
        allowed[:] = bits[: self._vocab_size].astype(bool)
        return allowed


class GuideCompiler:
    """Builds each guided request's :class:`GuideState` on one tokenizer's vocabulary.

    backend: the ``tokenizers.Tokenizer`` (llguidance reads its serialised form);
    vocab_size: the model's logit width (may exceed the tokenizer's ids);
    eos_token_ids: the ids that end generation, the only ones allowed once a grammar ends.
    The vocabulary's index (~0.2 s for 49k ids) is built at the first guided request.
    """

    def __init__(self, backend: Any, vocab_size: int, eos_token_ids: Iterable[int]) -> None:
        self._backend = backend
        self._vocab_size = vocab_size
        self._eos = sorted(eos_token_ids)
        self._vocabulary: Any = None  # llguidance.LLTokenizer, once built

    def _tokenizer(self) -> Any:
        if self._vocabulary is None:
            import llguidance

            self._vocabulary = llguidance.LLTokenizer(
                self._backend.to_str(), n_vocab=self._vocab_size, eos_token=self._eos
            )
        return self._vocabulary

    def state(self, guide: Guide) -> GuideState:
        """A fresh state at the grammar's start for a guide that passed
        :meth:`Guide.validate` (``SamplingParams.validate`` runs it); raises
        :class:`InvalidRequestError` when the guide does not compile (the library's
        message, naming ``guide.param``)."""
        import llguidance

        vocabulary = self._tokenizer()
        try:
            grammar = guide.grammar(self._tag_item)
            matcher = llguidance.LLMatcher(vocabulary, grammar, log_level=0)
        except (ValueError, RuntimeError, TypeError) as exc:
            raise InvalidRequestError(f"invalid {guide.kind}: {exc}", guide.param) from None
        if matcher.is_error():
            raise InvalidRequestError(f"invalid {guide.kind}: {matcher.get_error()}", guide.param)
        state = GuideState(matcher, self._vocab_size, self._eos)
        if not state.has_a_start():
            raise InvalidRequestError(
                f"the {guide.kind} can match no output: {_first_line(matcher.get_error())}",
                guide.param,
            )
        return state

    def _tag_item(self, text: str) -> str:
        """A tag as the grammar must name it: by its token where the vocabulary has it as
        one special token, else as a string. (Quoted, llguidance's mask offers the special
        token but its parser then rejects it: the model's own spelling must be named.)"""
        token = self._backend.token_to_id(text)
        if token is not None and self._tokenizer().is_special_token(token):
            return text
        return _quoted(text)
