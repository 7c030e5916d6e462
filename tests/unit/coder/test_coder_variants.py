"""The optimize skill's choice of the next variants from the Verifier's feedback."""

from __future__ import annotations

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth.variants import Variant, next_variants, tried_signatures


def verdict(**kw: object) -> verify_pb2.Verdict:
    v = verify_pb2.Verdict(**kw)  # type: ignore[arg-type]
    return v


def test_signature_round_trip_and_defaults() -> None:
    assert Variant().signature() == "default"
    v = Variant(vec="1", block="512")
    assert v.signature() == "block=512,vec=1"
    assert Variant.from_map({**v.as_map(), "tried": "default", "bogus": "x", "vec": "7"}) == Variant(
        block="512"
    )
    assert tried_signatures({"tried": "default;vec=1"}) == ["default", "vec=1"]


def test_build_failure_steps_to_conservative_code() -> None:
    v = verdict(compiled=False, reason="build failed")
    v.build.ok = False
    v.build.error = "forward.cu(12): error: misaligned"
    picks = next_variants(Variant().as_map(), v, cuda=True, count=2)
    assert [p.signature() for p, _ in picks] == ["vec=1", "vec=1,fusion=none"]


def test_close_numerical_miss_asks_for_double_accumulators() -> None:
    v = verdict(compiled=True, correct=False, reason="mismatch")
    v.correctness.max_rel_l2 = 3e-5
    v.correctness.tolerance = 1e-5
    picks = next_variants(Variant().as_map(), v, cuda=True, count=3)
    assert picks[0][0].acc == "double"
    assert "close miss" in picks[0][1]
    assert {p.signature() for p, _ in picks} >= {"acc=double", "fusion=none"}


def test_own_gemm_kernels_can_step_from_tensor_cores_to_simt() -> None:
    """A mismatch of a program whose own GEMM/convolution kernels run on 3xTF32 tensor cores tries SIMT float32
    (the default since the H200's measurements); a library program never does (nothing changes); tuning an
    accepted program measures the other products, GEMM kernel and epilogue placement."""
    v = verdict(compiled=True, correct=False, reason="mismatch")
    v.correctness.max_rel_l2 = 3e-3
    v.correctness.tolerance = 1e-5
    tensor = Variant(gemm="custom", gemm_kernel="own", conv_kernel="own", mma="tf32x3")
    picks = next_variants({**tensor.as_map(), "features": "gemm,conv"}, v, cuda=True, count=2)
    assert picks[0][0].mma == "simt" and "SIMT" in picks[0][1]
    assert all(p.mma == "simt" for p, _ in next_variants(Variant().as_map(), v, cuda=True, count=5))
    ok = verdict(compiled=True, correct=True, accepted=True)
    ok.profile.bound = "compute"
    custom = Variant(gemm="custom")
    sigs = [p.signature() for p, _ in next_variants(custom.as_map(), ok, cuda=True, count=10)]
    assert {"gemm=custom,mma=tf32x3", "gemm=custom,gemm_kernel=own", "gemm=custom,epilogue=fused"} <= set(
        sigs
    )


def test_gemm_programs_try_cutlass_and_step_back_from_it() -> None:
    """An accepted program with own GEMM kernels measures CUTLASS's GEMM against them (never where the program
    has only convolutions); a Hopper CUTLASS program (the default) that fails to build or mismatches goes back
    to CUTLASS's SM80 GEMM, an SM80 one to the own kernels."""
    ok = verdict(compiled=True, correct=True, accepted=True)
    ok.profile.bound = "compute"
    own = Variant(gemm="custom", gemm_kernel="own")
    picks = next_variants({**own.as_map(), "features": "gemm"}, ok, cuda=True, count=10)
    assert "gemm=custom" in [p.signature() for p, _ in picks], "back to the default CUTLASS GEMM"
    conv_only = next_variants({**own.as_map(), "features": "conv"}, ok, cuda=True, count=10)
    assert all(p.gemm_kernel == "own" for p, _ in conv_only)
    hopper = Variant(gemm="custom")
    assert hopper.gemm_kernel == "cutlass_sm90"
    cutlass = hopper.with_(gemm_kernel="cutlass")
    broken = verdict(compiled=False, reason="build failed")
    broken.build.ok = False
    broken.build.error = "cutlass_gemm.cu(40): error: no instance of constructor"
    gemms = {"features": "gemm"}
    assert next_variants({**cutlass.as_map(), **gemms}, broken, cuda=True, count=1)[0][0] == own
    assert next_variants({**hopper.as_map(), **gemms}, broken, cuda=True, count=1)[0][0] == cutlass
    # A program with convolutions steps back from Hopper's convolution first (the GEMM's stays).
    both = {"features": "gemm,conv"}
    assert next_variants({**hopper.as_map(), **both}, broken, cuda=True, count=1)[0][0] == hopper.with_(
        conv_kernel="own"
    )
    wrong = verdict(compiled=True, correct=False, reason="mismatch")
    wrong.correctness.max_rel_l2 = 3e-3
    wrong.correctness.tolerance = 1e-5
    assert next_variants({**cutlass.as_map(), **gemms}, wrong, cuda=True, count=1)[0][0] == own
    assert next_variants({**hopper.as_map(), **gemms}, wrong, cuda=True, count=1)[0][0] == cutlass
    convs = {"features": "conv"}
    assert next_variants({**hopper.as_map(), **convs}, wrong, cuda=True, count=1)[0][0].conv_kernel == "own"
    # A library program's GEMMs are cuBLAS's: the knob changes nothing there, so it is never proposed.
    assert all(
        p.gemm_kernel == "cutlass_sm90"
        for p, _ in next_variants(Variant().as_map(), broken, cuda=True, count=5)
    )


CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(8, 32, 3)

    def forward(self, x):
        return torch.relu(self.conv(x))

def get_inputs():
    return [torch.randn(2, 8, 16, 16)]

def get_init_inputs():
    return []
"""


def test_the_simt_variant_is_compiled_into_the_kernels() -> None:
    """mma=simt reaches the CUDA program: its kernels' device query then answers no tensor cores."""
    from stitchcuda.coder.synth.synthesizer import Synthesizer

    synth = Synthesizer(in_process=True)  # this test's own reference
    kernels = {}
    for mma in ("tf32x3", "simt"):
        out = synth.synthesize(CONV, None, variant=Variant(gemm="custom", mma=mma), device="cuda")
        kernels[mma] = out.files["kernels.cu"]
        assert "stitch_conv_tc_kernel" in kernels[mma] and "#ifdef STITCH_SIMT_ONLY" in kernels[mma]
    assert "#define STITCH_SIMT_ONLY 1" in kernels["simt"]
    assert "#define STITCH_SIMT_ONLY" not in kernels["tf32x3"]


def test_low_custom_share_moves_work_into_custom_kernels() -> None:
    v = verdict(
        compiled=True, correct=True, accepted=False, reason="custom kernels cover 4% of device time (D6)"
    )
    v.findings.add(rule="D6.custom-share", severity=verify_pb2.SEVERITY_REJECT, detail="share 0.04 < 0.5")
    picks = next_variants(Variant().as_map(), v, cuda=True, count=2)
    assert [p.gemm for p, _ in picks][:1] == ["custom"]
    assert picks[1][0].gemm_bias == "epilogue"


def test_accepted_memory_bound_explores_vector_width_and_blocks_skipping_tried() -> None:
    v = verdict(compiled=True, correct=True, accepted=True)
    v.profile.bound = "memory"
    previous = {**Variant().as_map(), "tried": "vec=1"}
    picks = next_variants(previous, v, cuda=True, count=3)
    sigs = [p.signature() for p, _ in picks]
    assert "vec=1" not in sigs and "default" not in sigs
    assert sigs[0] == "block=128"
    assert len(set(sigs)) == 3


def test_cpu_exploration_tunes_grain() -> None:
    v = verdict(compiled=True, correct=True, accepted=True)
    picks = next_variants(Variant().as_map(), v, cuda=False, count=2)
    assert [p.grain for p, _ in picks] == ["8192", "131072"]


def test_nothing_left_to_try() -> None:
    v = verdict(compiled=False, reason="build failed")
    v.build.error = "error"
    previous = {**Variant(vec="1").as_map(), "tried": "default;vec=1,fusion=none"}
    assert next_variants(previous, v, cuda=True, count=4) == []


def test_a_crashed_run_steps_back_from_the_cuda_graph_first() -> None:
    """A CUDA run that crashed (or outgrew its memory) under the default graph=auto tries graph=off next, and
    a program without a graph (the feature absent) never gets the proposal."""
    for rule in ("D1.crash", "D10.memory"):
        v = verdict(compiled=True, correct=False, reason="rejected")
        v.findings.add(rule=rule, severity=verify_pb2.SEVERITY_REJECT, detail="run failed")
        picks = next_variants({**Variant().as_map(), "features": "conv,graph"}, v, cuda=True, count=2)
        assert picks[0][0] == Variant(graph="off") and rule in picks[0][1]
        without = next_variants({**Variant().as_map(), "features": "conv"}, v, cuda=True, count=5)
        assert all(p.graph == "auto" for p, _ in without)
