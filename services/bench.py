"""`stitchcuda bench`: the loop on every problem of a folder, resumable, scored by KernelBench's fast_p.

Each problem runs as one job of the embedded platform in its own worker process (`python -m
stitchcuda.bench`), which writes `problems/<level>/<name>.json` atomically when the job ends; the parent only
schedules workers, shows progress and aggregates. Speedups are the Verifier's verdicts, never a second timer.
With `--jobs N` several workers plan, write and build at once. On CUDA their verifications take turns on the
node's GPU slot (`shared.gpu_slots`, one per GPU by default); with STITCH_GPU_SLOTS_PER_GPU=N they verify at
once, sharing the GPU while they work and each timing with the device alone (`verifier/harness/turns.py`).
Either way no timing shares the device with another problem's kernels, the Planner's runs included.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform as pyplatform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stitchcuda.shared.errors import InvalidRequest, ProblemError

FAST_P = (0.0, 0.8, 1.0, 1.5, 2.0)
BASELINES = ("eager", "compile")
RESULT_SCHEMA = 1
_LEVEL = re.compile(r"level_?(\d+)$", re.IGNORECASE)
_TERM_GRACE_S = 15.0


@dataclass(frozen=True)
class BenchSettings:
    """What a stored result depends on besides the problem's source: a change reruns the problem."""

    device: str
    rounds: int
    policy: str
    backend: str = "builtin"


@dataclass(frozen=True)
class Task:
    path: Path
    level: str
    name: str

    def result_path(self, out: Path) -> Path:
        return out / "problems" / self.level / f"{self.name}.json"

    def log_path(self, out: Path) -> Path:
        return out / "logs" / self.level / f"{self.name}.log"


# -- discovery ---------------------------------------------------------------------------------------------


def level_of(path: Path, root: Path) -> str:
    """'level2' for .../level2/x.py (KernelBench's layout), 'suite' for a problem outside such a folder."""
    parts = path.relative_to(root).parts[:-1] if path.is_relative_to(root) else path.parts[:-1]
    for part in reversed((root.name, *parts)):
        match = _LEVEL.match(part)
        if match:
            return f"level{int(match.group(1))}"
    return "suite"


def discover(root: Path, pattern: str, limit: int = 0) -> list[Task]:
    """The problems under `root` (a folder globbed by `pattern`, or one file), in a stable order."""
    if not root.exists():
        raise InvalidRequest(f"{root}: no such file or folder")
    root = root.resolve()
    if root.is_file():
        files = [root]
        root = root.parent
    else:
        files = sorted(p for p in root.glob(pattern) if p.is_file() and not p.name.startswith("_"))
    if not files:
        raise InvalidRequest(f"{root}: no problems matching {pattern!r}")
    tasks = sorted((Task(p, level_of(p, root), p.stem) for p in files), key=lambda t: (t.level, t.name))
    seen: dict[tuple[str, str], Path] = {}
    for task in tasks:
        other = seen.setdefault((task.level, task.name), task.path)
        if other != task.path:
            raise InvalidRequest(f"two problems named {task.name} in {task.level}: {other} and {task.path}")
    return tasks[:limit] if limit > 0 else tasks


# -- metrics -----------------------------------------------------------------------------------------------


