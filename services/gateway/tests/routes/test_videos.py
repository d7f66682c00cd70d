"""/v1/videos over HTTP: the create body (form and JSON), errors before any service call,
routing by model and by video id, and what the multimodal service's answers become.

Validation tests run against a gateway whose only multimodal address is dead: a request
that got past validation would come back 503, so each expected 400/404/413 proves it was
caught first. The fake multimodal service (``routes/conftest.py``) keeps videos in memory
and records what it was asked; the official SDK drives the same routes in
``test_videos_sdk.py``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest

from jacana_common.pb.jacana.multimodal.v1 import multimodal_pb2 as pb
from jacana_gateway.settings import GatewaySettings

VIDEO = "wan-test"
OTHER_VIDEO = "wan-other"
ASR = "whisper-test"
LLM = "llm"
URL = "/v1/videos"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4
TRACEPARENT = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


@pytest.fixture
def gateway(make_settings, make_client, dead_address):
    """``gateway({model: endpoints}, **settings)``: the real gateway app, in-process, serving
    those video models (default: ``VIDEO`` at a dead address), a generation model ``LLM``
    and a speech-to-text model ``ASR``, both at dead addresses."""

    def open_client(videos: dict[str, list[str]] | None = None, **overrides):
        settings = make_settings(
            {LLM: [dead_address()]},
            asr={ASR: [dead_address()]},
            videos=videos or {VIDEO: [dead_address()]},
            **overrides,
        )
        return make_client(settings)

    return open_client


@pytest.fixture
async def client(gateway) -> AsyncIterator[httpx.AsyncClient]:
    """Only a dead multimodal address behind it: anything past validation is a 503."""
    async with gateway() as c:
        yield c


@pytest.fixture
async def mm(make_multimodal):
    return await make_multimodal()


@pytest.fixture
async def served(gateway, mm) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway({VIDEO: [mm.address]}) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, param: str | None, code: str | None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert error["message"]
    assert (error["param"], error["code"]) == (param, code), error
    return error


def data_url(image: bytes = PNG, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(image).decode()}"


def form_parts(**fields) -> list[tuple[str, tuple[None, str]]]:
    """Text fields as multipart parts (httpx sends a form without files url-encoded; the
    SDK always sends multipart)."""
    return [(name, (None, value)) for name, value in fields.items()]


async def post_form(client, files=None, **fields):
    parts = form_parts(**{"prompt": "a heron", **fields}) + list((files or {}).items())
    return await client.post(URL, files=parts)


# --- validation: nothing reaches a service ----------------------------------------------


@pytest.mark.parametrize(
    "fields, param, code",
    [
        ({"seed": "x"}, "seed", "invalid_value"),
        ({"seed": str(2**63)}, "seed", "invalid_value"),
        ({"num_inference_steps": "0"}, "num_inference_steps", "invalid_value"),
        ({"num_inference_steps": "many"}, "num_inference_steps", "invalid_value"),
        ({"guidance_scale": "-0.5"}, "guidance_scale", "invalid_value"),
        ({"guidance_scale": "nan"}, "guidance_scale", "invalid_value"),
        ({"fps": "0"}, "fps", "invalid_value"),
        ({"colour": "blue"}, "colour", "unknown_parameter"),
        ({"input_reference": "not a file"}, "input_reference", "invalid_value"),
        ({"input_reference[file_id]": "file-1"}, "input_reference", "unsupported_parameter"),
        ({"input_reference[image_url]": "https://x/y.png"}, "input_reference", "invalid_value"),
    ],
)
async def test_bad_form_fields_are_400s_naming_them(client, fields, param, code):
    assert_error(await post_form(client, **fields), 400, param, code)


@pytest.mark.parametrize(
    "body, param, code",
    [
        ({"prompt": "x", "seed": "7"}, "seed", "invalid_value"),
        ({"prompt": "x", "seed": True}, "seed", "invalid_value"),
        ({"prompt": "x", "num_inference_steps": 1.5}, "num_inference_steps", "invalid_value"),
        ({"prompt": "x", "guidance_scale": "high"}, "guidance_scale", "invalid_value"),
        ({"prompt": "x", "fps": -1}, "fps", "invalid_value"),
        ({"prompt": "x", "negative_prompt": 3}, "negative_prompt", "invalid_value"),
        ({"prompt": "x", "size": 720}, "size", "invalid_value"),
        ({"prompt": "x", "model": ["a"]}, "model", "invalid_value"),
        ({"prompt": 5}, "prompt", "invalid_value"),
        ({"prompt": ""}, "prompt", "invalid_value"),
        ({"prompt": "\ud800"}, "prompt", "invalid_value"),
        ({"prompt": "x", "colour": "blue"}, "colour", "unknown_parameter"),
        ({"prompt": "x", "input_reference": "data:image/png;base64,AA=="}, "input_reference",
         "invalid_value"),
        ({"prompt": "x", "input_reference": {"image_url": "https://x/y.png"}}, "input_reference",
         "invalid_value"),
        ({"prompt": "x", "input_reference": {"image_url": "data:text/plain;base64,AA=="}},
         "input_reference", "invalid_value"),
        ({"prompt": "x", "input_reference": {"image_url": "data:image/png;base64,@@@"}},
         "input_reference", "invalid_value"),
        ({"prompt": "x", "input_reference": {"image_url": "data:image/png;base64,"}},
         "input_reference", "invalid_value"),
        ({"prompt": "x", "input_reference": {"file_id": "file-1"}}, "input_reference",
         "unsupported_parameter"),
    ],
)  # fmt: skip
async def test_bad_json_fields_are_400s_naming_them(client, body, param, code):
    raw = json.dumps(body)  # ASCII: a lone surrogate travels as its escape
    resp = await client.post(URL, content=raw, headers={"content-type": "application/json"})
    assert_error(resp, 400, param, code)


async def test_a_missing_prompt_is_a_400_naming_it(client):
    for fields in ({"seed": "1"}, {"prompt": ""}):
        resp = await client.post(URL, files=form_parts(**fields))
        assert_error(resp, 400, "prompt", "missing_required_parameter")
    resp = await client.post(URL, data={"prompt": ""})  # url-encoded
    assert_error(resp, 400, "prompt", "missing_required_parameter")
    resp = await client.post(URL, json={"model": VIDEO})
    assert_error(resp, 400, "prompt", "missing_required_parameter")


async def test_bodies_that_are_not_forms_or_json_objects_are_400s(client):
    resp = await client.post(URL, content=b"prompt", headers={"content-type": "text/plain"})
    assert_error(resp, 400, None, "invalid_content_type")
    resp = await client.post(URL, content=b"{", headers={"content-type": "application/json"})
    assert_error(resp, 400, None, "invalid_json")
    assert_error(await client.post(URL, json=["a heron"]), 400, None, "invalid_body")
    assert_error(await client.post(URL, content=b""), 400, None, "invalid_body")
    resp = await client.post(URL, content=b"[" * 100_000, headers={"content-type": ""})
    assert_error(resp, 400, None, "invalid_json")


async def test_a_scalar_field_given_twice_is_a_400(client):
    resp = await client.post(URL, files=[("prompt", (None, "a")), ("prompt", (None, "b"))])
    assert_error(resp, 400, "prompt", "invalid_value")
    # an empty field counts as unset, whatever its name: the placeholder part that makes
    # httpx send a form without files as multipart
    form = {"prompt": "x", "model": "sora-2"}
    resp = await client.post(URL, data=form, files={"unused": ("", b"")})
    assert_error(resp, 404, "model", "model_not_found")


async def test_unknown_model_is_404_and_other_kinds_are_400(client):
    assert_error(await post_form(client, model="sora-2"), 404, "model", "model_not_found")
    for other, route in ((LLM, "/v1/chat/completions"), (ASR, "/v1/audio/transcriptions")):
        resp = await client.post(URL, json={"prompt": "x", "model": other})
        error = assert_error(resp, 400, "model", "model_not_supported")
        assert route in error["message"]


@pytest.mark.parametrize(
    "query, param",
    [("limit=0", "limit"), ("limit=101", "limit"), ("limit=x", "limit"), ("order=up", "order")],
)
async def test_bad_list_parameters_are_400s(client, query, param):
    assert_error(await client.get(f"{URL}?{query}"), 400, param, "invalid_value")


async def test_bad_variant_and_remix_body_are_400s(client):
    resp = await client.get(f"{URL}/video_1/content?variant=gif")
    assert_error(resp, 400, "variant", "invalid_value")
    assert_error(
        await client.post(f"{URL}/video_1/remix", json={}),
        400,
        "prompt",
        "missing_required_parameter",
    )
    resp = await client.post(f"{URL}/video_1/remix", json={"prompt": 5})
    assert_error(resp, 400, "prompt", "invalid_value")
    resp = await client.post(f"{URL}/video_1/remix", json={"prompt": "x", "seed": 1})
    assert_error(resp, 400, "seed", "unknown_parameter")


async def test_unreachable_service_is_503_on_every_route(client):
    requests = [
        client.post(URL, json={"prompt": "a heron"}),
        client.get(URL),
        client.get(f"{URL}/video_1"),
        client.delete(f"{URL}/video_1"),
        client.get(f"{URL}/video_1/content"),
        client.post(f"{URL}/video_1/remix", json={"prompt": "x"}),
    ]
    for resp in await asyncio.gather(*requests):
        error = assert_error(resp, 503, None, "service_unavailable")
        assert "127.0.0.1" not in error["message"]


async def test_body_over_the_video_limit_is_a_413(gateway, mm):
    async with gateway({VIDEO: [mm.address]}, max_video_body_bytes=4096) as client:
        big = ("big.png", b"\0" * 5000, "image/png")
        resp = await post_form(client, files={"input_reference": big})
        assert_error(resp, 413, None, "request_too_large")
        body = {"prompt": "x", "input_reference": {"image_url": data_url(b"\1" * 4000)}}
        assert_error(await client.post(URL, json=body), 413, None, "request_too_large")
        assert (await post_form(client)).status_code == 200
    assert len(mm.servicer.requests) == 1


async def test_images_may_exceed_the_json_limit(gateway, mm):
    async with gateway({VIDEO: [mm.address]}, max_body_bytes=2048) as client:
        upload = ("frame.png", PNG * 4, "image/png")
        assert (await post_form(client, files={"input_reference": upload})).status_code == 200
        chat = {"model": LLM, "messages": [{"role": "user", "content": "x" * 4096}]}
        assert (await client.post("/v1/chat/completions", json=chat)).status_code == 413
    assert mm.servicer.requests[0].input_reference == PNG * 4


# --- through the fake multimodal service --------------------------------------------------


async def test_a_form_create_reaches_the_service(served, mm):
    fields = {
        "model": VIDEO,
        "seconds": "8",
        "size": "480x832",
        "seed": "-3",
        "num_inference_steps": "12",
        "guidance_scale": "4.5",
        "fps": "24",
        "negative_prompt": "blur",
    }
    files = {"input_reference": ("frame.png", PNG, "image/png")}
    resp = await post_form(served, files=files, **fields)
    assert resp.status_code == 200, resp.text
    (sent,) = mm.servicer.requests
    assert (sent.model, sent.prompt, sent.seconds, sent.size) == (VIDEO, "a heron", "8", "480x832")
    assert (sent.input_reference, sent.input_reference_name) == (PNG, "frame.png")
    assert (sent.seed, sent.num_inference_steps, sent.guidance_scale, sent.fps) == (-3, 12, 4.5, 24)
    assert sent.negative_prompt == "blur" and dict(sent.trace_context) == {}
    video = resp.json()
    assert (video["id"], video["status"], video["model"]) == ("video_1", "queued", VIDEO)
    assert (video["seed"], video["fps"], video["negative_prompt"]) == (-3, 24, "blur")


async def test_a_json_create_with_a_data_url(served, mm):
    body = {
        "prompt": "a heron",
        "seconds": 4,
        "guidance_scale": 0,
        "input_reference": {"image_url": data_url()},
    }
    resp = await served.post(URL, json=body, headers={"traceparent": TRACEPARENT})
    assert resp.status_code == 200, resp.text
    (sent,) = mm.servicer.requests
    assert (sent.input_reference, sent.input_reference_name) == (PNG, "")
    assert (sent.model, sent.seconds, sent.size) == (VIDEO, "4", "")  # model unset: the first
    assert sent.HasField("guidance_scale") and sent.guidance_scale == 0.0
    assert not sent.HasField("seed") and not sent.HasField("fps")
    assert dict(sent.trace_context) == {"traceparent": TRACEPARENT}
    # the SDK's spelling of the object inside a form, and a percent-encoded data URL
    url = "data:image/png," + "".join(f"%{b:02X}" for b in PNG[:64])
    resp = await post_form(served, **{"input_reference[image_url]": url})
    assert resp.status_code == 200, resp.text
    assert mm.servicer.requests[1].input_reference == PNG[:64]


async def test_unset_extensions_stay_unset(served, mm):
    assert (await post_form(served)).status_code == 200
    (sent,) = mm.servicer.requests
    for name in ("seed", "num_inference_steps", "guidance_scale", "fps"):
        assert not sent.HasField(name), name
    assert (sent.seconds, sent.size, sent.negative_prompt, sent.input_reference) == (
        "",
        "",
        "",
        b"",
    )


async def test_the_video_object_has_openais_shape_and_the_extensions(served, mm):
    mm.servicer.add(
        id="v_done",
        model=VIDEO,
        status="completed",
        progress=100,
        completed_at=9,
        seconds="4",
        size="832x480",
        prompt="p",
        expires_at=99,
        seed=1,
        num_inference_steps=2,
        guidance_scale=3.5,
        fps=16,
        notice="random weights: the frames are noise",
    )
    failed = mm.servicer.add(id="v_failed", status="failed", remixed_from_video_id="v_done")
    failed.error.CopyFrom(pb.VideoError(code="render_failed", message="out of memory"))
    done = (await served.get(f"{URL}/v_done")).json()
    assert done == {
        "id": "v_done",
        "object": "video",
        "model": VIDEO,
        "status": "completed",
        "progress": 100,
        "created_at": 1_700_000_000,
        "completed_at": 9,
        "expires_at": 99,
        "seconds": "4",
        "size": "832x480",
        "prompt": "p",
        "remixed_from_video_id": None,
        "error": None,
        "seed": 1,
        "num_inference_steps": 2,
        "guidance_scale": 3.5,
        "fps": 16,
        "negative_prompt": None,
        "notice": "random weights: the frames are noise",
    }
    shown = (await served.get(f"{URL}/v_failed")).json()
    assert shown["error"] == {"code": "render_failed", "message": "out of memory"}
    assert shown["remixed_from_video_id"] == "v_done"
    assert shown["completed_at"] is None and "notice" not in shown


async def test_poll_after_is_sent_only_while_the_video_is_pending(gateway, mm):
    async with gateway({VIDEO: [mm.address]}, video_poll_after_ms=250) as client:
        for status, expected in [
            ("queued", "250"),
            ("in_progress", "250"),
            ("completed", None),
            ("failed", None),
        ]:
            video = mm.servicer.add(status=status)
            resp = await client.get(f"{URL}/{video.id}")
            assert resp.status_code == 200
            assert resp.headers.get("openai-poll-after-ms") == expected, status
        created = await post_form(client)
        assert "openai-poll-after-ms" not in created.headers


@pytest.mark.parametrize(
    "metadata, expected",
    [((("retry-after", "7"),), "7"), ((), "1"), ((("retry-after", "2.5"),), "3")],
)
async def test_a_full_queue_is_a_429_with_retry_after(served, mm, metadata, expected):
    mm.servicer.error = (grpc.StatusCode.RESOURCE_EXHAUSTED, "the render queue is full", None)
    mm.servicer.trailing_metadata = metadata
    resp = await post_form(served)
    error = assert_error(resp, 429, None, None)
    assert error["message"] == "the render queue is full"
    assert resp.headers["retry-after"] == expected


async def test_content_of_a_video_that_is_not_ready_is_a_400(served, mm):
    video = mm.servicer.add(status="in_progress")
    resp = await served.get(f"{URL}/{video.id}/content")
    assert_error(resp, 400, None, "video_not_ready")
    resp = await served.post(f"{URL}/{video.id}/remix", json={"prompt": "again"})
    assert_error(resp, 400, None, "video_not_ready")


async def test_unknown_videos_are_404s(served):
    for resp in await asyncio.gather(
        served.get(f"{URL}/nope"),
        served.delete(f"{URL}/nope"),
        served.get(f"{URL}/nope/content"),
        served.post(f"{URL}/nope/remix", json={"prompt": "x"}),
    ):
        assert_error(resp, 404, "video_id", None)
    assert_error(await served.get(f"{URL}/{'x' * 300}"), 404, None, "not_found")


async def test_service_refusals_keep_their_param(served, mm):
    mm.servicer.error = (grpc.StatusCode.INVALID_ARGUMENT, "size 1x1 is not offered", "size")
    error = assert_error(await post_form(served, size="1x1"), 400, "size", "invalid_value")
    assert error["message"] == "size 1x1 is not offered"


async def test_content_is_streamed_intact_with_its_type_and_length(served, mm):
    video = mm.servicer.add(status="completed")
    mp4 = bytes(range(256)) * 40 + b"tail"  # 10244 bytes: eleven chunks
    mm.servicer.content[(video.id, pb.CONTENT_VARIANT_VIDEO)] = ("video/mp4", mp4)
    mm.servicer.content[(video.id, pb.CONTENT_VARIANT_SPRITESHEET)] = ("image/jpeg", b"jpg")
    resp = await served.get(f"{URL}/{video.id}/content")
    assert resp.status_code == 200
    assert resp.content == mp4
    assert resp.headers["content-type"] == "video/mp4"
    assert resp.headers["content-length"] == str(len(mp4))
    sheet = await served.get(f"{URL}/{video.id}/content", params={"variant": "spritesheet"})
    assert (sheet.content, sheet.headers["content-type"]) == (b"jpg", "image/jpeg")
    variants = [r.variant for r in mm.servicer.requests]
    assert variants == [pb.CONTENT_VARIANT_VIDEO, pb.CONTENT_VARIANT_SPRITESHEET]


async def test_list_passes_pagination_on_and_shows_a_cursor_page(served, mm):
    for _ in range(5):
        mm.servicer.add()
    page = (await served.get(URL, params={"after": "video_4", "limit": 2})).json()
    assert [v["id"] for v in page["data"]] == ["video_3", "video_2"]
    assert (page["object"], page["first_id"], page["last_id"], page["has_more"]) == (
        "list",
        "video_3",
        "video_2",
        True,
    )
    asc = (await served.get(URL, params={"order": "asc", "limit": 100})).json()
    assert [v["id"] for v in asc["data"]] == [f"video_{i}" for i in range(1, 6)]
    assert asc["has_more"] is False
    first, second = mm.servicer.requests
    assert (first.after, first.limit, first.order) == ("video_4", 2, "")
    assert (second.after, second.limit, second.order) == ("", 100, "asc")
    mm.servicer.videos.clear()
    empty = (await served.get(URL)).json()
    assert (empty["data"], empty["first_id"], empty["last_id"]) == ([], None, None)


async def test_delete_and_remix(served, mm):
    source = mm.servicer.add(status="completed", progress=100, completed_at=5, seed=11)
    resp = await served.post(
        f"{URL}/{source.id}/remix",
        json={"prompt": "at night"},
        headers={"traceparent": TRACEPARENT},
    )
    remix = resp.json()
    assert (remix["status"], remix["prompt"], remix["remixed_from_video_id"]) == (
        "queued",
        "at night",
        source.id,
    )
    assert remix["seed"] == 11 and remix["completed_at"] is None
    sent = mm.servicer.requests[-1]
    assert (sent.video_id, sent.prompt) == (source.id, "at night")
    assert dict(sent.trace_context) == {"traceparent": TRACEPARENT}
    resp = await served.delete(f"{URL}/{source.id}")
    assert resp.json() == {"id": source.id, "object": "video.deleted", "deleted": True}
    assert source.id not in mm.servicer.videos


async def test_creates_go_to_their_model_and_the_rest_to_any_replica(
    gateway, make_multimodal, dead_address
):
    first, second = await make_multimodal("a_"), await make_multimodal("b_")
    videos = {VIDEO: [first.address], OTHER_VIDEO: [dead_address(), second.address]}
    async with gateway(videos) as client:
        assert (await post_form(client, model=OTHER_VIDEO)).json()["id"] == "b_1"
        assert (await post_form(client)).json()["id"] == "a_1"  # unset: the first model
        # The two fakes share no store (real replicas share Redis), so which one answered
        # shows in the status: each id is found on one replica and missed on the other.
        statuses = {"a_1": set(), "b_1": set()}
        for _ in range(4):
            for video_id, seen in statuses.items():
                seen.add((await client.get(f"{URL}/{video_id}")).status_code)
        assert statuses == {"a_1": {200, 404}, "b_1": {200, 404}}
    for fake, model in ((first, VIDEO), (second, OTHER_VIDEO)):
        creates = [r for r in fake.servicer.requests if isinstance(r, pb.CreateVideoRequest)]
        gets = [r for r in fake.servicer.requests if isinstance(r, pb.GetVideoRequest)]
        assert [r.model for r in creates] == [model]
        assert len(gets) >= 2


async def test_client_disconnect_cancels_the_service_call(make_settings, serve, mm, dead_address):
    mm.servicer.hang = True
    settings = make_settings({LLM: [dead_address()]}, videos={VIDEO: [mm.address]})
    async with serve(settings) as url, httpx.AsyncClient() as http:
        request = asyncio.create_task(http.post(f"{url}{URL}", json={"prompt": "x"}))
        await asyncio.wait_for(mm.servicer.started.wait(), 5)
        request.cancel()
        await asyncio.wait_for(mm.servicer.cancelled.wait(), 5)


# --- video models in the rest of the gateway ---------------------------------------------


async def test_models_list_video_models_last_with_their_cards(served, mm):
    mm.servicer.cards = [
        pb.ModelCard(id="unrelated", description="not ours"),
        pb.ModelCard(id=VIDEO, random_weights=True, description="Wan 2.1 T2V, random weights"),
    ]
    data = (await served.get("/v1/models")).json()["data"]
    assert [m["id"] for m in data] == [LLM, ASR, VIDEO]
    assert "random_weights" not in data[0] and "description" not in data[1]
    assert (data[2]["random_weights"], data[2]["description"]) == (
        True,
        "Wan 2.1 T2V, random weights",
    )
    one = (await served.get(f"/v1/models/{VIDEO}")).json()
    assert one["random_weights"] is True and one["object"] == "model"
    asked = [r for r in mm.servicer.requests if isinstance(r, pb.ListModelsRequest)]
    assert len(asked) == 1  # the card is cached


async def test_models_list_a_video_model_without_its_card_while_unreachable(client):
    data = (await client.get("/v1/models")).json()["data"]
    assert data[-1] == {
        "id": VIDEO,
        "object": "model",
        "created": data[-1]["created"],
        "owned_by": "jacana",
    }


async def test_health_and_other_routes_know_video_models(served, mm):
    health_body = (await served.get("/health")).json()
    assert health_body["models"][VIDEO] == {
        "kind": "video",
        "healthy_replicas": 1,
        "replicas": {mm.address: "serving"},
    }
    chat = {"model": VIDEO, "messages": [{"role": "user", "content": "hi"}]}
    error = assert_error(
        await served.post("/v1/chat/completions", json=chat), 400, "model", "model_not_supported"
    )
    assert "/v1/videos" in error["message"]


async def test_a_gateway_can_serve_videos_alone(make_client, mm):
    async with make_client(GatewaySettings(videos={VIDEO: [mm.address]})) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.post(URL, json={"prompt": "x"})).status_code == 200


async def test_id_routes_without_video_models_answer_without_a_service(make_client, make_settings):
    async with make_client(make_settings()) as client:
        assert (await client.get(URL)).json()["data"] == []
        assert_error(await client.get(f"{URL}/video_1"), 404, None, "not_found")
        resp = await client.post(URL, json={"prompt": "x"})
        assert_error(resp, 404, "model", "model_not_found")


async def test_the_openapi_document_describes_the_video_routes(client):
    doc = (await client.get("/openapi.json")).json()
    paths = doc["paths"]
    for path in (
        URL,
        f"{URL}/{{video_id}}",
        f"{URL}/{{video_id}}/content",
        f"{URL}/{{video_id}}/remix",
    ):
        assert path in paths, path
    content = paths[URL]["post"]["requestBody"]["content"]
    form = content["multipart/form-data"]["schema"]
    assert form["properties"]["input_reference"]["format"] == "binary"
    assert "prompt" in form["required"]
    assert (
        "image_url"
        in content["application/json"]["schema"]["properties"]["input_reference"]["properties"]
    )
    assert json.dumps(paths[f"{URL}/{{video_id}}/content"]["get"]["parameters"]).count("variant")


def test_settings_validate_video_endpoints(make_settings):
    assert make_settings(videos={VIDEO: ["127.0.0.1:1"]}).videos == {VIDEO: ["127.0.0.1:1"]}
    for bad in ({VIDEO: ["not an address"]}, {VIDEO: []}, {"bad id": ["127.0.0.1:1"]}):
        with pytest.raises(ValueError):
            GatewaySettings(engines={LLM: ["127.0.0.1:1"]}, videos=bad)
    with pytest.raises(ValueError, match="appear in both"):
        GatewaySettings(asr={VIDEO: ["127.0.0.1:1"]}, videos={VIDEO: ["127.0.0.1:2"]})
    with pytest.raises(ValueError, match="JACANA_GATEWAY_VIDEOS"):
        GatewaySettings()
    for bad_poll in (0, 99, 60_001):
        with pytest.raises(ValueError):
            GatewaySettings(videos={VIDEO: ["127.0.0.1:1"]}, video_poll_after_ms=bad_poll)
