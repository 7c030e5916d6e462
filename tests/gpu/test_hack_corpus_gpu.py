"""The CUDA candidates of tests/corpus/cuda through the whole Verifier on a GPU (marker gpu).

Run on the H200 device machine: `pytest tests/gpu/test_hack_corpus_gpu.py -m gpu -q`.
"""

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import read_dir

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
_spec = importlib.util.spec_from_file_location("corpus_sync", CORPUS / "sync.py")
assert _spec is not None and _spec.loader is not None
sync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync)

pytestmark = pytest.mark.gpu
DEVICE = "cuda"
SEVERITY = {1: "INFO", 2: "WARNING", 3: "REJECT"}
_verdicts: dict[Path, verify_pb2.Verdict] = {}


@pytest.fixture(scope="module")
def service():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from stitchcuda.verifier.service import VerifierService
    from stitchcuda.verifier.settings import VerifierSettings

    # Share compiled kits with the other test tiers (tests/conftest.py sets the folder).
    svc = VerifierService(VerifierSettings(build_cache_dir=Path(os.environ["STITCH_TEST_BUILD_CACHE"])))
    # The corpus shares a few kits; build them side by side first, as the verifier.build queue would,
    # instead of one nvcc run after another inside the first verdict of each kit.
    kits = {svc.builder.key(c): c for c in (read_dir(f) for f in sync.cases(DEVICE))}
    with ThreadPoolExecutor(max_workers=len(kits) or 1) as pool:
        list(pool.map(lambda c: svc.build(c, device=DEVICE), kits.values()))
    return svc


def verdict_for(service, folder: Path) -> verify_pb2.Verdict:
    if folder not in _verdicts:
        _verdicts[folder] = service.verify(sync.reference_source(folder), read_dir(folder), device=DEVICE)
    return _verdicts[folder]


def describe(v: verify_pb2.Verdict) -> str:
    lines = [f"reason: {v.reason}"]
    lines += [
        f"  {SEVERITY.get(f.severity, f.severity)} {f.rule} at {f.where}: {f.detail}" for f in v.findings
    ]
    # The profiled call's kernels and their attribution: what a D6 verdict was decided on.
    lines += [
        f"  kernel {k.origin:<7} {k.time_ms:8.3f} ms x{k.calls} stream {k.stream}: {k.name[:100]}"
        for k in v.profile.kernels
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("folder", sync.cases(DEVICE), ids=lambda p: p.name)
def test_cuda_corpus_verdict(service, folder):
    e = sync.expect(folder)
    v = verdict_for(service, folder)
    if e["expected"] == "accept":
        assert v.accepted, f"honest {folder.name} ({e['why']}) was rejected\n{describe(v)}"
    else:
        assert not v.accepted, f"{folder.name} (row {e['row']}: {e['why']}) was accepted\n{describe(v)}"


@pytest.mark.parametrize(
    "folder",
    [f for f in sync.cases(DEVICE) if sync.expect(f)["caught_by"] in ("runtime", "both")],
    ids=lambda p: p.name,
)
def test_cuda_runtime_checks_reject_on_their_own(service, folder):
    e = sync.expect(folder)
    v = verdict_for(service, folder)
    runtime = [
        f for f in v.findings if f.severity == verify_pb2.SEVERITY_REJECT and not f.rule.startswith("D11.")
    ]
    assert runtime, f"{folder.name} (row {e['row']}) has no run-time REJECT, only static ones\n{describe(v)}"
