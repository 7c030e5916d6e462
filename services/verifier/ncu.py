"""Nsight Compute counters for a candidate's top custom kernels (GPU only; skipped when ncu cannot run).

The counters are feedback for the Coder (achieved bandwidth, occupancy, tensor-core use), never
evidence for the verdict: they are read from the run's log, which candidate code can also write to.
"""

from __future__ import annotations

import csv
import io
import logging
import re
import shutil

log = logging.getLogger("stitchcuda.verifier.ncu")

METRICS = {
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor_pct",
    "gpu__time_duration.sum": "duration_ns",
}


def executable() -> str | None:
    return shutil.which("ncu")


def base_name(kernel: str) -> str:
    """`void ns::fused<float>(float const*, ...)` -> `fused`."""
    head = kernel.split("(", 1)[0].split("<", 1)[0].strip()
    head = head.split()[-1] if head.split() else head
    return head.split("::")[-1]


def command(ncu: str, kernels: list[str], launches: int = 3) -> list[str]:
    names = "|".join(re.escape(base_name(k)) for k in kernels if base_name(k))
    return [
        ncu,
        "--csv",
        "--clock-control",
        "none",
        "--target-processes",
        "all",
        "--kernel-name",
        f"regex:^({names})$",
        "--launch-count",
        str(launches),
        "--metrics",
        ",".join(METRICS),
    ]


def parse(text: str) -> dict[str, dict[str, float]]:
    """Kernel base name -> {counter: value} from ncu's --csv output (the mean over its launches)."""
    start = text.find('"ID","Process ID"')
    if start < 0:
        return {}
    sums: dict[str, dict[str, list[float]]] = {}
    for row in csv.DictReader(io.StringIO(text[start:])):
        metric = METRICS.get(row.get("Metric Name", ""))
        name = base_name(row.get("Kernel Name", "") or "")
        if not metric or not name:
            continue
        try:
            value = float(str(row.get("Metric Value", "")).replace(",", ""))
        except ValueError:
            continue
        sums.setdefault(name, {}).setdefault(metric, []).append(value)
    return {name: {m: sum(v) / len(v) for m, v in metrics.items()} for name, metrics in sums.items()}
