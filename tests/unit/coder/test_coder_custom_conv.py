"""Convolutions (3-D, transposed 1-D/2-D/3-D) and GEMM-shaped einsums under the strict kernel policy: the
built-in Coder writes them as the program's own kernels (no at::conv*, no at::einsum, no at::mm), the CUDA
sources compile with nvcc, and (slow) each CPU program matches a float64 evaluation of the reference over
strides, paddings, output paddings, dilations, groups, odd sizes and layers with and without bias."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import torch
from synth_build import load_program
from test_coder_cuda_build import NVCC, assert_program_compiles
from torch.utils import cpp_extension

from stitchcuda.coder.synth import einsum
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir


def problem(layers: list[str], forward: str, inputs: str, args: str = "x") -> str:
    """A KernelBench-format reference with the given layers (self.l0, self.l1, ...) and forward."""
    init = "".join(f"        self.l{i} = {layer}\n" for i, layer in enumerate(layers)) or "        pass\n"
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n{init}\n"
        f"    def forward(self, {args}):\n        return {forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return []\n"
    )


PROBLEMS = {
    "conv3d": problem(
        [
            "nn.Conv3d(4, 6, (3, 2, 3), stride=(1, 2, 1), padding=(1, 0, 2), dilation=(2, 1, 1))",
            "nn.Conv3d(6, 4, 2, stride=2, padding=1, groups=2, bias=False)",
            "nn.Conv3d(4, 5, (2, 3, 4), padding='same', dilation=(1, 2, 1))",  # even extents: more padding after
            "nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)",
            "nn.Conv1d(4, 6, 3, padding=2, dilation=2, bias=False)",
        ],
        "self.l1(torch.relu(self.l0(x))), self.l2(x), self.l3(x[:, :, 0]), self.l4(x[:, :, 0, 0])",
        "[torch.randn(2, 4, 5, 7, 9)]",
    ),
    "transposed": problem(
        [
            "nn.ConvTranspose1d(4, 6, 3, stride=3, padding=1, output_padding=2, dilation=2, groups=2)",
            "nn.ConvTranspose2d(4, 6, (3, 5), stride=(2, 3), padding=(1, 2), output_padding=(1, 0), "
            "dilation=(2, 1), groups=2)",
            "nn.ConvTranspose2d(4, 3, 4, stride=1, padding=0, bias=False)",
            "nn.ConvTranspose3d(4, 6, (3, 2, 3), stride=2, padding=(1, 0, 1), output_padding=1, groups=2)",
            "nn.ConvTranspose3d(4, 4, 3, stride=(1, 2, 2), padding=1, dilation=(2, 1, 1), groups=4, bias=False)",
        ],
        "self.l0(x[:, :, 0, 0]), torch.tanh(self.l1(x[:, :, 0])), self.l2(x[:, :, 1]), self.l3(x), self.l4(x)",
        "[torch.randn(2, 4, 5, 7, 9)]",
    ),
    "einsum": problem(
        [],
        "(torch.einsum('bijl,lk->bijk', a, w), torch.einsum('bik,bkj->bji', c, d), torch.einsum('ij,jk', w.t(), w),"
        " torch.einsum('...ij,...jk->...ik', c, d), torch.einsum('i,j->ij', w[0], w[1]))",
        "[torch.randn(2, 3, 5, 7), torch.randn(7, 4), torch.randn(3, 6, 5), torch.randn(3, 5, 2)]",
        args="a, w, c, d",
    ),
}

# What a strict program must not call: the vendor libraries' GEMMs and convolutions.
LIBRARY = re.compile(r"\bat::(mm|addmm|bmm|baddbmm|matmul|conv\w*|einsum|linear|tensordot)\s*\(")
OWN = {"conv3d": "stitch_conv(", "transposed": "stitch_conv(", "einsum": "stitch_einsum_gemm("}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", list(PROBLEMS))
def test_strict_program_runs_its_own_kernels(synth: Synthesizer, name: str, device: str) -> None:
    synthesis = synth.synthesize(PROBLEMS[name], None, variant=Variant(), device=device)
    text = "\n".join(synthesis.files.values())
    assert not LIBRARY.search(text), LIBRARY.findall(text)
    assert OWN[name] in synthesis.files["forward.cpp"]
    assert synthesis.build.libraries == []


@pytest.mark.parametrize("name", ["conv3d", "transposed"])
def test_the_verifiers_static_scan_accepts_the_strict_cuda_program(synth: Synthesizer, name: str) -> None:
    """The implicit-GEMM convolution's tensor-core kernel carries TF32 operands with their residuals
    (3xTF32): the Verifier reports it and, the reference being fp32, lets D3 judge the accuracy."""
    from stitchcuda.api.v1 import verify_pb2
    from stitchcuda.verifier.static import scan

    synthesis = synth.synthesize(PROBLEMS[name], None, variant=Variant(), device="cuda")
    findings = scan(to_candidate(synthesis), PROBLEMS[name])
    rejects = [f"{f.rule}: {f.detail}" for f in findings if f.severity == verify_pb2.SEVERITY_REJECT]
    assert rejects == []
    assert "D11.precision-split" in {f.rule for f in findings}


def test_library_policy_keeps_the_library_calls(synth: Synthesizer) -> None:
    from stitchcuda.shared.policy import LIBRARY as LIBRARY_POLICY
    from stitchcuda.shared.policy import KernelPolicy

    synthesis = synth.synthesize(
        PROBLEMS["transposed"], None, variant=Variant(), device="cpu", policy=KernelPolicy(LIBRARY_POLICY)
    )
    assert "at::conv_transpose3d(" in synthesis.files["forward.cpp"]
    assert "stitch_conv(" not in synthesis.files["forward.cpp"]


@pytest.mark.parametrize(
    ("equation", "shapes", "form"),
    [
        ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], ([0, 1, 2], [0, 1, 2], 1, 1, 1, [0, 1, 2])),
        ("bijl,lk->bijk", [(2, 3, 4, 5), (5, 6)], ([0, 1, 2, 3], [0, 1], 0, 3, 1, [0, 1, 2, 3])),
        # The output's order differs from [batch, M, N]: the product is permuted.
        ("bik,bkj->bji", [(2, 3, 4), (2, 4, 5)], ([0, 1, 2], [0, 1, 2], 1, 1, 1, [0, 2, 1])),
        # Implicit output (labels seen once, alphabetically), a contraction over two labels.
        ("kaj,jkb", [(3, 4, 5), (5, 3, 6)], ([1, 0, 2], [1, 0, 2], 0, 1, 1, [0, 1])),
        # Ellipsis broadcast dims: batch where both operands have them, M where only the first does.
        ("...ij,jk->...ik", [(2, 3, 4, 5), (5, 6)], ([0, 1, 2, 3], [0, 1], 0, 3, 1, [0, 1, 2, 3])),
    ],
)
def test_einsum_gemm_forms(equation: str, shapes: list[tuple[int, ...]], form: tuple[object, ...]) -> None:
    plan = einsum.plan(equation, shapes)
    assert (plan.perm_a, plan.perm_b, plan.nbatch, plan.nm, plan.nn, plan.perm_out) == form
    # The plan, replayed with torch ops, is the einsum.
    a, b = (torch.randn(s, dtype=torch.float64) for s in shapes)
    ap, bp = a.permute(plan.perm_a), b.permute(plan.perm_b)
    nb, nm = plan.nbatch, plan.nm
    lead, m, n = ap.shape[:nb], ap.shape[nb : nb + nm], bp.shape[bp.dim() - plan.nn :]
    prod = ap.reshape(lead.numel(), m.numel(), -1) @ bp.reshape(lead.numel(), -1, n.numel())
    got = prod.view(*lead, *m, *n).permute(plan.perm_out)
    torch.testing.assert_close(got, torch.einsum(equation, a, b))


@pytest.mark.parametrize(
    ("equation", "shapes", "why"),
    [
        ("ii->i", [(3, 3)], "operands"),
        ("ij,jk->i", [(2, 3), (3, 4)], "summed within one operand"),
        ("ii,ij->ij", [(3, 3), (3, 4)], "repeated label"),
        ("bij,bjk->bik", [(1, 3, 4), (2, 4, 5)], "broadcast"),
    ],
)
def test_einsums_without_a_gemm_form_are_unsupported(
    equation: str, shapes: list[tuple[int, ...]], why: str
) -> None:
    with pytest.raises(Unsupported, match=why):
        einsum.plan(equation, shapes)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_cuda_sources_compile(synth: Synthesizer, tmp_path: Path) -> None:
    """kernels.cu with nvcc alone, forward.cpp parsed against this torch's headers (as test_coder_cuda_build)."""
    both = PROBLEMS["transposed"].replace(
        "self.l3(x), self.l4(x)", "self.l3(x), self.l4(x), torch.einsum('bcdhw,bcdvw->bcdhv', x, x)"
    )
    candidate = to_candidate(synth.synthesize(both, None, variant=Variant(), device="cuda"))
    folder = tmp_path / "program"
    write_dir(candidate, folder)
    assert "void stitch_conv_launch(" in (folder / "kernels.cu").read_text()
    assert_program_compiles(folder, tmp_path)


