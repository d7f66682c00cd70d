"""``python -m jacana_gateway``: serve the gateway with uvicorn until SIGTERM/SIGINT.

On SIGTERM uvicorn stops accepting connections, lets in-flight requests (streams
included) finish for up to ``shutdown_grace_s``, cancels what is left (which cancels
their engine calls), then the app's lifespan closes the engine channels.
"""

from __future__ import annotations

import logging

import uvicorn

from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_gateway.app import create_app
from jacana_gateway.settings import GatewaySettings

log = logging.getLogger("jacana_gateway")


def main() -> None:
    settings = GatewaySettings.load()
    configure_logging("gateway", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    for kind, served in (
        ("generation", settings.engines),
        ("embeddings", settings.embeddings),
        ("asr", settings.asr),
        ("videos", settings.videos),
    ):
        if served:
            log.info("%s: %s", kind, ", ".join(f"{m} -> {t}" for m, t in served.items()))
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # keep configure_logging's handlers and format
        log_level=settings.log_level,
        timeout_graceful_shutdown=settings.shutdown_grace_s,
        lifespan="on",
        server_header=False,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
