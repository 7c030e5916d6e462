"""Runs the harness on an untrusted reference in a sandboxed subprocess, with deadlines; reads its reports."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from stitchcuda.planner.analysis import Analysis, CompileResult, EagerResult, RunResult
from stitchcuda.planner.settings import PlannerSettings
from stitchcuda.shared.gpu_slots import device_gpu, gpu_turn
from stitchcuda.shared.isolation import Isolation, kill_group

HARNESS = Path(__file__).with_name("harness.py")
POLL_S = 0.05
Report = TypeVar("Report", bound=BaseModel)
Budget = float | Callable[[Path], float]


@dataclass
class Outcome:
    """What one harness process reported. `timed_out` names the stage that ran past its deadline."""

    analysis: Analysis | None = None
    run: RunResult | None = None
    compiled: CompileResult | None = None
    eager: EagerResult | None = None
    timed_out: str = ""
    returncode: int | None = None
    stderr: str = ""
    wall_s: float = 0.0
    unreadable: str = ""
    stage: str = ""  # the last stage the harness reached


class ReferenceRunner:
    """One harness process per call; the reference never runs in the Planner's own process."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings
        self.last_run_budget = settings.profile_timeout_s

    @property
    def isolation(self) -> Isolation:
        """The shared launcher for untrusted code (stitchcuda.shared.isolation) with this service's limits."""
        return Isolation(mode=self.settings.sandbox, memory_mb=self.settings.subprocess_memory_mb)

    def plan(self, source: str, *, device: str, run: bool, profile: bool) -> Outcome:
        """Analysis on the meta device, then (when it fits and `run`) a real forward and its profile."""
        s = self.settings
        request = {
            "mode": "plan", "device": device, "run": run, "profile": profile,
            "max_real_bytes": s.max_real_bytes, "warmup": s.profile_warmup, "iters": s.profile_iters,
            "op_iters": s.profile_op_iters, "seed": s.seed,
        }  # fmt: skip
        deadlines: list[tuple[str, Budget]] = [("analysis.json", s.analysis_timeout_s)]
        if run:
            deadlines.append(("run.json", self.run_budget))
        return self._execute(source, request, device, deadlines)

    def compile(self, source: str, *, device: str) -> Outcome:
        s = self.settings
        request = {"mode": "compile", "device": device, "warmup": s.profile_warmup, "iters": s.profile_iters}
        request["seed"] = s.seed
        return self._execute(source, request, device, [("compile.json", s.compile_timeout_s)])

    def eager_request(self, device: str) -> dict[str, Any]:
        """A bare timing loop (for an external profiler such as nsys to watch)."""
        s = self.settings
        return {
            "mode": "eager",
            "device": device,
            "warmup": s.profile_warmup,
            "iters": s.profile_iters,
            "seed": s.seed,
        }

    def _execute(
        self, source: str, request: dict[str, Any], device: str, deadlines: list[tuple[str, Budget]]
    ) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="stitch-plan-") as tmp:
            return self.execute_in(Path(tmp), source, request, device, deadlines, [])

    def execute_in(
        self,
        work: Path,
        source: str,
        request: dict[str, Any],
        device: str,
        deadlines: list[tuple[str, Budget]],
        prefix: list[str],
    ) -> Outcome:
        """Runs the harness in `work` (the caller owns the folder: nsys writes its report there)."""
        reference = work / "reference.py"
        reference.write_text(source)
        request = {**request, "reference": str(reference), "out_dir": str(work)}
        request_path = work / "request.json"
        request_path.write_text(json.dumps(request))
        cmd = [*prefix, *self.isolation.command(HARNESS, [str(request_path)], work, device)]
        outcome = Outcome()
        start = time.monotonic()
        stderr_path = work / "stderr.txt"
        with stderr_path.open("wb") as stderr, self._turn(device, prefix):
            proc = subprocess.Popen(
                cmd,
                cwd=work,
                env=self.isolation.env(work),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                outcome.timed_out = self._wait(proc, work, deadlines)
            finally:
                if proc.poll() is None:
                    kill_group(proc)
        outcome.returncode = proc.returncode
        outcome.wall_s = time.monotonic() - start
        stage = work / "stage"
        outcome.stage = stage.read_text().strip() if stage.exists() else ""
        outcome.stderr = stderr_path.read_bytes()[-4000:].decode(errors="replace")
        outcome.analysis = _read(work / "analysis.json", Analysis, outcome)
        outcome.run = _read(work / "run.json", RunResult, outcome)
        outcome.compiled = _read(work / "compile.json", CompileResult, outcome)
        outcome.eager = _read(work / "eager.json", EagerResult, outcome)
        return outcome

    def _turn(self, device: str, prefix: list[str]) -> contextlib.AbstractContextManager[None]:
        """A GPU run shares the device with the node's other work and keeps off its timings; a run under
        a profiler (nsys times kernels) has the device alone."""
        gpu = device_gpu(device) if self.settings.gpu_turns else None
        if gpu is None:
            return contextlib.nullcontext()
        return gpu_turn(self.settings.gpu_slot_dir, gpu, "alone" if prefix else "shared")

    def run_budget(self, work: Path) -> float:
        """Seconds the real run (forward, timing, profile) may take, from the analysis's FLOPs: a forward
        that loops or hangs is stopped in seconds, a large honest one gets up to profile_timeout_s."""
        s = self.settings
        analysis = _read(work / "analysis.json", Analysis, Outcome())
        flops = float(analysis.eager_flops or 0.0) if analysis is not None else 0.0
        calls = 2 + s.profile_warmup + s.profile_iters + s.profile_op_iters
        estimate = calls * flops / s.slowest_flops_per_s
        self.last_run_budget = min(s.profile_timeout_s, max(s.min_run_timeout_s, 3.0 * estimate))
        return self.last_run_budget

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], work: Path, deadlines: list[tuple[str, Budget]]) -> str:
        """Waits phase by phase: each report file must appear before its own deadline (a number of
        seconds, or a function of the work folder evaluated when the phase starts)."""
        for report, budget in deadlines:
            seconds = budget(work) if callable(budget) else budget
            deadline = time.monotonic() + seconds
            while not (work / report).exists():
                if proc.poll() is not None:
                    return ""
                if time.monotonic() > deadline:
                    stage = work / "stage"
                    return stage.read_text().strip() if stage.exists() else report
                time.sleep(POLL_S)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        return ""


def _read(path: Path, model: type[Report], outcome: Outcome) -> Report | None:
    if not path.exists():
        return None
    try:
        return model.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError) as exc:
        outcome.unreadable = f"{path.name}: {str(exc).splitlines()[0]}"
        return None
