"""Runs the tracing subprocess on a reference program and returns its graph description."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchcuda.shared.errors import ProblemError

WORKER = Path(__file__).with_name("trace_worker.py")


class TraceError(ProblemError):
    """The reference could not be executed or traced with torch.fx."""


@dataclass
class TracedNode:
    name: str
    op: str
    target: str
    args: list[Any]
    kwargs: dict[str, Any]
    meta: dict[str, Any]
    module: dict[str, Any] | None = None
    is_parameter: bool = False
    is_buffer: bool = False


@dataclass
class Trace:
    nodes: list[TracedNode]
    inputs: list[dict[str, Any]]
    init_inputs: list[Any]
    training: bool
    scalar_sources: dict[str, str]
    globals: dict[str, Any]
    init_check: dict[str, Any] | None = None
    torch_version: str = ""
    # Int attributes of the model read as constants by the trace (attribute path -> traced value).
    baked_ints: dict[str, int] = field(default_factory=dict)
    by_name: dict[str, TracedNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {n.name: n for n in self.nodes}


def run_trace(source: str, *, init_source: str | None = None, timeout_s: float = 120.0) -> Trace:
    """Executes the reference in a fresh `python -I` process; nothing it does reaches this process."""
    request = json.dumps({"source": source, "init_source": init_source})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STITCH_", "OPENAI", "AWS_"))}
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory(prefix="stitch-trace-") as tmp:
        out = Path(tmp) / "trace.json"
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(WORKER), str(out)],
                input=request,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                cwd=tmp,
                env=env,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise TraceError(f"tracing the reference took longer than {timeout_s:.0f} s") from exc
        if not out.is_file():
            tail = (proc.stderr or "").strip().splitlines()[-3:]
            raise TraceError(f"the tracing process died (exit {proc.returncode}): {' | '.join(tail)}")
        data = json.loads(out.read_text())
    return trace_from_json(data)


def trace_from_json(data: dict[str, Any]) -> Trace:
    """The Trace for the tracing process's JSON answer (raises TraceError for a failed trace)."""
    if not data.get("ok"):
        where = f" ({data['where']})" if data.get("where") else ""
        raise TraceError(f"cannot trace the reference{where}: {data.get('error', 'unknown error')}")
    nodes = [
        TracedNode(
            name=n["name"],
            op=n["op"],
            target=n["target"],
            args=n["args"],
            kwargs=n["kwargs"],
            meta=n["meta"],
            module=n.get("module"),
            is_parameter=bool(n.get("is_parameter")),
            is_buffer=bool(n.get("is_buffer")),
        )
        for n in data["nodes"]
    ]
    return Trace(
        nodes=nodes,
        inputs=data["inputs"],
        init_inputs=data["init_inputs"],
        training=data["training"],
        scalar_sources=data["scalar_sources"],
        globals=data["globals"],
        init_check=data.get("init_check"),
        torch_version=data.get("torch_version", ""),
        baked_ints=data.get("baked_ints", {}),
    )
