"""Turns on a shared GPU (verifier/harness/turns.py): work shares the device, a timing has it alone.

Each `Turns.at` opens its own file descriptions, so two in one process contend as two processes do; the
death test uses a real process, as the runners are.
"""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from stitchcuda.shared.gpu_slots import gpu_turn
from stitchcuda.verifier.harness import turns
from stitchcuda.verifier.harness.turns import ALONE, SHARED, Turns

HARNESS = os.path.dirname(turns.__file__)


def _taken(holder: Turns, mode: str, timeout: float = 0.5) -> bool:
    """Whether `holder` gets `mode` within `timeout` (it keeps waiting on a thread otherwise)."""
    done = threading.Event()

    def take() -> None:
        holder.take(mode)
        done.set()

    threading.Thread(target=take, daemon=True).start()
    return done.wait(timeout)


def test_shared_holders_work_at_once_and_a_timing_waits_for_them(tmp_path):
    a, b, timer = (Turns.at(tmp_path, "0") for _ in range(3))
    a.take(SHARED)
    assert _taken(b, SHARED)
    waiting = threading.Event()
    got = threading.Event()

    def time_alone() -> None:
        waiting.set()
        timer.take(ALONE)
        got.set()

    threading.Thread(target=time_alone, daemon=True).start()
    assert waiting.wait(2)
    assert not got.wait(0.3)  # two runs still work on the device
    a.release()
    assert not got.wait(0.3)
    b.release()
    assert got.wait(5)
    assert timer.held == ALONE
    for t in (a, b, timer):
        t.close()


def test_a_waiting_timing_goes_before_new_work(tmp_path):
    worker, timer, late = (Turns.at(tmp_path, "0") for _ in range(3))
    worker.take(SHARED)
    order: list[str] = []
    timer_waiting = threading.Event()

    def time_alone() -> None:
        timer_waiting.set()
        timer.take(ALONE)
        order.append("timing")
        time.sleep(0.2)
        timer.release()

    def work_late() -> None:
        late.take(SHARED)
        order.append("late work")
        late.release()

    t1 = threading.Thread(target=time_alone)
    t1.start()
    assert timer_waiting.wait(2)
    time.sleep(0.2)  # the timing is at the gate now
    t2 = threading.Thread(target=work_late)
    t2.start()
    time.sleep(0.3)
    assert order == []  # new work queues behind the waiting timing, not beside the running work
    worker.release()
    t1.join(5)
    t2.join(5)
    assert order == ["timing", "late work"]
    for t in (worker, timer, late):
        t.close()


def test_holding_returns_to_the_turn_held_before(tmp_path):
    run, other = Turns.at(tmp_path, "0"), Turns.at(tmp_path, "0")
    run.take(SHARED)
    with run.holding(ALONE):
        assert run.held == ALONE
        assert not _taken(other, SHARED, 0.2)
    assert run.held == SHARED
    # Shared again: the other work that waited proceeds beside it.
    deadline = time.monotonic() + 5
    while other.held != SHARED and time.monotonic() < deadline:
        time.sleep(0.01)
    assert other.held == SHARED
    run.close()
    other.close()


def test_gpus_have_separate_turns_and_cpu_runs_take_none(tmp_path):
    zero, one = Turns.at(tmp_path, "0"), Turns.at(tmp_path, "1")
    zero.take(ALONE)
    assert _taken(one, ALONE)
    nothing = Turns(None)
    nothing.take(ALONE)
    assert nothing.held == "" and turns.parse("") is None and turns.parse("-") is None
    assert turns.parse("101,152") == (101, 152)
    with pytest.raises(ValueError, match="unknown turn mode"):
        zero.take("exclusive")
    zero.close()
    one.close()


