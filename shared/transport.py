"""The Transport port: queue names, and the in-process adapter that runs the embedded mode."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable
from typing import Protocol

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.envelope import encode

log = logging.getLogger("stitchcuda.transport")

PLANNER = "planner"
CODER = "coder"
VERIFIER_BUILD = "verifier.build"
VERIFIER_GPU = "verifier.gpu"
VERIFIER_CPU = "verifier.cpu"
JUDGE = "judge"
QUEUES = (PLANNER, CODER, VERIFIER_BUILD, VERIFIER_GPU, VERIFIER_CPU, JUDGE)

Handler = Callable[[bytes], None]


class Transport(Protocol):
    def send(self, queue: str, envelope: messages_pb2.Envelope) -> None: ...


class InProcessTransport:
    """Delivers messages to handlers in this process, one at a time, in FIFO order.

    `send` only enqueues, so a handler that emits the next message returns before that message
    runs: the call stack stays flat and the order matches what the queues would do.
    """

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self.delivered: list[tuple[str, str]] = []

    def register(self, queue: str, handler: Handler) -> None:
        if queue not in QUEUES:
            raise ValueError(f"unknown queue {queue!r}")
        self._handlers[queue] = handler

    def send(self, queue: str, envelope: messages_pb2.Envelope) -> None:
        if queue not in self._handlers:
            raise ValueError(f"no handler registered for queue {queue!r}")
        self._queue.append((queue, encode(envelope)))

    def pending(self) -> int:
        return len(self._queue)

    def drain(self, max_messages: int = 10_000) -> int:
        """Runs queued messages (and the ones they emit) until none are left."""
        count = 0
        while self._queue:
            if count >= max_messages:
                raise RuntimeError("in-process transport did not settle (message loop?)")
            queue, data = self._queue.popleft()
            env = messages_pb2.Envelope.FromString(data)
            self.delivered.append((queue, env.WhichOneof("body") or ""))
            self._handlers[queue](data)
            count += 1
        return count
