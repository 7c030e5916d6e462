"""Reference results on the node's disk: one reference run serves `reference_reuse` verifications across
jobs and worker processes, within `reference_ttl_s`, and then fresh secret inputs are drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from verifier_support import FIXTURES, REF01

from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.verifier.probes import build_plan
from stitchcuda.verifier.reference import ReferenceResult, ReferenceStore, SetData


def result(numel: int = 16) -> ReferenceResult:
    sets = {
        "s0": SetData(inputs=[torch.randn(numel)], ref32=[torch.randn(numel)], ref64=None, err_ref32=[0.0])
    }
    return ReferenceResult(
        sha256="ab" * 32, device="cpu", plan=build_plan(3, 2, 1, 3), info={}, init_inputs=[], state={},
        param_bytes=0, sets=sets, skipped={}, offshape={}, timing={"eager": {"device": {"median": 1.5}}},
        cost={}, ceilings=None, sandbox="none", seconds=2.0, uses=1,
    )  # fmt: skip


def store(root: Path, **kw: object) -> ReferenceStore:
    values: dict[str, object] = {"reuse": 3, "ttl_s": 900.0, "max_bytes": 1 << 30}
    values.update(kw)
    return ReferenceStore(root, **values)  # type: ignore[arg-type]


def test_a_stored_result_serves_its_uses_then_is_spent(tmp_path: Path) -> None:
    key = ("ab" * 32, "cpu", 3)
    first, second = store(tmp_path), store(tmp_path)  # two processes' views of one node folder
    assert first.take(key) is None
    ref = result()
    ref.memo[("tolerance",)] = "derived facts are not stored"
    with first.locked(key):
        entry = first.put(key, ref)
    assert ref.memo, "the caller keeps its memo"
    taken = second.take(key)
    assert taken is not None and taken[0] == entry
    loaded = taken[1]
    assert loaded is not None and loaded.memo == {}
    assert torch.equal(loaded.sets["s0"].ref32[0], ref.sets["s0"].ref32[0]) and loaded.eager_ms == 1.5
    assert first.take(key) is not None  # use 3 of 3
    assert second.take(key) is None, "spent: the next verification draws fresh inputs"
    assert not list(tmp_path.glob("*.pt"))


def test_an_old_entry_is_not_served(tmp_path: Path) -> None:
    key = ("cd" * 32, "cpu")
    s = store(tmp_path, ttl_s=60.0)
    s.put(key, result())
    meta = next(tmp_path.glob("*.json"))
    doc = json.loads(meta.read_text())
    doc["created"] = time.time() - 61
    meta.write_text(json.dumps(doc))
    assert s.take(key) is None


def test_a_result_too_large_to_keep_is_still_counted(tmp_path: Path) -> None:
    key = ("ef" * 32, "cuda")
    s = store(tmp_path, max_bytes=1000)
    entry = s.put(key, result(numel=10_000))
    assert not list(tmp_path.glob("*.pt"))
    assert s.take(key) == (entry, None), "the process that holds it in memory reuses it"


def test_an_unreadable_entry_costs_one_reference_run(tmp_path: Path) -> None:
    key = ("01" * 32, "cpu")
    s = store(tmp_path)
    entry = s.put(key, result())
    next(tmp_path.glob("*.pt")).write_bytes(b"not a torch file")
    assert s.take(key) == (entry, None)
    assert not list(tmp_path.glob("*.pt")) and s.take(key) is None


def test_the_oldest_entries_go_when_the_folder_is_full(tmp_path: Path) -> None:
    s = store(tmp_path, max_bytes=1 << 30)
    s.put(("a",), result(numel=100_000))
    size = next(tmp_path.glob("*.pt")).stat().st_size
    s.max_bytes = int(size * 1.5)
    time.sleep(0.01)
    entry_b = s.put(("b",), result(numel=100_000))  # use 1 of 3
    assert len(list(tmp_path.glob("*.pt"))) == 1, "the oldest entry's data went"
    taken = s.take(("a",))
    assert taken is not None and taken[1] is None, "its uses stay: the process holding it reuses it"
    assert s.take(("b",), holding=entry_b) == (entry_b, None), "use 2: the holder does not read it again"
    taken = s.take(("b",))
    assert taken is not None and taken[1] is not None, "use 3: another process reads it"


def test_a_reference_held_in_memory_survives_another_process_filling_the_store(
    tmp_path: Path, build_store: LocalArtifactStore
) -> None:
    """Four problems of a few GiB each in one bench filled the node's store; the first problem's entry was
    evicted by the others' and its verification ran the reference a second time (GPU, stop 33)."""
    from verifier_support import fast_settings

    from stitchcuda.verifier.service import VerifierService

    svc = VerifierService(fast_settings(tmp_path / "home", reference_reuse=2), artifacts=build_store)
    runs = counted(svc)
    source = REF01.read_text()
    assert svc.prepare_reference(source, device="cpu") is True
    assert svc.reference_store is not None
    other = store(svc.reference_store.root, max_bytes=1)  # another process's put evicts every file
    other.put(("another problem",), result(numel=1000))
    assert not list(svc.reference_store.root.glob("*.pt"))
    verdict = svc.verify_dir(REF01, FIXTURES / "honest_cpu", device="cpu")
    assert verdict.accepted, verdict.reason
    assert runs == [1], "the verification reused the results this process holds"


