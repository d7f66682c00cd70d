"""The bodies of POST /v1/videos and POST /v1/videos/{video_id}/remix, read and checked as
OpenAI's Videos API defines them, with Jacana's extensions.

:func:`read_create_request` takes a multipart/form-data body (what the SDK always sends)
or a JSON object, and returns a :class:`VideoCreate`, or raises a 400 :class:`ApiError`
naming the field: ``prompt`` missing (``missing_required_parameter``), a value of the
wrong type or out of range (``invalid_value``), a field the API does not have
(``unknown_parameter``). The text fields are one model, :class:`VideoFields`, read from
strings for a form and strictly typed for JSON; an empty form field counts as not sent
(whatever its name: an empty part is how a client sends a form without files as
multipart).

``input_reference`` (the image the first frame starts from) is a file part, or an object
``{"image_url": "data:image/...;base64,..."}`` (in a form written as the SDK writes it,
``input_reference[image_url]``). Only data URLs are decoded: the gateway fetches nothing,
so any other URL is a 400 naming ``input_reference``, and so is a ``file_id`` (there is
no Files API here). Whether ``seconds`` and ``size`` are offered by the model, whether the
image is one it can take, and how long a prompt may be are the service's to say.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_to_bytes

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic import StrictStr as Str
from starlette.datastructures import UploadFile

from jacana_common.errors import ApiError, invalid_value
from jacana_gateway.errors import unknown_parameter, unsupported_parameter, validation_error
from jacana_gateway.schemas.generation import UINT32_MAX
from jacana_gateway.schemas.unicode import reject_lone_surrogates

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_FIELDS = 64
REFERENCE = "input_reference"
_FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")


class VideoFields(BaseModel):
    """Every field of a create request but ``input_reference``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = Field(..., min_length=1, description="What the video shows.")
    model: str | None = Field(None, description="A video model id; unset: the first served.")
    seconds: str | None = Field(
        None, description="Clip length in seconds, as the model offers it; unset: its default."
    )
    size: str | None = Field(None, description="'WIDTHxHEIGHT'; unset: the model's default.")
    seed: int | None = Field(
        None, ge=INT64_MIN, le=INT64_MAX, description="Jacana extension: the noise seed."
    )
    num_inference_steps: int | None = Field(
        None, ge=1, le=UINT32_MAX, description="Jacana extension: denoising steps."
    )
    guidance_scale: float | None = Field(
        None, ge=0.0, allow_inf_nan=False, description="Jacana extension: CFG scale."
    )
    fps: int | None = Field(
        None, ge=1, le=UINT32_MAX, description="Jacana extension: frames per second."
    )
    negative_prompt: str | None = Field(
        None, description="Jacana extension: what the video should not show."
    )

    @field_validator("seconds", mode="before")
    @classmethod
    def _seconds_as_text(cls, value: Any) -> Any:
        # OpenAI's seconds is a string ("4"); a JSON number says the same.
        return str(value) if type(value) is int else value


@dataclass(frozen=True)
class VideoCreate:
    """One checked create request. input_reference: the image's bytes (empty: none);
    input_reference_name: the upload's file name ("" for a data URL)."""

    fields: VideoFields
    input_reference: bytes = b""
    input_reference_name: str = ""


class VideoRemixRequest(BaseModel):
    """Body of POST /v1/videos/{video_id}/remix."""

    model_config = ConfigDict(extra="forbid")

    _text_only = model_validator(mode="before")(reject_lone_surrogates)

    prompt: Str = Field(..., min_length=1, description="The new prompt.")


def _fields_error(exc: ValidationError) -> ApiError:
    """The first failure of :class:`VideoFields`, worded as for any JSON body."""
    errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
    return validation_error(RequestValidationError(errors))


def decode_data_url(url: str) -> bytes:
    """The bytes of a ``data:image/...`` URL (base64 or percent-encoded); a 400 naming
    ``input_reference`` for anything else."""
    if url[:5].lower() != "data:":
        raise invalid_value(
            "'input_reference' image_url must be a data URL (data:image/png;base64,...); "
            "remote URLs are not fetched.",
            REFERENCE,
        )
    head, comma, data = url[5:].partition(",")
    params = [p.strip().lower() for p in head.split(";")]
    if not comma or not params[0].startswith("image/"):
        raise invalid_value("'input_reference' must be an image (data:image/...).", REFERENCE)
    if params[-1] == "base64":
        try:
            image = base64.b64decode("".join(data.split()), validate=True)
        except (binascii.Error, ValueError):
            raise invalid_value(
                "'input_reference' image_url is not valid base64.", REFERENCE
            ) from None
    else:
        image = unquote_to_bytes(data)
    if not image:
        raise invalid_value("'input_reference' is an empty image.", REFERENCE)
    return image


