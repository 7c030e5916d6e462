"""The gRPC client of the gateway, and `stitchcuda submit PROBLEM.py --gateway HOST:PORT [--watch]`."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import grpc
from rich.console import Console

from stitchcuda.api.v1 import gateway_pb2, gateway_pb2_grpc, jobs_pb2
from stitchcuda.shared.devices import NAMES
from stitchcuda.shared.envelope import SCHEMA_VERSION
from stitchcuda.shared.report import vs_compile

TERMINAL = frozenset({jobs_pb2.JOB_STATE_SUCCEEDED, jobs_pb2.JOB_STATE_FAILED, jobs_pb2.JOB_STATE_CANCELLED})
RESULT_FILES = ("model_new.py", "report.json", "report.html", "candidate.pb")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNAVAILABLE = 0, 1, 2, 3
_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


def default_key_file() -> Path:
    """Where `stitchcuda up` leaves the local tenant's key (under STITCH_HOME, default ~/.stitchcuda)."""
    return Path(os.environ.get("STITCH_HOME") or Path.home() / ".stitchcuda") / "api_key"


def resolve_api_key(api_key: str | None) -> str | None:
    if api_key:
        return api_key
    if os.environ.get("STITCH_API_KEY"):
        return os.environ["STITCH_API_KEY"]
    path = default_key_file()
    return path.read_text().strip() if path.is_file() else None


class GatewayClient:
    """JobService over gRPC with the API key on every call; Watch resumes after a dropped stream."""

    def __init__(self, target: str, api_key: str | None = None, *, timeout_s: float = 30.0) -> None:
        self.channel = grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)])
        self.stub = gateway_pb2_grpc.JobServiceStub(self.channel)
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self.timeout_s = timeout_s

    def __enter__(self) -> GatewayClient:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def submit(self, spec: jobs_pb2.JobSpec, *, retries: int = 3) -> jobs_pb2.Job:
        """Retries transient failures with the same idempotency key, so a retry never makes two jobs."""
        if not spec.idempotency_key:
            spec.idempotency_key = uuid.uuid4().hex
        request = gateway_pb2.SubmitRequest(spec=spec, schema_version=SCHEMA_VERSION)
        for attempt in range(retries + 1):
            try:
                job: jobs_pb2.Job = self.stub.Submit(request, metadata=self.metadata, timeout=self.timeout_s)
                return job
            except grpc.RpcError as exc:
                if exc.code() not in _RETRYABLE or attempt == retries:
                    raise
                time.sleep(0.5 * 2**attempt)
        raise AssertionError("unreachable")

    def get(self, job_id: str) -> jobs_pb2.Job:
        job: jobs_pb2.Job = self.stub.Get(
            gateway_pb2.GetJobRequest(job_id=job_id), metadata=self.metadata, timeout=self.timeout_s
        )
        return job

    def cancel(self, job_id: str, reason: str = "") -> jobs_pb2.Job:
        job: jobs_pb2.Job = self.stub.Cancel(
            gateway_pb2.CancelRequest(job_id=job_id, reason=reason),
            metadata=self.metadata,
            timeout=self.timeout_s,
        )
        return job

    def list(
        self, *, page_size: int = 50, page_token: str = "", state: int = 0
    ) -> gateway_pb2.ListJobsResponse:
        request = gateway_pb2.ListJobsRequest(page_size=page_size, page_token=page_token, state=state)  # type: ignore[arg-type]
        page: gateway_pb2.ListJobsResponse = self.stub.List(
            request, metadata=self.metadata, timeout=self.timeout_s
        )
        return page

    def watch(
        self,
        job_id: str,
        after_seq: str = "",
        *,
        reconnects: int = 20,
        deadline: float | None = None,
    ) -> Iterator[jobs_pb2.JobEvent]:
        """Events until the job ends (or `deadline`, a time.monotonic() value, passes: the stream then
        just ends); a dropped stream (gateway restart) resumes after the last seq."""
        failures = 0
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            try:
                for event in self.stub.Watch(
                    gateway_pb2.WatchRequest(job_id=job_id, after_seq=after_seq),
                    metadata=self.metadata,
                    timeout=remaining,
                ):
                    after_seq, failures = event.seq, 0
                    yield event
                return
            except grpc.RpcError as exc:
                if deadline is not None and exc.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                    return
                failures += 1
                if exc.code() not in _RETRYABLE or failures > reconnects:
                    raise
                time.sleep(min(5.0, 0.2 * 2**failures))

    def download(self, job_id: str, name: str) -> bytes:
        chunks = self.stub.DownloadArtifact(
            gateway_pb2.DownloadRequest(job_id=job_id, name=name), metadata=self.metadata, timeout=120
        )
        return b"".join(chunk.data for chunk in chunks)

    def artifact_url(self, job_id: str, name: str, expires_s: int = 0) -> gateway_pb2.ArtifactUrl:
        url: gateway_pb2.ArtifactUrl = self.stub.GetArtifactUrl(
            gateway_pb2.ArtifactUrlRequest(job_id=job_id, name=name, expires_s=expires_s),
            metadata=self.metadata,
            timeout=self.timeout_s,
        )
        return url

    def wait(self, job_id: str, timeout_s: float = 3600.0) -> jobs_pb2.Job:
        """Follows the job's events until it ends (or the timeout) and returns its final record."""
        for _ in self.watch(job_id, deadline=time.monotonic() + timeout_s):
            pass
        return self.get(job_id)


