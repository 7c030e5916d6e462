"""Dense copies by the program's own kernel (issue 14): a strided view that a helper or a kernel operand needs
contiguous (an expanded class token in a cat, the class row picked before a head, a permuted input to a scan,
a transposed source of an index_select) is copied by `stitch_dense`, never by ATen's `contiguous()`, whose copy
kernel counted as torch compute and made a small ViT's program fail the custom-share rule (D6)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from synth_build import load_program, seeded_pair
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import write_dir
from stitchcuda.shared.policy import STRICT, KernelPolicy

HEADER = "import torch\nimport torch.nn as nn\n\n"

# Every user of a dense copy on odd layouts: a cat of an expanded parameter and a transposed input (stride 0
# and a permuted view), a linear on one row of the cat (a strided select), a cumsum over a permuted input, an
# index_select from a transposed source, a roll of a narrowed view, reshapes and a flatten of views (one that
# is no view of its source: copied; one that is: a view).
STRIDED = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.cls = nn.Parameter(torch.randn(1, 1, 6))\n"
    "        self.head = nn.Linear(6, 5)\n\n"
    "    def forward(self, x, idx):\n"
    "        t = x.transpose(1, 2)\n"
    "        y = torch.cat((self.cls.expand(x.shape[0], -1, -1), t), dim=1)\n"
    "        z = self.head(y[:, 0])\n"
    "        s = torch.cumsum(x.permute(2, 0, 1), dim=1)\n"
    "        g = torch.index_select(t, 1, idx)\n"
    "        r = torch.roll(t[:, 1:], 2, 1)\n"
    "        return z, s, g, r\n\n"
    "def get_inputs():\n"
    "    return [torch.randn(3, 6, 7), torch.tensor([4, 0, 6, 4])]\n\n"
    "def get_init_inputs():\n"
    "    return []\n"
)

VIT = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self, p, dim, heads, classes):\n"
    "        super().__init__()\n"
    "        self.p = p\n"
    "        self.pos = nn.Parameter(torch.randn(1, 17, dim))\n"
    "        self.embed = nn.Linear(3 * p * p, dim)\n"
    "        self.cls = nn.Parameter(torch.randn(1, 1, dim))\n"
    "        self.encoder = nn.TransformerEncoder(\n"
    "            nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0), num_layers=2)\n"
    "        self.head = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, classes))\n\n"
    "    def forward(self, img):\n"
    "        p = self.p\n"
    "        x = img.unfold(2, p, p).unfold(3, p, p).reshape(img.shape[0], -1, p * p * img.shape[1])\n"
    "        x = self.embed(x)\n"
    "        x = torch.cat((self.cls.expand(img.shape[0], -1, -1), x), dim=1)\n"
    "        x += self.pos\n"
    "        x = self.encoder(x)\n"
    "        return self.head(x[:, 0])\n\n"
    "def get_inputs():\n"
    "    return [torch.randn(2, 3, 16, 16)]\n\n"
    "def get_init_inputs():\n"
    "    return [4, 32, 4, 10]\n"
)

# A call of torch's copy in the host code: `.contiguous()`, or a `.reshape(`/`.flatten(` that copies where no
# view exists, outside the helpers' own fallbacks (a contiguous or empty tensor, past 8 dims).
ATEN_COPY = re.compile(r"\.(contiguous|reshape|flatten)\(")
FALLBACKS = ("return t.contiguous();", "return t.reshape(sizes);", "return t.reshape({1});")


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer()


def aten_copies(host: str) -> list[str]:
    """The host code's lines that call torch's copy, the dense helper's fallback excepted."""
    return [
        line
        for line in host.splitlines()
        if ATEN_COPY.search(line.split("//")[0]) and not any(f in line for f in FALLBACKS)
    ]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_dense_copy_is_the_programs_own(synth: Synthesizer, device: str) -> None:
    synthesis = synth.synthesize(STRIDED, None, variant=Variant(), device=device, policy=KernelPolicy(STRICT))
    host = synthesis.files["forward.cpp"]
    assert "stitch_cat(" in host and "stitch_reshape(" in host and "stitch_flatten(" in host
    assert aten_copies(host) == []
    if device == "cuda":
        assert "stitch_dense_kernel" in synthesis.files["kernels.cu"]


@pytest.mark.slow
def test_strided_views_are_copied_exactly(synth: Synthesizer) -> None:
    mn = load_program(synth.synthesize(STRIDED, None, variant=Variant(), device="cpu"))
    ref, new = seeded_pair(STRIDED, mn)
    x, idx = torch.randn(3, 6, 7), torch.tensor([4, 0, 6, 4])
    for got, want in zip(new(x, idx), ref(x, idx), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_dense_kernel_compiles_for_cuda(synth: Synthesizer, tmp_path: Path) -> None:
    synthesis = synth.synthesize(STRIDED, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    write_dir(to_candidate(synthesis), tmp_path / "program")
    assert_program_compiles(tmp_path / "program", tmp_path)


@pytest.mark.slow
def test_small_vision_transformer_passes_the_verifier_with_no_aten_copy(synth: Synthesizer, verifier) -> None:  # type: ignore[no-untyped-def]
    candidate = to_candidate(
        synth.synthesize(VIT, None, variant=Variant(), device="cpu", policy=KernelPolicy(STRICT))
    )
    verdict = verifier.verify(
        VIT, candidate, device="cpu", policy=verify_pb2.VerifyPolicy(kernel_policy=STRICT)
    )
    assert verdict.accepted and verdict.correct, verdict.reason
    copies = [k.name for k in verdict.profile.kernels if re.match(r"aten::(contiguous|clone|copy_)$", k.name)]
    assert copies == [], copies
