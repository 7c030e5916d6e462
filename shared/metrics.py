"""The Prometheus metrics every service exports (names, labels, buckets) and the helpers that serve them."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal, Protocol

from stitchcuda.api.v1 import jobs_pb2, verify_pb2

log = logging.getLogger("stitchcuda.metrics")

# prometheus_client lives in the [platform] extra: the embedded mode runs without it and every
# helper below degrades to a no-op, while the label checks still run (so tests catch typos).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


def _load_client() -> ModuleType | None:
    # A prefork Celery pool writes samples from child processes; the multiprocess mode keeps them in
    # files under PROMETHEUS_MULTIPROC_DIR, which must exist before the first metric is created.
    multiproc_dir = os.environ.get(MULTIPROC_ENV)
    if multiproc_dir:
        os.makedirs(multiproc_dir, exist_ok=True)
    try:
        return importlib.import_module("prometheus_client")
    except ImportError:
        return None


_prom = _load_client()
_core = importlib.import_module("prometheus_client.core") if _prom is not None else None
ENABLED = _prom is not None

Kind = Literal["counter", "histogram", "gauge"]

# Speedups below 1 are slower than eager PyTorch; above 10 the verifier sends the result to review.
SPEEDUP_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)
# Stages range from a Redis write (ms) to a cold nvcc build or an LLM round (minutes).
STAGE_BUCKETS = (0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
REQUEST_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)

# A closed set keeps the stage label's cardinality bounded; add a stage here before using it.
STAGES = frozenset(
    {
        "submit",
        "admit",
        "plan",
        "code",
        "llm",
        "build",
        "verify",
        "reference",
        "run",
        "correctness",
        "timing",
        "profile",
        "evaluate",
        "static",
        "judge",
        "round",
        "job",
    }
)


@dataclass(frozen=True)
class MetricSpec:
    """One metric family as scraped: its full name, type, help text, label names and buckets."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    # Labels whose values form a closed set, with that set: any other value is refused when emitted,
    # and a dashboard or alert matching a value outside it is a panel that stays empty (tests check).
    values: tuple[tuple[str, frozenset[str]], ...] = ()

    def closed_values(self) -> dict[str, frozenset[str]]:
        return dict(self.values)

    def series(self) -> frozenset[str]:
        """The sample names this family puts in the exposition (what PromQL can select)."""
        if self.kind == "counter":
            base = self.name.removesuffix("_total")
            return frozenset({self.name, f"{base}_created"})
        if self.kind == "histogram":
            return frozenset({f"{self.name}_{s}" for s in ("bucket", "sum", "count", "created")})
        return frozenset({self.name})


DEVICES = frozenset({"cpu", "cuda", "unspecified"})
STATES = frozenset({"succeeded", "failed", "cancelled"})
TASK_OUTCOMES = frozenset({"ok", "retry", "failed", "dropped", "duplicate", "malformed"})

