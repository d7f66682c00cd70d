"""Render a model's own Jinja chat template, the way Hugging Face ``transformers`` does.

A template from a model file is untrusted code: it runs in jinja2's immutable sandbox, with
the globals and filters HF templates expect (``raise_exception``, ``strftime_now``, a
non-escaping ``tojson``, ``namespace``, loop controls, the ``{% generation %}`` block) and
HF's whitespace settings (``trim_blocks``, ``lstrip_blocks``). There is no fallback template:
a model without one cannot serve chat requests, and says so.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jacana_engine.core.errors import InvalidRequestError

if TYPE_CHECKING:
    from jacana_engine.text.tokenizer import Tokenizer

# Marks the end of a final assistant message being continued; cut from the rendered prompt.
_CONTINUE_TAG = "\u2063JACANA_CONTINUE\u2063"


class ChatTemplate:
    """A compiled chat template plus the special-token variables it renders with.

    Construction compiles the source and raises ``ValueError`` on a syntax error (a defect of
    the model files, found at load time). ``render`` raises :class:`InvalidRequestError` for
    anything a request can cause: malformed messages or a template that rejects them.
    """

    def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None) -> None:
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self._special_tokens = dict(special_tokens or {})

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ChatTemplate:
        if not tokenizer.chat_template:
            raise InvalidRequestError(
                "this model has no chat template; send a raw prompt to /v1/completions instead",
                "messages",
            )
        return cls(tokenizer.chat_template, tokenizer.special_tokens)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        **template_kwargs: Any,
    ) -> str:
        """The prompt text for ``messages`` ([{"role": ..., "content": ...}, ...]).

        add_generation_prompt: end with the header that opens the assistant's reply.
        continue_final_message: leave the last (assistant) message open so the model continues
            it; exclusive with ``add_generation_prompt``.
        template_kwargs: extra variables (e.g. ``enable_thinking``); they override the
            special-token variables.
        """
        chat = _normalize(messages)
        if continue_final_message:
            if add_generation_prompt:
                raise InvalidRequestError(
                    "continue_final_message and add_generation_prompt are exclusive",
                    "continue_final_message",
                )
            last = chat[-1].get("content")
            if not isinstance(last, str):
                raise InvalidRequestError(
                    "continue_final_message needs a final message with text content", "messages"
                )
            chat[-1]["content"] = last + _CONTINUE_TAG
        variables = {**self._special_tokens, **_plain(template_kwargs)}
        try:
            text = self._template.render(
                messages=chat,
                tools=_plain(tools),
                documents=_plain(documents),
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
        except Exception as exc:  # any failure here comes from the request meeting the template
            raise InvalidRequestError(
                f"chat template rejected the messages: {exc}", "messages"
            ) from exc
        if continue_final_message:
            if _CONTINUE_TAG not in text:
                raise InvalidRequestError(
                    "the chat template drops the final message, so it cannot be continued",
                    "messages",
                )
            text = text[: text.rindex(_CONTINUE_TAG)]
        return text


def apply_chat_template(
    tokenizer: Tokenizer,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    **kwargs: Any,
) -> str:
    """Render with ``tokenizer``'s own template (compiled once per tokenizer)."""
    return tokenizer.apply_chat_template(messages, add_generation_prompt, **kwargs)


def chat_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """The template's messages for the proto ``ChatMessage``s: role and content, with a
    ``name``, a ``tool_call_id`` and ``tool_calls`` where set. A call's arguments go to
    the template as an object where they are one (as Hugging Face's templates expect:
    they apply ``tojson`` to them), else as the text that came."""
    chat = []
    for m in messages:
        message: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.name:
            message["name"] = m.name
        if m.tool_call_id:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": _arguments(c.arguments)},
                }
                for c in m.tool_calls
            ]
        chat.append(message)
    return chat


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, dict) else text


def check_tool_calls_render(messages: Sequence[Mapping[str, Any]], tokenizer: Tokenizer) -> None:
    """Refuse (naming the message) a conversation whose assistant calls of tools the
    model's template never reads: they would vanish from the prompt unseen."""
    if "tool_calls" in (tokenizer.chat_template or ""):
        return
    for i, message in enumerate(messages):
        if message.get("tool_calls"):
            raise InvalidRequestError(
                "this model's chat template does not render tool calls", f"messages[{i}].tool_calls"
            )


def chat_tools(tools_json: str, tokenizer: Tokenizer) -> list[Any] | None:
    """The tools to render (OpenAI's ``tools`` array, from its JSON text), None when there
    are none; a template that never reads ``tools`` cannot show them to the model, so a
    request with tools is refused (naming ``tools``) rather than served blind."""
    if not tools_json:
        return None
    try:
        tools = json.loads(tools_json)
    except ValueError:
        raise InvalidRequestError("tools must be a JSON array", "tools") from None
    if not isinstance(tools, list) or not tools:
        raise InvalidRequestError("tools must be a non-empty JSON array", "tools")
    if "tools" not in (tokenizer.chat_template or ""):
        raise InvalidRequestError(
            "this model's chat template does not render tools, so it cannot call them", "tools"
        )
    return tools


def _normalize(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Fresh plain dicts; keys whose value is None are dropped, as HF does (templates handle
    a missing ``content`` better than ``None``)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise InvalidRequestError("messages must be a non-empty list", "messages")
    chat = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise InvalidRequestError(f"messages[{i}] must be an object with a 'role'", "messages")
        chat.append({k: _plain(v) for k, v in message.items() if v is not None})
    return chat


def _plain(value: Any) -> Any:
    """Rebuild ``value`` from JSON types only, so a template never sees a caller's objects."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    # Subclasses (enums, numpy scalars...) carry methods a template must not reach.
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    raise InvalidRequestError(
        f"unsupported value in chat input: {type(value).__name__}", "messages"
    )


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: HF marks assistant text with it; here it
    renders its body unchanged."""

    tags = frozenset({"generation"})

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class _Namespace(jinja2.utils.Namespace):
    """``namespace(...)`` that refuses underscore names (no reach into Python internals)."""

    # ``self`` comes out of ``args`` so that ``namespace(self=...)`` still works, as in jinja.
    def __init__(*args: Any, **kwargs: Any) -> None:
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} is not allowed")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _dict(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return dict(*args, **kwargs)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    env.globals["dict"] = _dict
    return env
