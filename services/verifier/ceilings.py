"""Measured device ceilings (copy bandwidth, matmul rate) cached on disk, and the physics floor they imply.

floor = max(bytes / bandwidth, flops / matmul rate). The ceilings are the *best* rates measured (cache-
resident copies on a CPU, so small problems are not judged against DRAM), which keeps the floor a true
lower bound: a time below a fraction of it is a hack (skipped work, replayed results), not a win.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Ceilings:
    device: str
    device_name: str = ""
    peak_copy_gbs: float = 0.0
    dram_copy_gbs: float = 0.0
    matmul_tflops: dict[str, float] = field(default_factory=dict)
    measured_at: float = 0.0

    def rate(self, dtype: str) -> float:
        name = dtype.replace("torch.", "")
        return self.matmul_tflops.get(name) or self.matmul_tflops.get("float32", 0.0)


@dataclass
class Floor:
    floor_ms: float
    bound: str
    memory_ms: float
    compute_ms: float
    intensity: float
    ridge: float


class CeilingStore:
    """One JSON file per (device kind, host): measured once, reused by every later verification."""

    def __init__(self, root: Path) -> None:
        self.root = root / "ceilings"

    def _path(self, device: str) -> Path:
        host = socket.gethostname().replace("/", "_")
        visible = (
            os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_") if device == "cuda" else "host"
        )
        return self.root / f"{device}-{host}-{visible}.json"

    def get(self, device: str, dtype: str = "float32") -> Ceilings | None:
        try:
            data = json.loads(self._path(device).read_text())
            found = Ceilings(**data)
        except (OSError, ValueError, TypeError):
            return None
        if found.peak_copy_gbs <= 0:
            return None
        if dtype and dtype.replace("torch.", "") not in found.matmul_tflops and device == "cuda":
            return None
        return found

    def put(self, device: str, measured: dict[str, Any], device_name: str) -> Ceilings:
        path = self._path(device)
        previous = self.get(device, "")
        rates = dict(previous.matmul_tflops) if previous else {}
        rates.update({k: float(v) for k, v in (measured.get("matmul_tflops") or {}).items()})
        found = Ceilings(
            device=device,
            device_name=device_name,
            peak_copy_gbs=float(measured.get("peak_copy_gbs", 0.0)),
            dram_copy_gbs=float(measured.get("dram_copy_gbs", 0.0)),
            matmul_tflops=rates,
            measured_at=time.time(),
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(found), indent=2))
        os.replace(tmp, path)
        return found


def physics_floor(ceilings: Ceilings, flops: float, nbytes: float, dtype: str) -> Floor:
    bandwidth = max(ceilings.peak_copy_gbs, 1e-9) * 1e9
    rate = max(ceilings.rate(dtype), 1e-9) * 1e12
    memory_ms = nbytes / bandwidth * 1e3
    compute_ms = flops / rate * 1e3
    dram = max(ceilings.dram_copy_gbs or ceilings.peak_copy_gbs, 1e-9) * 1e9
    intensity = flops / nbytes if nbytes > 0 else 0.0
    ridge = rate / dram
    return Floor(
        floor_ms=max(memory_ms, compute_ms),
        bound="compute" if intensity >= ridge else "memory",
        memory_ms=memory_ms,
        compute_ms=compute_ms,
        intensity=intensity,
        ridge=ridge,
    )
