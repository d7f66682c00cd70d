"""Structured output: from a request's ``response_format`` or ``guided_*`` field to the
engine's ``Guide``. Pure functions, no I/O.

Accepted (one of them per request; 400 ``invalid_value`` naming the field otherwise):
- chat ``response_format``: ``{"type": "text"}`` (no guide), ``{"type": "json_object"}``
  (any JSON object), ``{"type": "json_schema", "json_schema": {"name": ..., "schema":
  {...}, "strict": ..., "description": ...}}`` (a value the schema accepts), as OpenAI's;
- chat ``tool_choice`` "required" or a named function (:mod:`.tool_calling`);
- both endpoints, vLLM's names: ``guided_json`` (a schema), ``guided_regex`` (a regular
  expression the whole output matches, Rust ``regex`` syntax), ``guided_grammar`` (a
  Lark grammar, llguidance's dialect), ``guided_choice`` (the output is one of these
  strings).

The shape is checked here; whether a schema or regex compiles is the engine's to say
(its 400 names the same field). Unlike OpenAI's ``json_object``, the messages need not
mention JSON (vLLM's choice): the grammar, not the prompt, holds the output to it.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jacana_common.errors import invalid_value
from jacana_common.pb.jacana.engine.v1 import engine_pb2 as pb
from jacana_gateway.schemas.chat import ChatCompletionRequest
from jacana_gateway.schemas.generation import GenerationRequest
from jacana_gateway.translate import tool_calling

_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_FORMAT_TYPES = ("text", "json_object", "json_schema")


def _schema_text(schema: Any, param: str) -> str:
    if not isinstance(schema, dict | bool):
        raise invalid_value(f"'{param}' must be a JSON schema (an object).", param)
    return json.dumps(schema)


def _from_response_format(fmt: dict[str, Any]) -> pb.Guide | None:
    kind = fmt.get("type")
    if kind not in _FORMAT_TYPES:
        raise invalid_value(
            f"'response_format.type' must be one of {', '.join(_FORMAT_TYPES)}; got {kind!r}.",
            "response_format.type",
        )
    if kind == "text":
        return None
    if kind == "json_object":
        return pb.Guide(json_object=True, param="response_format")
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid_value(
            "'response_format.json_schema' must be an object with a 'name' and a 'schema'.",
            "response_format.json_schema",
        )
    name = spec.get("name")
    if not isinstance(name, str) or not _SCHEMA_NAME.fullmatch(name):
        raise invalid_value(
            "'response_format.json_schema.name' must be 1-64 letters, digits, '_' or '-'.",
            "response_format.json_schema.name",
        )
    if "schema" not in spec:  # OpenAI's default: any JSON object
        return pb.Guide(json_object=True, param="response_format")
    text = _schema_text(spec["schema"], "response_format.json_schema.schema")
    return pb.Guide(json_schema=text, param="response_format")


def guide(body: GenerationRequest) -> pb.Guide | None:
    """The engine's guide for ``body``, None when its output is free text (a forced tool
    call is one too: :func:`tool_calling.forced_guide`)."""
    chat = isinstance(body, ChatCompletionRequest)
    fmt = body.response_format if chat else None
    forced = tool_calling.forced_guide(body) if chat else None
    asked = [
        name
        for name, value in (
            ("tool_choice", forced),
            ("response_format", None if fmt == {"type": "text"} else fmt),
            ("guided_json", body.guided_json),
            ("guided_regex", body.guided_regex),
            ("guided_grammar", body.guided_grammar),
            ("guided_choice", body.guided_choice),
        )
        if value is not None
    ]
    if len(asked) > 1:
        raise invalid_value(f"Set only one of {', '.join(repr(a) for a in asked)}.", asked[1])
    if forced is not None:
        return forced
    if fmt is not None:
        return _from_response_format(fmt)
    if body.guided_json is not None:
        return pb.Guide(
            json_schema=_schema_text(body.guided_json, "guided_json"), param="guided_json"
        )
    if body.guided_regex is not None:
        return pb.Guide(regex=body.guided_regex, param="guided_regex")
    if body.guided_grammar is not None:
        return pb.Guide(lark=body.guided_grammar, param="guided_grammar")
    if body.guided_choice is not None:
        return pb.Guide(choice=json.dumps(body.guided_choice), param="guided_choice")
    return None
