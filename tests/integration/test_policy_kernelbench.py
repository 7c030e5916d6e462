"""One kernel policy, read by Coder and Verifier: every CUDA program the built-in Coder writes for the public
KernelBench problems, under the strict default and under the opt-in library policy, passes the Verifier's
static checks under that same policy (no program the job's policy rejects is ever emitted, so no round is lost
to a rejection the Coder could have known). The problems are read from ../shared/kernelbench, where the
development set lives (STITCH_KERNELBENCH names another folder); skipped where neither exists.

Programs are written for CUDA but not run here: the verdicts on a GPU come from `stitchcuda bench`."""

from __future__ import annotations

import os
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


@pytest.mark.parametrize("level", ["level1", "level2"])
def test_every_program_the_coder_writes_passes_the_verifier_under_its_policy(level: str) -> None:
    synth = Synthesizer(in_process=True)  # public benchmark references: read, traced on the meta device
    written = {STRICT: 0, LIBRARY: 0}
    rejected: list[str] = []
    for path in sorted((KERNELBENCH / level).glob("*.py")):
        source = path.read_text()
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
    assert not rejected, "\n".join(rejected)
    # The library policy never writes fewer programs than strict: it only adds declared library calls.
    assert written[LIBRARY] >= written[STRICT] > 0, written
