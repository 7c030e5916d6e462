"""Turns on one GPU that several processes of a node share: GPU work shares it, timing has it alone.

Processes of one node that use the same GPU (the references and candidates of several verifications, the
Planner's runs) may work on it at once, but a timing is only honest while nothing else runs there: the
device time-slices between processes, so a neighbour's kernels would be counted as the timed program's.
A reader-writer lock over two lock files per GPU gives both: work takes the turn *shared*, a timing takes
it *alone* and waits for the shared holders to finish. A gate file keeps a waiting timing from being
starved: a process that wants the turn alone holds the gate while it waits, and new shared holders queue
behind it.

The locks are `flock` locks on open file descriptions: the verifier opens the two files for each runner
(`open_files`) and passes the descriptors to it, so a sandboxed runner needs no path to the folder, and
the kernel releases whatever a process holds when it exits or is killed. Standard library only: runner
scripts import this file directly.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

SHARED, ALONE = "shared", "alone"


def open_files(folder: Path | str, gpu: str) -> tuple[int, int]:
    """Fresh descriptions of `gpu`'s gate and turn files (the caller passes them on, then closes its
    copies: a lock lives as long as any descriptor of its description is open)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    gate = os.open(folder / f"gpu{gpu}-gate.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        turn = os.open(folder / f"gpu{gpu}-turn.lock", os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except BaseException:
        os.close(gate)
        raise
    return gate, turn


def parse(text: str) -> tuple[int, int] | None:
    """The `--turns GATE,TURN` argument of a runner ("" or "-": this run takes no turns)."""
    if not text or text == "-":
        return None
    gate, _, turn = text.partition(",")
    return int(gate), int(turn)


class Turns:
    """One process's hold on its GPU's turn: none, shared or alone. Without files (a CPU run, a node
    that does not share its GPU) every method does nothing.

    `slot` is the description of the node's GPU slot (shared/gpu_slots.py) that the verifier took for
    this run and lends it, where it does: the run may give the slot back while it does host work only
    (`lend_slot`), so another verification goes on meanwhile, and takes it again before it times."""

    def __init__(self, fds: tuple[int, int] | None, slot: int | None = None) -> None:
        self.fds = fds
        self.slot = slot
        self.slot_lent = False
        self._flock = fcntl.flock  # bound now: code imported later cannot swap what releases the turn
        self.held = ""

    @classmethod
    def at(cls, folder: Path | str, gpu: str) -> Turns:
        """Turns on files this process opens itself (the caller closes them with `close`)."""
        return cls(open_files(folder, gpu))

    def take(self, mode: str) -> None:
        """Holds the turn in `mode` (SHARED or ALONE), leaving the one held before."""
        if self.fds is None or self.held == mode:
            return
        if mode not in (SHARED, ALONE):
            raise ValueError(f"unknown turn mode {mode!r}")
        gate, turn = self.fds
        self.release()
        if mode == ALONE:
            # Hold the gate while waiting, so shared holders arriving now wait behind this timing.
            self._flock(gate, fcntl.LOCK_EX)
            try:
                self._flock(turn, fcntl.LOCK_EX)
            finally:
                self._flock(gate, fcntl.LOCK_UN)
        else:
            # Pass through the gate: a timing waiting there goes first.
            self._flock(gate, fcntl.LOCK_SH)
            try:
                self._flock(turn, fcntl.LOCK_SH)
            finally:
                self._flock(gate, fcntl.LOCK_UN)
        self.held = mode

    def release(self) -> None:
        if self.fds is not None and self.held:
            self._flock(self.fds[1], fcntl.LOCK_UN)
        self.held = ""

    @contextlib.contextmanager
    def holding(self, mode: str) -> Iterator[None]:
        """Holds `mode` for the block, then returns to what was held before."""
        before = self.held
        self.take(mode)
        try:
            yield
        finally:
            if before:
                self.take(before)
            else:
                self.release()

    def lend_slot(self) -> bool:
        """Gives the GPU slot back to the node for host work; False where this run holds none."""
        if self.slot is None or self.slot_lent:
            return False
        self._flock(self.slot, fcntl.LOCK_UN)
        self.slot_lent = True
        return True

    def take_slot(self, wait_s: float, poll_s: float = 0.05) -> bool:
        """Takes the lent slot again, waiting up to `wait_s` for the verification holding it now. False
        when the wait ran out: the run goes on without it (its timings still take the turn alone, so
        only the bound on the node's concurrent runs is exceeded, for the rest of this run)."""
        if self.slot is None or not self.slot_lent:
            return True
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self._flock(self.slot, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(poll_s)
                continue
            self.slot_lent = False
            return True

    def close(self) -> None:
        self.release()
        if self.fds is not None:
            for fd in self.fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.fds = None