def build_cpu(synth: Synthesizer, source: str, variant: Variant) -> dict[str, object]:
    """Builds the strict CPU program of `source` with the real compiler; returns model_new's namespace."""
    synthesis = synth.synthesize(source, None, variant=variant, device="cpu")
    if variant.conv_bias == "library":  # the bias inside the convolution call, added in its store
        assert re.search(r"stitch_conv\(T_\w+, T_\w+, c10::optional", synthesis.files["forward.cpp"])
    return load_program(synthesis)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "variant"),
    [(name, Variant()) for name in PROBLEMS] + [("transposed", Variant(conv_bias="library"))],
)
def test_compiled_cpu_program_matches_the_reference(synth: Synthesizer, name: str, variant: Variant) -> None:
    source = PROBLEMS[name]
    mn = build_cpu(synth, source, variant)
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    ref = ns["Model"]()  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"]()  # type: ignore[operator]
    for seed in (5, 6):
        torch.manual_seed(seed)
        xs = ns["get_inputs"]()  # type: ignore[operator]
        with torch.no_grad():
            want = ref.double()(*[x.double() for x in xs])
            ref.float()
            got = new(*xs)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.dtype == torch.float32 and g.shape == w.shape, (i, g.shape, w.shape)
            rel = ((g.double() - w).norm() / w.norm()).item()
            assert rel < 1e-5, f"{name} output {i}: relative L2 error {rel:.2e}"


