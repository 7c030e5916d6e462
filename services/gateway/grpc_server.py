"""The gRPC front (grpc.aio): JobService of gateway.proto over the JobService class; health; reflection.

Requests arrive as raw bytes and are parsed here, so a corrupt message or one with fields of a newer
schema is answered INVALID_ARGUMENT with the reason (grpc's own deserializer would say INTERNAL).
The API key comes from `authorization: Bearer <key>` or `x-api-key` metadata.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from stitchcuda.api.v1 import gateway_pb2
from stitchcuda.gateway.convert import parse_binary
from stitchcuda.gateway.errors import INTERNAL, Status, status_of
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import Tenant
from stitchcuda.gateway.wiring import GatewayServices
from stitchcuda.shared.errors import StitchError

log = logging.getLogger("stitchcuda.gateway.grpc")

SERVICE = "stitchcuda.api.v1.JobService"
T = TypeVar("T")
M = TypeVar("M", bound=Message)


def api_key_from(metadata: Any) -> str | None:
    for key, value in metadata or ():
        if key == "authorization" and isinstance(value, str) and value.lower().startswith("bearer "):
            return value[7:].strip()
        if key == "x-api-key" and isinstance(value, str):
            return value.strip()
    return None


def _observe(method: str, code: grpc.StatusCode, started: float) -> None:
    try:
        from stitchcuda.shared import metrics
    except ImportError:
        return
    metrics.REQUESTS.inc(transport="grpc", method=method, code=code.name)
    metrics.REQUEST_SECONDS.observe(time.perf_counter() - started, transport="grpc", method=method)


class JobServicer:
    """Adapters only: authenticate, parse, call the JobService in a thread, map the result or error."""

    def __init__(self, services: GatewayServices, settings: GatewaySettings) -> None:
        self.jobs = services.jobs
        self.settings = settings
        self.pool = ThreadPoolExecutor(settings.request_threads, thread_name_prefix="grpc-req")
        self.watch_pool = ThreadPoolExecutor(settings.watch_threads, thread_name_prefix="grpc-watch")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.watch_pool.shutdown(wait=False, cancel_futures=True)

    async def _run(self, pool: ThreadPoolExecutor, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn)

    async def _unary(
        self,
        method: str,
        data: bytes,
        context: grpc.aio.ServicerContext,
        request_type: type[M],
        call: Callable[[Tenant, M], T],
    ) -> T:
        started = time.perf_counter()
        key = api_key_from(context.invocation_metadata())

        def run() -> T:
            tenant = self.jobs.authenticate(key)
            return call(tenant, parse_binary(data, request_type))

        try:
            result = await self._run(self.pool, run)
        except Exception as exc:
            status, message = self._status(context, exc)
            _observe(method, status.grpc, started)
            await context.abort(status.grpc, message)
            raise  # abort raises; this line is for the type checker
        _observe(method, grpc.StatusCode.OK, started)
        return result

    def _status(self, context: grpc.aio.ServicerContext, exc: BaseException) -> tuple[Status, str]:
        if isinstance(exc, StitchError):
            context.set_trailing_metadata((("stitch-error-code", exc.code),))
            return status_of(exc), exc.message
        log.error("unexpected error in a gRPC call", exc_info=exc)
        return INTERNAL, "internal error"

    # -- unary methods ------------------------------------------------------------------------------------

    async def Submit(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return await self._unary("Submit", data, context, gateway_pb2.SubmitRequest, self.jobs.submit)

    async def Get(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return await self._unary(
            "Get", data, context, gateway_pb2.GetJobRequest, lambda t, r: self.jobs.get(t, r.job_id)
        )

    async def Cancel(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return await self._unary(
            "Cancel",
            data,
            context,
            gateway_pb2.CancelRequest,
            lambda t, r: self.jobs.cancel(t, r.job_id, r.reason),
        )

    async def List(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return await self._unary(
            "List",
            data,
            context,
            gateway_pb2.ListJobsRequest,
            lambda t, r: self.jobs.list(t, state=r.state, page_size=r.page_size, page_token=r.page_token),
        )

    async def GetArtifactUrl(self, data: bytes, context: grpc.aio.ServicerContext) -> Message:  # noqa: N802
        return await self._unary(
            "GetArtifactUrl",
            data,
            context,
            gateway_pb2.ArtifactUrlRequest,
            lambda t, r: self.jobs.artifact_url(t, r.job_id, r.name, r.expires_s),
        )

    # -- streams ---------------------------------------------------------------------------------------

    async def Watch(self, data: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[Message]:  # noqa: N802
        started = time.perf_counter()
        watch = await self._unary(
            "Watch",
            data,
            context,
            gateway_pb2.WatchRequest,
            lambda t, r: self.jobs.watch(t, r.job_id, r.after_seq),
        )
        wait_s = self.settings.watch_wait_s
        while not watch.done:
            try:
                events = await self._run(self.watch_pool, functools.partial(watch.poll, wait_s))
            except Exception as exc:
                status, message = self._status(context, exc)
                _observe("WatchStream", status.grpc, started)
                await context.abort(status.grpc, message)
                return
            for event in events:
                yield event

    async def DownloadArtifact(  # noqa: N802
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Message]:
        artifact = await self._unary(
            "DownloadArtifact",
            data,
            context,
            gateway_pb2.DownloadRequest,
            lambda t, r: self.jobs.download(t, r.job_id, r.name),
        )
        size, step = len(artifact.data), self.settings.download_chunk_bytes
        for offset in range(0, max(size, 1), step):
            yield gateway_pb2.ArtifactChunk(
                name=artifact.name, data=artifact.data[offset : offset + step], offset=offset, total_size=size
            )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_job_service(server: grpc.aio.Server, servicer: JobServicer) -> None:
    unary = {
        name: grpc.unary_unary_rpc_method_handler(getattr(servicer, name), response_serializer=_serialize)
        for name in ("Submit", "Get", "Cancel", "List", "GetArtifactUrl")
    }
    streams = {
        name: grpc.unary_stream_rpc_method_handler(getattr(servicer, name), response_serializer=_serialize)
        for name in ("Watch", "DownloadArtifact")
    }
    handlers = {**unary, **streams}
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))


class GrpcFront:
    """The gRPC server of the gateway process: JobService, health and reflection on one port."""

    def __init__(self, settings: GatewaySettings, services: GatewayServices) -> None:
        self.settings = settings
        self.server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", settings.max_request_bytes()),
                ("grpc.max_send_message_length", 4 * settings.download_chunk_bytes),
                # A second gateway on a taken port must fail, not silently share it, unless this is
                # one of the processes of a multi-process gateway.
                ("grpc.so_reuseport", 1 if settings.shares_port() else 0),
                ("grpc.keepalive_time_ms", 30_000),
                ("grpc.http2.max_pings_without_data", 0),
                ("grpc.keepalive_permit_without_calls", 1),
            ]
        )
        self.servicer = JobServicer(services, settings)
        add_job_service(self.server, self.servicer)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot listen for gRPC on {host}:{port}")
        await self.server.start()
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("gRPC listening on %s:%d", host, self.port)
        return self.port

    async def stop(self, grace_s: float = 5.0) -> None:
        for name in ("", SERVICE):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(grace_s)
        self.servicer.close()
