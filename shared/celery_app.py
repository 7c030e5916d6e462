"""The one Celery app of the platform: queues, msgpack-only serialization, delivery guarantees, task runner.

Every task takes one argument, the serialized protobuf Envelope (bytes). Messages are acknowledged
only after the handler returns (`acks_late`), a pool process that dies mid-task puts its message back
(`reject_on_worker_lost`), and each worker process takes one message at a time (prefetch 1), so a
`kill -9` loses no work. The broker's visibility timeout is above the longest task's hard time limit,
so Redis never hands a message that is still running to a second worker.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, Task
from celery.exceptions import SecurityWarning, SoftTimeLimitExceeded
from kombu.entity import Exchange, Queue
from pydantic import model_validator

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.errors import InvalidRequest, NotFound, StitchError, Unavailable
from stitchcuda.shared.logs import log_context
from stitchcuda.shared.settings import CommonSettings
from stitchcuda.shared.stores import MessageLedger
from stitchcuda.shared.transport import (
    CODER,
    JUDGE,
    PLANNER,
    QUEUES,
    VERIFIER_BUILD,
    VERIFIER_CPU,
    VERIFIER_GPU,
)

log = logging.getLogger("stitchcuda.celery")

# Task names are fixed strings so a sender never imports another service's tasks module.
TASK_NAMES: dict[str, str] = {
    PLANNER: "stitchcuda.planner.plan",
    CODER: "stitchcuda.coder.code",
    VERIFIER_BUILD: "stitchcuda.verifier.build",
    VERIFIER_GPU: "stitchcuda.verifier.verify_gpu",
    VERIFIER_CPU: "stitchcuda.verifier.verify_cpu",
    JUDGE: "stitchcuda.training.judge",
}


class QueueSettings(CommonSettings):
    """Broker, time limits, retries and worker sizing (env STITCH_*)."""

    broker_url: str = ""  # "" = redis_url
    # Hard limits per queue; the soft limit fires first so the task can still report the failure.
    time_limit_planner_s: int = 900
    time_limit_coder_s: int = 1200
    time_limit_build_s: int = 1500
    time_limit_verify_s: int = 1800
    time_limit_judge_s: int = 600
    soft_limit_margin_s: int = 30
    visibility_timeout_s: int = 3900
    restore_interval_s: int = 10
    # Unavailable (Redis/S3/LLM down): retried with exponential backoff, then reported as a failure.
    task_max_retries: int = 10
    retry_backoff_s: float = 1.0
    retry_backoff_max_s: float = 30.0
    # A message whose worker died this many times is poison: its job gets a failure, not a loop.
    max_deliveries: int = 4
    worker_concurrency: int = 1
    metrics_port: int = 9100

    @model_validator(mode="after")
    def _visibility_above_longest_task(self) -> QueueSettings:
        longest = max(self.time_limits().values()) + int(self.retry_backoff_max_s)
        if self.visibility_timeout_s <= longest:
            raise ValueError(
                f"STITCH_VISIBILITY_TIMEOUT_S ({self.visibility_timeout_s}) must exceed the longest task "
                f"time limit plus retry delay ({longest}), or Redis redelivers tasks that are still running"
            )
        return self

    def resolved_broker_url(self) -> str:
        return self.broker_url or self.redis_url

    def time_limits(self) -> dict[str, int]:
        return {
            PLANNER: self.time_limit_planner_s,
            CODER: self.time_limit_coder_s,
            VERIFIER_BUILD: self.time_limit_build_s,
            VERIFIER_GPU: self.time_limit_verify_s,
            VERIFIER_CPU: self.time_limit_verify_s,
            JUDGE: self.time_limit_judge_s,
        }

    def soft_limit(self, queue: str) -> int:
        hard = self.time_limits()[queue]
        return max(1, hard - min(self.soft_limit_margin_s, hard // 4))


def _queue(name: str) -> Queue:
    return Queue(name, Exchange(name, type="direct"), routing_key=name)  # type: ignore[no-untyped-call]


def configure_app(app: Celery, settings: QueueSettings) -> Celery:
    broker = settings.resolved_broker_url()
    app.conf.update(
        broker_url=broker,
        result_backend=None,
        task_ignore_result=True,
        task_serializer="msgpack",
        result_serializer="msgpack",
        accept_content=["msgpack"],
        result_accept_content=["msgpack"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,
        worker_prefetch_multiplier=1,
        worker_concurrency=settings.worker_concurrency,
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "visibility_timeout": settings.visibility_timeout_s,
            # Broadcasts (revoke on cancel) stay within this Redis database.
            "fanout_prefix": True,
            "fanout_patterns": True,
            "socket_connect_timeout": 5,
            # A publish on a dead connection fails instead of hanging (the poll timeout is 1 s).
            "socket_timeout": 30,
            # Messages of a worker that died whole are swept back after their visibility timeout.
            "unacked_restore_interval": settings.restore_interval_s,
            "unacked_restore_throttle": 1,
        },
        task_default_queue=PLANNER,
        task_queues=[_queue(q) for q in QUEUES],
        task_routes={name: {"queue": queue, "routing_key": queue} for queue, name in TASK_NAMES.items()},
        task_time_limit=max(settings.time_limits().values()),
        task_soft_time_limit=max(settings.soft_limit(q) for q in QUEUES),
    )
    return app


def create_celery(settings: QueueSettings | None = None) -> Celery:
    """A configured Celery app (the gateway sends with it; workers use the module-level `app`)."""
    return configure_app(Celery("stitchcuda", set_as_current=False), settings or QueueSettings())


# Workers' tasks bind to this app at import; `configure_app` re-applies explicit settings before start.
app = Celery("stitchcuda")
configure_app(app, QueueSettings())


def task_options(queue: str, settings: QueueSettings | None = None) -> dict[str, Any]:
    """Decorator options every task shares: its name, queue, limits and delivery guarantees."""
    settings = settings or QueueSettings()
    return {
        "name": TASK_NAMES[queue],
        "queue": queue,
        "acks_late": True,
        "reject_on_worker_lost": True,
        "time_limit": settings.time_limits()[queue],
        "soft_time_limit": settings.soft_limit(queue),
        "ignore_result": True,
        "max_retries": settings.task_max_retries,
        "serializer": "msgpack",
    }


# -- the runner every task calls ---------------------------------------------------------------------


@dataclass
class Runtime:
    """What one worker process needs to run its tasks (built after the pool forks)."""

    handle: Callable[[bytes], None]
    # Turns a message that cannot be processed into a job result (failed plan, rejected verdict...).
    report_failure: Callable[[messages_pb2.Envelope, str], None]
    ledger: MessageLedger
    settings: QueueSettings
    # Called after every delivery with its queue and wall time (GPU-seconds metering).
    on_finished: Callable[[str, messages_pb2.Envelope, float], None] | None = None
    closers: list[Callable[[], None]] = field(default_factory=list)


class LazyRuntime:
    """Builds a process's Runtime on first use, once per process (connections must not cross a fork)."""

    def __init__(self, factory: Callable[[], Runtime]) -> None:
        self._factory = factory
        self._runtime: Runtime | None = None
        self._pid = 0
        self._lock = threading.Lock()

    def set_factory(self, factory: Callable[[], Runtime]) -> None:
        with self._lock:
            self._factory, self._runtime = factory, None

    def get(self) -> Runtime:
        with self._lock:
            if self._runtime is None or self._pid != os.getpid():
                self._runtime, self._pid = self._factory(), os.getpid()
            return self._runtime


