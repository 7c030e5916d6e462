"""The gateway process: gRPC and HTTP served from one event loop over one set of services."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from stitchcuda.gateway.grpc_server import GrpcFront
from stitchcuda.gateway.http_app import create_app
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.wiring import GatewayServices, build_services

log = logging.getLogger("stitchcuda.gateway")


@dataclass(frozen=True)
class Listening:
    grpc_port: int
    http_port: int


async def serve(
    settings: GatewaySettings,
    services: GatewayServices | None = None,
    *,
    on_ready: Callable[[Listening], None] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Runs until SIGINT/SIGTERM (uvicorn's handlers) or until `stop` is set; then drains both fronts."""
    owned = services is None
    services = services or build_services(settings)
    grpc_front = GrpcFront(settings, services)
    grpc_port = await grpc_front.start(settings.host, settings.grpc_port)
    app = create_app(settings, services)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.http_port,
        log_level=settings.log_level.lower(),
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        backlog=4096,
    )
    http = uvicorn.Server(config)

    async def watch_stop() -> None:
        if stop is not None:
            await stop.wait()
            http.should_exit = True

    async def announce() -> None:
        while not http.started:
            if http.should_exit:
                return
            await asyncio.sleep(0.02)
        http_port = http.servers[0].sockets[0].getsockname()[1] if http.servers else settings.http_port
        log.info("gateway ready: gRPC :%d, HTTP :%d", grpc_port, http_port)
        if on_ready is not None:
            on_ready(Listening(grpc_port, int(http_port)))

    stopper = asyncio.create_task(watch_stop())
    announcer = asyncio.create_task(announce())
    try:
        await http.serve()
    finally:
        stopper.cancel()
        announcer.cancel()
        await grpc_front.stop()
        if owned:
            services.close()
        log.info("gateway stopped")


def main(argv: list[str] | None = None) -> int:
    """`python -m stitchcuda.gateway [--host H] [--grpc-port P] [--http-port P]` (defaults from STITCH_*)."""
    import argparse

    from stitchcuda.shared.logs import configure_logging

    parser = argparse.ArgumentParser(prog="python -m stitchcuda.gateway")
    parser.add_argument("--host", default=None)
    parser.add_argument("--grpc-port", type=int, default=None)
    parser.add_argument("--http-port", type=int, default=None)
    args = parser.parse_args(argv)
    overrides = {k: v for k, v in (("host", args.host), ("grpc_port", args.grpc_port),
                                   ("http_port", args.http_port)) if v is not None}  # fmt: skip
    settings = GatewaySettings(**overrides)
    configure_logging(settings.log_level, json_output=settings.log_json)
    try:
        asyncio.run(serve(settings))
    except KeyboardInterrupt:
        pass
    return 0
