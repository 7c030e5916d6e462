"""Nsight Systems adapter: the reference's CUDA kernels summarised from a timeline (skipped when absent)."""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from stitchcuda.planner.analysis import KernelTime
from stitchcuda.planner.runner import ReferenceRunner
from stitchcuda.planner.settings import PlannerSettings


@dataclass
class NsysSummary:
    kernels: list[KernelTime] = field(default_factory=list)
    warning: str = ""
    note: str = ""


def parse_kernel_summary(text: str, iters: int) -> list[KernelTime]:
    """Rows of `nsys stats --report cuda_gpu_kern_sum --format csv`, as ms and calls per forward."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "Total Time" in line and "Name" in line), None)
    if start is None:
        return []
    rows = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    kernels = []
    per = max(iters, 1)
    for row in rows:
        total = next((v for k, v in row.items() if k and k.startswith("Total Time")), None)
        calls = next((v for k, v in row.items() if k and k.startswith("Instances")), "0")
        name = row.get("Name") or ""
        if total is None or not name:
            continue
        try:
            kernels.append(KernelTime(name=name, ms=float(total) / 1e6 / per, calls=float(calls) / per))
        except ValueError:
            continue
    return sorted(kernels, key=lambda k: -k.ms)[:20]


class NsysProfiler:
    def __init__(self, settings: PlannerSettings, runner: ReferenceRunner) -> None:
        self.settings = settings
        self.runner = runner

    @staticmethod
    def executable() -> str | None:
        return shutil.which("nsys")

    def summarise(self, source: str, device: str) -> NsysSummary:
        exe = self.executable()
        if device != "cuda" or not self.settings.nsys_enabled:
            return NsysSummary()
        if exe is None:
            return NsysSummary(note="nsys is not installed: kernel times come from torch.profiler")
        with tempfile.TemporaryDirectory(prefix="stitch-nsys-") as tmp:
            work = Path(tmp)
            report = work / "timeline"
            prefix = [
                exe,
                "profile",
                "--trace=cuda",
                "--sample=none",
                "--cpuctxsw=none",
                "--force-overwrite=true",
            ]
            prefix += ["--output", str(report)]
            request = self.runner.eager_request(device)
            budget = self.settings.nsys_timeout_s
            outcome = self.runner.execute_in(work, source, request, device, [("eager.json", budget)], prefix)
            if outcome.timed_out or outcome.eager is None or not outcome.eager.ok:
                why = (outcome.timed_out and f"timed out in {outcome.timed_out}") or outcome.stderr[-300:]
                return NsysSummary(warning=f"nsys profile failed: {why.strip()}")
            rep = next(work.glob("timeline*.nsys-rep"), None)
            if rep is None:
                return NsysSummary(warning="nsys wrote no report")
            try:
                stats = subprocess.run(
                    [
                        exe,
                        "stats",
                        "--report",
                        "cuda_gpu_kern_sum",
                        "--format",
                        "csv",
                        "--output",
                        "-",
                        str(rep),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=budget,
                    check=False,
                )
            except (OSError, subprocess.SubprocessError) as exc:
                return NsysSummary(warning=f"nsys stats failed: {exc}")
            kernels = parse_kernel_summary(stats.stdout, outcome.eager.iters + self.settings.profile_warmup)
            if not kernels:
                return NsysSummary(warning=f"nsys stats gave no kernel table: {stats.stderr.strip()[-300:]}")
            return NsysSummary(
                kernels=kernels, note="kernel times from an nsys timeline of the eager forward"
            )
