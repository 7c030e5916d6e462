"""The synthesizer's own convolution kernels and einsum GEMMs on a GPU (strict policy): implicit-GEMM (3xTF32
tensor cores from sm_80) and direct 1-D/2-D/3-D convolutions and transposed 1-D/2-D/3-D convolutions (the implicit
GEMM per output phase where a group has >= 16 output channels) over strides, paddings, output paddings, dilations
and groups, with
outputs larger than one pass of the grid-stride loop, each within 1e-5 (relative L2) of a float64
evaluation of the reference on fresh and shifted inputs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from test_synth_gpu import build_source, compare  # noqa: E402

from stitchcuda.coder.synth.synthesizer import Synthesizer  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def problem(layer: str, inputs: str, forward: str = "self.layer(x)", args: str = "x") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        self.layer = {layer}\n\n"
        f"    def forward(self, {args}):\n        return {forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return []\n"
    )


PROBLEMS = {
    "conv3d_strided_dilated": problem(
        "nn.Conv3d(8, 16, (3, 5, 3), stride=(1, 2, 1), padding=(1, 2, 0), dilation=(2, 1, 1))",
        "[torch.randn(2, 8, 13, 33, 35)]",
    ),
    "conv3d_grouped_same": problem(
        "nn.Conv3d(8, 12, (2, 3, 4), padding='same', groups=4, bias=False)", "[torch.randn(3, 8, 9, 17, 31)]"
    ),
    "conv_transpose1d": problem(
        "nn.ConvTranspose1d(16, 8, 5, stride=3, padding=2, output_padding=1, dilation=2, groups=2)",
        "[torch.randn(8, 16, 4099)]",
    ),
    "conv_transpose2d": problem(
        "nn.ConvTranspose2d(16, 24, (3, 5), stride=(2, 3), padding=(1, 2), output_padding=(1, 2), "
        "dilation=(2, 1), groups=4)",
        "[torch.randn(4, 16, 37, 41)]",
    ),
    "conv_transpose2d_no_bias": problem(
        "nn.ConvTranspose2d(32, 16, 3, padding=1, bias=False)", "[torch.randn(2, 32, 65, 127)]"
    ),
    "conv_transpose3d": problem(
        "nn.ConvTranspose3d(8, 16, (3, 5, 7), stride=2, padding=(1, 2, 3), output_padding=1, groups=4)",
        "[torch.randn(2, 8, 7, 13, 21)]",
    ),
    "conv_transpose3d_relu": problem(
        "nn.ConvTranspose3d(16, 8, 3, stride=(1, 2, 2), padding=1, dilation=(2, 1, 1))",
        "[torch.randn(2, 16, 9, 15, 17)]",
        forward="torch.relu(self.layer(x)) * 0.5",
    ),
    # The implicit GEMM (a group's output channels >= 16): partial tiles in M, N and K.
    "conv2d_igemm_wide": problem("nn.Conv2d(64, 128, 3, padding=1)", "[torch.randn(3, 64, 37, 45)]"),
    "conv2d_igemm_strided_dilated_grouped": problem(
        "nn.Conv2d(32, 96, (3, 5), stride=(2, 1), padding=(2, 1), dilation=(2, 1), groups=2)",
        "[torch.randn(2, 32, 29, 31)]",
    ),
    "conv1d_igemm": problem("nn.Conv1d(24, 40, 7, stride=3, padding=4)", "[torch.randn(4, 24, 1001)]"),
    "conv3d_igemm": problem(
        "nn.Conv3d(16, 32, 3, stride=(1, 2, 2), padding=1, bias=False)", "[torch.randn(2, 16, 9, 17, 19)]"
    ),
    "conv2d_igemm_stem_relu": problem(
        "nn.Conv2d(3, 64, 7, stride=2, padding=3)",
        "[torch.randn(2, 3, 67, 71)]",
        forward="torch.relu(self.layer(x))",
    ),
    # Depthwise (one input channel a group): the shared-memory tile kernel, tiles cut in both dims, strides,
    # dilation, a channel multiplier and an epilogue in the store; a 1-D one keeps the direct kernel.
    "conv2d_depthwise": problem(
        "nn.Conv2d(32, 32, 3, padding=1, groups=32)", "[torch.randn(3, 32, 45, 131)]"
    ),
    "conv2d_depthwise_strided_multiplier_relu": problem(
        "nn.Conv2d(16, 32, (5, 3), stride=(2, 1), padding=(2, 3), dilation=(1, 2), groups=16, bias=False)",
        "[torch.randn(2, 16, 67, 70)]",
        forward="torch.relu(self.layer(x)) * 0.5",
    ),
    "conv1d_depthwise": problem("nn.Conv1d(24, 24, 7, padding=3, groups=24)", "[torch.randn(4, 24, 1001)]"),
    # Transposed through the implicit GEMM, one GEMM per output phase.
    "conv_transpose2d_igemm": problem(
        "nn.ConvTranspose2d(32, 64, 4, stride=2, padding=1)", "[torch.randn(3, 32, 33, 35)]"
    ),
    "conv_transpose3d_igemm_grouped": problem(
        "nn.ConvTranspose3d(32, 64, 3, stride=2, padding=1, output_padding=1, groups=2)",
        "[torch.randn(2, 32, 7, 9, 11)]",
    ),
    "conv_transpose1d_igemm_dilated": problem(
        "nn.ConvTranspose1d(24, 48, 5, stride=3, padding=2, dilation=2, bias=False)",
        "[torch.randn(4, 24, 501)]",
    ),
    # Pointwise kernels over the output fused into the store (variant epilogue=fused): broadcast parameters,
    # a residual input, a transposed convolution's phases, a Linear through the large tiles.
    "conv2d_igemm_epilogue_residual": problem(
        "nn.Conv2d(32, 64, 3, padding=1)",
        "[torch.randn(3, 32, 33, 35), torch.randn(3, 64, 33, 35), torch.randn(64, 1, 1)]",
        forward="torch.nn.functional.gelu(self.layer(x) * s) + r",
        args="x, r, s",
    ),
    "conv_transpose3d_igemm_epilogue": problem(
        "nn.ConvTranspose3d(32, 32, 3, stride=2, padding=1, output_padding=1)",
        "[torch.randn(2, 32, 7, 9, 11)]",
        forward="torch.clamp(torch.sigmoid(self.layer(x)) - 0.25, min=0.0, max=0.5)",
    ),
    # Hopper's convolution (the default conv_kernel; at least 2^28 products, 128 an output element), its
    # store applying the fused epilogue at the element's index in the whole output: several batches of
    # images (10.6 MB of scratch an image, split input and channels-last output: 50 in 512 MiB, 4 batches).
    "conv2d_hopper_epilogue_residual_batches": problem(
        "nn.Conv2d(64, 96, 3, padding=1)",
        "[torch.randn(160, 64, 96, 96), torch.randn(160, 96, 96, 96), torch.randn(96, 1, 1)]",
        forward="torch.nn.functional.gelu(self.layer(x) * s) + r",
        args="x, r, s",
    ),
    "conv_transpose2d_hopper_stride_one": problem(
        "nn.ConvTranspose2d(64, 64, 3, padding=1)",
        "[torch.randn(16, 64, 64, 64)]",
        forward="torch.sigmoid(self.layer(x))",
    ),
    "linear_epilogue_large_tiles": problem(
        "nn.Linear(512, 2048)",
        "[torch.randn(4, 1024, 512), torch.randn(2048)]",
        forward="torch.nn.functional.leaky_relu(self.layer(x) + b, 0.05) * 2.0",
        args="x, b",
    ),
    "linear_epilogue_small_tiles": problem(
        "nn.Linear(100, 70)", "[torch.randn(9, 100)]", forward="torch.tanh(self.layer(x))"
    ),
    "einsum_4d_matmul": problem(
        "nn.Identity()",
        "[torch.randn(4, 33, 65, 96), torch.randn(96, 130)]",
        forward="torch.einsum('bijl,lk->bijk', a, w)",
        args="a, w",
    ),
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


@pytest.mark.parametrize("name", list(PROBLEMS))
@pytest.mark.parametrize("mma", ["simt", "tf32x3"])
def test_own_convolution_and_einsum_kernels_match(synth: Synthesizer, name: str, mma: str) -> None:
    """The own kernels (conv_kernel=own; Hopper's convolution is test_synth_gpu's) on SIMT float32 products
    (the default since stop 35) and on the 3xTF32 tensor-core kernels."""
    source = PROBLEMS[name]
    synthesis = build_source(synth, source, Variant(mma=mma, conv_kernel="own"))
    host = synthesis.files["forward.cpp"]
    assert any(
        f"stitch_{call}" in host
        for call in ("conv(", "conv_prepare(", "einsum_gemm(", "linear(", "linear_prepare(")
    )
    assert "at::conv" not in host and "at::einsum" not in host and "at::linear" not in host
    compare(source, synthesis.files["model_new.py"])


@pytest.mark.parametrize("name", [name for name in PROBLEMS if "hopper" in name])
@pytest.mark.parametrize("epilogue", ["auto", "kernel", "fused"])
def test_hopper_convolution_matches(synth: Synthesizer, name: str, epilogue: str) -> None:
    """The default program's convolutions on CUTLASS's Hopper kernel (compute capability 9.0; the own kernels
    elsewhere): a transposed one of stride 1, and one in several batches of images with a residual
    epilogue inside Hopper's store (auto, the default, and fused) or in a kernel of its own."""
    source = PROBLEMS[name]
    synthesis = build_source(synth, source, Variant(gemm="custom", epilogue=epilogue))
    assert "cutlass_conv.cu" in synthesis.build.sources
    compare(source, synthesis.files["model_new.py"])


