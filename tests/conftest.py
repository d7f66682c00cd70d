"""Session fixtures: the real engine (default SmolLM2 GGUF, float32, CPU) and a gateway
pointed at it, each started once per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from stack import MODEL_ID, Service, start_engine, start_gateway


@pytest.fixture(scope="session")
def engine() -> Iterator[Service]:
    service = start_engine()
    yield service
    service.stop()


@pytest.fixture(scope="session")
def gateway(engine: Service) -> Iterator[Service]:
    service = start_gateway({MODEL_ID: [engine.address]})
    yield service
    service.stop()


@pytest.fixture(scope="session")
def base_url(gateway: Service) -> str:
    return f"http://{gateway.address}/v1"


@pytest.fixture
def client(base_url: str):
    import openai

    with openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
def async_client(base_url: str):
    import openai

    return openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
