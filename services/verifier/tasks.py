"""The Verifier's Celery tasks (build, verify on CPU, on GPU): envelope bytes in, VerifierWorker.handle.

GPU verifications are metered: the wall time a message holds a GPU worker is charged to its tenant's
GPU-seconds, which the gateway's quota checks read.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.celery_app import (
    LazyRuntime,
    QueueSettings,
    Runtime,
    app,
    run_envelope_task,
    task_options,
)
from stitchcuda.shared.errors import StitchError
from stitchcuda.shared.stores import build_stores, build_workflow
from stitchcuda.shared.transport import VERIFIER_BUILD, VERIFIER_CPU, VERIFIER_GPU

log = logging.getLogger("stitchcuda.verifier")


def build_runtime(service: Any = None, settings: QueueSettings | None = None) -> Runtime:
    """The worker process's runtime: platform stores, the workflow, and the Verifier service.

    The Verifier gets the artifact store as its build cache, so a candidate compiled once on any
    worker is never compiled again.
    """
    from stitchcuda.verifier.service import VerifierService
    from stitchcuda.verifier.worker import VerifierWorker

    settings = settings or QueueSettings()
    stores = build_stores(settings)
    workflow = build_workflow(settings, stores)
    if service is None:
        service = VerifierService(artifacts=stores.artifacts)
    worker = VerifierWorker(service, workflow, stores.artifacts, stores.transport)

    def report_failure(env: messages_pb2.Envelope, reason: str) -> None:
        # Retries are spent (a worker died on it, or a store stayed down): the harness's failure, which
        # ends the job with the reason instead of counting as the candidate's rejection.
        workflow.record_harness_failure(env, f"verification did not complete: {reason}", "verifier_failed")

    def on_finished(queue: str, env: messages_pb2.Envelope, seconds: float) -> None:
        if queue != VERIFIER_GPU or not env.tenant_id:
            return
        try:
            stores.usage.add(env.tenant_id, "gpu_seconds", seconds)
        except StitchError as exc:
            log.warning("GPU-seconds of tenant %s not metered: %s", env.tenant_id, exc)
        try:
            from stitchcuda.shared import metrics
        except ImportError:
            return
        metrics.GPU_SECONDS.inc(seconds, tenant=env.tenant_id)

    return Runtime(worker.handle, report_failure, stores.ledger, settings, on_finished, [stores.close])


runtime = LazyRuntime(build_runtime)


@app.task(bind=True, **task_options(VERIFIER_BUILD))  # type: ignore[untyped-decorator]
def build(self: Task, data: bytes) -> None:
    run_envelope_task(self, data, runtime.get(), VERIFIER_BUILD)


@app.task(bind=True, **task_options(VERIFIER_CPU))  # type: ignore[untyped-decorator]
def verify_cpu(self: Task, data: bytes) -> None:
    run_envelope_task(self, data, runtime.get(), VERIFIER_CPU)


@app.task(bind=True, **task_options(VERIFIER_GPU))  # type: ignore[untyped-decorator]
def verify_gpu(self: Task, data: bytes) -> None:
    run_envelope_task(self, data, runtime.get(), VERIFIER_GPU)