# The CUDA kernel's text compiled for the CPU: CUDA's built-ins shimmed, one "thread" walking the whole
# grid-stride loop. No GPU here, so this is where its indexing (channel blocks, groups, the gather form of
# the transpose) is checked against torch; tests/gpu/test_synth_conv_gpu.py runs it on a device.
CUDA_ON_CPU = r"""
#include <torch/extension.h>
#include <cmath>
#define __global__
#define __launch_bounds__(n)
#define __device__
#define __forceinline__ inline
#define STITCH_HD inline
#define STITCH_UNROLL
struct StitchDim { unsigned x; };
static const StitchDim blockIdx{0}, threadIdx{0}, gridDim{1}, blockDim{1};
static inline float __ldg(const float* p) { return *p; }
struct StitchNoEpi {
  template <typename I>
  float operator()(float v, I) const { return v; }
};
__COMMON__
__KERNEL__
template <bool kTransposed>
static void stitch_conv_emulated(const float* x, const float* w, const float* bias, float* y, const ConvGeom& g) {
  if ((g.co / g.groups) % 4 == 0)
    stitch_conv_kernel<kTransposed, 4>(x, w, bias, y, g, StitchNoEpi{});
  else
    stitch_conv_kernel<kTransposed, 1>(x, w, bias, y, g, StitchNoEpi{});
}
static void stitch_conv_launch(const float* x, const float* w, const float* bias, float* y,
                               const int64_t* geom, bool transposed) {
  const ConvGeom g = conv_geom(geom);
  transposed ? stitch_conv_emulated<true>(x, w, bias, y, g) : stitch_conv_emulated<false>(x, w, bias, y, g);
}
__HOST__
"""

