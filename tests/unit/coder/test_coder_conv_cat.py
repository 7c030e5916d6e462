"""Concatenations along the channels that their convolutions write in place (CUDA, own kernels): each
convolution whose output (or whose pointwise tail's, run as its epilogue) only the cat reads stores straight
into its channels of the concatenation, so the part is written once and never copied (SqueezeNet's fire
modules, GoogLeNet's inception modules, DenseNet's layers). The kernels' side (images ybatch apart, the
epilogue at the convolution's own flat index) is emulated in test_coder_conv_igemm.py and
test_coder_custom_conv.py; GPU runs are in tests/gpu/test_synth_conv_gpu.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_coder_conv_epilogue import forward_of, program
from test_coder_cuda_build import NVCC, assert_program_compiles
from test_coder_custom_conv import problem

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy
from stitchcuda.verifier import static


def module(layers: dict[str, str], body: list[str], inputs: str) -> str:
    """A KernelBench-format reference: `layers` by attribute name, `body` the forward's statements."""
    init = "".join(f"        self.{name} = {layer}\n" for name, layer in layers.items())
    forward = "".join(f"        {line}\n" for line in body)
    return (
        "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n{init}\n    def forward(self, x):\n{forward}\n"
        f"def get_inputs():\n    return {inputs}\n\ndef get_init_inputs():\n    return []\n"
    )


# A fire module: a squeeze convolution read by two expand convolutions (not a cat's part), whose activated
# outputs are concatenated; a dense layer's cat of its input with a new feature map.
FIRE = module(
    {"squeeze": "nn.Conv2d(5, 6, 1)", "expand1x1": "nn.Conv2d(6, 16, 1)",
     "expand3x3": "nn.Conv2d(6, 24, 3, padding=1)"},
    ["s = torch.relu(self.squeeze(x))",
     "return torch.cat([torch.relu(self.expand1x1(s)), torch.relu(self.expand3x3(s))], 1)"],
    "[torch.randn(2, 5, 9, 10)]",
)  # fmt: skip
DENSE = problem(
    ["nn.Conv2d(8, 4, 3, padding=1)"],
    "torch.cat([x, self.l0(x)], dim=1)",
    "[torch.randn(2, 8, 7, 6)]",
)
# Parts another step reads too, a cat along the width, and a convolution that is the program's output.
SHARED = module(
    {"l0": "nn.Conv2d(3, 4, 1)", "l1": "nn.Conv2d(3, 4, 1)"},
    ["a = self.l0(x)", "b = torch.sigmoid(self.l1(x))", "c = self.l1(x)",
     "return torch.cat([a, b], 1) * a.mean() + b.sum(), torch.cat([c, c * 2], 3), c"],
    "[torch.randn(2, 3, 5, 6)]",
)  # fmt: skip


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


def test_both_expand_convolutions_write_their_channels_of_the_cat(synth: Synthesizer) -> None:
    forward = forward_of(program(synth, FIRE))
    assert "StitchCatInto CB_cat{40, at::Tensor()};" in forward
    # Each expand convolution runs with its ReLU as its epilogue, into channels 0.. and 16.. of the cat.
    prepared = re.findall(r"stitch_conv_prepare\((.*)\);", forward)  # the arguments
    assert len(prepared) == 3
    assert prepared[1].endswith(", 1, false, CI_cat, 0") and prepared[2].endswith(", 1, false, CI_cat, 16")
    assert "CI_cat" not in prepared[0], "the squeeze convolution's output is read twice: no cat's part"
    assert "stitch_cat_into(*CI_cat, {" in forward and "{true, true})" in forward
    assert "stitch_cat(" not in forward
    # The slice is used as it is (a contiguous copy of it would take the convolution's store).
    assert forward.count("stitch_dense(LP_") == 1


def test_the_verifiers_static_scan_accepts_the_in_place_parts(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(FIRE, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    findings = static.scan(to_candidate(synthesis), FIRE)
    assert not [f for f in findings if f.severity >= 3], [
        (f.rule, f.detail) for f in findings if f.severity >= 3
    ]


def test_a_dense_layer_copies_its_input_and_writes_its_new_features(synth: Synthesizer) -> None:
    forward = forward_of(program(synth, DENSE))
    assert re.search(r"stitch_conv_to\(T_x, .*, 1, false, CI_cat, 8\);", forward)
    assert "stitch_cat_into(*CI_cat, {T_x, T_l0}, {false, true})" in forward


@pytest.mark.parametrize(("source", "device", "policy"), [("shared", "cuda", STRICT), ("fire", "cuda", LIBRARY),
                                                        ("fire", "cpu", STRICT)])  # fmt: skip
def test_no_part_is_written_in_place_where_that_would_be_wrong(
    synth: Synthesizer, source: str, device: str, policy: str
) -> None:
    """Parts other steps read, a cat along another dim or of a program's output, the library's convolutions
    and the CPU back end keep the copying cat."""
    reference = {"shared": SHARED, "fire": FIRE}[source]
    synthesis = synth.synthesize(
        reference, None, variant=Variant(), device=device, policy=KernelPolicy(policy)
    )
    forward = forward_of(dict(synthesis.files))
    assert "StitchCatInto" not in forward and "stitch_cat_into" not in forward
    assert forward.count("stitch_cat(") == (2 if source == "shared" else 1)


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_program_writing_into_its_concatenations_compiles(synth: Synthesizer, tmp_path: Path) -> None:
    """kernels.cu with nvcc, forward.cpp parsed against this torch's headers."""
    candidate = to_candidate(
        synth.synthesize(FIRE, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    )
    folder = tmp_path / "program"
    write_dir(candidate, folder)
    assert_program_compiles(folder, tmp_path)
