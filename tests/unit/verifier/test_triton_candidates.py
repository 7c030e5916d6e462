"""Triton candidates: recognised as their own format, no build entry, and D11 knows Triton's ways of not doing
the work (every static check with an honest variant that must stay clean)."""

from pathlib import Path

import pytest

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import (
    builds,
    export_standalone,
    from_kernelbench_source,
    read_dir,
    validate,
)
from stitchcuda.shared.errors import InvalidRequest
from stitchcuda.verifier.accounting import account
from stitchcuda.verifier.static import scan

REPO = Path(__file__).resolve().parents[3]
CUDA_CORPUS = REPO / "tests" / "corpus" / "cuda"
SOFTMAX_REF = (REPO / "benchmarks/problems/04_softmax.py").read_text()
GEMM_REF = (REPO / "benchmarks/problems/06_gemm_bias_relu.py").read_text()
HONEST_SOFTMAX = (CUDA_CORPUS / "tr_honest_softmax" / "model_new.py").read_text()
HONEST_GEMM = (CUDA_CORPUS / "tr_honest_gemm" / "model_new.py").read_text()


def rejects(source: str, reference: str) -> dict[str, str]:
    findings = scan(from_kernelbench_source(source, backend="cuda"), reference)
    return {f.rule: f.detail for f in findings if f.severity == verify_pb2.SEVERITY_REJECT}


def test_a_single_triton_file_is_recognised_with_its_kernels_and_builds_nothing():
    cand = from_kernelbench_source(HONEST_SOFTMAX, backend="cuda")
    assert cand.format == "triton: 1 @triton.jit kernel (softmax_kernel)"
    assert builds(cand) == []
    gemm = from_kernelbench_source(HONEST_GEMM, backend="cuda")
    assert gemm.format == "triton: 1 @triton.jit kernel (gemm_bias_relu_kernel), autotuned"


def test_triton_imported_under_other_names_is_recognised():
    source = HONEST_SOFTMAX.replace("import triton\n", "import triton as tr\nfrom triton import jit\n")
    source = source.replace("@triton.jit", "@jit").replace("triton.next_power_of_2", "tr.next_power_of_2")
    assert from_kernelbench_source(source, backend="cuda").format.startswith("triton: 1 @triton.jit kernel")


def test_a_folder_without_manifest_holding_a_triton_entry(tmp_path):
    (tmp_path / "model_new.py").write_text(HONEST_SOFTMAX)
    cand = read_dir(tmp_path)
    assert cand.format == "folder: triton: 1 @triton.jit kernel (softmax_kernel)"


def test_a_file_with_neither_build_call_nor_triton_kernel_names_both():
    with pytest.raises(InvalidRequest, match=r"no @triton\.jit kernel.*load_inline or load.*@triton\.jit"):
        from_kernelbench_source("import torch\nimport triton\n\nclass ModelNew: pass\n", backend="cuda")


def test_a_candidate_without_build_must_define_triton_kernels():
    cand = from_kernelbench_source(HONEST_SOFTMAX, backend="cuda")
    cand.files[0].content = "import torch\n"
    with pytest.raises(InvalidRequest, match="no extension to build"):
        validate(cand)


def test_honest_triton_candidates_have_no_static_reject():
    assert rejects(HONEST_SOFTMAX, SOFTMAX_REF) == {}
    assert rejects(HONEST_GEMM, GEMM_REF) == {}


def test_sizes_passed_to_a_kernel_are_not_outputs_it_writes():
    # `cols` goes to the kernel; a launch parameter derived from it must not read as tensor compute.
    source = HONEST_SOFTMAX.replace(
        "num_warps=8 if block >= 2048 else 4", "num_warps=8 if cols > block else 4"
    )
    assert rejects(source, SOFTMAX_REF) == {}


LAUNCH = "softmax_kernel[(rows,)](out, x, cols, x.stride(0), out.stride(0), BLOCK=block)"


def gated(condition: str, fallback: str) -> str:
    body = HONEST_SOFTMAX[: HONEST_SOFTMAX.index("        x = x.contiguous()")]
    return body + (
        f"        if {condition}:\n"
        "            x = x.contiguous()\n"
        "            out = torch.empty_like(x)\n"
        "            rows, cols = x.shape\n"
        "            block = triton.next_power_of_2(cols)\n"
        f"            {LAUNCH}\n"
        "            return out\n"
        f"        {fallback}\n"
    )


def test_a_kernel_gated_on_a_dtype_the_benchmark_never_has_is_rejected():
    found = rejects(gated("x.dtype == torch.float16", "return x.new_zeros(x.shape)"), SOFTMAX_REF)
    assert "torch.float16" in found["D11.no-kernel-launch"]
    # Gated on float32 (the benchmark's dtype): the kernel runs, no ghost-branch finding.
    honest = rejects(gated("x.dtype == torch.float32", "raise ValueError('float32 only')"), SOFTMAX_REF)
    assert "D11.no-kernel-launch" not in honest