JOBS_SUBMITTED_SPEC = MetricSpec(
    "stitch_jobs_submitted_total", "counter", "Jobs accepted by the gateway.", ("tenant",)
)
JOBS_FINISHED_SPEC = MetricSpec(
    "stitch_jobs_finished_total",
    "counter",
    "Jobs that reached a final state (succeeded, failed, cancelled).",
    ("tenant", "state"),
    values=(("state", STATES),),
)
JOB_SPEEDUP_EAGER_SPEC = MetricSpec(
    "stitch_job_speedup_vs_eager",
    "histogram",
    "Best speedup over eager PyTorch of each succeeded job.",
    ("device",),
    SPEEDUP_BUCKETS,
    values=(("device", DEVICES),),
)
JOB_SPEEDUP_COMPILE_SPEC = MetricSpec(
    "stitch_job_speedup_vs_compile",
    "histogram",
    "Speedup over torch.compile of each succeeded job's best program (where torch.compile was timed).",
    ("device",),
    SPEEDUP_BUCKETS,
    values=(("device", DEVICES),),
)
CANDIDATES_SPEC = MetricSpec(
    "stitch_candidates_total",
    "counter",
    "Candidates written by the Coder.",
    ("skill", "backend"),
    values=(("skill", frozenset({"generate", "optimize"})),),
)
VERDICTS_SPEC = MetricSpec(
    "stitch_verdicts_total",
    "counter",
    "Verdicts by device, acceptance and the rule that decided a rejection.",
    ("device", "accepted", "reason_rule"),
    values=(("device", DEVICES), ("accepted", frozenset({"true", "false"}))),
)
SPEEDUP_EAGER_SPEC = MetricSpec(
    "stitch_speedup_vs_eager",
    "histogram",
    "Speedup of accepted candidates over eager PyTorch.",
    ("device",),
    SPEEDUP_BUCKETS,
    values=(("device", DEVICES),),
)
SPEEDUP_COMPILE_SPEC = MetricSpec(
    "stitch_speedup_vs_compile",
    "histogram",
    "Speedup of accepted candidates over torch.compile (where it was available).",
    ("device",),
    SPEEDUP_BUCKETS,
    values=(("device", DEVICES),),
)
STAGE_SECONDS_SPEC = MetricSpec(
    "stitch_stage_seconds",
    "histogram",
    "Wall time spent in one pipeline stage.",
    ("stage",),
    STAGE_BUCKETS,
    values=(("stage", STAGES),),
)
BUILD_CACHE_SPEC = MetricSpec(
    "stitch_build_cache_total",
    "counter",
    "Candidate builds served from the build cache or compiled.",
    ("result",),
    values=(("result", frozenset({"hit", "miss"})),),
)
QUEUE_DEPTH_SPEC = MetricSpec(
    "stitch_queue_depth", "gauge", "Messages waiting in a Celery queue (Redis LLEN).", ("queue",)
)
TASKS_SPEC = MetricSpec(
    "stitch_tasks_total",
    "counter",
    "Queue tasks handled, by outcome.",
    ("queue", "outcome"),
    values=(("outcome", TASK_OUTCOMES),),
)
LLM_TOKENS_SPEC = MetricSpec(
    "stitch_llm_tokens_total",
    "counter",
    "Tokens used on the LLM endpoint.",
    ("kind",),
    values=(("kind", frozenset({"prompt", "completion"})),),
)
GPU_SECONDS_SPEC = MetricSpec(
    "stitch_gpu_seconds_total", "counter", "GPU-seconds spent verifying, charged to a tenant.", ("tenant",)
)
REQUESTS_SPEC = MetricSpec(
    "stitch_requests_total",
    "counter",
    "Gateway requests by transport (http, grpc), method and status code.",
    ("transport", "method", "code"),
    values=(("transport", frozenset({"http", "grpc"})),),
)
REQUEST_SECONDS_SPEC = MetricSpec(
    "stitch_request_seconds",
    "histogram",
    "Gateway request latency.",
    ("transport", "method"),
    REQUEST_BUCKETS,
    values=(("transport", frozenset({"http", "grpc"})),),
)

SPECS: tuple[MetricSpec, ...] = (
    JOBS_SUBMITTED_SPEC,
    JOBS_FINISHED_SPEC,
    JOB_SPEEDUP_EAGER_SPEC,
    JOB_SPEEDUP_COMPILE_SPEC,
    CANDIDATES_SPEC,
    VERDICTS_SPEC,
    SPEEDUP_EAGER_SPEC,
    SPEEDUP_COMPILE_SPEC,
    STAGE_SECONDS_SPEC,
    BUILD_CACHE_SPEC,
    QUEUE_DEPTH_SPEC,
    TASKS_SPEC,
    LLM_TOKENS_SPEC,
    GPU_SECONDS_SPEC,
    REQUESTS_SPEC,
    REQUEST_SECONDS_SPEC,
)


def exposed_series() -> frozenset[str]:
    """Every sample name the StitchCUDA services can expose (dashboards and alerts are checked against it)."""
    return frozenset().union(*(spec.series() for spec in SPECS))


def _check_labels(spec: MetricSpec, labels: dict[str, str]) -> dict[str, str]:
    if set(labels) != set(spec.labels):
        raise ValueError(f"{spec.name} takes labels {sorted(spec.labels)}, got {sorted(labels)}")
    values = {k: str(v) for k, v in labels.items()}
    for label, allowed in spec.values:
        if values[label] not in allowed:
            raise ValueError(f"{spec.name}{{{label}}} is one of {sorted(allowed)}, got {values[label]!r}")
    return values


