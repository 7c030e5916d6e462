"""The gateway process: gRPC and HTTP served from one event loop over one set of services."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import subprocess
import sys
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
    if settings.gateway_processes > 1 and not (owned and settings.job_store == "redis"):
        raise ValueError("several gateway processes need the Redis job store and their own services")
    services = services or build_services(settings)
    grpc_front = GrpcFront(settings, services)
    grpc_port = await grpc_front.start(settings.host, settings.grpc_port)
    app = create_app(settings, services)
    http_socket = _shared_socket(settings.host, settings.http_port) if settings.shares_port() else None
    siblings: list[subprocess.Popen[bytes]] = []
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
        if settings.gateway_processes > 1 and not settings.share_port:
            siblings.extend(_start_siblings(settings, grpc_port, int(http_port)))
        log.info("gateway ready: gRPC :%d, HTTP :%d", grpc_port, http_port)
        if on_ready is not None:
            on_ready(Listening(grpc_port, int(http_port)))

    stopper = asyncio.create_task(watch_stop())
    announcer = asyncio.create_task(announce())
    try:
        await http.serve(sockets=[http_socket] if http_socket is not None else None)
    finally:
        stopper.cancel()
        announcer.cancel()
        _stop_siblings(siblings)
        await grpc_front.stop()
        if owned:
            services.close()
        log.info("gateway stopped")


def _shared_socket(host: str, port: int) -> socket.socket:
    """The HTTP listening socket with SO_REUSEPORT, so the gateway's other processes can bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(4096)
    sock.setblocking(False)
    return sock


def _start_siblings(
    settings: GatewaySettings, grpc_port: int, http_port: int
) -> list[subprocess.Popen[bytes]]:
    """The other processes of the gateway, on the ports this one bound (port 0 resolved)."""
    command = [sys.executable, "-m", "stitchcuda.gateway", "--host", settings.host,
               "--grpc-port", str(grpc_port), "--http-port", str(http_port)]  # fmt: skip
    env = {**os.environ, "STITCH_SHARE_PORT": "1", "STITCH_GATEWAY_PROCESSES": "1"}
    log.info("starting %d more gateway processes", settings.gateway_processes - 1)
    return [subprocess.Popen(command, env=env) for _ in range(settings.gateway_processes - 1)]


def _stop_siblings(siblings: list[subprocess.Popen[bytes]], timeout_s: float = 10.0) -> None:
    for proc in siblings:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in siblings:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