def test_a_killed_runner_gives_its_turn_back(tmp_path):
    """A runner holds the only descriptions of its files (the verifier closes its copies): when the kernel
    reaps it, its turn is free, whatever it was doing."""
    gate, turn = turns.open_files(tmp_path, "0")
    code = (
        "import sys, time; sys.path.insert(0, sys.argv[1]); import turns; "
        "t = turns.Turns(turns.parse(sys.argv[2])); t.take(turns.ALONE); print('held', flush=True); "
        "time.sleep(60)"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, HARNESS, f"{gate},{turn}"],
        pass_fds=(gate, turn),
        stdout=subprocess.PIPE,
        text=True,
    )
    os.close(gate)
    os.close(turn)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        other = Turns.at(tmp_path, "0")
        assert not _taken(other, SHARED, 0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _taken(other, SHARED, 5)
        other.close()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_gpu_turn_holds_for_a_block(tmp_path):
    other = Turns.at(tmp_path, "3")
    with gpu_turn(tmp_path, "3", "alone"):
        assert not _taken(other, SHARED, 0.2)
    assert _taken(other, SHARED, 5)
    other.close()


def test_a_cuda_run_gets_fresh_turn_files_and_a_cpu_run_none(tmp_path, monkeypatch):
    from stitchcuda.verifier.sandbox import Mount, RunSpec, Sandbox
    from stitchcuda.verifier.settings import VerifierSettings

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    slots = tmp_path / "slots"
    sandbox = Sandbox(VerifierSettings(home=tmp_path / "home", gpu_slot_dir=slots, sandbox="none"))

    def spec(device: str) -> RunSpec:
        mounts = {"work": Mount(tmp_path)}
        return RunSpec("candidate_runner.py", {}, b"", mounts, device, 1.0, 1 << 30, "candidate")

    fds = sandbox._turn_files(spec("cuda"))
    assert fds is not None
    try:
        cmd, _ = sandbox._command(spec("cuda"), 3, 4, 5, -1, fds)
        assert cmd[cmd.index("--turns") + 1] == f"{fds[0]},{fds[1]}"
        assert os.fstat(fds[1]).st_ino == (slots / "gpu2-turn.lock").stat().st_ino
        # The run's own descriptions: a lock taken through them contends with the node's other holders.
        runner = Turns(fds)
        runner.take(ALONE)
        assert not _taken(Turns.at(slots, "2"), SHARED, 0.2)
        runner.release()
    finally:
        for fd in fds:
            os.close(fd)
    assert sandbox._turn_files(spec("cpu")) is None
    assert "--turns" not in sandbox._command(spec("cpu"), 3, 4, 5, -1)[0]
    off = Sandbox(
        VerifierSettings(home=tmp_path / "home", gpu_slot_dir=slots, sandbox="none", gpu_turns=False)
    )
    assert off._turn_files(spec("cuda")) is None


def test_a_runner_moves_its_descriptors_only_onto_free_numbers(tmp_path):
    """The numbers the verifier passes are its own and may lie in the range a runner moves them to: a move
    onto one of them would close it (a turn file landing on the job channel)."""
    sys.path.insert(0, HARNESS)
    # A range above every descriptor this process holds (earlier tests may hold hundreds).
    import resource

    import common

    span = 8
    highest = max(int(n) for n in os.listdir("/proc/self/fd"))
    low = min(highest + 100, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - span - 1)
    assert low > highest, "no room for free descriptors under this process's limit"
    free = low + 5
    sentinel = os.open(tmp_path, os.O_RDONLY)
    taken = [n for n in range(low, low + span) if n != free]
    for n in taken:
        os.dup2(sentinel, n)
    moving = os.open(os.devnull, os.O_RDONLY)
    try:
        assert common._move_fd(moving, low, span) == free
        assert all(os.path.samestat(os.fstat(n), os.fstat(sentinel)) for n in taken)
        with pytest.raises(RuntimeError, match="no free file descriptor"):
            common._move_fd(os.open(os.devnull, os.O_RDONLY), low, span)
    finally:
        for n in [*taken, free, sentinel]:
            with contextlib.suppress(OSError):
                os.close(n)


class _Recorded(Turns):
    """Turns on real files that also record every mode taken."""

    def __init__(self, fds):
        super().__init__(fds)
        self.taken: list[str] = []

    def take(self, mode: str) -> None:
        self.taken.append(mode)
        super().take(mode)


def test_the_compile_baseline_holds_no_turn_but_its_graph_runs_share_the_device(tmp_path):
    """torch.compile's first call is host work: other runs time meanwhile. The compiled graph's runs take
    the device shared, and the wrappers are gone before the compiled model is timed."""
    import torch

    sys.path.insert(0, HARNESS)
    import reference_runner
    from torch._inductor.output_code import CompiledFxGraph

    original = CompiledFxGraph.__call__
    gpu = _Recorded(turns.open_files(tmp_path, "0"))
    gpu.take(ALONE)  # as after the eager timing
    gpu.taken.clear()
    model = torch.compile(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()))
    other = Turns.at(tmp_path, "0")
    with reference_runner.compiling(gpu):
        assert gpu.held == ""
        assert _taken(other, ALONE, 2), "a timing elsewhere goes on while this compiles"
        other.release()
        with torch.no_grad():
            model(torch.randn(4, 8))
        assert gpu.held == ""
    assert gpu.taken[0] == SHARED, gpu.taken  # the graph's run
    assert CompiledFxGraph.__call__ is original
    assert gpu.held == ALONE
    gpu.taken.clear()
    with reference_runner.compiling(gpu, keep=True):  # a run that keeps the device alone throughout
        assert gpu.held == ALONE
        assert not _taken(Turns.at(tmp_path, "0"), SHARED, 0.2)
    gpu.close()
    other.close()


def test_a_run_whose_turn_files_cannot_be_made_goes_on_without_them(tmp_path, monkeypatch, caplog):
    from stitchcuda.verifier.sandbox import Mount, RunSpec, Sandbox
    from stitchcuda.verifier.settings import VerifierSettings

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    sandbox = Sandbox(
        VerifierSettings(home=tmp_path / "home", gpu_slot_dir=blocked / "slots", sandbox="none")
    )
    spec = RunSpec(
        "candidate_runner.py", {}, b"", {"work": Mount(tmp_path)}, "cuda", 1.0, 1 << 30, "candidate"
    )
    assert sandbox._turn_files(spec) is None
    assert "times without waiting for other work on GPU 0" in caplog.text