@pytest.mark.parametrize("name", [name for name in PROBLEMS if "epilogue" in name or name.endswith("_relu")])
@pytest.mark.parametrize(("epilogue", "mma"), [("fused", "simt"), ("fused", "tf32x3"), ("auto", "simt")])
def test_epilogues_inside_the_store_match(synth: Synthesizer, name: str, epilogue: str, mma: str) -> None:
    """The variant epilogue=fused (the optimize skill tries it): the pointwise kernel applied in the own
    convolution's or GEMM's store, on SIMT and tensor cores; epilogue=auto (the default): in the direct and
    depthwise kernels' stores, a pass of its own after the implicit GEMM."""
    source = PROBLEMS[name]
    synthesis = build_source(
        synth, source, Variant(epilogue=epilogue, gemm_kernel="own", conv_kernel="own", mma=mma)
    )
    assert "_prepare(" in synthesis.files["forward.cpp"].split(" forward(")[-1]
    compare(source, synthesis.files["model_new.py"])


# Convolutions writing their channels of a concatenation in place (the default program): a shared squeeze
# convolution (read twice: not a part), expand convolutions through the implicit GEMM (with its epilogue as a
# pass over the slice) and Hopper's kernel (epilogue in its store), a direct one (4 output channels), and a
# part that is copied (the input).
FIRE_CAT = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.squeeze = nn.Conv2d(128, 16, 1)
        self.expand1x1 = nn.Conv2d(16, 48, 1)
        self.expand3x3 = nn.Conv2d(16, 64, 3, padding=1)
        self.narrow = nn.Conv2d(128, 4, 1)

    def forward(self, x):
        s = torch.relu(self.squeeze(x))
        return torch.cat([torch.relu(self.expand1x1(s)), x, torch.tanh(self.expand3x3(s)), self.narrow(x)], 1)

def get_inputs():
    return [torch.randn(8, 128, 64, 64)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("conv_kernel", ["cutlass_sm90", "own"])
def test_convolutions_write_their_slices_of_a_concatenation(synth: Synthesizer, conv_kernel: str) -> None:
    synthesis = build_source(synth, FIRE_CAT, Variant(gemm="custom", conv_kernel=conv_kernel))
    forward = synthesis.files["forward.cpp"].split(" forward(")[-1]
    assert "stitch_cat_into(*CI_cat, {" in forward and "{true, false, true, true})" in forward
    compare(FIRE_CAT, synthesis.files["model_new.py"])
