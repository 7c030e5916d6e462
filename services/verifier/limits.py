"""Memory and time limits of a verification, derived from the machine and the problem.

A fixed limit is wrong at both ends: 8 GiB kills a KernelBench reference whose inputs are 6 GiB on a
host with 128 GiB, and a large fixed limit lets one runaway candidate take a shared host down. The
limit here is this run's share of the memory the host has free now (the GPU slots of a node share it),
and a problem whose estimated need exceeds that share is refused up front with both numbers, as a
failure of the machine, never of a candidate.

`memory_limit_gb` > 0 in the settings is an operator's fixed limit and wins over the derived one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.verifier.settings import VerifierSettings

GIB = 1 << 30
# What a runner process holds besides the problem's tensors: the interpreter, torch, a CUDA context.
BASE_BYTES = {"cpu": 2 * GIB, "cuda": 6 * GIB}
FLOOR_BYTES = 2 * GIB


@dataclass(frozen=True)
class Lean:
    """How a large problem is held (settings.summary_*, regen_input_mb; harness.sketch)."""

    min_numel: int = 0  # outputs of this many elements and more are kept as summaries
    input_bytes: int = 0  # input sets of this many bytes and more are made again by the candidate's runner
    summary_bytes: int = 0  # what one summary holds

    @classmethod
    def of(cls, settings: VerifierSettings) -> Lean:
        samples = settings.summary_samples
        return cls(
            min_numel=settings.summary_min_numel,
            input_bytes=int(settings.regen_input_mb * (1 << 20)),
            summary_bytes=4 * 8 * samples + 8 * settings.summary_blocks + 16 * settings.summary_edge,
        )

    def regenerates(self, input_bytes: int) -> bool:
        return 0 < self.input_bytes <= input_bytes

    def summarizes(self, output_bytes: int) -> bool:
        # The planner gives the bytes of all outputs; a float32 output of min_numel elements or more.
        return 0 < self.min_numel * 4 <= output_bytes


NO_LEAN = Lean()


@dataclass(frozen=True)
class ProblemSize:
    """Bytes of one call of the reference, from the planner's meta-device analysis (0 when unknown)."""

    inputs: int = 0
    outputs: int = 0
    parameters: int = 0

    @property
    def known(self) -> bool:
        return self.inputs + self.outputs + self.parameters > 0

    @property
    def per_set(self) -> int:
        """The inputs of one set, its float32 results and its float64 ones, whole."""
        return self.inputs + 3 * self.outputs

    def held_per_set(self, lean: Lean = NO_LEAN) -> int:
        """What the verifier keeps and sends per input set: a large set's inputs are made again by the
        candidate's runner, a large output is kept as a summary."""
        inputs = 0 if lean.regenerates(self.inputs) else self.inputs
        outputs = lean.summary_bytes if lean.summarizes(self.outputs) else 3 * self.outputs
        return inputs + outputs

    def large(self, lean: Lean) -> bool:
        return lean.regenerates(self.inputs) or lean.summarizes(self.outputs)

    def runner_bytes(self, device: str, sets: int, lean: Lean = NO_LEAN) -> int:
        """Peak host memory of the reference process: the model (and its float64 copy), one set on its
        way through the result channel (host copy and serialized), and the inputs of the sets it keeps
        on the host (every set; a large problem's bases and timing pool only)."""
        kept = min(sets, 4) if lean.regenerates(self.inputs) else sets
        on_host = 3 * self.outputs if device == "cpu" else 0
        return (
            BASE_BYTES.get(device, BASE_BYTES["cpu"])
            + 3 * self.parameters
            + on_host
            + 2 * self.held_per_set(lean)
            + kept * self.inputs
        )

    def parent_bytes(self, sets: int, lean: Lean = NO_LEAN) -> int:
        """What the verifier's own process holds for the candidates of the problem: every set, and
        one large candidate output on its way to its summary."""
        arriving = 2 * self.outputs if lean.summarizes(self.outputs) else 0
        return sets * self.held_per_set(lean) + self.parameters + arriving


@dataclass(frozen=True)
class HostMemory:
    total: int
    available: int


