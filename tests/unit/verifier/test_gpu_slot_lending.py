"""The reference lends the node's GPU slot while torch.compile compiles (host work), then takes it back.

A slot (shared/gpu_slots.py) bounds the verifications working on a GPU at once; with one slot per GPU a
large model's compile (218.8 s for DenseNet201 on an H100, benchmarks/results/gpu_stop38) held every other
problem's verification back. The verifier passes its slot's description to the reference runner, which gives
it back around the compile (`reference_runner.lending_slot`). The runner here is a real process, as in the
sandbox: the lock belongs to the open file description both processes share.
"""

import contextlib
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from stitchcuda.shared.errors import Unavailable
from stitchcuda.shared.gpu_slots import gpu_slot, held_slot
from stitchcuda.verifier.harness import turns
from stitchcuda.verifier.harness.turns import ALONE, SHARED, Turns

HARNESS = os.path.dirname(turns.__file__)

# A runner's side of the slot: lend it, then take it back on request, waiting as long as asked.
RUNNER = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    from turns import Turns
    gpu = Turns(None, slot=int(sys.argv[2]))
    print("lent" if gpu.lend_slot() else "none", flush=True)
    for line in sys.stdin:
        print("took" if gpu.take_slot(float(line)) else "gave-up", flush=True)
    """
)


def _runner(fd: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RUNNER, HARNESS, str(fd)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(fd,),
    )


def _ask(proc: subprocess.Popen[str], wait_s: float) -> str:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{wait_s}\n")
    proc.stdin.flush()
    return proc.stdout.readline().strip()


def test_a_lent_slot_serves_another_verification_and_comes_back(tmp_path):
    assert held_slot() is None
    with gpu_slot(tmp_path, "0", 1):
        fd = held_slot()
        assert fd is not None
        with pytest.raises(Unavailable):  # held: nobody else gets it
            with gpu_slot(tmp_path, "0", 1, timeout_s=0.2):
                pass
        proc = _runner(fd)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "lent"
            # While the runner compiles, another verification takes the slot...
            with gpu_slot(tmp_path, "0", 1, timeout_s=5):
                # ...and the runner, done compiling, waits for it, giving up after its wait.
                assert _ask(proc, 0.3) == "gave-up"
            assert _ask(proc, 5.0) == "took"
            with pytest.raises(Unavailable):  # the runner holds it again
                with gpu_slot(tmp_path, "0", 1, timeout_s=0.2):
                    pass
        finally:
            proc.stdin.close()  # type: ignore[union-attr]
            proc.wait(10)
        # The runner is gone but the verification's block still holds the slot (one description).
        with pytest.raises(Unavailable):
            with gpu_slot(tmp_path, "0", 1, timeout_s=0.2):
                pass
    assert held_slot() is None
    with gpu_slot(tmp_path, "0", 1, timeout_s=1):
        pass


def test_a_run_lent_no_slot_has_nothing_to_give_back():
    gpu = Turns(None)
    assert not gpu.lend_slot()
    assert gpu.take_slot(0.0)


def test_the_compile_lends_the_slot_unless_the_run_keeps_the_device_alone(tmp_path):
    sys.path.insert(0, HARNESS)
    import reference_runner

    def blocked() -> bool:
        try:
            with gpu_slot(tmp_path, "0", 1, timeout_s=0.2):
                return False
        except Unavailable:
            return True

    with gpu_slot(tmp_path, "0", 1):
        fd = held_slot()
        assert fd is not None
        gpu = Turns(None, slot=os.dup(fd))  # the runner's copy: the same description
        timing: dict = {}
        with reference_runner.lending_slot(gpu, {"slot_wait_s": 5}, timing, keep=False):
            assert not blocked()  # another verification goes on meanwhile
        assert timing["slot_wait_s"] < 5 and "slot_note" not in timing
        assert blocked()
        # The other verification still holds the slot when the compile ends: the run waits, then goes on.
        timing = {}
        with contextlib.ExitStack() as other:
            with reference_runner.lending_slot(gpu, {"slot_wait_s": 0.2}, timing, keep=False):
                other.enter_context(gpu_slot(tmp_path, "0", 1, timeout_s=1))
            assert "its holder went on too long" in timing["slot_note"]
        assert gpu.take_slot(1.0)
        # A run that keeps the device alone (a large problem) keeps its slot through the compile.
        timing = {}
        with reference_runner.lending_slot(gpu, {"slot_wait_s": 5}, timing, keep=True):
            assert blocked()
        assert timing == {}
        os.close(gpu.slot)  # type: ignore[arg-type]


def test_the_sandbox_lends_the_slot_to_a_reference_run_only(tmp_path, monkeypatch):
    from stitchcuda.verifier.sandbox import Mount, RunSpec, Sandbox
    from stitchcuda.verifier.settings import VerifierSettings

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    slots = tmp_path / "slots"
    sandbox = Sandbox(VerifierSettings(home=tmp_path / "home", gpu_slot_dir=slots, sandbox="none"))

    def spec(label: str) -> RunSpec:
        script = f"{label}_runner.py"
        return RunSpec(script, {}, b"", {"work": Mount(tmp_path)}, "cuda", 1.0, 1 << 30, label)

    turn_fds = sandbox._turn_files(spec("reference"))
    assert turn_fds is not None
    try:
        assert sandbox._lent_slot(spec("reference"), turn_fds) is None  # no slot held
        with gpu_slot(slots, "0", 1):
            fd = sandbox._lent_slot(spec("reference"), turn_fds)
            assert fd == held_slot()
            cmd, _ = sandbox._command(spec("reference"), 3, 4, 5, -1, turn_fds, fd)
            assert cmd[cmd.index("--slot") + 1] == str(fd)
            assert sandbox._lent_slot(spec("candidate"), turn_fds) is None  # a candidate never compiles
            assert (
                sandbox._lent_slot(spec("reference"), None) is None
            )  # no turns: it would time beside others
    finally:
        for n in turn_fds:
            os.close(n)


def test_the_wait_for_the_slot_holds_no_turn(tmp_path):
    """The slot's holder needs the turn alone to finish its timing: a run that waited for the slot holding a
    turn (a compiled graph's run, or a torch without the compile's hooks) would stall both."""
    sys.path.insert(0, HARNESS)
    import reference_runner

    started = threading.Event()

    def other_verification() -> None:  # the slot, then a timing alone
        with gpu_slot(tmp_path, "0", 1, timeout_s=5):
            started.set()
            timer = Turns.at(tmp_path, "0")
            timer.take(ALONE)
            timer.close()

    with gpu_slot(tmp_path, "0", 1):
        gpu = Turns(turns.open_files(tmp_path, "0"), slot=os.dup(held_slot()))  # type: ignore[arg-type]
        timing: dict = {}
        other = threading.Thread(target=other_verification, daemon=True)
        with reference_runner.lending_slot(gpu, {"slot_wait_s": 20}, timing, keep=False):
            other.start()
            assert started.wait(5)
            gpu.take(SHARED)  # still working on the device when the compile ends
        other.join(5)
        assert not other.is_alive()
        assert "slot_note" not in timing and timing["slot_wait_s"] < 10
        assert gpu.held == SHARED, "the turn held before the wait is held again"
        # A run that holds a turn through the compile keeps its slot: the holder could not finish.
        gpu.take(ALONE)
        with reference_runner.lending_slot(gpu, {"slot_wait_s": 5}, {}, keep=False):
            with pytest.raises(Unavailable):
                with gpu_slot(tmp_path, "0", 1, timeout_s=0.2):
                    pass
        gpu.close()
        os.close(gpu.slot)  # type: ignore[arg-type]