def geomean(values: list[float]) -> float:
    """Geometric mean of the positive values (an unmeasured speedup is 0 and left out); 0 when none."""
    values = [v for v in values if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def speedup(row: dict[str, Any], baseline: str) -> float:
    return float(row.get(f"speedup_vs_{baseline}") or 0.0)


def fast_p(rows: list[dict[str, Any]], baseline: str, p: float) -> float:
    """KernelBench's fast_p: the share of ALL problems that are verified AND faster than `p` x the baseline.

    fast_0 is the verified rate by definition; for p > 0 an unmeasured baseline (speedup 0) counts as not
    faster, so a missing torch.compile figure can only lower the score."""
    if not rows:
        return 0.0
    hits = sum(1 for r in rows if r.get("verified") and (p <= 0 or speedup(r, baseline) > p))
    return hits / len(rows)


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    verified = [r for r in rows if r.get("verified")]
    walls = sorted(float(r.get("wall_s") or 0.0) for r in rows)
    return {
        "problems": len(rows),
        "verified": len(verified),
        "verified_rate": len(verified) / len(rows) if rows else 0.0,
        "fast_p": {b: {f"{p:g}": fast_p(rows, b, p) for p in FAST_P} for b in BASELINES},
        **{f"geomean_vs_{b}": geomean([speedup(r, b) for r in verified]) for b in BASELINES},
        "median_wall_s": walls[len(walls) // 2] if walls else 0.0,
    }


def summary_by_level(rows: list[dict[str, Any]]) -> dict[str, Any]:
    levels = sorted({r["level"] for r in rows})
    return {
        "overall": summarize(rows),
        "levels": {lv: summarize([r for r in rows if r["level"] == lv]) for lv in levels},
    }


# -- one problem (the worker process) ------------------------------------------------------------------------


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """A reader (or a rerun after a kill) sees the old file or the whole new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _row_head(task: Task, settings: BenchSettings, sha: str) -> dict[str, Any]:
    return {
        "schema": RESULT_SCHEMA,
        "level": task.level,
        "problem": task.name,
        "file": str(task.path),
        "source_sha256": sha,
        "settings": asdict(settings),
        "verified": False,
        "reason": "",
        "error_code": "",
        "speedup_vs_eager": None,
        "speedup_vs_compile": None,
        "custom_share": None,
        "library_share": None,
        "torch_share": None,
        "rounds": 0,
        "replans": 0,
        "verdicts": 0,
        "wall_s": 0.0,
    }


def run_one(task: Task, settings: BenchSettings) -> dict[str, Any]:
    """Runs the whole loop on one problem in this process and returns its result row."""
    from stitchcuda.api.v1 import jobs_pb2
    from stitchcuda.embedded import EmbeddedPlatform
    from stitchcuda.shared import devices, problem
    from stitchcuda.shared.settings import CommonSettings
    from stitchcuda.verifier.service import VerifierService

    started = time.monotonic()
    prob = problem.load(task.path)
    row = _row_head(task, settings, prob.sha256)
    spec = jobs_pb2.JobSpec(
        problem_name=prob.name,
        reference_source=prob.source,
        device=devices.to_proto(settings.device),
        options=jobs_pb2.JobOptions(
            max_rounds=settings.rounds,
            stagnation_rounds=2,
            min_improvement=0.02,
            coder_backend=settings.backend,
            samples=1,
            max_replans=1,
            kernel_policy=settings.policy,
        ),
    )
    staging = Path(tempfile.mkdtemp(prefix="stitchcuda-bench-"))
    try:
        # Job artifacts are scratch; the verifier keeps its default store (STITCH_ARTIFACT_DIR or
        # ~/.stitchcuda/artifacts), so builds are cached across problems, workers and reruns.
        platform = EmbeddedPlatform(CommonSettings(), artifact_root=staging, verifier=VerifierService())

        def log_event(event: jobs_pb2.JobEvent) -> None:
            # The problem's log shows where its time went: every event of the job, timed from its start.
            print(f"{time.monotonic() - started:8.1f}s  {event.stage or '-':<10} {event.message}", flush=True)

        try:
            job = platform.run(spec, on_event=log_event)
        except ProblemError as exc:
            row.update(reason=str(exc), error_code="invalid_problem", wall_s=time.monotonic() - started)
            return row
        report: dict[str, Any] = {}
        if "report.json" in job.artifacts:
            report = json.loads(platform.artifacts.get(job.artifacts["report.json"]))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    status = job.status
    ok = status.state == jobs_pb2.JOB_STATE_SUCCEEDED
    verdicts = report.get("rounds") or []
    row.update(
        verified=ok,
        reason=status.message.splitlines()[0] if status.message else "",
        error_code=status.error_code,
        rounds=len({v["round"] for v in verdicts}),
        replans=status.replans,
        verdicts=len(verdicts),
        wall_s=time.monotonic() - started,
    )
    if ok:
        profile = (report.get("best") or {}).get("profile") or {}
        row.update(
            speedup_vs_eager=status.best_speedup_vs_eager,
            speedup_vs_compile=status.best_speedup_vs_compile,
            custom_share=profile.get("custom_share"),
            library_share=profile.get("library_share"),
            torch_share=profile.get("torch_share"),
        )
    return row


def _watch_parent(parent: int) -> None:
    """A worker whose bench died (even by SIGKILL) stops too, so no orphan writes a result later."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGINT)  # unwinds the loop, whose sandboxes kill their process groups
    time.sleep(_TERM_GRACE_S)
    os._exit(130)


def _interrupt(_sig: int, _frame: object) -> None:
    raise KeyboardInterrupt


def worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stitchcuda.bench", description="one bench problem")
    for name in ("problem", "result", "level", "device", "policy", "backend", "parent"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    threading.Thread(target=_watch_parent, args=(int(args.parent),), daemon=True).start()
    from stitchcuda.shared.logs import configure_logging

    configure_logging("INFO", json_output=False)  # the verifier's own timings go to the problem's log
    path = Path(args.problem)
    task = Task(path, args.level, path.stem)
    settings = BenchSettings(args.device, args.rounds, args.policy, args.backend)
    try:
        row = run_one(task, settings)
    except KeyboardInterrupt:
        return 130
    write_json_atomic(Path(args.result), row)
    return 0


# -- the bench (parent) ------------------------------------------------------------------------------------


def load_result(task: Task, out: Path, settings: BenchSettings, sha: str) -> dict[str, Any] | None:
    """The stored row of a problem, if it was produced for this source and these settings."""
    try:
        row: dict[str, Any] = json.loads(task.result_path(out).read_text())
    except (OSError, ValueError):
        return None
    same = row.get("settings") == asdict(settings) and row.get("source_sha256") == sha
    return row if same and row.get("schema") == RESULT_SCHEMA else None


def worker_env(jobs: int, environ: Mapping[str, str], cpus: int) -> dict[str, str]:
    """A problem worker's environment: with several at once, each gets its share of the cores for torch's
    thread pools (unless the user set OMP_NUM_THREADS). The pools spin while they wait, so pools of every
    core in every worker fight: the comparison of level-2 problem 12's outputs, 0.4 s on an idle 2-core
    host, took 10.7 s and 55 s with four workers on a 16-core H100 host (benchmarks/results/gpu_stop29)."""
    env = dict(environ)
    if jobs > 1:
        env.setdefault("OMP_NUM_THREADS", str(max(1, cpus // jobs)))
    return env


class Bench:
    def __init__(self, tasks: list[Task], settings: BenchSettings, out: Path, *, jobs: int = 1) -> None:
        self.tasks, self.settings, self.out, self.jobs = tasks, settings, out, max(1, jobs)
        self.rows: dict[Task, dict[str, Any]] = {}
        self.skipped = 0

    def plan(self, *, fresh: bool) -> list[Task]:
        """Fills in the problems already done (or not loadable) and returns the ones left to run."""
        from stitchcuda.shared import problem

        todo = []
        for task in self.tasks:
            try:
                sha = problem.load(task.path).sha256
            except ProblemError as exc:
                self.rows[task] = {**_row_head(task, self.settings, ""), "reason": str(exc),
                                   "error_code": "invalid_problem"}  # fmt: skip
                continue
            stored = None if fresh else load_result(task, self.out, self.settings, sha)
            if stored is None:
                todo.append(task)
            else:
                self.rows[task] = stored
                self.skipped += 1
        return todo

    def _start(self, task: Task) -> subprocess.Popen[bytes]:
        log = task.log_path(self.out)
        log.parent.mkdir(parents=True, exist_ok=True)
        s = self.settings
        cmd = [sys.executable, "-m", "stitchcuda.bench", "--problem", str(task.path), "--level", task.level,
               "--result", str(task.result_path(self.out)), "--device", s.device, "--rounds", str(s.rounds),
               "--policy", s.policy, "--backend", s.backend, "--parent", str(os.getpid())]  # fmt: skip
        with log.open("wb") as handle:
            # Its own session: a terminal's Ctrl-C reaches only the bench, which then stops each worker.
            return subprocess.Popen(
                cmd,
                stdout=handle,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=worker_env(self.jobs, os.environ, os.cpu_count() or 1),
            )

    def _collect(self, task: Task, proc: subprocess.Popen[bytes]) -> None:
        stored = load_result(task, self.out, self.settings, _sha(task))
        if stored is None:
            # The worker died without a verdict (a crash of the interpreter, the OOM killer): that is this
            # problem's result under these settings, kept like any other; --fresh tries again.
            tail = task.log_path(self.out).read_text(errors="replace").strip().splitlines()[-1:] or [""]
            stored = {**_row_head(task, self.settings, _sha(task)), "error_code": "worker_crashed",
                      "reason": f"bench worker exited with {proc.returncode}: {tail[0][:200]}"}  # fmt: skip
            write_json_atomic(task.result_path(self.out), stored)
        self.rows[task] = stored

    def run(self, todo: list[Task], console: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        pending = deque(todo)
        running: dict[Task, subprocess.Popen[bytes]] = {}
        columns = (TextColumn("[bold]bench[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.description}"))  # fmt: skip
        try:
            with Progress(*columns, console=console, transient=False) as progress:
                bar = progress.add_task("", total=len(self.tasks), completed=len(self.tasks) - len(todo))
                while pending or running:
                    while pending and len(running) < self.jobs:
                        task = pending.popleft()
                        running[task] = self._start(task)
                    names = ", ".join(f"{t.level}/{t.name}" for t in running)
                    progress.update(bar, description=names)
                    for task, proc in list(running.items()):
                        if proc.poll() is not None:
                            del running[task]
                            self._collect(task, proc)
                            progress.advance(bar)
                            mark = (
                                "[green]verified[/]"
                                if self.rows[task]["verified"]
                                else "[red]not verified[/]"
                            )
                            progress.console.print(f"{task.level}/{task.name}: {mark}", highlight=False)
                    time.sleep(0.1)
                progress.update(bar, description="done")
        finally:
            _stop(list(running.values()))

    def ordered_rows(self) -> list[dict[str, Any]]:
        return [self.rows[t] for t in self.tasks if t in self.rows]


def _sha(task: Task) -> str:
    from stitchcuda.shared.artifacts import sha256_hex

    return sha256_hex(task.path.read_text())


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """Stops the workers this bench started: SIGTERM (sandboxes clean up), then their groups' SIGKILL."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def _versions() -> dict[str, str]:
    """The project's version (the package's own, so a source tree that is not installed works too)."""
    import stitchcuda

    found = {"stitchcuda": stitchcuda.__version__, "python": pyplatform.python_version()}
    try:
        import torch

        found["torch"] = torch.__version__
        found["cuda"] = str(torch.version.cuda or "")
    except ImportError:
        pass
    return found


def results(bench: Bench, suite: str, *, complete: bool) -> dict[str, Any]:
    rows = bench.ordered_rows()
    return {
        "suite": suite,
        "settings": asdict(bench.settings),
        "complete": complete,
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": ["stitchcuda", *sys.argv[1:]],
        "versions": _versions(),
        "skipped": bench.skipped,
        "ran": len(rows) - bench.skipped,
        "summary": summary_by_level(rows),
        "rows": rows,
    }


def run_bench(
    tasks: list[Task],
    settings: BenchSettings,
    out: Path,
    *,
    suite: str,
    jobs: int = 1,
    fresh: bool = False,
    console: Any,
) -> int:
    """The command's body: run what is left, write results.json and report.html; returns the exit code."""
    from stitchcuda.bench_report import print_table, to_html

    bench = Bench(tasks, settings, out, jobs=jobs)
    todo = bench.plan(fresh=fresh)
    console.print(
        f"[bold]StitchCUDA bench[/] {suite}: {len(tasks)} problems on {settings.device}, {settings.rounds} "
        f"optimize rounds, {settings.policy} policy; {bench.skipped} already done, {len(todo)} to run "
        f"({bench.jobs} at a time) → {out}"
    )
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        bench.run(todo, console)
    except KeyboardInterrupt:
        data = results(bench, suite, complete=False)
        write_json_atomic(out / "results.json", data)
        console.print(f"[yellow]interrupted[/]: {len(data['rows'])} results kept in {out}; rerun to resume")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    data = results(bench, suite, complete=True)
    write_json_atomic(out / "results.json", data)
    (out / "report.html").write_text(to_html(data))
    print_table(data)
    overall = data["summary"]["overall"]
    return 0 if overall["verified"] == overall["problems"] else 1


if __name__ == "__main__":
    sys.exit(worker_main())