def _count(queue: str, outcome: str) -> None:
    try:
        from stitchcuda.shared import metrics
    except ImportError:
        return
    metrics.TASKS.inc(queue=queue, outcome=outcome)


def backoff_s(settings: QueueSettings, retries: int) -> float:
    return float(min(settings.retry_backoff_max_s, settings.retry_backoff_s * (2**retries)))


def run_envelope_task(task: Task, data: bytes, runtime: Runtime, queue: str) -> None:
    """Decode, skip what is done, handle; retry what is transient, report what is not. Never loops."""
    try:
        env = decode(data)
    except InvalidRequest as exc:
        # Nothing to retry and no job to tell: a malformed message is dropped with the reason.
        log.warning("dropping a malformed message on %s: %s", queue, exc)
        _count(queue, "malformed")
        return
    retries = int(task.request.retries or 0)
    with log_context(job_id=env.job_id, tenant_id=env.tenant_id, round=str(env.round), queue=queue):
        if runtime.ledger.is_done(env.message_id):
            log.info("message %s was already handled; duplicate dropped", env.message_id)
            _count(queue, "duplicate")
            return
        deliveries = runtime.ledger.delivered(env.message_id, retries)
        if deliveries > runtime.settings.max_deliveries:
            _report(runtime, env, f"its worker died {deliveries - 1} times handling this step", queue)
            return
        started = time.monotonic()
        retry_exc: Unavailable | None = None
        try:
            runtime.handle(data)
        except Unavailable as exc:
            retry_exc = exc
        except SoftTimeLimitExceeded:
            _report(runtime, env, f"time limit of {runtime.settings.soft_limit(queue)} s exceeded", queue)
            return
        except NotFound as exc:
            log.warning("dropping message %s: %s", env.message_id, exc)
            _count(queue, "dropped")
            return
        except StitchError as exc:
            _report(runtime, env, str(exc), queue)
            return
        except Exception as exc:
            log.exception("task on %s failed", queue)
            _report(runtime, env, f"internal error: {type(exc).__name__}: {exc}", queue)
            return
        finally:
            if runtime.on_finished is not None:
                runtime.on_finished(queue, env, time.monotonic() - started)
        if retry_exc is None:
            runtime.ledger.mark_done(env.message_id)
            _count(queue, "ok")
            return
        if retries < runtime.settings.task_max_retries:
            delay = backoff_s(runtime.settings, retries)
            log.warning("%s unavailable (%s); retry %d in %.1f s", queue, retry_exc, retries + 1, delay)
            _count(queue, "retry")
            raise task.retry(exc=retry_exc, countdown=delay)
        _report(runtime, env, f"gave up after {retries} retries: {retry_exc}", queue)