def test_a_torch_fallback_doing_the_work_is_rejected():
    found = rejects(gated("x.shape[-1] <= 1024", "return torch.softmax(x, dim=-1)"), SOFTMAX_REF)
    assert "torch.softmax" in found["D11.torch-op"]


def test_an_unused_kernel_and_a_torch_forward_are_rejected():
    source = HONEST_SOFTMAX[: HONEST_SOFTMAX.index("        x = x.contiguous()")]
    found = rejects(source + "        return torch.softmax(x, dim=-1)\n", SOFTMAX_REF)
    assert "D11.no-custom-call" in found
    findings = scan(
        from_kernelbench_source(source + "        return torch.softmax(x, dim=-1)\n", "cuda"), SOFTMAX_REF
    )
    assert any(f.rule == "D11.unlaunched-kernel" for f in findings)


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ('input_precision="ieee"', 'input_precision="tf32"', "D11.precision"),
        ('input_precision="ieee"', "allow_tf32=True", "D11.precision"),
        (
            "import triton.language as tl\n",
            "import triton.language as tl\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
            "D11.global-state",
        ),
        (
            'tl.dot(a, b, input_precision="ieee")',
            "tl.dot(a.to(tl.float16), b.to(tl.float16))",
            "D11.precision",
        ),
        ('input_precision="ieee"', 'input_precision="tf32x3"', "D11.precision"),
        (
            "import triton.language as tl\n",
            "import triton.language as tl\n\ntorch.set_float32_matmul_precision('high')\n",
            "D11.global-state",
        ),
    ],
)
def test_precision_downgrades_are_rejected(old, new, rule):
    assert rule in rejects(HONEST_GEMM.replace(old, new, 1), GEMM_REF)


def test_a_triton_launch_counts_as_the_candidates_own_kernel_whatever_its_name():
    token = "sc0123"
    # A GPU trace: the forward span, a Triton launch range, and a kernel named like a library GEMM.
    events = [
        {"cat": "user_annotation", "name": f"{token}::<profiled call>", "ts": 0.0, "dur": 100.0, "tid": "1"},
        {
            "cat": "user_annotation",
            "name": f"{token}::triton::gemm_kernel",
            "ts": 10.0,
            "dur": 20.0,
            "tid": "1",
        },
        {
            "cat": "cuda_driver",
            "name": "cuLaunchKernelEx",
            "ts": 15.0,
            "dur": 2.0,
            "tid": "1",
            "correlation": 7,
        },
        {"cat": "kernel", "name": "gemm_kernel", "ts": 40.0, "dur": 50.0, "correlation": 7, "stream": 7},
        {
            "cat": "cuda_driver",
            "name": "cuLaunchKernelEx",
            "ts": 50.0,
            "dur": 2.0,
            "tid": "1",
            "correlation": 8,
        },
        {"cat": "kernel", "name": "gemm_kernel", "ts": 90.0, "dur": 5.0, "correlation": 8, "stream": 7},
    ]
    acc = account(events, token, "cuda", set())
    origins = [(k.name, k.origin, k.calls) for k in acc.kernels]
    # The launch inside the Triton range is custom; the same-named launch outside it is not.
    assert ("gemm_kernel", "custom", 1) in origins and ("gemm_kernel", "library", 1) in origins


def test_a_launch_in_try_with_a_torch_handler_is_rejected():
    source = gated("True", "return out")
    launch = f"            {LAUNCH}\n"
    handled = (
        "            try:\n"
        f"                {LAUNCH}\n"
        "            except Exception:\n"
        "                return torch.softmax(x, dim=-1)\n"
    )
    assert launch in source
    assert "D11.fallback" in rejects(source.replace(launch, handled), SOFTMAX_REF)


def test_a_triton_candidate_exports_as_itself():
    assert export_standalone(from_kernelbench_source(HONEST_SOFTMAX, backend="cuda")) == HONEST_SOFTMAX


def test_a_triton_kernel_without_a_recorded_launch_is_known_by_its_jit_name():
    token = "sc0123"
    events = [
        {"cat": "user_annotation", "name": f"{token}::<profiled call>", "ts": 0.0, "dur": 100.0, "tid": "1"},
        {
            "cat": "user_annotation",
            "name": f"{token}::triton::softmax_kernel",
            "ts": 10.0,
            "dur": 20.0,
            "tid": "1",
        },
        {
            "cat": "kernel",
            "name": "softmax_kernel",
            "ts": 40.0,
            "dur": 50.0,
            "correlation": None,
            "stream": 7,
        },
        {"cat": "kernel", "name": "other_kernel", "ts": 90.0, "dur": 5.0, "correlation": None, "stream": 7},
    ]
    origins = {k.name: k.origin for k in account(events, token, "cuda", set()).kernels}
    assert origins == {"softmax_kernel": "custom", "other_kernel": "torch"}
