"""A per-node bound on concurrent CUDA contexts: slots held as fcntl locks that every worker process sees.

Several verifier processes on one node (one per GPU, or several sharing one) each take a slot before they
start a candidate process on a GPU; a slot is a lock on a file in a node-local folder, so the bound holds
across processes and is released by the kernel if a worker dies holding it.
"""

from __future__ import annotations

import contextlib
import contextvars
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from stitchcuda.shared.errors import Unavailable

# The description of the slot this thread of work holds (gpu_slot), which a run it starts may borrow.
_HELD: contextvars.ContextVar[int | None] = contextvars.ContextVar("stitchcuda_gpu_slot", default=None)


def held_slot() -> int | None:
    """The descriptor of the GPU slot held by the surrounding `gpu_slot` block, None outside one.

    A run started inside the block may be passed it (the reference runner is): a flock belongs to the
    open file description, so the run can give the slot back for a while and take it again, and the
    block's end releases it whatever the run did."""
    return _HELD.get()


def visible_gpus() -> list[str]:
    """The GPU ids this process may use, from CUDA_VISIBLE_DEVICES (unset: ask torch how many there are)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in (x.strip() for x in env.split(",")) if g and g != "-1"]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def device_gpu(device: str) -> str | None:
    """The GPU a run on `device` uses: the first visible one for "cuda"; None on the CPU or without GPUs."""
    if device != "cuda":
        return None
    gpus = visible_gpus()
    return gpus[0] if gpus else None


def pin_environment(gpu: str) -> dict[str, str]:
    """Environment for a worker pinned to one GPU: it sees exactly that device as cuda:0."""
    return {"CUDA_VISIBLE_DEVICES": gpu, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


@contextlib.contextmanager
def gpu_slot(
    folder: Path, gpu: str, per_gpu: int, *, timeout_s: float = 600.0, poll_s: float = 0.05
) -> Iterator[int]:
    """Holds one of `per_gpu` slots of `gpu` for the duration of the block; yields the slot number."""
    if per_gpu < 1:
        raise ValueError("per_gpu must be at least 1")
    folder.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    while True:
        for slot in range(per_gpu):
            fd = os.open(folder / f"gpu{gpu}-slot{slot}.lock", os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            token = _HELD.set(fd)
            try:
                yield slot
            finally:
                _HELD.reset(token)
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            return
        if time.monotonic() > deadline:
            raise Unavailable(f"no free CUDA context slot on GPU {gpu} after {timeout_s:.0f} s")
        time.sleep(poll_s)


@contextlib.contextmanager
def gpu_turn(folder: Path, gpu: str, mode: str) -> Iterator[None]:
    """Holds the node's turn on `gpu` in `mode` ("shared" for GPU work, "alone" for timing) for the block.

    For work a process starts whole (the Planner's runs); the Verifier's runners take their turns
    themselves. The protocol lives beside the runner scripts, which import it directly.
    """
    from stitchcuda.verifier.harness import turns

    held = turns.Turns.at(folder, gpu)
    try:
        held.take(mode)
        yield
    finally:
        held.close()
