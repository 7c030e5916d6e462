"""The Coder's Celery task: the envelope bytes in, CoderWorker.handle, failures reported to the job."""

from __future__ import annotations

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
from stitchcuda.shared.stores import build_stores, build_workflow
from stitchcuda.shared.transport import CODER


def build_runtime(service: Any = None, settings: QueueSettings | None = None) -> Runtime:
    """The worker process's runtime: platform stores, the workflow, and the Coder service."""
    from stitchcuda.coder.service import CoderService
    from stitchcuda.coder.worker import CoderWorker

    settings = settings or QueueSettings()
    stores = build_stores(settings)
    workflow = build_workflow(settings, stores)
    worker = CoderWorker(service if service is not None else CoderService(), workflow, stores.artifacts)

    def report_failure(env: messages_pb2.Envelope, reason: str) -> None:
        # An empty round: the loop policy decides whether to try again, replan or fail.
        workflow.record_candidates(env, [], error=reason)

    return Runtime(worker.handle, report_failure, stores.ledger, settings, closers=[stores.close])


runtime = LazyRuntime(build_runtime)


@app.task(bind=True, **task_options(CODER))  # type: ignore[untyped-decorator]
def code(self: Task, data: bytes) -> None:
    run_envelope_task(self, data, runtime.get(), CODER)