class Counter:
    """A counter family; `inc(**labels)` with exactly the spec's labels."""

    def __init__(self, spec: MetricSpec) -> None:
        if spec.kind != "counter":
            raise ValueError(f"{spec.name} is a {spec.kind}, not a counter")
        self.spec = spec
        self._metric: Any = None
        if _prom is not None:
            self._metric = _prom.Counter(spec.name, spec.help, list(spec.labels))

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        values = _check_labels(self.spec, labels)
        if amount < 0:
            raise ValueError(f"{self.spec.name} can only go up (got {amount})")
        if self._metric is not None:
            (self._metric.labels(**values) if values else self._metric).inc(amount)


class Histogram:
    """A histogram family; `observe(value, **labels)` with exactly the spec's labels."""

    def __init__(self, spec: MetricSpec) -> None:
        if spec.kind != "histogram":
            raise ValueError(f"{spec.name} is a {spec.kind}, not a histogram")
        self.spec = spec
        self._metric: Any = None
        if _prom is not None:
            self._metric = _prom.Histogram(spec.name, spec.help, list(spec.labels), buckets=spec.buckets)

    def observe(self, value: float, **labels: str) -> None:
        values = _check_labels(self.spec, labels)
        if self._metric is not None:
            (self._metric.labels(**values) if values else self._metric).observe(value)


JOBS_SUBMITTED = Counter(JOBS_SUBMITTED_SPEC)
JOBS_FINISHED = Counter(JOBS_FINISHED_SPEC)
JOB_SPEEDUP_VS_EAGER = Histogram(JOB_SPEEDUP_EAGER_SPEC)
JOB_SPEEDUP_VS_COMPILE = Histogram(JOB_SPEEDUP_COMPILE_SPEC)
CANDIDATES = Counter(CANDIDATES_SPEC)
VERDICTS = Counter(VERDICTS_SPEC)
SPEEDUP_VS_EAGER = Histogram(SPEEDUP_EAGER_SPEC)
SPEEDUP_VS_COMPILE = Histogram(SPEEDUP_COMPILE_SPEC)
STAGE_SECONDS = Histogram(STAGE_SECONDS_SPEC)
BUILD_CACHE = Counter(BUILD_CACHE_SPEC)
TASKS = Counter(TASKS_SPEC)
LLM_TOKENS = Counter(LLM_TOKENS_SPEC)
GPU_SECONDS = Counter(GPU_SECONDS_SPEC)
REQUESTS = Counter(REQUESTS_SPEC)
REQUEST_SECONDS = Histogram(REQUEST_SECONDS_SPEC)
# stitch_queue_depth has no object here: QueueDepthCollector reads it from Redis at scrape time.


