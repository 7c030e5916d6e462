"""One kernel policy, read by Coder and Verifier: every CUDA program the built-in Coder writes for the public
KernelBench problems, under the strict default and under the opt-in library policy, passes the Verifier's
static checks under that same policy (no program the job's policy rejects is ever emitted, so no round is lost
to a rejection the Coder could have known). The problems are read from ../shared/kernelbench, where the
development set lives (STITCH_KERNELBENCH names another folder); skipped where neither exists.

Programs are written for CUDA but not run here: the verdicts on a GPU come from `stitchcuda bench`."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy
from stitchcuda.verifier.static import scan

ROOT = Path(__file__).resolve().parents[2]
KERNELBENCH = Path(os.environ.get("STITCH_KERNELBENCH", ROOT.parent / "shared" / "kernelbench"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not KERNELBENCH.is_dir(), reason=f"no KernelBench problems at {KERNELBENCH}"),
]


_SYNTH: list[Synthesizer] = []


def _check(path: Path) -> tuple[dict[str, int], list[str]]:
    """(programs written per policy, findings that reject one) for one problem, in a pool's process."""
    if not _SYNTH:
        _SYNTH.append(Synthesizer(in_process=True))  # public benchmark references: traced on the meta device
    synth = _SYNTH[0]
    source = path.read_text()
    written = {STRICT: 0, LIBRARY: 0}
    rejected: list[str] = []
    for name in (STRICT, LIBRARY):
        policy = KernelPolicy(name)
        try:
            synthesis = synth.synthesize(source, None, variant=Variant(), device="cuda", policy=policy)
        except Unsupported:
            continue  # not written at all: counted by the bench as "not verified", never a wrong verdict
        written[name] += 1
        findings = scan(to_candidate(synthesis), source, (), policy)
        rejected += [
            f"{path.stem} [{name}]: {f.rule}: {f.message[:160]}"
            for f in findings
            if f.severity == verify_pb2.SEVERITY_REJECT
        ]
    return written, rejected


@pytest.mark.parametrize("level", ["level1", "level2"])
def test_every_program_the_coder_writes_passes_the_verifier_under_its_policy(level: str) -> None:
    written = {STRICT: 0, LIBRARY: 0}
    rejected: list[str] = []
    paths = sorted((KERNELBENCH / level).glob("*.py"))
    # The problems are independent: one process per core (a fresh interpreter each, not a fork of this one).
    with ProcessPoolExecutor(os.cpu_count() or 1, mp_context=multiprocessing.get_context("spawn")) as pool:
        for counts, found in pool.map(_check, paths):
            for name, n in counts.items():
                written[name] += n
            rejected += found
    assert not rejected, "\n".join(rejected)
    # The library policy never writes fewer programs than strict: it only adds declared library calls.
    assert written[LIBRARY] >= written[STRICT] > 0, written