def host_memory(meminfo: Path = Path("/proc/meminfo")) -> HostMemory:
    """The host's total and available memory (the cgroup's limit where it is smaller)."""
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            name, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                fields[name] = int(parts[0]) * 1024
    except OSError:
        pass
    total = fields.get("MemTotal") or os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = fields.get("MemAvailable", total)
    cap = _cgroup_limit()
    if cap is not None:
        total, available = min(total, cap), min(available, cap)
    return HostMemory(total=total, available=available)


def _cgroup_limit() -> int | None:
    for path in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < (1 << 60):
            return int(text)
    return None


@dataclass(frozen=True)
class MemoryBudget:
    limit: int  # bytes the run's process tree may hold
    need: int  # the estimate for this problem (0 when its size is not known yet)
    how: str  # one line: where the limit comes from, for messages and the verdict's environment

    def refuses(self) -> str:
        """Why this problem cannot run here ("" when it can)."""
        if self.need <= self.limit:
            return ""
        return (
            f"the problem needs about {self.need / GIB:.1f} GiB of host memory to verify, more than this "
            f"worker's {self.limit / GIB:.1f} GiB ({self.how}); run it on a larger verifier node"
        )


def memory_budget(
    settings: VerifierSettings, device: str, size: ProblemSize | None = None, sets: int = 0
) -> MemoryBudget:
    """The memory limit of one runner process on `device`, and what a problem of `size` verified with
    `sets` input sets needs on this host (the runner and the verifier's copy of the sets together)."""
    size = size or ProblemSize()
    lean = Lean.of(settings)
    need = size.runner_bytes(device, sets, lean) + size.parent_bytes(sets, lean) if size.known else 0
    if settings.memory_limit_gb > 0:
        fixed = int(settings.memory_limit_gb * GIB)
        return MemoryBudget(fixed, need, f"fixed by STITCH_MEMORY_LIMIT_GB={settings.memory_limit_gb:g}")
    host = host_memory()
    sharers = max(1, settings.concurrent_runs)
    share = int(host.available * settings.memory_fraction / sharers)
    limit = max(share, FLOOR_BYTES)
    how = (
        f"{settings.memory_fraction:.0%} of the {host.available / GIB:.1f} GiB available of "
        f"{host.total / GIB:.1f} GiB" + (f", shared by {sharers} runs" if sharers > 1 else "")
    )
    return MemoryBudget(limit, need, how)


_DTYPE_BYTES = {"float64": 8, "int64": 8, "complex64": 8, "float16": 2, "bfloat16": 2, "int16": 2, "int8": 1,
                "uint8": 1, "bool": 1}  # fmt: skip


def problem_size(plan: plan_pb2.Plan | None) -> ProblemSize:
    """The problem's bytes per call from the planner's analysis (unknown without a plan)."""
    if plan is None:
        return ProblemSize()
    outputs = 0
    for out in plan.outputs:
        count = 1
        for dim in out.shape:
            count *= max(int(dim), 0)
        outputs += count * _DTYPE_BYTES.get(out.dtype.removeprefix("torch."), 4)
    return ProblemSize(int(plan.input_bytes), outputs, int(plan.parameter_bytes))


def needs_compact(settings: VerifierSettings, device: str, size: ProblemSize, sets: int) -> bool:
    """Would the full schedule's sets not fit this host's share (the compact one may)? A large problem
    (one whose sets are made again or whose outputs are summarised) always gets the compact one: each
    set costs the candidate's runner the time to make it again and the parent the time to summarise."""
    if size.large(Lean.of(settings)):
        return True
    budget = memory_budget(settings, device, size, sets)
    return bool(budget.refuses())


# The slowest rate at which a candidate's outputs reach the parent (serialised, piped, summarised).
TRANSFER_BYTES_PER_S = 0.5 * GIB


def run_timeout(settings_timeout_s: float, reference_seconds: float, transfer_bytes: int = 0) -> float:
    """A candidate does the reference's work again (every input set, the timed loop) with its own
    kernels: it gets the configured time or twice what the reference took, whichever is longer, plus
    the time its recorded outputs take to reach the parent (minutes for a 6 GiB output)."""
    return max(settings_timeout_s, 2.0 * reference_seconds + 30.0) + transfer_bytes / TRANSFER_BYTES_PER_S