def _reference_object(value: Any) -> bytes:
    """``{"image_url": ...}`` -> the image; ``file_id`` and other keys are refused."""
    if not isinstance(value, dict):
        raise invalid_value(
            f"'{REFERENCE}' must be an image file or an object with an 'image_url'.", REFERENCE
        )
    for key in value:
        if key == "file_id":
            raise unsupported_parameter(REFERENCE, "file ids are not served; send the image")
        if key != "image_url":
            raise unknown_parameter(f"{REFERENCE}.{key}")
    url = value.get("image_url")
    if not isinstance(url, str):
        raise invalid_value(f"'{REFERENCE}' image_url must be a string.", REFERENCE)
    return decode_data_url(url)


def _checked(data: dict[str, Any], strings: bool) -> VideoFields:
    try:
        if strings:
            return VideoFields.model_validate_strings(data)
        return VideoFields.model_validate(data, strict=True)
    except ValidationError as exc:
        raise _fields_error(exc) from None


async def _read_form(request: Request) -> VideoCreate:
    form = await request.form(max_files=1, max_fields=MAX_FIELDS)
    try:
        texts: dict[str, str] = {}
        upload: UploadFile | None = None
        reference: dict[str, str] = {}
        for key, value in form.multi_items():
            if key.startswith(f"{REFERENCE}[") and key.endswith("]"):
                if not isinstance(value, str):
                    raise invalid_value(f"'{key}' must be a text field, not a file.", REFERENCE)
                reference[key[len(REFERENCE) + 1 : -1]] = value
                continue
            if key == REFERENCE:
                if not isinstance(value, UploadFile):
                    raise invalid_value(
                        f"'{REFERENCE}' must be a file (a part with a filename).", REFERENCE
                    )
                upload = value
                continue
            if not isinstance(value, str):
                raise invalid_value(f"'{key}' must be a text field, not a file.", key)
            if not value:
                # An empty text field is an unset one, whatever its name: clients add one
                # to send a form without files as multipart.
                continue
            if key not in VideoFields.model_fields:
                raise unknown_parameter(key)
            if key in texts:
                raise invalid_value(f"'{key}' was given more than once.", key)
            texts[key] = value
        fields = _checked(texts, strings=True)
        if upload is not None and reference:
            raise invalid_value(f"'{REFERENCE}' was given more than once.", REFERENCE)
        if reference:
            return VideoCreate(fields, _reference_object(reference))
        if upload is None:
            return VideoCreate(fields)
        image = await upload.read()
        if not image:
            raise invalid_value(f"'{REFERENCE}' is an empty file.", REFERENCE)
        return VideoCreate(fields, image, upload.filename or "")
    finally:
        await form.close()


def _parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise ApiError(
            400, "The request body is missing; send a JSON object.", None, "invalid_body"
        )
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise ApiError(
            400, "The request body is not valid UTF-8 JSON.", None, "invalid_json"
        ) from None
    except RecursionError:
        raise ApiError(
            400,
            "The request body nests arrays or objects too deeply to parse.",
            None,
            "invalid_json",
        ) from None
    except ValueError:
        raise ApiError(400, "The request body is not valid JSON.", None, "invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "The request body must be a JSON object.", None, "invalid_body")
    return reject_lone_surrogates(data)


async def _read_json(request: Request) -> VideoCreate:
    data = _parse_json(await request.body())
    reference = data.pop(REFERENCE, None)
    fields = _checked(data, strings=False)
    if reference is None:
        return VideoCreate(fields)
    return VideoCreate(fields, _reference_object(reference))


async def read_create_request(request: Request) -> VideoCreate:
    """Read and check the body of one create request, multipart or JSON (a body without
    Content-Type is read as JSON). Raises a 400 :class:`ApiError` (or, through the body
    limit, a 413) for every problem."""
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith(_FORM_TYPES):
        return await _read_form(request)
    if not content_type or content_type.startswith("application/json"):
        return await _read_json(request)
    raise ApiError(
        400,
        "Send the request as multipart/form-data or as a JSON object.",
        None,
        "invalid_content_type",
    )
