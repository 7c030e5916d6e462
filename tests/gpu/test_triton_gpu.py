"""Triton candidates through the whole Verifier on a GPU (marker gpu): the honest ones (a row softmax, an
autotuned GEMM) accepted with a measured speedup and their kernels counted as their own; the Triton variants of
the hack catalogue (tests/corpus/cuda/tr*) rejected, each by the rule its row names.

Run on the device machine: `pytest tests/gpu/test_triton_gpu.py -m gpu -q -s`.
"""

import importlib.util
import json
import os
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
CASES = sorted((CORPUS / "cuda").glob("tr*"))
HONEST = [f for f in CASES if sync.expect(f)["expected"] == "accept"]
HACKS = [f for f in CASES if sync.expect(f)["expected"] == "reject"]
# The rule (static or run-time) each hack must draw among its REJECTs.
EXPECTED_RULES = {
    "tr01_unused_kernel": {"D6.no-custom-kernel", "D11.no-custom-call"},
    "tr04_ghost_dtype": {"D6.no-custom-kernel", "D11.no-kernel-launch"},
    "tr04_ghost_shape": {"D6.no-custom-kernel", "D11.torch-op"},
    "tr06_torch_fallback": {"D6.low-custom-share", "D11.torch-op"},
    "tr26_dot_tf32": {"D11.precision"},
    "tr27_tf32_flags": {"D11.global-state"},
}
_verdicts: dict[Path, verify_pb2.Verdict] = {}


@pytest.fixture(scope="module")
def service():
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from stitchcuda.verifier.service import VerifierService
    from stitchcuda.verifier.settings import VerifierSettings

    cache = os.environ.get("STITCH_TEST_BUILD_CACHE")
    svc = VerifierService(VerifierSettings(**({"build_cache_dir": Path(cache)} if cache else {})))
    yield svc
    svc.close()


def verdict_for(service, folder: Path) -> verify_pb2.Verdict:
    if folder not in _verdicts:
        v = service.verify(sync.reference_source(folder), read_dir(folder), device=DEVICE)
        _verdicts[folder] = v
        kernels = [(k.name[:60], k.origin, round(k.time_ms, 4)) for k in v.profile.kernels[:4]]
        rules = sorted({f.rule for f in v.findings if f.severity == verify_pb2.SEVERITY_REJECT})
        print(
            json.dumps(
                {
                    "case": folder.name,
                    "accepted": v.accepted,
                    "speedup_vs_eager": round(v.speedup_vs_eager, 3),
                    "custom_share": round(v.custom_kernel_share, 3),
                    "rejects": rules,
                    "kernels": kernels,
                }
            )
        )
    return _verdicts[folder]


def describe(v: verify_pb2.Verdict) -> str:
    lines = [f"reason: {v.reason}"]
    lines += [f"  {f.severity} {f.rule} at {f.where}: {f.detail}" for f in v.findings]
    lines += [
        f"  kernel {k.origin:<7} {k.time_ms:8.3f} ms x{k.calls}: {k.name[:100]}" for k in v.profile.kernels
    ]
    return "\n".join(lines)


@pytest.mark.parametrize("folder", HONEST, ids=lambda p: p.name)
def test_honest_triton_candidates_are_accepted_with_a_speedup(service, folder):
    v = verdict_for(service, folder)
    assert v.accepted, f"honest {folder.name} was rejected\n{describe(v)}"
    assert v.speedup_vs_eager > 0 and v.timing.median_ms > 0, describe(v)
    custom = {k.name for k in v.profile.kernels if k.origin == "custom"}
    jit_names = {"tr_honest_softmax": "softmax_kernel", "tr_honest_gemm": "gemm_bias_relu_kernel"}
    # Triton names each compiled kernel after its jit function: the launch range makes it the candidate's.
    assert any(jit_names[folder.name] in name for name in custom), describe(v)
    assert v.custom_kernel_share >= 0.5, describe(v)


@pytest.mark.parametrize("folder", HACKS, ids=lambda p: p.name)
def test_triton_hacks_are_rejected_for_their_row(service, folder):
    v = verdict_for(service, folder)
    assert not v.accepted, f"{folder.name} ({sync.expect(folder)['why']}) was accepted\n{describe(v)}"
    rules = {f.rule for f in v.findings if f.severity == verify_pb2.SEVERITY_REJECT}
    assert rules & EXPECTED_RULES[folder.name], describe(v)


@pytest.mark.parametrize("folder", HONEST, ids=lambda p: p.name)
def test_triton_first_call_compilation_and_autotuning_never_trip_the_audit_hook(service, folder):
    # ptxas, the launcher's C compiler and the autotuner's benchmark launches run in the warm-up.
    v = verdict_for(service, folder)
    audit = [
        f
        for f in v.findings
        if f.rule.startswith(("D9.", "D8.")) and f.severity == verify_pb2.SEVERITY_REJECT
    ]
    assert not audit, describe(v)
