"""The gateway's transport-free application service: submit, get, watch, cancel, list and download jobs.

Both fronts (gRPC and HTTP) and the tests call this class; it knows tenants, not transports. A
tenant only ever sees its own jobs and artifacts: anything else is NotFound, exactly as if it did
not exist, so job ids of other tenants cannot even be probed.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import logging
import re
import sys
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from stitchcuda.api.v1 import gateway_pb2, jobs_pb2
from stitchcuda.gateway.convert import TERMINAL_STATES, check_version, job_summary, unknown_field_paths
from stitchcuda.gateway.settings import GatewaySettings
from stitchcuda.gateway.tenancy import Tenancy, Tenant
from stitchcuda.shared.artifacts import Keys, sha256_hex
from stitchcuda.shared.errors import InvalidRequest, NotFound, ProblemError, StitchError
from stitchcuda.shared.problem import validate_source
from stitchcuda.shared.workflow import Workflow

log = logging.getLogger("stitchcuda.gateway")

ALIASES = {"result": "model_new.py", "report": "report.json"}
CONTENT_TYPES = {
    ".py": "text/x-python",
    ".json": "application/json",
    ".html": "text/html; charset=utf-8",
    ".pb": "application/x-protobuf",
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,199}$")
_BACKENDS = frozenset({"", "builtin", "llm"})
# Digests of references that passed the static checks (the checks depend only on the source).
_VALID_SOURCES = 4096


@functools.lru_cache(maxsize=1024)
def _importable(module: str) -> bool:
    # find_spec on a top-level name consults the finders only: nothing of the module runs here.
    return module in sys.stdlib_module_names or importlib.util.find_spec(module) is not None


def missing_imports(source: str | ast.Module) -> list[str]:
    """Modules the reference imports that this platform does not have (checked without running it)."""
    missing: set[str] = set()
    tree = ast.parse(source) if isinstance(source, str) else source
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            missing.add("." * node.level + (node.module or ""))
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            try:
                ok = _importable(top)
            except (ImportError, ValueError):
                ok = False
            if not ok:
                missing.add(top)
    return sorted(missing)


@dataclass(frozen=True)
class Artifact:
    name: str
    key: str
    data: bytes
    content_type: str


class Watch:
    """A cursor over one job's events; `done` once the final state's event has been read."""

    def __init__(self, workflow: Workflow, job: jobs_pb2.Job, after_seq: str) -> None:
        self._jobs = workflow.jobs
        self.job_id = job.job_id
        self.after_seq = after_seq
        self._ended = job.status.state in TERMINAL_STATES
        self.done = False
        # The first read happens now, so a bad seq is refused before a stream opens.
        self._pending = self._read(0.0)

    def _read(self, wait_s: float) -> list[jobs_pb2.JobEvent]:
        events = self._jobs.read_events(self.job_id, self.after_seq, timeout_s=0.0 if self._ended else wait_s)
        if events:
            self.after_seq = events[-1].seq
            if any(e.kind == jobs_pb2.EVENT_KIND_STATE and e.state in TERMINAL_STATES for e in events):
                self._ended = True
        elif self._ended:
            self.done = True
        return events

    def poll(self, wait_s: float) -> list[jobs_pb2.JobEvent]:
        """The next events, waiting up to wait_s for the first; [] on a quiet interval."""
        if self._pending:
            events, self._pending = self._pending, []
            return events
        if self.done:
            return []
        return self._read(wait_s)

    def __iter__(self) -> Iterator[jobs_pb2.JobEvent]:
        while not self.done:
            yield from self.poll(5.0)


class JobService:
    def __init__(
        self,
        workflow: Workflow,
        tenancy: Tenancy,
        settings: GatewaySettings,
        *,
        stop_work: Callable[[str], object] | None = None,
        presign: Callable[[str, int], str] | None = None,
    ) -> None:
        self.workflow = workflow
        self.jobs = workflow.jobs
        self.artifacts = workflow.artifacts
        self.tenancy = tenancy
        self.settings = settings
        self._stop_work = stop_work
        self._presign = presign
        self._valid_sources: OrderedDict[bytes, None] = OrderedDict()
        self._valid_lock = threading.Lock()

    def authenticate(self, api_key: str | None) -> Tenant:
        tenant = self.tenancy.authenticate(api_key)
        self.tenancy.check_rate(tenant, "requests")
        return tenant

    # -- submit ----------------------------------------------------------------------------------------

    def submit(self, tenant: Tenant, request: gateway_pb2.SubmitRequest) -> jobs_pb2.Job:
        check_version(request.schema_version)
        unknown = unknown_field_paths(request)
        if unknown:
            raise InvalidRequest(
                f"the request has fields this gateway does not know: {', '.join(unknown[:10])}"
            )
        spec = jobs_pb2.JobSpec()
        spec.CopyFrom(request.spec)
        self._validate(spec)
        self.tenancy.check_rate(tenant, "submits")
        job_id = uuid.uuid4().hex[:20]
        replayable = bool(spec.idempotency_key)
        if replayable:
            # A replay maps to the same id; the reservation finds the first job before taking a slot.
            job_id = sha256_hex(tenant.tenant_id, spec.idempotency_key)[:20]
        if not self.tenancy.admit(tenant, job_id, spec.device, unless_exists=replayable):
            return self.get(tenant, job_id)
        try:
            job = self.workflow.submit(spec, tenant.tenant_id, job_id=job_id, validated=True)
        except BaseException:
            self.tenancy.release(tenant, job_id)
            raise
        if job.job_id != job_id:  # an idempotent replay: the first submission holds the slot
            self.tenancy.release(tenant, job_id)
        _count_submitted(tenant.tenant_id)
        return job

    def _validate(self, spec: jobs_pb2.JobSpec) -> None:
        name = spec.problem_name or "reference"
        if spec.problem_name and not _NAME.match(spec.problem_name):
            raise InvalidRequest("problem_name: letters, digits, '.', '_' and '-' only, at most 200")
        self._check_reference(spec.reference_source, name)
        if spec.device not in jobs_pb2.Device.values():
            raise InvalidRequest(f"unknown device {spec.device}")
        if spec.device in (jobs_pb2.DEVICE_UNSPECIFIED, jobs_pb2.DEVICE_AUTO):
            spec.device = jobs_pb2.DEVICE_CUDA if self.settings.auto_device == "cuda" else jobs_pb2.DEVICE_CPU
        opts = spec.options
        if opts.max_rounds > self.settings.max_rounds_limit:
            raise InvalidRequest(
                f"max_rounds {opts.max_rounds} is above the limit {self.settings.max_rounds_limit}"
            )
        if opts.samples > self.settings.max_samples_limit:
            raise InvalidRequest(
                f"samples {opts.samples} is above the limit {self.settings.max_samples_limit}"
            )
        if opts.coder_backend not in _BACKENDS:
            raise InvalidRequest(f"unknown coder_backend {opts.coder_backend!r}: builtin or llm")
        if opts.target_speedup < 0 or opts.min_improvement < 0:
            raise InvalidRequest("target_speedup and min_improvement cannot be negative")
        if len(spec.labels) > 32 or any(len(k) > 63 or len(v) > 256 for k, v in spec.labels.items()):
            raise InvalidRequest("at most 32 labels, keys up to 63 and values up to 256 characters")
        if len(spec.idempotency_key) > 200:
            raise InvalidRequest("idempotency_key is longer than 200 characters")

    def _check_reference(self, source: str, name: str) -> None:
        """Static checks of the reference; sources that passed are remembered by digest (resubmits)."""
        digest = hashlib.sha256(source.encode()).digest()
        with self._valid_lock:
            if digest in self._valid_sources:
                self._valid_sources.move_to_end(digest)
                return
        tree = validate_source(source, max_bytes=self.settings.max_reference_bytes, name=name)
        missing = missing_imports(tree)
        if missing:
            raise ProblemError(
                f"{name}: the reference imports modules that are not available: {', '.join(missing)}"
            )
        with self._valid_lock:
            self._valid_sources[digest] = None
            while len(self._valid_sources) > _VALID_SOURCES:
                self._valid_sources.popitem(last=False)

    # -- read --------------------------------------------------------------------------------------------

    def get(self, tenant: Tenant, job_id: str) -> jobs_pb2.Job:
        if not job_id:
            raise InvalidRequest("job_id is required")
        try:
            job = self.jobs.get(job_id)
        except NotFound:
            raise NotFound(f"job not found: {job_id}") from None
        if job.tenant_id != tenant.tenant_id:
            raise NotFound(f"job not found: {job_id}")
        return job

    def watch(self, tenant: Tenant, job_id: str, after_seq: str = "") -> Watch:
        return Watch(self.workflow, self.get(tenant, job_id), after_seq)

    def list(
        self, tenant: Tenant, *, state: int = 0, page_size: int = 50, page_token: str = ""
    ) -> gateway_pb2.ListJobsResponse:
        size = min(max(page_size or 50, 1), 500)
        jobs, token = self.jobs.list_jobs(tenant.tenant_id, state=state, limit=size, page_token=page_token)
        return gateway_pb2.ListJobsResponse(jobs=[job_summary(j) for j in jobs], next_page_token=token)

    # -- cancel ------------------------------------------------------------------------------------------

    def cancel(self, tenant: Tenant, job_id: str, reason: str = "") -> jobs_pb2.Job:
        job = self.get(tenant, job_id)
        if job.status.state in TERMINAL_STATES:
            return job
        job = self.workflow.cancel(job_id, reason or f"cancelled by tenant {tenant.tenant_id}")
        if self._stop_work is not None:
            try:
                self._stop_work(job_id)
            except StitchError as exc:
                # The job is cancelled either way: its remaining messages are dropped when they arrive.
                log.warning("could not stop the running work of job %s: %s", job_id, exc)
        self.tenancy.release(tenant, job_id)
        return job

    # -- artifacts ---------------------------------------------------------------------------------------

    def _artifact_key(self, tenant: Tenant, job_id: str, name: str) -> tuple[jobs_pb2.Job, str, str]:
        job = self.get(tenant, job_id)
        name = ALIASES.get(name, name)
        key = job.artifacts.get(name)
        # The prefix check is a second wall: a key outside the tenant's folder is never served.
        if not key or not key.startswith(Keys.job(tenant.tenant_id, job_id) + "/"):
            available = ", ".join(sorted(job.artifacts)) or "none yet"
            raise NotFound(f"job {job_id} has no artifact {name!r} (available: {available})")
        return job, name, key

    def download(self, tenant: Tenant, job_id: str, name: str) -> Artifact:
        job, name, key = self._artifact_key(tenant, job_id, name)
        if name == "reference" and job.spec.reference_source:
            # The job record carries the reference (small ones are stored nowhere else).
            data = job.spec.reference_source.encode()
        else:
            data = self.artifacts.get(key)
        suffix = "." + name.rsplit(".", 1)[-1] if "." in name else ""
        return Artifact(name, key, data, CONTENT_TYPES.get(suffix, "application/octet-stream"))

    def artifact_url(
        self, tenant: Tenant, job_id: str, name: str, expires_s: int = 0
    ) -> gateway_pb2.ArtifactUrl:
        job, name, key = self._artifact_key(tenant, job_id, name)
        expires = min(expires_s or self.settings.presign_expires_s, 7 * 24 * 3600)
        out = gateway_pb2.ArtifactUrl(name=name)
        if self._presign is not None:
            if name == "reference" and job.spec.reference_source and not self.artifacts.exists(key):
                # A reference kept inline at submit is copied to the store the first time a URL names it.
                self.artifacts.put(key, job.spec.reference_source.encode(), "text/x-python")
            out.url = self._presign(key, expires)
            out.expires_at.GetCurrentTime()
            out.expires_at.seconds += expires
        return out


def _count_submitted(tenant_id: str) -> None:
    try:
        from stitchcuda.shared import metrics
    except ImportError:
        return
    metrics.JOBS_SUBMITTED.inc(tenant=tenant_id)
