"""Runs the reference runner and turns its frames into ground truth, baselines and problem facts.

A broken reference (does not import, fails on its own inputs, is nondeterministic) raises ProblemError
naming the failing line; everything else about the reference is data for the candidate's verdict.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stitchcuda.shared.artifacts import sha256_hex
from stitchcuda.shared.errors import HarnessError, ProblemError, Unavailable
from stitchcuda.verifier.ceilings import Ceilings, CeilingStore
from stitchcuda.verifier.harness import wire
from stitchcuda.verifier.limits import GIB, ProblemSize, memory_budget
from stitchcuda.verifier.probes import Plan
from stitchcuda.verifier.sandbox import Mount, RunSpec, Sandbox
from stitchcuda.verifier.settings import VerifierSettings

log = logging.getLogger("stitchcuda.verifier.reference")


@dataclass
class SetData:
    # None for a large set the candidate's runner makes again from `spec` (its seed and kind).
    inputs: list[Any] | None
    # Whole tensors, or for a large output the summary of its float64 target (harness.sketch).
    ref32: list[Any]
    ref64: list[Any] | None
    err_ref32: list[float]
    note: str = ""
    spec: dict[str, Any] = field(default_factory=dict)
    input_bytes: int = 0


@dataclass
class ReferenceResult:
    sha256: str
    device: str
    plan: Plan
    info: dict[str, Any]
    init_inputs: list[Any]
    state: dict[str, Any]
    param_bytes: int
    sets: dict[str, SetData]
    skipped: dict[str, str]
    offshape: dict[str, Any]
    timing: dict[str, Any]
    cost: dict[str, Any]
    ceilings: Ceilings | None
    sandbox: str
    seconds: float
    source: str = ""
    created: float = field(default_factory=time.monotonic)
    uses: int = 0
    # A problem whose input set and outputs reach settings.gpu_alone_set_gb: its runs hold the GPU alone
    # throughout, since several of them would not fit beside another's (harness/turns.py).
    alone: bool = False
    # The reference draws random numbers (dropout in training mode, torch.randn in forward): every forward
    # call on an input set, the reference's and the candidate's, is seeded with that set's forward seed
    # (harness/seeds.py), and the float32 run is the ground truth.
    random: bool = False
    # Facts derived from the reference alone (tolerances, null-model checks), computed once.
    memo: dict[tuple[object, ...], Any] = field(default_factory=dict)

    @property
    def eager_ms(self) -> float:
        return float(self.timing.get("eager", {}).get("device", {}).get("median", 0.0))

    @property
    def compile_ms(self) -> float:
        return float(self.timing.get("compile", {}).get("device", {}).get("median", 0.0))

    @property
    def compile_available(self) -> bool:
        return "compile" in self.timing


class ReferenceRunner:
    def __init__(self, settings: VerifierSettings, sandbox: Sandbox) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.ceilings = CeilingStore(settings.state_root())
        self.baselines = settings.state_root() / "baselines"

    def _baseline_path(self, sha: str, device: str) -> Path:
        return self.baselines / f"{sha[:32]}-{device}.json"

    def run(
        self, source: str, device: str, plan: Plan, *, compile_baseline: bool, size: ProblemSize | None = None
    ) -> ReferenceResult:
        """Runs the reference once on `device` for `plan`; `size` (the planner's bytes of one call)
        says whether this host can hold it, before anything runs."""
        sha = sha256_hex(source)
        budget = memory_budget(self.settings, device, size, len(plan.sets))
        refused = budget.refuses()
        if refused:
            raise HarnessError(refused, error_code="machine_too_small")
        cached_compile = self._cached_compile(sha, device) if compile_baseline else None
        want_ceilings = self.ceilings.get(device) is None
        run_root = Path(tempfile.mkdtemp(prefix="ref-", dir=self._run_root()))
        try:
            work = run_root / "work"
            work.mkdir()
            mounts = {"work": Mount(work, writable=True)}
            inside = self.sandbox.paths(mounts)
            nonce = os.urandom(8).hex()
            header = {
                "nonce": nonce,
                "device": device,
                "work_dir": inside["work"],
                "init_seed": plan.init_seed,
                "sets": [s for s in plan.sets if s["name"] != plan.offshape],
                "offshape": next(
                    ({"name": s["name"], "seed": s["seed"]} for s in plan.sets if s["name"] == plan.offshape),
                    None,
                ),
                "pool": plan.pool,
                "warmup": plan.warmup,
                "iterations": plan.iterations,
                "compile": compile_baseline and cached_compile is None,
                "measure_ceilings": (["float32", "float16", "bfloat16"] if device == "cuda" else ["float32"])
                if want_ceilings
                else [],
                "threads": self.settings.runner_threads or None,
                "lean": self.lean(device),
                "gpu_alone": size is not None and size.per_set >= self.settings.gpu_alone_set_gb * GIB,
                "slot_wait_s": self.settings.reference_slot_wait_s,
            }
            extra_env = {k: v for k, v in os.environ.items() if k == "STITCHCUDA_SIZE"}
            spec = RunSpec(
                script="reference_runner.py",
                header=header,
                payload=source.encode(),
                mounts=mounts,
                device=device,
                timeout_s=self.settings.reference_timeout_s,
                memory_bytes=budget.limit,
                label="reference",
                extra_env=extra_env,
            )
            outcome = self.sandbox.run(spec)
            result = self._parse(
                outcome, sha, device, plan, nonce, f"{budget.limit / GIB:.1f} GiB, {budget.how}"
            )
            result.source = source
            result.alone = bool(header["gpu_alone"])
        finally:
            shutil.rmtree(run_root, ignore_errors=True)
        if compile_baseline:
            if cached_compile is not None:
                result.timing.update(cached_compile)
            else:
                self._store_compile(sha, device, result.timing)
        return result

    def lean(self, device: str) -> dict[str, Any]:
        """How the reference runner treats large sets and outputs (settings.summary_*, regen_input_mb).
        A GPU problem's inputs are made on the GPU: seconds per set faster than the CPU's generators
        (7-8 s of a level-2 reference run on an H100), and the same seed gives the same bits there, so
        a set made again by the candidate's runner matches."""
        s = self.settings
        return {
            "make_on": "cuda" if device == "cuda" else "cpu",
            "min_numel": s.summary_min_numel,
            "samples": s.summary_samples,
            "blocks": s.summary_blocks,
            "edge": s.summary_edge,
            "seed": secrets.randbits(63),  # the sample positions: secret from every candidate
            "input_bytes": int(s.regen_input_mb * (1 << 20)),
        }

    def _run_root(self) -> Path:
        root = self.settings.run_dir or Path(tempfile.gettempdir()) / f"stitchcuda-verify-{os.getuid()}"
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o711)
        return root

    def _cached_compile(self, sha: str, device: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._baseline_path(sha, device).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) else None

    def _store_compile(self, sha: str, device: str, timing: dict[str, Any]) -> None:
        keep = {k: timing[k] for k in ("compile", "compile_error", "compile_seconds") if k in timing}
        if not keep:
            return
        path = self._baseline_path(sha, device)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(keep))
        os.replace(tmp, path)

    def _parse(
        self, outcome: Any, sha: str, device: str, plan: Plan, nonce: str, limits: str = ""
    ) -> ReferenceResult:
        error = outcome.first("error")
        if error is not None:
            head = error[0]
            if head.get("stage") == "device":
                raise Unavailable(f"the reference process cannot use {device}: {head.get('message')}")
            where = f"line {head['line']}: {head['code']}: " if head.get("line") else ""
            if _out_of_memory(str(head.get("message", ""))):
                raise HarnessError(
                    f"the reference ran out of memory ({head.get('stage')}): {where}{head.get('message')} "
                    f"(memory limit {limits})",
                    detail=str(head.get("traceback", ""))[-2000:],
                    error_code="reference_out_of_memory",
                )
            raise ProblemError(
                f"the reference fails ({head.get('stage')}): {where}{head.get('message')}",
                detail=str(head.get("traceback", ""))[-2000:],
            )
        if not outcome.completed(nonce):
            # Out of memory or time is the harness's limit, not a bug in the reference: say which.
            if outcome.memory_exceeded or outcome.timed_out:
                code = "reference_out_of_memory" if outcome.memory_exceeded else "reference_timeout"
                limit = (
                    f"memory limit {limits}"
                    if outcome.memory_exceeded
                    else f"time limit {self.settings.reference_timeout_s:.0f} s"
                )
                raise HarnessError(
                    f"the reference run {outcome.crash_reason()} ({limit})",
                    detail=outcome.log_tail[-2000:],
                    error_code=code,
                )
            raise ProblemError(f"the reference run {outcome.crash_reason()}", detail=outcome.log_tail[-2000:])
        info = outcome.first("info")[0]
        problem_head, problem_blob = outcome.first("problem")
        problem = wire.loads(problem_blob)
        sets: dict[str, SetData] = {}
        skipped: dict[str, str] = {}
        offshape: dict[str, Any] = {}
        specs = {s["name"]: s for s in plan.sets}
        random = False
        for head, blob in outcome.all("set"):
            random = random or bool(head.get("random"))
            if head.get("skipped"):
                skipped[head["name"]] = head["skipped"]
                continue
            data = wire.loads(blob)
            if data["inputs"] is None and not head.get("regen"):
                raise HarnessError(f"the reference runner sent no inputs for set {head['name']}")
            sets[head["name"]] = SetData(
                inputs=data["inputs"],
                ref32=data["ref32"],
                ref64=data["ref64"],
                err_ref32=list(head.get("err_ref32") or []),
                note=head.get("note", ""),
                spec={**specs.get(head["name"], {}), "made_on": str(head.get("made_on") or "cpu")},
                input_bytes=int(head.get("input_bytes") or 0),
            )
            if head["name"] == plan.offshape:
                offshape = {
                    "dims": head.get("dims", {}),
                    "init_changed": bool(head.get("init_changed")),
                    "init_inputs": data.get("init_inputs", problem["init_inputs"]),
                    "state": data.get("state", problem["state"]),
                }
        timing = dict(outcome.first("timing")[0])
        cost = dict(outcome.first("cost")[0])
        ceilings = self.ceilings.get(device)
        measured = outcome.first("ceilings")
        if measured is not None and measured[0].get("finite"):
            ceilings = self.ceilings.put(device, measured[0], str(info.get("device_name", "")))
        return ReferenceResult(
            sha256=sha,
            device=device,
            plan=plan,
            info=info,
            init_inputs=problem["init_inputs"],
            state=problem["state"],
            param_bytes=int(problem_head.get("param_bytes", 0)),
            sets=sets,
            skipped=skipped,
            offshape=offshape,
            timing=timing,
            cost=cost,
            ceilings=ceilings,
            sandbox=outcome.sandbox,
            seconds=outcome.seconds,
            random=random,
        )


