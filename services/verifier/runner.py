"""Runs the candidate runner on a prepared reference and collects its frames into a CandidateRun."""

from __future__ import annotations

import atexit
import concurrent.futures
import contextlib
import os
import secrets
import shutil
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from stitchcuda.api.v1 import code_pb2
from stitchcuda.shared.candidate import ENTRY, builds
from stitchcuda.verifier import limits
from stitchcuda.verifier.accounting import CALL_SPAN
from stitchcuda.verifier.harness import seeds, sketch, wire
from stitchcuda.verifier.reference import ReferenceResult
from stitchcuda.verifier.sandbox import Launch, Mount, Outcome, RunSpec, Sandbox
from stitchcuda.verifier.settings import VerifierSettings


@dataclass
class Recorded:
    name: str
    set_name: str
    outputs: list[Any] | None
    custom_calls: int | None = None
    error: str = ""


@dataclass
class CandidateRun:
    outcome: Outcome
    completed: bool
    token: str
    outputs: dict[str, Recorded] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, str]] = field(default_factory=list)
    fault: dict[str, Any] = field(default_factory=dict)
    memory: dict[str, Any] = field(default_factory=dict)
    bad_record: str = ""
    # Why the eager reference could not be timed beside the candidate ("" when it was, or not asked).
    baseline_error: str = ""


