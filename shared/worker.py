"""What every service worker shares: decode the envelope, skip ended jobs, turn failures into job results."""

from __future__ import annotations

import abc
import logging
import threading
from collections import OrderedDict
from typing import Any

from stitchcuda.api.v1 import code_pb2, jobs_pb2, messages_pb2, plan_pb2, verify_pb2
from stitchcuda.shared.artifacts import ArtifactStore, Keys
from stitchcuda.shared.devices import NAMES
from stitchcuda.shared.envelope import decode
from stitchcuda.shared.logs import log_context
from stitchcuda.shared.workflow import TERMINAL_STATES, Workflow

log = logging.getLogger("stitchcuda.worker")


def device_name(device: int) -> str:
    name = next((n for n, v in NAMES.items() if v == device), "cpu")
    return "cpu" if name == "auto" else name


class BaseWorker(abc.ABC):
    """Decodes a queue message and runs `work` for it, unless its job has already ended."""

    stage = "work"

    # References and plans are written once per job (a plan once per replan), and every round of a job
    # reads them again: a worker keeps the last few instead of fetching them from S3 on every message.
    write_once_entries = 64

    def __init__(self, workflow: Workflow, artifacts: ArtifactStore) -> None:
        self.workflow = workflow
        self.artifacts = artifacts
        self._write_once: OrderedDict[str, bytes] = OrderedDict()
        self._write_once_lock = threading.Lock()

    def handle(self, data: bytes) -> None:
        env = decode(data)
        with log_context(job_id=env.job_id, tenant_id=env.tenant_id, round=str(env.round), stage=self.stage):
            job = self.workflow.jobs.get(env.job_id)
            if job.status.state in TERMINAL_STATES:
                log.info("job %s has ended; message dropped", env.job_id)
                return
            if job.spec.reference_source:
                # The job record carries the reference, so it is never fetched from the artifact store
                # (where small references are not stored at all).
                self._remember(Keys.reference(job.tenant_id, job.job_id), job.spec.reference_source.encode())
            self.work(env, job)

    @abc.abstractmethod
    def work(self, env: messages_pb2.Envelope, job: jobs_pb2.Job) -> None:
        """Does this worker's stage for one message and reports the result to the workflow."""

    def progress_callback(self, env: messages_pb2.Envelope) -> Any:
        def report(message: str, fraction: float) -> None:
            self.workflow.progress(env, self.stage, fraction, message)

        return report

    def _get_write_once(self, key: str) -> bytes:
        with self._write_once_lock:
            data = self._write_once.get(key)
            if data is not None:
                self._write_once.move_to_end(key)
                return data
        data = self.artifacts.get(key)
        self._remember(key, data)
        return data

    def _remember(self, key: str, data: bytes) -> None:
        with self._write_once_lock:
            self._write_once[key] = data
            self._write_once.move_to_end(key)
            while len(self._write_once) > self.write_once_entries:
                self._write_once.popitem(last=False)

    def load_reference(self, key: str) -> str:
        return self._get_write_once(key).decode()

    def load_plan(self, key: str) -> plan_pb2.Plan:
        return plan_pb2.Plan.FromString(self._get_write_once(key))

    def load_candidate(self, key: str) -> code_pb2.Candidate:
        return code_pb2.Candidate.FromString(self.artifacts.get(key))

    def load_verdict(self, key: str) -> verify_pb2.Verdict:
        return verify_pb2.Verdict.FromString(self.artifacts.get(key))