@contextlib.contextmanager
def observe_stage(stage: str) -> Iterator[None]:
    """Times the block into stitch_stage_seconds{stage}; a block that raises is timed too."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}: add it to stitchcuda.shared.metrics.STAGES")
    start = time.perf_counter()
    try:
        yield
    finally:
        STAGE_SECONDS.observe(time.perf_counter() - start, stage=stage)


_DEVICE_LABELS: dict[int, str] = {jobs_pb2.DEVICE_CPU: "cpu", jobs_pb2.DEVICE_CUDA: "cuda"}
_STATE_LABELS: dict[int, str] = {
    jobs_pb2.JOB_STATE_SUCCEEDED: "succeeded",
    jobs_pb2.JOB_STATE_FAILED: "failed",
    jobs_pb2.JOB_STATE_CANCELLED: "cancelled",
}


def device_label(device: int | str) -> str:
    if isinstance(device, str):
        return device if device in ("cpu", "cuda") else "unspecified"
    return _DEVICE_LABELS.get(device, "unspecified")


def state_label(state: int) -> str:
    return _STATE_LABELS.get(state, "other")


def verdict_reason_rule(verdict: verify_pb2.Verdict) -> str:
    """One bounded label for why a verdict went the way it did: the first rejecting rule wins."""
    if verdict.accepted:
        return "accepted"
    if not verdict.compiled and not verdict.build.ok:
        return "build"
    for finding in verdict.findings:
        if finding.severity == verify_pb2.SEVERITY_REJECT and finding.rule:
            return finding.rule
    if not verdict.correct:
        return "correctness"
    return "other"


def record_verdict(verdict: verify_pb2.Verdict, device: int | str | None = None) -> None:
    """Counts a verdict and, when accepted, its speedups; call once per verdict recorded."""
    label = device_label(verdict.device if device is None else device)
    VERDICTS.inc(
        device=label, accepted=str(verdict.accepted).lower(), reason_rule=verdict_reason_rule(verdict)
    )
    if verdict.accepted and verdict.speedup_vs_eager > 0:
        SPEEDUP_VS_EAGER.observe(verdict.speedup_vs_eager, device=label)
    if verdict.accepted and verdict.speedup_vs_compile > 0:
        SPEEDUP_VS_COMPILE.observe(verdict.speedup_vs_compile, device=label)


def record_verdict_stages(verdict: verify_pb2.Verdict) -> None:
    """The verification's own stages (correctness, timing, profile from the verdict, the whole verify)."""
    for stage, seconds in verdict.stage_seconds.items():
        if stage in STAGES and seconds >= 0:
            STAGE_SECONDS.observe(seconds, stage=stage)
    if verdict.seconds > 0:
        STAGE_SECONDS.observe(verdict.seconds, stage="verify")


def record_build(*, cached: bool, seconds: float | None = None) -> None:
    """Counts a build as a cache hit or miss; `seconds` (its wall time) goes to the build stage."""
    BUILD_CACHE.inc(result="hit" if cached else "miss")
    if seconds is not None and seconds >= 0:
        STAGE_SECONDS.observe(seconds, stage="build")


def record_build_result(build: verify_pb2.BuildResult) -> None:
    """A build the verifier attempted (a result with no cache key and no error was never attempted)."""
    if build.cache_key or build.error or build.ok:
        record_build(cached=build.cached, seconds=build.seconds)


def record_llm_usage(*, prompt_tokens: int, completion_tokens: int, seconds: float | None = None) -> None:
    """Tokens of one LLM response and, with `seconds`, how long the endpoint took to give it."""
    LLM_TOKENS.inc(max(prompt_tokens, 0), kind="prompt")
    LLM_TOKENS.inc(max(completion_tokens, 0), kind="completion")
    if seconds is not None and seconds >= 0:
        STAGE_SECONDS.observe(seconds, stage="llm")


def record_candidates(*, skill: str, backend: str, count: int) -> None:
    if count > 0:
        CANDIDATES.inc(count, skill=skill, backend=backend)


def record_job_finished(job: jobs_pb2.Job, *, now: float | None = None) -> None:
    """A job that just reached a final state: its outcome, its wall time and, if it succeeded, the best
    program's speedups. Call once, where the state changes."""
    state = _STATE_LABELS.get(job.status.state)
    if state is None:
        raise ValueError(f"job {job.job_id} is not in a final state ({job.status.state})")
    JOBS_FINISHED.inc(tenant=job.tenant_id, state=state)
    if job.HasField("created_at"):
        finished = time.time() if now is None else now
        STAGE_SECONDS.observe(max(0.0, finished - job.created_at.ToNanoseconds() / 1e9), stage="job")
    if job.status.state != jobs_pb2.JOB_STATE_SUCCEEDED:
        return
    device = device_label(job.spec.device)
    if job.status.best_speedup_vs_eager > 0:
        JOB_SPEEDUP_VS_EAGER.observe(job.status.best_speedup_vs_eager, device=device)
    if job.status.best_speedup_vs_compile > 0:
        JOB_SPEEDUP_VS_COMPILE.observe(job.status.best_speedup_vs_compile, device=device)


class RedisLike(Protocol):
    def llen(self, name: str) -> Any: ...


