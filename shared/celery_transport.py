"""The Celery adapter of the Transport port: one task per message, the envelope bytes as its argument."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from kombu.exceptions import KombuError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from stitchcuda.api.v1 import messages_pb2
from stitchcuda.shared.celery_app import TASK_NAMES
from stitchcuda.shared.envelope import encode
from stitchcuda.shared.errors import Unavailable

log = logging.getLogger("stitchcuda.transport")

# Task ids of a job's messages, so Cancel can revoke what is queued or running.
_TASKS_KEY = "stitch:job:{job_id}:tasks"
_TASKS_TTL_S = 7 * 24 * 3600


class CeleryTransport:
    """Sends each envelope as one Celery task on its queue; the task id is the envelope's message id."""

    def __init__(self, app: Celery, redis: Any = None) -> None:
        self.app = app
        self.redis = redis

    def send(self, queue: str, envelope: messages_pb2.Envelope) -> None:
        if queue not in TASK_NAMES:
            raise ValueError(f"unknown queue {queue!r}")
        data = encode(envelope)
        task_id = envelope.message_id or None
        try:
            self.app.send_task(
                TASK_NAMES[queue],
                args=(data,),
                queue=queue,
                routing_key=queue,
                task_id=task_id,
                serializer="msgpack",
                ignore_result=True,
                retry=True,
                retry_policy={"max_retries": 3, "interval_start": 0.1, "interval_step": 0.5},
            )
        except (OperationalError, KombuError, OSError) as exc:
            raise Unavailable(f"the broker is unavailable: {exc}") from exc
        if self.redis is not None and task_id and envelope.job_id:
            key = _TASKS_KEY.format(job_id=envelope.job_id)
            try:
                pipe = self.redis.pipeline(transaction=False)
                pipe.sadd(key, task_id)
                pipe.expire(key, _TASKS_TTL_S)
                pipe.execute()
            except (RedisConnectionError, RedisTimeoutError) as exc:
                # The task is already queued: losing its id only means Cancel cannot terminate it early.
                log.warning("could not record task %s of job %s: %s", task_id, envelope.job_id, exc)

    def revoke_job(self, job_id: str) -> int:
        """Revokes every task sent for the job: queued ones are skipped, running ones terminated."""
        if self.redis is None:
            return 0
        try:
            members = self.redis.smembers(_TASKS_KEY.format(job_id=job_id))
        except (RedisConnectionError, RedisTimeoutError) as exc:
            raise Unavailable(f"Redis is unavailable: {exc}") from exc
        ids = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)
        if ids:
            try:
                self.app.control.revoke(ids, terminate=True, signal="SIGTERM")
            except (OperationalError, KombuError, OSError) as exc:
                raise Unavailable(f"the broker is unavailable: {exc}") from exc
            log.info("revoked %d task(s) of job %s", len(ids), job_id)
        return len(ids)