VERIFY = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from stitchcuda.verifier.service import VerifierService
    from verifier_support import fast_settings
    svc = VerifierService(fast_settings(Path(sys.argv[1]), reference_reuse=int(sys.argv[4])))
    runs = []
    original = svc.references.run
    svc.references.run = lambda *a, **k: runs.append(1) or original(*a, **k)
    verdict = svc.verify_dir(Path(sys.argv[2]), Path(sys.argv[3]), device="cpu")
    stages = sorted(verdict.stage_seconds)
    print(json.dumps({"accepted": verdict.accepted, "reason": verdict.reason, "reference_runs": len(runs),
                      "stages": stages}))
    """
)


def verify_in_a_new_process(home: Path, reuse: int) -> dict[str, object]:
    root = Path(__file__).resolve().parents[3]
    here = str(Path(__file__).resolve().parent)
    env = {**os.environ, "PYTHONPATH": here + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(
        [sys.executable, "-c", VERIFY, str(home), str(REF01), str(FIXTURES / "honest_cpu"), str(reuse)],
        capture_output=True, text=True, timeout=600, env=env, cwd=root, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.slow
def test_a_second_worker_process_reuses_the_reference_run_of_the_first(tmp_path: Path) -> None:
    first = verify_in_a_new_process(tmp_path / "home", reuse=2)
    assert first["accepted"] and first["reference_runs"] == 1, first
    # the verdict times its own stages (the stitch_stage_seconds panels read them)
    assert {"static", "build", "correctness", "timing"} <= set(first["stages"]), first["stages"]
    second = verify_in_a_new_process(tmp_path / "home", reuse=2)
    assert second["accepted"] and second["reference_runs"] == 0, second
    third = verify_in_a_new_process(tmp_path / "home", reuse=2)
    assert third["accepted"] and third["reference_runs"] == 1, "two uses spent: fresh inputs"


def test_a_look_at_an_entry_spends_no_use(tmp_path: Path) -> None:
    key = ("0a" * 32, "cpu")
    s = store(tmp_path, reuse=1)
    assert s.peek(key) is None
    ref = result()
    ref.uses = 0  # computed ahead of its first verification
    entry = s.put(key, ref)
    assert s.peek(key) == (entry, True) and s.peek(key) == (entry, True)
    assert s.take(key) is not None, "the one use is still there"
    assert s.peek(key) is None and s.take(key) is None
    big = store(tmp_path / "big", max_bytes=1000)
    assert big.peek(key) is None
    assert big.put(key, result(numel=10_000)) and big.peek(key) == (big.take(key)[0], False)  # type: ignore[index]


def counted(svc: object) -> list[int]:
    runs: list[int] = []
    original = svc.references.run  # type: ignore[attr-defined]
    svc.references.run = lambda *a, **k: runs.append(1) or original(*a, **k)  # type: ignore[attr-defined]
    return runs


def test_a_reference_prepared_ahead_serves_the_verification_without_spending_a_use(
    tmp_path: Path, build_store: LocalArtifactStore
) -> None:
    from verifier_support import fast_settings

    from stitchcuda.verifier.service import VerifierService

    svc = VerifierService(fast_settings(tmp_path / "home", reference_reuse=1), artifacts=build_store)
    runs = counted(svc)
    source = REF01.read_text()
    # Prepared on a thread that ends (embedded mode's): the standby it starts must outlive it (a
    # runner gets its parent-death signal when the thread that started it ends).
    ahead: list[bool] = []
    worker = threading.Thread(target=lambda: ahead.append(svc.prepare_reference(source, device="cpu")))
    worker.start()
    worker.join()
    assert ahead == [True]
    assert svc.prepare_reference(source, device="cpu") is False, "already there: nothing runs twice"
    assert runs == [1]
    assert "cpu" in svc.candidates._standby, "the first candidate's runner starts while the build runs"
    standby = svc.candidates._standby["cpu"][0]
    assert standby.ready(60)
    time.sleep(0.5)
    assert standby.alive(), "the standby died with the thread that prepared the reference"
    verdict = svc.verify_dir(REF01, FIXTURES / "honest_cpu", device="cpu")
    assert verdict.accepted, verdict.reason
    assert runs == [1], "the verification reused the prepared results"
    # The prepared run spent none of the reference's uses: with one use, that verification spent it.
    svc.verify_dir(REF01, FIXTURES / "honest_cpu", device="cpu")
    assert runs == [1, 1]


def test_a_reference_that_fails_ahead_fails_its_verification_without_a_second_run(
    tmp_path: Path, build_store: LocalArtifactStore
) -> None:
    from verifier_support import fast_settings

    from stitchcuda.shared.errors import ProblemError
    from stitchcuda.verifier.service import VerifierService

    bad = tmp_path / "bad.py"
    bad.write_text(
        REF01.read_text().replace(
            "y = x * self.scale", "raise RuntimeError('boom')\n        y = x * self.scale"
        )
    )
    svc = VerifierService(fast_settings(tmp_path / "home"), artifacts=build_store)
    runs = counted(svc)
    with pytest.raises(ProblemError, match="boom") as ahead:
        svc.prepare_reference(bad.read_text(), device="cpu")
    with pytest.raises(ProblemError) as at_verification:
        svc.verify_dir(bad, FIXTURES / "honest_cpu", device="cpu")
    assert at_verification.value is ahead.value and runs == [1]


def test_an_entry_the_caller_holds_is_not_read_again(tmp_path: Path) -> None:
    key = ("0b" * 32, "cpu")
    s = store(tmp_path)
    entry = s.put(key, result(numel=1000))
    assert s.take(key, holding=entry) == (entry, None), "counted, not loaded: the process holds it"
    taken = s.take(key, holding="another-entry")
    assert taken is not None and taken[1] is not None, "another process's entry is read from disk"