# A convolution into channels [offset, offset + CO) of a concatenation `channels` wide (the whole buffer back,
# its other channels zero), through the emulated kernels' stitch_conv_launch.
INTO = r"""
at::Tensor stitch_conv_into(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias,
                            const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
                            const std::vector<int64_t>& dil, const std::vector<int64_t>& out_pad,
                            int64_t groups, bool transposed, int64_t channels, int64_t offset) {
  StitchCatInto into{channels, at::Tensor()};
  stitch_conv_prepare(x, w, bias, stride, pad, pad, dil, out_pad, groups, transposed, &into, 0);
  into.buf.zero_();
  const StitchConv c = stitch_conv_prepare(x, w, bias, stride, pad, pad, dil, out_pad, groups, transposed,
                                           &into, offset);
  stitch_conv_launch(c.x.data_ptr<float>(), c.w.data_ptr<float>(), c.bias_ptr(), c.y.data_ptr<float>(),
                     c.geom, c.transposed);
  return into.buf;
}
"""


def assert_into_matches(ext: Any, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, args: tuple[Any, ...],
                        want: torch.Tensor) -> None:  # fmt: skip
    """The convolution written into channels 2.. of a concatenation 3 channels wider than it: its slice holds
    the convolution, every other channel stays zero."""
    stride, pad, dil, out_pad, groups, transposed = args
    co = want.shape[1]
    whole = ext.stitch_conv_into(x, w, b, stride, pad, dil, out_pad, groups, transposed, co + 3, 2)
    assert whole.shape == (want.shape[0], co + 3, *want.shape[2:])
    torch.testing.assert_close(whole[:, 2 : 2 + co].double(), want, rtol=1e-5, atol=1e-5)
    assert not whole[:, :2].any() and not whole[:, 2 + co :].any()


# (transposed, x shape, weight shape, stride, padding, output_padding, dilation, groups, bias)
GEOMETRIES = [
    (False, (2, 4, 5, 7, 9), (8, 2, 3, 2, 3), (1, 2, 1), (1, 0, 2), (0, 0, 0), (2, 1, 1), 2, True),
    (False, (2, 6, 9, 11), (3, 6, 3, 3), (2, 2), (1, 1), (0, 0), (1, 1), 1, False),
    (True, (2, 4, 7), (4, 4, 3), (3,), (1,), (2,), (2,), 2, True),
    (True, (2, 4, 5, 6), (4, 3, 3, 5), (2, 3), (1, 2), (1, 0), (2, 1), 2, False),
    (True, (1, 8, 3, 4, 5), (8, 4, 3, 2, 3), (2, 2, 1), (1, 0, 1), (1, 1, 0), (1, 1, 2), 2, True),
]


@pytest.mark.slow
def test_cuda_kernel_text_emulated_on_the_cpu_matches_torch(tmp_path: Path) -> None:
    from stitchcuda.coder.synth import convolution, libops

    kernel = convolution.CUDA.split(
        "template <bool kTransposed, int kCo, typename Epi>\nstatic void stitch_conv_run"
    )[0]
    source = (
        CUDA_ON_CPU.replace("__COMMON__", convolution.COMMON)
        .replace("__KERNEL__", kernel)
        .replace("__HOST__", libops.DENSE_CPU + convolution.HOST + INTO)
    )
    ext = cpp_extension.load_inline(  # type: ignore[no-untyped-call]
        name="stitch_conv_cuda_on_cpu",
        cpp_sources=[source],
        functions=["stitch_conv", "stitch_conv_into"],
        extra_cflags=["-O1"],
        build_directory=str(tmp_path),
    )
    functional = torch.nn.functional
    for transposed, xs, ws, stride, pad, out_pad, dil, groups, has_bias in GEOMETRIES:
        x, w = torch.randn(xs), torch.randn(ws)
        co = ws[1] * groups if transposed else ws[0]
        b = torch.randn(co) if has_bias else None
        nd = len(ws) - 2
        got = ext.stitch_conv(x, w, b, stride, pad, pad, dil, out_pad, groups, transposed)
        x64, w64, b64 = x.double(), w.double(), b.double() if b is not None else None
        if transposed:
            conv_t = getattr(functional, f"conv_transpose{nd}d")
            want = conv_t(x64, w64, b64, stride, pad, out_pad, groups, dil)
        else:
            want = getattr(functional, f"conv{nd}d")(x64, w64, b64, stride, pad, dil, groups)
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        assert_into_matches(ext, x, w, b, (stride, pad, dil, out_pad, groups, transposed), want)