def download_results(client: GatewayClient, job: jobs_pb2.Job, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in RESULT_FILES:
        if name in job.artifacts:
            path = out / name
            path.write_bytes(client.download(job.job_id, name))
            written.append(path)
    return written


def _exit_for(code: grpc.StatusCode) -> int:
    if code in _RETRYABLE:
        return EXIT_UNAVAILABLE
    return EXIT_USAGE


def submit_main(
    problem: Path,
    gateway: str,
    watch: bool,
    out: Path | None,
    api_key: str | None,
    device: str,
    rounds: int,
) -> int:
    """Submits PROBLEM over gRPC; with watch, follows live progress; with out, downloads the result.

    Exit codes: 0 submitted (or, when following, succeeded), 1 the job failed or was cancelled,
    2 the request was refused (bad input, API key, quota), 3 the gateway is unreachable.
    """
    from stitchcuda.progress import EventPrinter, describe_job

    console = Console(stderr=True)
    key = resolve_api_key(api_key)
    if device not in NAMES:
        console.print(f"[bold red]error:[/] unknown device {device!r}: auto, cpu or cuda")
        return EXIT_USAGE
    try:
        source = problem.read_text()
    except OSError as exc:
        console.print(f"[bold red]error:[/] cannot read {problem}: {exc}")
        return EXIT_USAGE
    spec = jobs_pb2.JobSpec(
        problem_name=problem.stem,
        reference_source=source,
        device=NAMES[device],
        options=jobs_pb2.JobOptions(max_rounds=rounds),
    )
    with GatewayClient(gateway, key) as client:
        try:
            job = client.submit(spec)
            console.print(f"submitted job [bold]{job.job_id}[/] to {gateway}")
            if not watch and out is None:
                print(job.job_id)
                return EXIT_OK
            if watch:
                printer = EventPrinter(console)
                try:
                    for event in client.watch(job.job_id):
                        printer(event)
                finally:
                    printer.stop()
                job = client.get(job.job_id)
            else:
                job = client.wait(job.job_id)
            console.print(describe_job(job))
            if job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED:
                console.print(
                    f"[bold green]verified[/]: {job.status.best_speedup_vs_eager:.2f}x vs eager, "
                    f"{vs_compile(job.status.best_speedup_vs_compile)}"
                )
            if out is not None:
                for path in download_results(client, job, out):
                    console.print(f"  wrote {path}")
        except grpc.RpcError as exc:
            console.print(f"[bold red]error:[/] {exc.code().name}: {exc.details()}")
            return _exit_for(exc.code())
    print(job.job_id)
    return EXIT_OK if job.status.state == jobs_pb2.JOB_STATE_SUCCEEDED else EXIT_FAILED
