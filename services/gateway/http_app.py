"""The HTTP front (FastAPI): the JobService operations, server-sent events for Watch, health and metrics.

`create_app(settings, services)` is the composition root: services live on `app.state`, routes reach
them through typed dependencies, and every domain error becomes a JSON error with the status from
the one table in `errors.py`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from stitchcuda.api.v1 import gateway_pb2
from stitchcuda.gateway.convert import event_to_sse, parse_binary, parse_json, parse_state, to_json
from stitchcuda.gateway.errors import error_body, status_of
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import Tenant
from stitchcuda.gateway.wiring import GatewayServices, build_services
from stitchcuda.shared.errors import InvalidRequest, StitchError

log = logging.getLogger("stitchcuda.gateway.http")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]

_SUBMIT_SCHEMA = {
    "type": "object",
    "required": ["spec"],
    "properties": {
        "schema_version": {"type": "integer", "example": 1},
        "spec": {
            "type": "object",
            "required": ["reference_source"],
            "properties": {
                "problem_name": {"type": "string"},
                "reference_source": {"type": "string", "description": "KernelBench-format program"},
                "device": {"type": "string", "enum": ["DEVICE_AUTO", "DEVICE_CPU", "DEVICE_CUDA"]},
                "options": {"type": "object", "description": "JobOptions (max_rounds, target_speedup, ...)"},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "idempotency_key": {"type": "string"},
            },
        },
    },
}


class LimitsAndMetrics:
    """ASGI middleware: refuses oversized bodies before they are read, and times every request."""

    def __init__(self, app: ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body:
            exc = InvalidRequest(f"the request body is {int(length)} bytes (limit {self.max_body})")
            response = JSONResponse(error_body(exc), status_code=413)
            await response(scope, receive, send)
            return
        started, status = time.perf_counter(), [500]

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            method = f"{scope.get('method', '')} {getattr(route, 'path', 'unmatched')}"
            _observe(method, status[0], started)


def _observe(method: str, status: int, started: float) -> None:
    try:
        from stitchcuda.shared import metrics
    except ImportError:
        return
    metrics.REQUESTS.inc(transport="http", method=method, code=str(status))
    metrics.REQUEST_SECONDS.observe(time.perf_counter() - started, transport="http", method=method)


# -- dependencies ---------------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False)
_api_key = APIKeyHeader(name="x-api-key", auto_error=False)


def get_services(request: Request) -> GatewayServices:
    services: GatewayServices = request.app.state.services
    return services


Services = Annotated[GatewayServices, Depends(get_services)]


def get_tenant(
    services: Services,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    api_key: Annotated[str | None, Depends(_api_key)],
) -> Tenant:
    return services.jobs.authenticate(bearer.credentials if bearer else api_key)


CurrentTenant = Annotated[Tenant, Depends(get_tenant)]


async def _parse_submit(request: Request, limit: int) -> gateway_pb2.SubmitRequest:
    body = await request.body()
    if len(body) > limit:
        raise InvalidRequest(f"the request body is {len(body)} bytes (limit {limit})")
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    if kind in ("application/x-protobuf", "application/protobuf", "application/octet-stream"):
        return parse_binary(body, gateway_pb2.SubmitRequest)
    try:
        data = json.loads(body or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidRequest(f"the body is not valid JSON: {exc}") from exc
    return parse_json(data, gateway_pb2.SubmitRequest)


def create_app(settings: GatewaySettings, services: GatewayServices | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = services is None
        svc = build_services(settings) if services is None else services
        app.state.services = svc
        app.state.watch_pool = ThreadPoolExecutor(settings.watch_threads, thread_name_prefix="sse-watch")
        try:
            from stitchcuda.shared import metrics

            for collector in svc.collectors:
                metrics.register_collector(collector)
        except ImportError:
            pass
        try:
            yield
        finally:
            app.state.watch_pool.shutdown(wait=False, cancel_futures=True)
            if owned:
                svc.close()

    app = FastAPI(
        title="StitchCUDA",
        version="1",
        summary="Submit PyTorch reference programs; get verified, faster GPU programs back.",
        lifespan=lifespan,
    )
    app.add_middleware(LimitsAndMetrics, max_body=settings.max_request_bytes())

    @app.exception_handler(StitchError)
    async def _domain_error(request: Request, exc: StitchError) -> JSONResponse:
        return JSONResponse(error_body(exc), status_code=status_of(exc).http)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        reason = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in exc.errors()
        )
        return JSONResponse(error_body(InvalidRequest(reason or "invalid request")), status_code=400)

    submit_body = {
        "required": True,
        "content": {
            "application/json": {"schema": _SUBMIT_SCHEMA},
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
        },
    }

    @app.post("/v1/jobs", tags=["jobs"], openapi_extra={"requestBody": submit_body})
    async def submit(request: Request, services: Services, tenant: CurrentTenant) -> dict[str, Any]:
        """Submits a job (a SubmitRequest as JSON or binary protobuf); idempotent on spec.idempotency_key."""
        message = await _parse_submit(request, settings.max_request_bytes())
        job = await run_in_threadpool(services.jobs.submit, tenant, message)
        return to_json(job)

    @app.get("/v1/jobs", tags=["jobs"])
    def list_jobs(
        services: Services,
        tenant: CurrentTenant,
        page_size: Annotated[int, Query(ge=0, le=500)] = 50,
        page_token: str = "",
        state: str = "",
    ) -> dict[str, Any]:
        """The tenant's jobs, newest first (without their reference sources)."""
        page = services.jobs.list(
            tenant, state=parse_state(state), page_size=page_size, page_token=page_token
        )
        return to_json(page)

    @app.get("/v1/jobs/{job_id}", tags=["jobs"])
    def get_job(job_id: str, services: Services, tenant: CurrentTenant) -> dict[str, Any]:
        return to_json(services.jobs.get(tenant, job_id))

    @app.post("/v1/jobs/{job_id}/cancel", tags=["jobs"])
    async def cancel_job(
        job_id: str, request: Request, services: Services, tenant: CurrentTenant
    ) -> dict[str, Any]:
        """Cancels the job: queued work is dropped, running work is terminated."""
        body = await request.body()
        reason = ""
        if body:
            try:
                reason = str(json.loads(body).get("reason", ""))
            except (ValueError, AttributeError) as exc:
                raise InvalidRequest('the body must be a JSON object like {"reason": "..."}') from exc
        return to_json(await run_in_threadpool(services.jobs.cancel, tenant, job_id, reason))

    @app.get("/v1/jobs/{job_id}/events", tags=["jobs"], response_class=StreamingResponse)
    async def watch_job(
        job_id: str,
        request: Request,
        services: Services,
        tenant: CurrentTenant,
        after_seq: str = "",
        last_event_id: Annotated[str | None, Header()] = None,
    ) -> StreamingResponse:
        """Server-sent events of the job (resume: ?after_seq= or Last-Event-ID) until its final state."""
        watch = await run_in_threadpool(services.jobs.watch, tenant, job_id, after_seq or last_event_id or "")
        pool: ThreadPoolExecutor = request.app.state.watch_pool

        async def stream() -> AsyncIterator[str]:
            # One chunk per poll, and nothing written once the client is gone: uvicorn's send does not
            # yield while the socket takes the data, so a poll's events written one by one to a client
            # that left mid-batch never let the event loop see the close, and asyncio logged each
            # write ("socket.send() raised exception.", thousands for a long history).
            sent = 0
            try:
                yield "retry: 2000\n\n"
                loop = asyncio.get_running_loop()
                while not watch.done:
                    if await request.is_disconnected():
                        return
                    try:
                        events = await loop.run_in_executor(pool, watch.poll, settings.watch_wait_s)
                    except StitchError as exc:
                        yield f"event: error\ndata: {json.dumps(error_body(exc))}\n\n"
                        return
                    if await request.is_disconnected():
                        return
                    yield "".join(event_to_sse(event) for event in events) or ": keep-alive\n\n"
                    sent += len(events)
                yield "event: end\ndata: {}\n\n"
            finally:
                if not watch.done:
                    log.debug("event stream of job %s closed by the client after %d events", job_id, sent)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    @app.get("/v1/jobs/{job_id}/artifacts/{name}", tags=["artifacts"], response_class=Response)
    def download(job_id: str, name: str, services: Services, tenant: CurrentTenant) -> Response:
        """The artifact's bytes ("result" = model_new.py, "report" = report.json, or a Job.artifacts name)."""
        artifact = services.jobs.download(tenant, job_id, name)
        disposition = f'attachment; filename="{artifact.name}"'
        return Response(
            artifact.data, media_type=artifact.content_type, headers={"Content-Disposition": disposition}
        )

    @app.get("/v1/jobs/{job_id}/artifacts/{name}/url", tags=["artifacts"])
    def artifact_url(
        job_id: str, name: str, services: Services, tenant: CurrentTenant, expires_s: int = 0
    ) -> dict[str, Any]:
        """A presigned S3 URL for the artifact (empty where the store cannot presign)."""
        return to_json(services.jobs.artifact_url(tenant, job_id, name, expires_s))

    @app.get("/healthz", tags=["operations"])
    def healthz() -> dict[str, str]:
        """Liveness: the process serves requests (which one, for a gateway of several processes)."""
        return {"status": "ok", "process": str(os.getpid())}

    @app.get("/readyz", tags=["operations"])
    def readyz(services: Services) -> JSONResponse:
        """Readiness: Redis and S3 answer."""
        checks = services.readiness()
        ok = all(v == "ok" for v in checks.values())
        return JSONResponse(
            {"status": "ok" if ok else "unavailable", "checks": checks}, status_code=200 if ok else 503
        )

    @app.get("/metrics", tags=["operations"], response_class=Response)
    def prometheus() -> Response:
        try:
            from stitchcuda.shared import metrics
        except ImportError:
            return Response(b"", media_type="text/plain")
        body, content_type = metrics.render_latest()
        return Response(body, media_type=content_type)

    return app
