"""``python -m jacana_drafter``: serve ``jacana.drafter.v1.Drafter``."""

from __future__ import annotations

import asyncio

from jacana_common.grpc_server import GrpcServer
from jacana_common.interpreter import set_gil_switch_interval
from jacana_common.logging import configure_logging
from jacana_common.pb.jacana.drafter.v1 import drafter_pb2_grpc
from jacana_drafter.settings import DrafterSettings

SERVICE_NAME = "jacana.drafter.v1.Drafter"


async def serve(settings: DrafterSettings) -> None:
    from jacana_drafter.server import DrafterServicer
    from jacana_engine.spec.registry import create_local_proposer

    def build(proposer: str):
        built = create_local_proposer(settings.speculative_config(proposer))
        if settings.device.startswith("cuda"):  # a draft model's kernels compile now,
            built.warm_up()  # not in the middle of the stream's drafting steps
        return built

    server = GrpcServer(SERVICE_NAME, settings)
    servicer = DrafterServicer(build, settings.max_streams)
    drafter_pb2_grpc.add_DrafterServicer_to_server(servicer, server.server)
    await server.start()
    await server.run()


def main() -> None:
    settings = DrafterSettings.load()
    configure_logging("drafter", settings.log_level, settings.log_json)
    set_gil_switch_interval(settings.gil_switch_interval_us)
    asyncio.run(serve(settings))


if __name__ == "__main__":
    main()
