"""Runs the tracing subprocess on a reference program and returns its graph description."""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchcuda.shared.errors import ProblemError
from stitchcuda.shared.isolation import Isolation
from stitchcuda.shared.isolation import run as run_isolated

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
    constant: float | int | bool | None = None  # the value of a one-element graph constant


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
    # The graph holds the inputs' shapes as numbers (the forward read them): valid for those shapes only.
    specialized: bool = False
    by_name: dict[str, TracedNode] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name = {n.name: n for n in self.nodes}


def run_trace(
    source: str,
    *,
    init_source: str | None = None,
    timeout_s: float = 120.0,
    isolation: Isolation | None = None,
) -> Trace:
    """Executes the reference in its own isolated process (stitchcuda.shared.isolation: no network, the
    system read-only, a clean environment, a memory limit); nothing it does reaches this process."""
    isolation = isolation or Isolation()
    request = json.dumps({"source": source, "init_source": init_source}).encode()
    with tempfile.TemporaryDirectory(prefix="stitch-trace-") as tmp:
        work = Path(tmp)
        out = work / "trace.json"
        done = run_isolated(
            isolation,
            WORKER,
            [str(out)],
            work,
            timeout_s=timeout_s,
            stdin=request,
            env=isolation.env(work, OMP_NUM_THREADS="1"),
        )
        if done.timed_out:
            raise TraceError(f"tracing the reference took longer than {timeout_s:.0f} s")
        if not out.is_file():
            tail = done.stderr.strip().splitlines()[-3:]
            if any("MemoryError" in line for line in tail):
                raise TraceError(
                    f"tracing the reference ran out of memory (limit {isolation.memory_mb} MiB): {tail[-1]}"
                )
            raise TraceError(f"the tracing process died (exit {done.returncode}): {' | '.join(tail)}")
        data = json.loads(out.read_text())
    if not data.get("ok") and "MemoryError" in str(data.get("error", "")):
        raise TraceError(
            f"tracing the reference ran out of memory (limit {isolation.memory_mb} MiB)"
            f"{' at ' + str(data['where']) if data.get('where') else ''}"
        )
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
            constant=n.get("constant"),
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
        specialized=bool(data.get("specialized")),
    )