def _out_of_memory(message: str) -> bool:
    """A host MemoryError (the address-space limit) or a device allocation failure."""
    return any(
        m in message for m in ("MemoryError", "OutOfMemoryError", "CUDA out of memory", "out of memory")
    )


class ReferenceStore:
    """Reference results on this node's disk, shared by every verifier process of the node.

    A problem's ground truth and baselines (its input sets, float32 and float64 outputs or their summaries,
    eager and torch.compile timings) are computed once and then serve `reuse` verifications, across jobs,
    rounds and worker processes, for at most `ttl_s`; then the next verification draws fresh secret inputs.
    Entries are keyed by the reference's hash, the device and the schedule; each holds its own seeds. One
    file lock per key makes a second process wait for the first one's run instead of repeating it, and the
    use count lives beside the data, so every process spends from the same budget. Files larger than
    `max_bytes` are not kept (a level-1 problem's sets are made again from seeds anyway); the oldest
    entries' data goes first when the folder outgrows `max_bytes` (their use counts stay).
    """

    def __init__(self, root: Path, *, reuse: int, ttl_s: float, max_bytes: int) -> None:
        self.root = root
        self.reuse = reuse
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes

    @staticmethod
    def digest(key: tuple[object, ...]) -> str:
        return sha256_hex(json.dumps([str(k) for k in key]))[:40]

    def _paths(self, digest: str) -> tuple[Path, Path, Path]:
        return (
            self.root / f"{digest}.pt",
            self.root / f"{digest}.json",
            self.root / f".{digest}.lock",
        )

    @contextlib.contextmanager
    def locked(self, key: tuple[object, ...]) -> Iterator[None]:
        """Holds the key's file lock: one process runs a missing reference while the others wait."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self._paths(self.digest(key))[2], "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def peek(self, key: tuple[object, ...]) -> tuple[str, bool] | None:
        """(entry id, whether its data is on disk) of a usable entry, spending no use; None if there is
        none. Call under `locked(key)`."""
        data, meta_path, _ = self._paths(self.digest(key))
        meta = self._usable_meta(data, meta_path)
        return None if meta is None else (str(meta["entry"]), data.is_file())

    def _usable_meta(self, data: Path, meta_path: Path) -> dict[str, Any] | None:
        """The entry's metadata if it has uses left and has not expired; a spent or expired one is dropped."""
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError):
            return None
        if int(meta.get("uses", 0)) >= self.reuse or time.time() - float(meta.get("created", 0)) > self.ttl_s:
            self._drop(data, meta_path)
            return None
        return dict(meta)

    def take(self, key: tuple[object, ...], holding: str = "") -> tuple[str, ReferenceResult | None] | None:
        """(entry id, the result or None when the caller holds it in memory) for one more use; None if
        there is no usable entry (missing, spent, expired or unreadable). `holding` is the entry id the
        caller holds: that entry is not read from disk again. Call under `locked(key)`."""
        data, meta_path, _ = self._paths(self.digest(key))
        meta = self._usable_meta(data, meta_path)
        if meta is None:
            return None
        meta["uses"] = int(meta["uses"]) + 1
        self._write_meta(meta_path, meta)
        entry = str(meta["entry"])
        if entry == holding or not data.is_file():
            return entry, None
        return entry, self._load(data, meta_path)

    def _load(self, data: Path, meta_path: Path) -> ReferenceResult | None:
        import torch

        try:
            ref = torch.load(data, map_location="cpu", weights_only=False)
        except Exception as exc:  # a torn or foreign file costs one reference run
            log.warning("reference store entry %s is unreadable (%s); running the reference", data.name, exc)
            self._drop(data, meta_path)
            return None
        return ref if isinstance(ref, ReferenceResult) else None

    def put(self, key: tuple[object, ...], ref: ReferenceResult) -> str:
        """Stores `ref` (already used once) and returns its entry id. Call under `locked(key)`."""
        import torch

        entry = secrets.token_hex(8)
        data, meta_path, _ = self._paths(self.digest(key))
        self.root.mkdir(parents=True, exist_ok=True)
        memo, ref.memo = ref.memo, {}
        tmp = data.with_name(f".{data.name}.{entry}")
        size = 0
        try:
            torch.save(ref, tmp)
            size = tmp.stat().st_size
            if size > self.max_bytes:  # counted on disk all the same; only this process holds it
                log.info("reference %s is not kept on disk: %.1f GiB", str(key[0])[:12], size / GIB)
                tmp.unlink(missing_ok=True)
                data.unlink(missing_ok=True)
                size = 0
            else:
                os.replace(tmp, data)
        except Exception as exc:  # a full disk or an unpicklable result only costs later runs
            log.warning("could not keep reference %s on disk: %s", str(key[0])[:12], exc)
            tmp.unlink(missing_ok=True)
            data.unlink(missing_ok=True)
            size = 0
        finally:
            ref.memo = memo
        self._write_meta(meta_path, {"entry": entry, "created": time.time(), "uses": ref.uses, "bytes": size})
        self._evict()
        return entry

    def _write_meta(self, path: Path, meta: dict[str, Any]) -> None:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(meta))
        os.replace(tmp, path)

    def _drop(self, data: Path, meta_path: Path) -> None:
        data.unlink(missing_ok=True)
        meta_path.unlink(missing_ok=True)

    def _evict(self) -> None:
        """Drops the oldest entries' data until the folder fits `max_bytes`. Their metadata stays: the
        process that computed an entry still holds it in memory and serves its remaining uses (dropping
        the entry would make that process run the reference again), and the use count stays shared."""
        entries = sorted(self.root.glob("*.pt"), key=lambda p: p.stat().st_mtime)
        total = sum(p.stat().st_size for p in entries)
        for path in entries:
            if total <= self.max_bytes:
                break
            total -= path.stat().st_size
            path.unlink(missing_ok=True)
