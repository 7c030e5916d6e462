"""The Verifier port of the reward: one verdict per candidate, in this process today, through a queue later.

A queue-backed adapter (the `verifier.gpu` Celery queue of a cluster) implements the same `verify`; the
reward service never knows which one it holds.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from stitchcuda.api.v1 import code_pb2, verify_pb2


class VerifierPort(Protocol):
    """Verifies one candidate against its reference; a candidate's faults come back as a rejecting Verdict."""

    def verify(
        self, reference_source: str, candidate: code_pb2.Candidate, *, device: str
    ) -> verify_pb2.Verdict: ...


class InProcessVerifier:
    """stitchcuda.verifier's VerifierService in this process (one machine: the CPU backend or local GPUs)."""

    def __init__(self, service: Any = None) -> None:
        self._service = service
        self._lock = threading.Lock()

    def _get(self) -> Any:
        with self._lock:
            if self._service is None:
                from stitchcuda.verifier.service import VerifierService

                self._service = VerifierService()
            return self._service

    def verify(
        self, reference_source: str, candidate: code_pb2.Candidate, *, device: str
    ) -> verify_pb2.Verdict:
        verdict: verify_pb2.Verdict = self._get().verify(reference_source, candidate, device=device)
        return verdict

    def close(self) -> None:
        with self._lock:
            if self._service is not None and hasattr(self._service, "close"):
                self._service.close()
