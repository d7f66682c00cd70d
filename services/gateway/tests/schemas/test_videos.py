"""The create body of /v1/videos as pure checks: data URLs, and the fields read from a
form (strings) and from JSON (strict types)."""

from __future__ import annotations

import base64

import pytest

from jacana_common.errors import ApiError
from jacana_gateway.schemas.videos import VideoFields, decode_data_url

PNG = b"\x89PNG\r\n\x1a\n\x00\xff" * 10


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64," + base64.b64encode(PNG).decode(),
        "DATA:Image/PNG;name=x.png;BASE64," + base64.b64encode(PNG).decode(),
        # wrapped base64, as some encoders write it
        "data:image/png;base64," + "\n".join(base64.encodebytes(PNG).decode().split()),
        "data:image/png," + "".join(f"%{b:02x}" for b in PNG),
    ],
)
def test_data_urls_decode_to_their_bytes(url):
    assert decode_data_url(url) == PNG


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/a.png",
        "file:///etc/passwd",
        "data:image/png;base64",  # no comma
        "data:;base64,AAAA",
        "data:text/plain;base64,AAAA",
        "data:image/png;base64,A===",
        "data:image/png;base64,not base64!",
        "data:image/png;base64,",
    ],
)
def test_anything_else_is_a_400_naming_input_reference(url):
    with pytest.raises(ApiError) as info:
        decode_data_url(url)
    assert (info.value.status, info.value.param, info.value.code) == (
        400,
        "input_reference",
        "invalid_value",
    )


def test_form_strings_and_json_types_give_the_same_fields():
    from_form = VideoFields.model_validate_strings(
        {"prompt": "p", "seconds": "4", "seed": "-1", "guidance_scale": "2", "fps": "8"}
    )
    from_json = VideoFields.model_validate(
        {"prompt": "p", "seconds": 4, "seed": -1, "guidance_scale": 2, "fps": 8}, strict=True
    )
    assert from_form == from_json
    assert (from_json.seconds, from_json.guidance_scale, from_json.model) == ("4", 2.0, None)


@pytest.mark.parametrize(
    "field, value",
    [("seconds", True), ("seconds", 4.0), ("seed", 2**63), ("fps", 2**32), ("guidance_scale", -1)],
)
def test_json_values_out_of_type_or_range_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        VideoFields.model_validate({"prompt": "p", field: value}, strict=True)