def _report(runtime: Runtime, env: messages_pb2.Envelope, reason: str, queue: str) -> None:
    log.warning("step failed on %s: %s", queue, reason)
    _count(queue, "failed")
    try:
        runtime.report_failure(env, reason)
        runtime.ledger.mark_done(env.message_id)
    except StitchError as exc:
        log.error("could not report the failure of message %s: %s", env.message_id, exc)


# -- worker entry points ----------------------------------------------------------------------------


def _say_if_root(name: str) -> None:
    """One line of ours instead of Celery's page-long SecurityWarning when a worker runs as root.

    The images run every worker as uid 10001; root happens on a developer's machine or a container
    started with --user 0, where the sandbox still isolates tenant code but the worker itself does not
    need the privilege. Celery refuses root only with pickle, which these workers never accept.
    """
    warnings.filterwarnings("ignore", category=SecurityWarning)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        log.warning(
            "%s worker runs as root: deployed images run it as uid 10001 (Dockerfile); "
            "start it as an unprivileged user where you can",
            name,
        )


def worker_main(
    name: str,
    default_queues: list[str],
    argv: list[str] | None,
    *,
    runtime: LazyRuntime,
    build: Callable[..., Runtime],
    service_factory: Callable[[], Any] | None = None,
) -> int:
    """`python -m stitchcuda.<service>`: a Celery worker on its queues, configured by the environment.

    Options: --queues a,b (default: the service's queues; STITCH_<NAME>_QUEUES), --concurrency N
    (STITCH_WORKER_CONCURRENCY), --metrics-port P (STITCH_METRICS_PORT; 0 = none), --loglevel.
    `service_factory` replaces the real service (tests, benchmarks); it runs in each pool process.
    """
    import argparse
    import tempfile

    env_queues = os.environ.get(f"STITCH_{name.upper()}_QUEUES", "")
    parser = argparse.ArgumentParser(prog=f"python -m stitchcuda.{name}")
    parser.add_argument("--queues", default=env_queues or ",".join(default_queues))
    parser.add_argument("--concurrency", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=-1)
    parser.add_argument("--loglevel", default="")
    args = parser.parse_args(argv)
    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = [q for q in queues if q not in QUEUES]
    if unknown or not queues:
        parser.error(f"unknown queue(s) {unknown}; choose from {', '.join(QUEUES)}")

    settings = QueueSettings()
    metrics_port = settings.metrics_port if args.metrics_port < 0 else args.metrics_port
    if metrics_port:
        # Pool processes write their samples to files the parent's /metrics server merges; set before
        # any module creates a metric. A fresh folder per start: stale files of dead pids would count.
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix=f"stitch-{name}-metrics-"))
    from stitchcuda.shared.logs import configure_logging

    level = args.loglevel or settings.log_level
    configure_logging(level, json_output=settings.log_json)
    configure_app(app, settings)
    if service_factory is not None:
        runtime.set_factory(lambda: build(service_factory(), settings))
    else:
        runtime.set_factory(lambda: build(None, settings))
    if metrics_port:
        try:
            from stitchcuda.shared import metrics
        except ImportError:
            log.info("stitchcuda.shared.metrics is not available: no metrics server")
        else:
            metrics.start_metrics_server(metrics_port)
    concurrency = args.concurrency or settings.worker_concurrency
    log.info("%s worker: queues %s, concurrency %d", name, ",".join(queues), concurrency)
    worker_args = [
        "worker",
        "--queues",
        ",".join(queues),
        "--concurrency",
        str(concurrency),
        "--pool",
        "prefork",
        "--hostname",
        f"{name}-{os.getpid()}@%h",
        "--without-gossip",
        "--without-mingle",
        "--loglevel",
        level.upper(),
    ]
    _say_if_root(name)
    try:
        app.worker_main(worker_args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0
