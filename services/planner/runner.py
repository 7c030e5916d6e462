"""Runs the harness on an untrusted reference in a sandboxed subprocess, with deadlines; reads its reports."""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from stitchcuda.planner.analysis import Analysis, CompileResult, EagerResult, RunResult
from stitchcuda.planner.settings import PlannerSettings

HARNESS = Path(__file__).with_name("harness.py")
# Variables the reference process may see; everything else (credentials, tokens) stays out.
PASSED_ENV = (
    "PATH", "LANG", "LC_ALL", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
    "NVIDIA_VISIBLE_DEVICES", "STITCHCUDA_SIZE", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "TORCH_CUDA_ARCH_LIST", "CC", "CXX",
)  # fmt: skip
POLL_S = 0.05
# Sets the limits inside the child, then runs the harness in the same process (no preexec_fn: it is
# unsafe when the Planner runs in a threaded server).
LAUNCH = (
    "import resource, runpy, sys; m = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_CORE, (0, 0)); "
    "m and resource.setrlimit(resource.RLIMIT_AS, (m, m)); sys.argv = sys.argv[2:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
Report = TypeVar("Report", bound=BaseModel)


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


@functools.cache
def bwrap_works(cuda: bool) -> bool:
    """Whether bubblewrap can start a network-less, read-only sandbox on this machine."""
    exe = shutil.which("bwrap")
    if exe is None:
        return False
    with tempfile.TemporaryDirectory() as work:
        cmd = [*_bwrap_prefix(exe, Path(work), cuda), sys.executable, "-I", "-c", "pass"]
        try:
            return subprocess.run(cmd, capture_output=True, timeout=30, check=False).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


def _bwrap_prefix(exe: str, work: Path, cuda: bool) -> list[str]:
    devices = ["--dev-bind", "/dev", "/dev"] if cuda else ["--dev", "/dev"]
    return [
        exe, "--die-with-parent", "--unshare-net", "--unshare-ipc", "--ro-bind", "/", "/", *devices,
        "--proc", "/proc", "--bind", str(work), str(work), "--chdir", str(work), "--",
    ]  # fmt: skip


class ReferenceRunner:
    """One harness process per call; the reference never runs in the Planner's own process."""

    def __init__(self, settings: PlannerSettings) -> None:
        self.settings = settings

    def _command(self, work: Path, request: Path, device: str) -> list[str]:
        memory = self.settings.subprocess_memory_mb << 20 if device == "cpu" else 0
        base = [sys.executable, "-I", "-c", LAUNCH, str(memory), str(HARNESS), str(request)]
        mode = self.settings.sandbox
        cuda = device == "cuda"
        exe = shutil.which("bwrap")
        if mode == "bwrap" or (mode == "auto" and exe is not None and bwrap_works(cuda)):
            return [*_bwrap_prefix(exe or "bwrap", work, cuda), *base]
        return base

    def _env(self, work: Path) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
        env.update(HOME=str(work), TMPDIR=str(work), TORCHINDUCTOR_CACHE_DIR=str(work / "inductor"))
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        return env

    def plan(self, source: str, *, device: str, run: bool, profile: bool) -> Outcome:
        """Analysis on the meta device, then (when it fits and `run`) a real forward and its profile."""
        s = self.settings
        request = {
            "mode": "plan", "device": device, "run": run, "profile": profile,
            "max_real_bytes": s.max_real_bytes, "warmup": s.profile_warmup, "iters": s.profile_iters,
            "op_iters": s.profile_op_iters, "seed": s.seed,
        }  # fmt: skip
        deadlines = [("analysis.json", s.analysis_timeout_s)]
        if run:
            deadlines.append(("run.json", s.profile_timeout_s))
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
        self, source: str, request: dict[str, Any], device: str, deadlines: list[tuple[str, float]]
    ) -> Outcome:
        with tempfile.TemporaryDirectory(prefix="stitch-plan-") as tmp:
            return self.execute_in(Path(tmp), source, request, device, deadlines, [])

    def execute_in(
        self,
        work: Path,
        source: str,
        request: dict[str, Any],
        device: str,
        deadlines: list[tuple[str, float]],
        prefix: list[str],
    ) -> Outcome:
        """Runs the harness in `work` (the caller owns the folder: nsys writes its report there)."""
        reference = work / "reference.py"
        reference.write_text(source)
        request = {**request, "reference": str(reference), "out_dir": str(work)}
        request_path = work / "request.json"
        request_path.write_text(json.dumps(request))
        cmd = [*prefix, *self._command(work, request_path, device)]
        outcome = Outcome()
        start = time.monotonic()
        stderr_path = work / "stderr.txt"
        with stderr_path.open("wb") as stderr:
            proc = subprocess.Popen(
                cmd,
                cwd=work,
                env=self._env(work),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
            try:
                outcome.timed_out = self._wait(proc, work, deadlines)
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
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

    @staticmethod
    def _wait(proc: subprocess.Popen[bytes], work: Path, deadlines: list[tuple[str, float]]) -> str:
        """Waits phase by phase: each report file must appear before its own deadline."""
        for report, budget in deadlines:
            deadline = time.monotonic() + budget
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _read(path: Path, model: type[Report], outcome: Outcome) -> Report | None:
    if not path.exists():
        return None
    try:
        return model.model_validate_json(path.read_bytes())
    except (ValidationError, ValueError) as exc:
        outcome.unreadable = f"{path.name}: {str(exc).splitlines()[0]}"
        return None