class CandidateRunner:
    """Runs candidates, one fresh sandboxed process each; keeps one prepared standby per device."""

    def __init__(self, settings: VerifierSettings, sandbox: Sandbox) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self._standby: dict[str, tuple[Launch, Path]] = {}
        self._lock = threading.Lock()
        # Standbys are started from this one long-lived thread: a runner dies with the thread that
        # started it (the parent-death signal is per thread), and prewarm may be called from a thread
        # that ends soon after (the reference computed ahead, in embedded mode).
        self._starter = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="standby-start")
        # A standby dies with this process; its folder must not outlive it either.
        atexit.register(_close_at_exit, weakref.ref(self))
        self._sweep()

    def run(
        self,
        candidate: code_pb2.Candidate,
        ext_dir: Path,
        ref: ReferenceResult,
        *,
        timeout_s: float,
        quick: bool = False,
        prefix: list[str] | None = None,
    ) -> CandidateRun:
        """One sandboxed run of the whole schedule (quick: two calls only, for profiling tools)."""
        device = ref.device
        taken = None if prefix else self._take(device)
        launch, root = taken or self._launch(device, prefix)
        try:
            nonce, token, header, payload = self._job(
                candidate, ext_dir, ref, root, launch.spec.mounts, quick
            )
            outcome = self.sandbox.finish(launch, header, payload, timeout_s, transform=summarizer(ref))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        # The next standby starts when the caller is done with this run (`prewarm`): started here, its
        # interpreter and device start-up took the cores the evaluation's parallel loops wait on.
        return _collect(outcome, nonce, token)

    def prewarm(self, device: str) -> None:
        """Starts the standby runner for `device` if there is none (it waits for a job, up to a limit)."""
        if not self.settings.standby:
            return
        with self._lock:
            if device in self._standby:
                return
            self._standby[device] = self._starter.submit(self._launch, device, None).result()

    def settle(self, timeout: float = 120.0) -> None:
        """Waits for standbys to finish preparing, so they cannot disturb a measurement."""
        with self._lock:
            launches = [launch for launch, _ in self._standby.values()]
        for launch in launches:
            launch.ready(timeout)

    def close(self) -> None:
        with self._lock:
            standbys, self._standby = list(self._standby.values()), {}
        for launch, root in standbys:
            self.sandbox.discard(launch)
            shutil.rmtree(root, ignore_errors=True)

    def _take(self, device: str) -> tuple[Launch, Path] | None:
        with self._lock:
            found = self._standby.pop(device, None)
        if found is None:
            return None
        if found[0].alive():
            return found
        self.sandbox.discard(found[0])
        shutil.rmtree(found[1], ignore_errors=True)
        return None

    def _launch(self, device: str, prefix: list[str] | None) -> tuple[Launch, Path]:
        root = Path(tempfile.mkdtemp(prefix="cand-", dir=self._run_root()))
        cand, ext, work = root / "cand", root / "ext", root / "work"
        for d in (cand, ext, work):
            d.mkdir()
        for d in (root, cand, ext):
            d.chmod(0o755)
        mounts = {"cand": Mount(cand), "ext": Mount(ext), "work": Mount(work, writable=True)}
        budget = limits.memory_budget(self.settings, device)
        args = ["--device", device, "--threads", str(self.settings.runner_threads)]
        args += ["--idle-timeout", str(self.settings.standby_idle_s)]
        spec = RunSpec(
            script="candidate_runner.py",
            header={},
            payload=b"",
            mounts=mounts,
            device=device,
            timeout_s=self.settings.run_timeout_s,
            memory_bytes=budget.limit,
            label="candidate",
            prefix=list(prefix or []),
            log_limit=200_000 if prefix else 6000,
            args=args,
        )
        try:
            return self.sandbox.launch(spec), root
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise

    def _job(
        self,
        candidate: code_pb2.Candidate,
        ext_dir: Path,
        ref: ReferenceResult,
        root: Path,
        mounts: dict[str, Mount],
        quick: bool,
    ) -> tuple[str, str, dict[str, Any], wire.Payload]:
        """Fills the run's folders with the candidate and its build; the job header and payload."""
        plan = ref.plan
        cand, ext = root / "cand", root / "ext"
        entry = candidate.entry or ENTRY
        served = {b.extension_name: b.call_digest for b in builds(candidate) if b.call_digest}
        for f in candidate.files:
            # A candidate whose own build calls are served reads its sources to ask for them (load(...)).
            if f.path.endswith(".py") or f.path == entry or served:
                path = cand / f.path
                if ".." in Path(f.path).parts or Path(f.path).is_absolute():
                    continue
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(f.content)
        for so in ext_dir.glob("*.so"):
            shutil.copy2(so, ext / so.name)
        for path in [*cand.rglob("*"), *ext.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        inside = self.sandbox.paths(mounts)
        nonce = os.urandom(8).hex()
        token = "sc" + secrets.token_hex(6)
        names = set(plan.checked) | set(plan.pool) | {plan.late, plan.profile}
        steps = usable_steps(plan.steps, set(ref.sets))
        offshape = None
        if plan.offshape and plan.offshape in ref.sets:
            names.add(plan.offshape)
            offshape = {"set": plan.offshape, "init_changed": ref.offshape.get("init_changed", False)}
        needed, regen = input_sets(ref, names)
        baseline = not quick and self.interleaves(ref, regen)
        first = ref.sets[plan.pool[0]].ref32 if plan.pool[0] in ref.sets else []
        poison = [list(shape) for t in first if (shape := _shape_dtype(t))]
        memory = None
        if ref.device == "cuda":
            allowed, held = memory_budget(ref)
            memory = {"allowed_extra": int(allowed + held)}
        header = {
            "nonce": nonce,
            "device": ref.device,
            "ext_name": candidate.build.extension_name,
            "ext_names": [b.extension_name for b in builds(candidate)],
            "served": served,
            "entry": entry,
            "cand_dir": inside["cand"],
            "ext_dir": inside["ext"],
            "work_dir": inside["work"],
            "init_seed": plan.init_seed,
            "span_token": token,
            "call_span": f"{token}::{CALL_SPAN}",
            "steps": steps,
            "pool": [p for p in plan.pool if p in ref.sets],
            "warmup": plan.warmup,
            "iterations": plan.iterations,
            "late": plan.late if plan.late in ref.sets else "",
            "profile_set": plan.profile,
            "offshape": offshape,
            "poison_shapes": poison,
            "memory": memory,
            # A large problem's run, and a profiling tool's, hold the GPU alone throughout (turns.py).
            "gpu_alone": ref.alone or quick,
            "baseline": baseline,
            "rounds": self.settings.timing_rounds,
            "max_rounds": max(self.settings.timing_rounds, self.settings.timing_max_rounds),
            "noise": self.settings.timing_noise_cuda
            if ref.device == "cuda"
            else self.settings.timing_noise_cpu,
            "block_ms": self.settings.timing_block_ms_cuda
            if ref.device == "cuda"
            else self.settings.timing_block_ms_cpu,
            # A random reference's sets: the seed of every forward call on each (harness/seeds.py).
            "forward_seeds": {
                name: seeds.forward_seed(int(data.spec["seed"]))
                for name, data in ref.sets.items()
                if "seed" in data.spec
            }
            if ref.random
            else {},
        }
        if quick:
            header.update(steps=steps[:2], warmup=1, iterations=1, late="", offshape=None)
        payload = wire.dumps(
            {
                "init_inputs": ref.init_inputs,
                "state": ref.state,
                "sets": needed,
                # Large sets are made again by the runner, from the reference's own get_inputs.
                "regen": regen,
                "reference": ref.source if regen or baseline else "",
                "offshape_init": ref.offshape.get("init_inputs", ref.init_inputs),
                "offshape_state": ref.offshape.get("state", ref.state),
            }
        )
        return nonce, token, header, payload

    def interleaves(self, ref: ReferenceResult, regen: dict[str, Any]) -> bool:
        """Whether the run times the eager reference beside the candidate: the reference's source is
        known, no input set is made again from its seed, and the reference's parameters and a second
        copy of the timing pool fit `interleave_max_mb`."""
        if not self.settings.interleave or regen or not ref.source:
            return False
        pool = sum(
            ref.sets[n].input_bytes or _nbytes(ref.sets[n].inputs) for n in ref.plan.pool if n in ref.sets
        )
        return ref.param_bytes + pool <= self.settings.interleave_max_mb * (1 << 20)

    def _run_root(self) -> Path:
        root = self.settings.run_dir or Path(tempfile.gettempdir()) / f"stitchcuda-verify-{os.getuid()}"
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        return root

    def _sweep(self) -> None:
        """Removes run folders left by processes that died without cleaning up (older than any run)."""
        limit = time.time() - (self.settings.standby_idle_s + 2 * self.settings.run_timeout_s + 60)
        for path in self._run_root().glob("cand-*"):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < limit:
                    shutil.rmtree(path, ignore_errors=True)


def _close_at_exit(ref: weakref.ref[CandidateRunner]) -> None:
    runner = ref()
    if runner is not None:
        runner.close()


def _nbytes(items: list[Any] | None) -> int:
    total = 0
    for t in items or []:
        if isinstance(t, torch.Tensor):
            total += t.numel() * t.element_size()
        elif sketch.is_summary(t):
            total += int(t["numel"]) * _dtype_size(str(t["dtype"]))
    return total


def _dtype_size(name: str) -> int:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    return torch.empty((), dtype=dtype).element_size() if isinstance(dtype, torch.dtype) else 4


def _shape_dtype(t: Any) -> tuple[list[int], str] | None:
    """(shape, dtype) of a reference output, whole or summarised."""
    if isinstance(t, torch.Tensor):
        return list(t.shape), str(t.dtype)
    if sketch.is_summary(t):
        return list(t["shape"]), str(t["dtype"])
    return None


def input_sets(ref: ReferenceResult, names: set[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The input sets the run needs: those sent whole, and the seeds of those its runner makes again
    (with every set they derive from, so it can make them in the reference's way)."""
    whole: dict[str, Any] = {}
    regen: dict[str, Any] = {}
    todo = [n for n in names if n in ref.sets]
    while todo:
        name = todo.pop()
        if name in whole or name in regen:
            continue
        data = ref.sets[name]
        if data.inputs is not None:
            whole[name] = data.inputs
            continue
        regen[name] = data.spec
        base = data.spec.get("base")
        if base and base in ref.sets:
            todo.append(base)
    return whole, regen


def memory_budget(ref: ReferenceResult) -> tuple[float, float]:
    """(device memory the candidate may use beyond the runner's own, memory the runner itself holds).

    The candidate gets max(3x, +1 GiB) of the reference's peak (parameters plus one forward); the
    runner holds every input set on the device plus a few outputs alive on purpose (D5 aliasing).
    """
    base = float(ref.cost.get("forward_peak", 0)) + ref.param_bytes
    allowed = max(3 * base, base + (1 << 30))
    first = next(iter(ref.sets.values()), None)
    out_bytes = _nbytes(first.ref32) if first else 0
    held = sum(s.input_bytes or _nbytes(s.inputs) for s in ref.sets.values()) + 12 * out_bytes + (256 << 20)
    return allowed, held


def transfer_bytes(ref: ReferenceResult) -> int:
    """Bytes of the outputs a run sends the parent: one output list per checked call, timed ones too."""
    first = next(iter(ref.sets.values()), None)
    return (len(ref.plan.checked) + 3) * _nbytes(first.ref32) if first else 0


def summarizer(ref: ReferenceResult) -> Any:
    """A frame transform that reduces each large candidate output to the summary its reference has
    (same secret positions, blocks and edges), as it arrives; None when the problem has none."""
    shapes = {
        name: {i: t for i, t in enumerate(data.ref32) if sketch.is_summary(t)}
        for name, data in ref.sets.items()
    }
    if not any(shapes.values()):
        return None

    def reduce(head: dict[str, Any], blob: wire.Payload) -> tuple[dict[str, Any], wire.Payload]:
        wanted = shapes.get(str(head.get("set"))) if head.get("kind") == "output" else None
        if not wanted or not blob:
            return head, blob
        try:
            outputs = wire.loads(blob)
            del blob
            if not isinstance(outputs, list):
                raise ValueError("outputs are not a list")
            for i, summary in wanted.items():
                c = outputs[i] if i < len(outputs) else None
                if isinstance(c, torch.Tensor) and c.is_floating_point() and c.numel() == summary["numel"]:
                    outputs[i] = sketch.summarize(
                        c, summary["idx"], len(summary["block_norms"]), len(summary["head"])
                    )
            return head, wire.dumps(outputs)
        except Exception as exc:  # the candidate's malformed record, reported by _collect
            return {**head, "malformed": f"{type(exc).__name__}: {exc}"}, b""

    return reduce


def usable_steps(steps: list[list[Any]], available: set[str]) -> list[list[Any]]:
    """Drops steps whose input set the reference could not make, and calls on slots left stale by them."""
    holding: dict[str, str] = {}
    out = []
    for step in steps:
        op, slot = step[0], step[1]
        if op in ("new", "refill"):
            if step[2] not in available:
                holding[slot] = ""
                continue
            holding[slot] = step[2]
        elif op == "call" and holding.get(slot) != step[3]:
            continue
        out.append(step)
    return out


def _collect(outcome: Outcome, nonce: str, token: str) -> CandidateRun:
    run = CandidateRun(outcome=outcome, completed=outcome.completed(nonce), token=token)
    for head, blob in outcome.frames:
        kind = head.get("kind")
        try:
            if head.get("malformed"):
                raise ValueError(head["malformed"])
            if kind == "output":
                outputs = wire.loads(blob) if blob else None
                if outputs is not None and not isinstance(outputs, list):
                    raise ValueError("outputs are not a list")
                run.outputs[str(head.get("name"))] = Recorded(
                    name=str(head.get("name")),
                    set_name=str(head.get("set")),
                    outputs=outputs,
                    custom_calls=head.get("custom_calls"),
                    error=str(head.get("error", "")),
                )
            elif kind == "timing":
                run.timing = head
            elif kind == "profile":
                run.profile = head
            elif kind == "findings":
                run.findings += [dict(f) for f in head.get("items", []) if isinstance(f, dict)]
            elif kind == "finding":
                run.findings.append({k: head.get(k, "") for k in ("rule", "severity", "detail", "where")})
            elif kind == "fault":
                run.fault = head
            elif kind == "memory":
                run.memory = head
            elif kind == "baseline":
                run.baseline_error = str(head.get("error", ""))[:300]
        except Exception as exc:  # a malformed record is the candidate's fault, never the parent's crash
            run.bad_record = f"malformed {kind} record: {exc}"
            run.completed = False
    return run
