"""Models, health, version, OpenAPI, unknown routes and authentication."""

from __future__ import annotations

import pytest


def assert_openai_error(resp, status: int, code: str | None) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code
    return error


async def test_models_lists_every_configured_model(make_client, make_settings, dead_address):
    engines = {"org/model-a": [dead_address()], "model-b": [dead_address(), dead_address()]}
    async with make_client(make_settings(engines)) as client:
        resp = await client.get("/v1/models")
        assert resp.status_code == 200
        body = resp.json()
        assert body["object"] == "list"
        assert [m["id"] for m in body["data"]] == ["org/model-a", "model-b"]
        for card in body["data"]:
            assert card["object"] == "model"
            assert isinstance(card["created"], int)
            assert card["owned_by"] == "jacana"
        one = await client.get("/v1/models/org/model-a")
        assert one.status_code == 200 and one.json()["id"] == "org/model-a"
        missing = await client.get("/v1/models/org/model-c")
        error = assert_openai_error(missing, 404, "model_not_found")
        assert error["param"] == "model" and "org/model-c" in error["message"]


async def test_health_is_503_when_a_model_has_no_serving_engine(client, model):
    resp = await client.get("/health")
    assert resp.status_code == 503
    body = resp.json()
    assert body["error"]["code"] == "engine_unavailable"
    assert body["models"][model]["healthy_replicas"] == 0


async def test_health_is_200_when_each_model_has_one_serving_engine(
    make_client, make_settings, make_engine, dead_address
):
    a, b = await make_engine(), await make_engine()
    engines = {"one": [dead_address(), a.address], "two": [b.address]}
    async with make_client(make_settings(engines)) as client:
        resp = await client.get("/health")
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["status"] == "ok"
        assert body["models"]["one"]["healthy_replicas"] == 1
        assert body["models"]["one"]["replicas"][a.address] == "serving"
        # The only engine of "two" stops serving: the gateway is no longer healthy.
        await b.health.set("jacana.engine.v1.Engine", 2)  # NOT_SERVING
        resp = await client.get("/health")
        assert resp.status_code == 503
        assert resp.json()["models"]["two"]["replicas"][b.address] == "unavailable"
        assert "two" in resp.json()["error"]["message"]


async def test_version(client):
    resp = await client.get("/version")
    assert resp.status_code == 200
    assert resp.json()["version"].count(".") >= 2


async def test_openapi_document_describes_the_openai_routes(client):
    resp = await client.get("/openapi.json")
    assert resp.status_code == 200
    doc = resp.json()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/version"):
        assert path in doc["paths"], path
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert {"model", "messages"} <= set(chat["required"])
    assert chat["properties"]["temperature"]["anyOf"][0]["maximum"] == 2.0
    assert "prompt" in schemas["CompletionRequest"]["required"]


async def test_unknown_route_is_an_openai_404(client):
    error = assert_openai_error(await client.get("/v1/nothing-here"), 404, "not_found")
    assert "/v1/nothing-here" in error["message"]
    assert_openai_error(await client.post("/v2/chat/completions", json={}), 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/chat/completions"), ("DELETE", "/v1/completions"), ("POST", "/v1/models")],
)
async def test_wrong_method_is_an_openai_405(client, method, path):
    resp = await client.request(method, path)
    assert_openai_error(resp, 405, "method_not_allowed")
    assert resp.headers["allow"]


async def test_api_keys_guard_the_v1_routes_only(make_client, make_settings, model):
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    async with make_client(make_settings(api_keys=["sk-one", "sk-two"])) as client:
        for headers in (
            {},
            {"Authorization": "Bearer sk-three"},
            {"Authorization": "sk-one"},
            {"Authorization": "Basic c2stb25l"},
            {"Authorization": "Bearer "},
        ):
            resp = await client.post("/v1/chat/completions", json=body, headers=headers)
            error = assert_openai_error(resp, 401, "invalid_api_key")
            assert error["type"] == "authentication_error"
            assert resp.headers["www-authenticate"] == "Bearer"
        # Unauthenticated and malformed: still a 401, the body is never looked at.
        resp = await client.post("/v1/chat/completions", content=b"{not json")
        assert_openai_error(resp, 401, "invalid_api_key")
        assert (await client.get("/v1/models")).status_code == 401
        # A valid key gets through (to the dead engine: 503), either key works.
        for key in ("sk-one", "sk-two"):
            auth = {"Authorization": f"Bearer {key}"}
            resp = await client.post("/v1/chat/completions", json=body, headers=auth)
            assert_openai_error(resp, 503, "engine_unavailable")
            assert (await client.get("/v1/models", headers=auth)).status_code == 200
        # Probes and the schema stay open.
        assert (await client.get("/health")).status_code == 503
        assert (await client.get("/version")).status_code == 200
        assert (await client.get("/openapi.json")).status_code == 200
