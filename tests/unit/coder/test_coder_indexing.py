"""Indexing by int64 tensors (issue 14 item 1): x[index], x[:, index], index_select, F.embedding and
nn.Embedding, and an int64 index buffer (a Swin-V2 style relative position bias: a table computed by a small
MLP, then picked by a registered index buffer). Each comes out as the synthesizer's own gather kernel under
both policies; the CPU build is compared with PyTorch, the CUDA source compiled with nvcc."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from synth_build import load_program
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate, write_dir
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

PICKS = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.emb = nn.Embedding(11, 6)\n"
    "        self.table = nn.Parameter(torch.randn(9, 6))\n"
    "        self.register_buffer('order', torch.tensor([4, 0, 3, 3, 5, 1]))\n"
    "        self.register_buffer('wrap', torch.tensor([-1, 0, 1, -2]))\n\n"
    "    def forward(self, x, ids):\n"
    "        a = self.emb(ids)\n"  # [2, 5, 6]
    "        b = F.embedding(ids, self.table)\n"
    "        c = x[:, self.order]\n"  # [2, 6, 6]
    "        d = torch.index_select(x, 2, self.order.view(-1)[:4])\n"  # [2, 6, 4]
    "        e = x[self.wrap]\n"  # negative indices count from the end
    "        return (a * b).sum(-1), c.relu() + 1.0, d * 2.0, e\n\n"
    "def get_inputs():\n"
    "    return [torch.randn(2, 6, 6), torch.randint(0, 9, (2, 5))]\n\n"
    "def get_init_inputs():\n    return []\n"
)

# A Swin-V2 style window attention: cosine attention with a clamped learnt logit scale, a relative position
# bias from an MLP over a coordinates buffer, picked by an int64 index buffer.
SWIN_V2 = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self, dim, window, heads):\n"
    "        super().__init__()\n"
    "        self.heads = heads\n"
    "        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((heads, 1, 1))))\n"
    "        self.cpb_mlp = nn.Sequential(nn.Linear(2, 32), nn.ReLU(inplace=True), nn.Linear(32, heads, bias=False))\n"
    "        h = torch.arange(-(window - 1), window, dtype=torch.float32) / (window - 1) * 8\n"
    "        table = torch.stack(torch.meshgrid([h, h], indexing='ij')).permute(1, 2, 0).unsqueeze(0)\n"
    "        self.register_buffer('coords', torch.sign(table) * torch.log2(table.abs() + 1.0) / math.log2(8))\n"
    "        grid = torch.stack(torch.meshgrid([torch.arange(window)] * 2, indexing='ij')).flatten(1)\n"
    "        rel = (grid[:, :, None] - grid[:, None, :]).permute(1, 2, 0) + (window - 1)\n"
    "        self.register_buffer('index', rel[:, :, 0] * (2 * window - 1) + rel[:, :, 1])\n"
    "        self.qkv = nn.Linear(dim, dim * 3, bias=False)\n"
    "        self.q_bias = nn.Parameter(torch.randn(dim))\n"
    "        self.v_bias = nn.Parameter(torch.randn(dim))\n"
    "        self.proj = nn.Linear(dim, dim)\n\n"
    "    def forward(self, x):\n"
    "        B, N, C = x.shape\n"
    "        bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias, requires_grad=False), self.v_bias))\n"
    "        qkv = F.linear(input=x, weight=self.qkv.weight, bias=bias)\n"
    "        q, k, v = qkv.reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 1, 4)\n"
    "        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)\n"
    "        scale = torch.clamp(self.logit_scale, max=torch.log(torch.tensor(1.0 / 0.01, device=x.device))).exp()\n"
    "        table = self.cpb_mlp(self.coords).view(-1, self.heads)\n"
    "        rel = table[self.index.view(-1)].view(N, N, -1).permute(2, 0, 1).contiguous()\n"
    "        attn = (attn * scale + 16 * torch.sigmoid(rel).unsqueeze(0)).softmax(dim=-1)\n"
    "        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))\n\n"
    "def get_inputs():\n    return [torch.rand(3, 16, 32)]\n\n"
    "def get_init_inputs():\n    return [32, 4, 4]\n"
)

PROBLEMS = {"picks": (PICKS, []), "swin_v2": (SWIN_V2, [32, 4, 4])}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the test's own references


def reference(source: str, init: list[Any]) -> torch.nn.Module:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    model: torch.nn.Module = ns["Model"](*init)
    return model


@pytest.mark.parametrize("name", sorted(PROBLEMS))
def test_indexing_comes_out_with_its_own_gather_kernel_and_matches(synth: Synthesizer, name: str) -> None:
    source, init = PROBLEMS[name]
    for policy in (LIBRARY, STRICT):
        synthesis = synth.synthesize(
            source, None, variant=Variant(), device="cuda", policy=KernelPolicy(policy)
        )
        validate(to_candidate(synthesis))
        assert "stitch_index(" in synthesis.files["forward.cpp"]
        assert (
            "at::index" not in synthesis.files["forward.cpp"]
            and "at::embedding" not in synthesis.files["forward.cpp"]
        )
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cpu")
    mn = load_program(synthesis)
    ref = reference(source, init)
    torch.manual_seed(0)
    new = mn["ModelNew"](*init)
    ns: dict[str, Any] = {}
    exec(compile(source, "reference.py", "exec"), ns)
    for _ in range(2):
        inputs = ns["get_inputs"]()
        want, got = ref(*inputs), new(*inputs)
        for w, g in zip(
            want if isinstance(want, tuple) else [want], got if isinstance(got, tuple) else [got]
        ):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def test_an_index_out_of_range_is_an_error_on_cpu(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(PICKS, None, variant=Variant(), device="cpu")
    new = load_program(synthesis)["ModelNew"]()
    with pytest.raises(RuntimeError, match="out of range"):
        new(torch.randn(2, 6, 6), torch.full((2, 5), 11))


def test_boolean_mask_indexing_is_refused_with_the_reason(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def forward(self, x, mask):\n"
        "        return x[mask]\n\n"
        "def get_inputs():\n    return [torch.randn(4, 3), torch.rand(4, 3) > 0.5]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(Unsupported, match="boolean mask"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


def test_int64_index_buffer_is_not_read_by_arithmetic(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.register_buffer('steps', torch.arange(4))\n\n"
        "    def forward(self, x):\n"
        "        return x * self.steps\n\n"
        "def get_inputs():\n    return [torch.randn(3, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(Unsupported, match="int64 tensor"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


ROLL = HEADER + (
    "class Model(nn.Module):\n"
    "    def forward(self, x):\n"
    "        y = torch.roll(x, shifts=(-2, 1), dims=(1, 2))\n"
    "        return torch.roll(y, 3, 0) * 2.0 + torch.roll(x, shifts=-1, dims=-1)\n\n"
    "def get_inputs():\n    return [torch.randn(3, 5, 4, 2)]\n\n"
    "def get_init_inputs():\n    return []\n"
)
SWIN_V2_MODEL = (Path(__file__).parent / "problems" / "swin_v2.py").read_text()


def test_roll_is_the_programs_own_kernel_and_matches(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(ROLL, None, variant=Variant(), device="cpu")
    assert (
        "stitch_roll(" in synthesis.files["forward.cpp"] and "at::roll" not in synthesis.files["forward.cpp"]
    )
    new = load_program(synthesis)["ModelNew"]()
    ns: dict[str, Any] = {}
    exec(compile(ROLL, "reference.py", "exec"), ns)
    x = torch.randn(3, 5, 4, 2)
    torch.testing.assert_close(new(x), ns["Model"]()(x))


@pytest.mark.slow
def test_a_whole_swin_v2_in_training_mode_matches(synth: Synthesizer) -> None:
    for policy in (LIBRARY, STRICT):
        validate(
            to_candidate(
                synth.synthesize(
                    SWIN_V2_MODEL, None, variant=Variant(), device="cuda", policy=KernelPolicy(policy)
                )
            )
        )
    mn = load_program(synth.synthesize(SWIN_V2_MODEL, None, variant=Variant(), device="cpu"))
    ref = reference(SWIN_V2_MODEL, [])
    torch.manual_seed(0)
    new = mn["ModelNew"]()
    x = torch.rand(2, 3, 16, 16)
    for seed in (1, 2):  # stochastic depth: the same draws under the same seed
        torch.manual_seed(seed)
        want = ref(x)
        torch.manual_seed(seed)
        torch.testing.assert_close(new(x), want, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", ["gather", "roll"])
def test_the_kernels_compile_for_cuda(synth: Synthesizer, tmp_path: Path, name: str) -> None:
    source = SWIN_V2 if name == "gather" else ROLL
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    write_dir(to_candidate(synthesis), tmp_path / "program")
    assert_program_compiles(tmp_path / "program", tmp_path)