# The depthwise kernel's text on the CPU: one "thread" stages each tile and computes its outputs (the kernel's
# loops stride by blockDim, so one thread covers the tile; its barriers order nothing then).
DW_ON_CPU = (
    "#define __align__(n)\n#define __syncthreads()\n"
    + CUDA_ON_CPU.split("template <bool kTransposed>\nstatic void stitch_conv_emulated", maxsplit=1)[0]
    + r"""
static void stitch_conv_launch(const float* x, const float* w, const float* bias, float* y,
                               const int64_t* geom, bool transposed) {
  const ConvGeom g = conv_geom(geom);
  TORCH_CHECK(!transposed && g.groups == g.c, "depthwise geometries only");
  stitch_conv_dw_kernel<StitchNoEpi>(x, w, bias, y, g, dw_tile(g), StitchNoEpi{});
}
__HOST__
"""
)

# (x shape, weight shape, stride, padding, dilation, bias): one input channel a group (groups = channels),
# tiles cut along both dims, a channel multiplier of 2, strides, dilation and asymmetric kernels.
DEPTHWISE = [
    ((2, 4, 9, 70), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), True),
    ((1, 3, 37, 13), (6, 1, 3, 5), (2, 1), (1, 2), (1, 2), True),
    ((2, 2, 33, 130), (2, 1, 5, 5), (2, 2), (0, 0), (1, 1), False),
    ((1, 5, 18, 66), (5, 1, 7, 1), (1, 3), (3, 0), (2, 1), True),
]


@pytest.mark.slow
def test_depthwise_kernel_text_emulated_on_the_cpu_matches_torch(tmp_path: Path) -> None:
    from stitchcuda.coder.synth import convolution, libops

    start = convolution.CUDA.index("constexpr int kDwRows")
    end = convolution.CUDA.index("// The depthwise kernel where it applies")
    kernel = convolution.CUDA[start:end].replace(
        "extern __shared__ __align__(16) float dw_smem[];", "static float dw_smem[kDwSmem / 4];"
    )
    source = (
        DW_ON_CPU.replace("__COMMON__", convolution.COMMON)
        .replace("__KERNEL__", kernel)
        .replace("__HOST__", libops.DENSE_CPU + convolution.HOST + INTO)
    )
    ext = cpp_extension.load_inline(  # type: ignore[no-untyped-call]
        name="stitch_conv_dw_on_cpu",
        cpp_sources=[source],
        functions=["stitch_conv", "stitch_conv_into"],
        extra_cflags=["-O1"],
        build_directory=str(tmp_path),
    )
    for xs, ws, stride, pad, dil, has_bias in DEPTHWISE:
        x, w = torch.randn(xs), torch.randn(ws)
        b = torch.randn(ws[0]) if has_bias else None
        got = ext.stitch_conv(x, w, b, stride, pad, pad, dil, (0, 0), xs[1], False)
        want = torch.nn.functional.conv2d(
            x.double(), w.double(), b.double() if b is not None else None, stride, pad, dil, xs[1]
        )
        assert got.shape == want.shape
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        assert_into_matches(ext, x, w, b, (stride, pad, dil, (0, 0), xs[1], False), want)