class QueueDepthCollector:
    """Reports stitch_queue_depth{queue} by reading each Celery queue's Redis list at scrape time.

    Celery's Redis transport keeps a queue's waiting messages in a list whose key is the queue name
    (the same key KEDA's redis scaler reads). Messages already taken by a worker are not counted.
    """

    def __init__(self, redis_client: RedisLike, queues: Sequence[str]) -> None:
        self.redis = redis_client
        self.queues = tuple(queues)

    def _family(self) -> Any:
        assert _core is not None
        return _core.GaugeMetricFamily(
            QUEUE_DEPTH_SPEC.name, QUEUE_DEPTH_SPEC.help, labels=list(QUEUE_DEPTH_SPEC.labels)
        )

    def describe(self) -> list[Any]:
        # Describing without values keeps registration from reaching Redis.
        return [self._family()] if _prom is not None else []

    def depths(self) -> dict[str, int]:
        return {queue: int(self.redis.llen(queue)) for queue in self.queues}

    def collect(self) -> Iterator[Any]:
        if _prom is None:
            return
        try:
            depths = self.depths()
        except Exception as exc:
            # A failed scrape must not break /metrics; the missing series fires the absent() alert.
            log.warning("queue depth unavailable: %s", exc)
            return
        family = self._family()
        for queue, depth in depths.items():
            family.add_metric([queue], depth)
        yield family


_extra_collectors: list[Any] = []
_extras_on_default = False


class _ExtraCollectors:
    """Collects the registered extra collectors on whichever registry is served."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        for collector in list(_extra_collectors):
            yield from collector.collect()


def register_collector(collector: Any) -> None:
    """Adds a collector (e.g. a QueueDepthCollector) to what this process serves on /metrics."""
    if not any(existing is collector for existing in _extra_collectors):
        _extra_collectors.append(collector)


def unregister_collector(collector: Any) -> None:
    """Stops serving a collector added by register_collector (tests, shutdown)."""
    _extra_collectors[:] = [c for c in _extra_collectors if c is not collector]


def _use_multiprocess_values() -> None:
    """Makes metric values from now on live in PROMETHEUS_MULTIPROC_DIR's files.

    prometheus_client picks its value class when it is first imported. A worker sets the variable in
    its entry point, after imports that may already have loaded the client (the workflow, the stores);
    the label children our metrics create later, in the pool processes, must still write to the files
    the parent's /metrics reads, or every sample of a prefork worker is lost.
    """
    multiproc_dir = os.environ.get(MULTIPROC_ENV)
    if _prom is None or not multiproc_dir:
        return
    os.makedirs(multiproc_dir, exist_ok=True)
    values = importlib.import_module("prometheus_client.values")
    if not getattr(getattr(values, "ValueClass", None), "_multiprocess", False):
        setattr(values, "ValueClass", values.get_value_class())  # noqa: B010 (a module attribute, by name)


def _serving_registry() -> Any:
    global _extras_on_default
    assert _prom is not None
    if os.environ.get(MULTIPROC_ENV):
        _use_multiprocess_values()
        from prometheus_client import multiprocess

        registry = _prom.CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        registry.register(_ExtraCollectors())
        return registry
    if not _extras_on_default:
        _prom.REGISTRY.register(_ExtraCollectors())
        _extras_on_default = True
    return _prom.REGISTRY


@dataclass
class MetricsServer:
    """A running /metrics HTTP server (workers: port 9100)."""

    port: int
    _server: Any
    _thread: threading.Thread

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def start_metrics_server(
    port: int, addr: str = "0.0.0.0", collectors: Iterable[Any] = ()
) -> MetricsServer | None:
    """Serves /metrics on addr:port in a daemon thread; None (and a log line) without prometheus_client."""
    if _prom is None:
        log.info("prometheus_client is not installed: metrics are not served")
        return None
    for collector in collectors:
        register_collector(collector)
    server, thread = _prom.start_http_server(port, addr=addr, registry=_serving_registry())
    bound = int(server.server_address[1])
    log.info("serving metrics on %s:%d", addr, bound)
    return MetricsServer(bound, server, thread)


def render_latest() -> tuple[bytes, str]:
    """The exposition body and its content type, for a web framework's /metrics route (the gateway)."""
    if _prom is None:
        return b"", "text/plain; charset=utf-8"
    return bytes(_prom.generate_latest(_serving_registry())), str(_prom.CONTENT_TYPE_LATEST)
