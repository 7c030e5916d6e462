"""Structured logging that carries the job and tenant ids of the work in progress."""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("stitch_log_context", default={})  # noqa: B039


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Adds fields (job_id, tenant_id, round, ...) to every log record emitted inside the block."""
    token = _context.set({**_context.get(), **{k: str(v) for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


class _ContextFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.stitch = _context.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **getattr(record, "stitch", {}),
        }
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = super().format(record)
        ctx = getattr(record, "stitch", {})
        return base + ("  " + " ".join(f"{k}={v}" for k, v in ctx.items()) if ctx else "")


def configure_logging(level: str = "INFO", *, json_output: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(_ContextFilter())
    handler.setFormatter(
        JsonFormatter() if json_output else TextFormatter("%(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger("stitchcuda")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
