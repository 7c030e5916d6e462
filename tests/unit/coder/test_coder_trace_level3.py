"""Level-3 model patterns torch.fx cannot trace symbolically (issue 14 items 2 and 3): forwards that slice a
buffer by the input length, loop over a size, branch on the device or assert on shapes are traced
specialised to the inputs' shapes (the program checks them); nn.MultiheadAttention; einops and
many-operand einsums (a Mamba-2 style chunked scan, with a mask made in the forward); a branch on tensor
values and a missing package are refused with a clear reason; large models are traced on the meta
device. Where a program comes out, its CPU build (slow) is compared with PyTorch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from synth_build import load_program, seeded_pair
from test_coder_cuda_build import NVCC, assert_program_compiles

from stitchcuda.coder.synth import init_check, trace_worker
from stitchcuda.coder.synth.ir import Unsupported
from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate
from stitchcuda.coder.synth.trace import TraceError
from stitchcuda.coder.synth.variants import Variant
from stitchcuda.shared.candidate import validate, write_dir
from stitchcuda.shared.policy import LIBRARY, STRICT, KernelPolicy

HEADER = "import math\nimport torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# A causal self-attention whose mask buffer is longer than the sequence: sliced by T = x.size(1), read at run
# time (the symbolic trace holds buffers as graph attributes).
CAUSAL = (
    HEADER
    + """class Model(nn.Module):
    def __init__(self, width, heads, longest):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.heads = heads
        self.register_buffer("mask", torch.tril(torch.ones(longest, longest)).view(1, 1, longest, longest))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return y.transpose(1, 2).contiguous().view(B, T, C)

def get_inputs():
    return [torch.randn(2, 5, 8)]

def get_init_inputs():
    return [8, 2, 7]
"""
)
# The same forward asserting on the sequence length: an assertion on a shape is traced specialised.
CAUSAL_ASSERT = CAUSAL.replace(
    "        B, T, C = x.size()\n", "        B, T, C = x.size()\n        assert T <= self.mask.size(-1)\n"
)

# An RNN cell unrolled by a Python loop over the sequence length, its state moved to x's device.
LOOP = (
    HEADER
    + """class Model(nn.Module):
    def __init__(self, features, hidden):
        super().__init__()
        self.cell = nn.Linear(features + hidden, hidden)

    def forward(self, x, h0):
        h = h0.to(x.device)
        outs = []
        for t in range(x.size(0)):
            h = torch.tanh(self.cell(torch.cat((x[t], h), dim=1)))
            outs.append(h * 2.0)
        return torch.stack(outs, dim=0)

def get_inputs():
    return [torch.randn(4, 3, 6), torch.randn(3, 5)]

def get_init_inputs():
    return [6, 5]
"""
)

# A device check and a shape assertion before the work (NetVLAD and Swin patch embedding style).
BRANCHES = (
    HEADER
    + """class Model(nn.Module):
    def __init__(self, features, clusters, side):
        super().__init__()
        self.centres = nn.Parameter(torch.randn(features, clusters))
        self.side = side

    def forward(self, x, mask=None):
        B, N, D = x.shape
        assert N == self.side * self.side, f"{N} tokens for a {self.side}x{self.side} grid"
        if x.device != self.centres.device:
            raise ValueError("x and the centres are on different devices")
        if mask is not None:
            x = x * mask
        x = x.view(-1, D)
        a = F.softmax(torch.matmul(x, self.centres), dim=1)
        return a.view(B, N, -1).sum(dim=1)

def get_inputs():
    return [torch.randn(2, 9, 4)]

def get_init_inputs():
    return [4, 3, 3]
"""
)


def mha_problem(batch_first: bool, forward: str, inputs: str) -> str:
    return (
        HEADER
        + f"""class Model(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.attn = nn.MultiheadAttention(width, heads, batch_first={batch_first})
        self.norm = nn.LayerNorm(width)

    def forward(self, x, y):
{forward}

def get_inputs():
    return {inputs}

def get_init_inputs():
    return [8, 2]
"""
    )


# Self-attention, time-major, residual and norm (KernelBench 31's block); the weights are discarded.
MHA_SELF = mha_problem(
    False,
    "        out, _ = self.attn(x, x, x)\n        return self.norm(out + x) + y.sum()",
    "[torch.randn(5, 3, 8), torch.randn(1)]",
)
# Cross-attention, batch-first: separate projections of query and key/value.
MHA_CROSS = mha_problem(
    True,
    "        return self.attn(x, y, y, need_weights=False)[0] * 2.0",
    "[torch.randn(3, 4, 8), torch.randn(3, 6, 8)]",
)

# A state argument get_inputs leaves out: the trace takes the reference's `is None` branch (KernelBench 35).
DEFAULT_STATE = (
    HEADER
    + """class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.proj = nn.Linear(width, width)

    def forward(self, x, h0=None):
        if h0 is None:
            h0 = torch.ones_like(x)
        return torch.tanh(self.proj(x) + h0)

def get_inputs():
    return [torch.randn(3, 4)]

def get_init_inputs():
    return [4]
"""
)

# Constant padding of the two last dims (Swin's shifted windows), and of one with the default value.
PAD = (
    HEADER
    + """class Model(nn.Module):
    def forward(self, x):
        y = F.pad(x, [1, 2, 0, 3], "constant", 0.5) * 2.0
        return y + F.pad(x, (1, 2)).sum(dim=1, keepdim=True)

def get_inputs():
    return [torch.randn(2, 3, 4)]

def get_init_inputs():
    return []
"""
)

# A chunked state-space scan (Mamba-2's SSD form), written with einops: chunks by rearrange, a causal
# mask made in the forward from constants, segment sums through cumsum, many-operand einsums (contracted
# pairwise), the chunk recurrence through F.pad and cat.
SSD = (
    HEADER
    + """from einops import rearrange


class Model(nn.Module):
    def __init__(self, batch, length, heads, state, chunk):
        super().__init__()
        self.chunk = chunk
        self.decay = nn.Parameter(-torch.rand(batch, length, heads))
        self.b = nn.Parameter(torch.randn(batch, length, heads, state) * 0.5)
        self.c = nn.Parameter(torch.randn(batch, length, heads, state) * 0.5)

    def segments(self, a):
        n = a.size(-1)
        run = torch.cumsum(a, dim=-1)
        diff = run[..., :, None] - run[..., None, :]
        causal = torch.tril(torch.ones(n, n, device=a.device, dtype=bool))
        return diff.masked_fill(~causal, -torch.inf)

    def forward(self, x):
        xs, a, b, c = [rearrange(t, "b (k l) ... -> b k l ...", l=self.chunk) for t in (x, self.decay, self.b, self.c)]
        a = rearrange(a, "b k l h -> b h k l")
        run = torch.cumsum(a, dim=-1)
        inner = torch.einsum("bklhn,bkshn,bhkls,bkshp->bklhp", c, b, torch.exp(self.segments(a)), xs)
        carried = torch.einsum("bklhn,bhkl,bklhp->bkhpn", b, torch.exp(run[:, :, :, -1:] - run), xs)
        carried = torch.cat([torch.zeros_like(carried[:, :1]), carried], dim=1)
        across = torch.exp(self.segments(F.pad(run[:, :, :, -1], (1, 0))))
        carried = torch.einsum("bhzk,bkhpn->bzhpn", across, carried)[:, :-1]
        outer = torch.einsum("bklhn,bkhpn,bhkl->bklhp", c, carried, torch.exp(run))
        return rearrange(inner + outer, "b k l h p -> b (k l) h p")

def get_inputs():
    return [torch.randn(2, 8, 3, 5)]

def get_init_inputs():
    return [2, 8, 3, 4, 4]
"""
)

# Many-operand einsums: a label summed within one operand, a product with no label summed, a chain.
EINSUMS = (
    HEADER
    + """class Model(nn.Module):
    def forward(self, x, w, v):
        chain = torch.einsum("ab,bc,cd->ad", x[:, :, 0], w, w.t())
        reduced = torch.einsum("abc,bd,d->a", x, w, v)
        product = torch.einsum("abc,b,ac->cab", x, v, x[:, 0, :])
        return chain.sum(dim=1) + reduced + product.mean(dim=(0, 2))

def get_inputs():
    return [torch.randn(4, 3, 5), torch.randn(3, 3), torch.randn(3)]

def get_init_inputs():
    return []
"""
)

BUILT = {
    "ssd": SSD,
    "einsums": EINSUMS,
    "pad": PAD,
    "causal": CAUSAL,
    "causal_assert": CAUSAL_ASSERT,
    "loop": LOOP,
    "branches": BRANCHES,
    "mha_self": MHA_SELF,
    "mha_cross": MHA_CROSS,
    "default_state": DEFAULT_STATE,
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    # The references are the test's own: trace them in this process (the service uses a subprocess).
    return Synthesizer(in_process=True)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("name", sorted(BUILT))
def test_each_pattern_comes_out_under_both_policies(synth: Synthesizer, name: str, device: str) -> None:
    for policy in (LIBRARY, STRICT):
        synthesis = synth.synthesize(
            BUILT[name], None, variant=Variant(), device=device, policy=KernelPolicy(policy)
        )
        validate(to_candidate(synthesis))
        host = synthesis.files["forward.cpp"]
        assert "at::multi_head_attention" not in host and "at::_native_multi_head_attention" not in host
        # Only the forwards that read their input shapes as numbers are specialised, and checked.
        specialised = name in ("causal_assert", "loop", "branches", "ssd")
        assert ("was generated for shape" in host) == specialised, name


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_chunked_scan_compiles_for_cuda(synth: Synthesizer, tmp_path: Path) -> None:
    synthesis = synth.synthesize(SSD, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT))
    write_dir(to_candidate(synthesis), tmp_path / "program")
    assert_program_compiles(tmp_path / "program", tmp_path)


def test_specialised_program_checks_every_input_and_parameter_shape(synth: Synthesizer) -> None:
    host = synth.synthesize(CAUSAL_ASSERT, None, variant=Variant(), device="cpu").files["forward.cpp"]
    checks = re.findall(
        r"TORCH_CHECK\(\((\w+)\.sizes\(\)\.vec\(\) == std::vector<int64_t>\{([\d, ]*)\}", host
    )
    shapes = {name: [int(d) for d in dims.split(", ")] for name, dims in checks}
    assert [2, 5, 8] in shapes.values()  # x
    assert [1, 1, 7, 7] in shapes.values()  # the mask buffer
    assert [24, 8] in shapes.values() and [24] in shapes.values()  # the projection
    # The sequence length is a number in the program: 5 of the 7 mask rows, the view sizes.
    trace = synth.trace(CAUSAL_ASSERT)
    assert trace.specialized
    assert not any(n.target.endswith("size") for n in trace.nodes)


def test_loop_over_a_size_is_unrolled(synth: Synthesizer) -> None:
    trace = synth.trace(LOOP)
    cells = [n for n in trace.nodes if n.op == "call_module" and n.target == "cell"]
    assert len(cells) == 4  # x.size(0) steps


def test_branch_on_tensor_values_is_refused(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        if x.size(0) > 1 and x.sum() > 0:\n"
        "            return x * 2.0\n"
        "        return x\n\n"
        "def get_inputs():\n    return [torch.randn(3, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(TraceError, match="branches on the values of a tensor") as err:
        synth.synthesize(source, None, variant=Variant(), device="cpu")
    assert "line 8" in str(err.value)


def test_missing_package_says_what_to_do(synth: Synthesizer) -> None:
    source = "import torch\nfrom einops_not_here import rearrange\n" + LOOP.replace("import torch\n", "", 1)
    with pytest.raises(TraceError, match="imports einops_not_here, which is not installed"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")
    error = trace_worker.describe(ModuleNotFoundError("No module named 'einops'", name="einops"))
    assert "reshape/permute" in error


def test_attention_weights_of_multihead_attention_are_refused_when_used(synth: Synthesizer) -> None:
    source = mha_problem(
        False, "        return self.attn(x, x, x)[1] + y", "[torch.randn(5, 3, 8), torch.randn(1)]"
    )
    with pytest.raises(Unsupported, match="attention weights"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")
    masked = mha_problem(
        False,
        "        return self.attn(x, x, x, attn_mask=y)[0]",
        "[torch.randn(5, 3, 8), torch.zeros(5, 5)]",
    )
    with pytest.raises(Unsupported, match="attn_mask"):
        synth.synthesize(masked, None, variant=Variant(), device="cpu")


def test_large_model_is_traced_on_the_meta_device(monkeypatch: pytest.MonkeyPatch) -> None:
    whole = trace_worker.safe_trace(CAUSAL, None)
    monkeypatch.setattr(trace_worker, "LARGE_MODEL_BYTES", 0)
    monkeypatch.setattr(torch.nn.Linear, "reset_parameters", _refuse_real_init)
    meta = trace_worker.safe_trace(CAUSAL, None)
    assert meta["ok"], meta
    assert meta["nodes"] == whole["nodes"] and meta["inputs"] == whole["inputs"]


def _refuse_real_init(self: torch.nn.Linear) -> None:
    # Initialising on the meta device touches no values; on the CPU it would mean real memory.
    assert self.weight.device.type == "meta", "a large model was built with real values"


def test_constructors_too_large_for_memory_are_compared_without_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def make(width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU())

    same = init_check.compare_constructors(lambda: make(3), lambda: make(3))
    assert same == {"ok": True, "detail": "", "values": True}
    shifted = init_check.compare_constructors(lambda: make(3), lambda: (torch.randn(1), make(3))[1])
    assert not shifted["ok"] and "0.weight differs" in shifted["detail"]
    monkeypatch.setattr(init_check, "memory_budget", lambda: 10)
    blind = init_check.compare_constructors(lambda: make(3), lambda: (torch.randn(1), make(3))[1])
    assert blind == {"ok": True, "detail": "", "values": False}
    wider = init_check.compare_constructors(lambda: make(3), lambda: make(5))
    assert not wider["ok"] and not wider["values"]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILT))
def test_compiled_cpu_program_matches_pytorch(synth: Synthesizer, name: str) -> None:
    source = BUILT[name]
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cpu", policy=KernelPolicy(STRICT))
    mn = load_program(synthesis)
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    init = ns["get_init_inputs"]()  # type: ignore[operator]
    torch.manual_seed(0)
    ref = ns["Model"](*init).double()  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](*init)  # type: ignore[operator]
    for seed in (1, 2):
        torch.manual_seed(seed)
        inputs = ns["get_inputs"]()  # type: ignore[operator]
        with torch.no_grad():
            want = ref(*[x.double() for x in inputs])
            got = new(*inputs)
        assert got.dtype == torch.float32 and got.shape == want.shape
        rel = ((got.double() - want).norm() / want.norm()).item()
        assert rel < 1e-5, f"{name}: relative L2 error {rel:.2e}"
    if name in ("causal_assert", "loop"):
        # A program specialised to the traced shapes refuses others instead of computing garbage.
        longer = (
            [torch.randn(2, 6, 8)] if name == "causal_assert" else [torch.randn(5, 3, 6), torch.randn(3, 5)]
        )
        with pytest.raises(RuntimeError, match="was generated for shape"):
            new(*longer)
    if name == "causal":
        # Sliced at run time: another sequence length within the mask is computed, not refused.
        x = torch.randn(2, 6, 8)
        with torch.no_grad():
            want, got = ref(x.double()), new(x)
        assert ((got.double() - want).norm() / want.norm()).item() < 1e-5


def test_constructor_helper_made_by_a_call_is_copied_after_its_maker(synth: Synthesizer) -> None:
    # Swin's `to_2tuple = _ntuple(2)`: ModelNew's constructor needs the made helper and its maker, in order.
    source = HEADER + (
        "def _tuple_of(n):\n"
        "    def parse(x):\n"
        "        return tuple([x] * n)\n"
        "    return parse\n\n"
        "to_pair = _tuple_of(2)\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, side):\n"
        "        super().__init__()\n"
        "        self.pool = nn.AvgPool2d(to_pair(side))\n\n"
        "    def forward(self, x):\n"
        "        return self.pool(x) * 2.0\n\n"
        "def get_inputs():\n    return [torch.randn(1, 2, 4, 4)]\n\n"
        "def get_init_inputs():\n    return [2]\n"
    )
    model_new = synth.synthesize(source, None, variant=Variant(), device="cpu").files["model_new.py"]
    # Under its own name: the Verifier rejects a candidate that reassigns a module name of the problem.
    assert 0 < model_new.index("def _tuple_of(n):") < model_new.index("stitch_to_pair = _tuple_of(2)")
    assert "nn.AvgPool2d(stitch_to_pair(side))" in model_new
    assert not re.search(r"^to_pair =", model_new, re.M)


def test_defaulted_arguments_left_out_are_not_program_inputs(synth: Synthesizer) -> None:
    trace = synth.trace(DEFAULT_STATE)
    assert not trace.specialized
    assert [n.name for n in trace.nodes if n.op == "placeholder"] == ["x"]
    model_new = synth.synthesize(DEFAULT_STATE, None, variant=Variant(), device="cpu").files["model_new.py"]
    assert "def forward(self, x, h0=None):" in model_new and "ext.forward(x, " in model_new


def test_forward_keeping_state_between_calls_is_refused(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n"
        "        self.hidden = torch.zeros(3, 4)\n\n"
        "    def forward(self, x):\n"
        "        self.hidden = torch.tanh(self.proj(x) + self.hidden)\n"
        "        return self.hidden * 2.0\n\n"
        "def get_inputs():\n    return [torch.randn(3, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(
        TraceError, match=r"assigns self\.hidden and reads it before overwriting it: state kept"
    ):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


# KernelBench's stateful RNN cell (level 3 problem 33's kind): the state attribute is overwritten in place by
# an input before it is read, so no value carries from one call to the next.
OVERWRITTEN_STATE = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self, n, h):\n"
    "        super().__init__()\n"
    "        self.hidden = torch.randn((3, h))\n"
    "        self.i2h = nn.Linear(n + h, h)\n"
    "        self.h2o = nn.Linear(h, 5)\n\n"
    "    def forward(self, x, initial_hidden=None):\n"
    "        if initial_hidden is not None:\n"
    "            self.hidden.copy_(initial_hidden)\n"
    "        self.hidden = self.hidden.to(x.device)\n"
    "        combined = torch.cat((x, self.hidden), dim=1)\n"
    "        self.hidden = torch.tanh(self.i2h(combined))\n"
    "        return self.h2o(self.hidden)\n\n"
    "def get_inputs():\n    return [torch.rand(3, 6), torch.rand(1, 7)]\n\n"
    "def get_init_inputs():\n    return [6, 7]\n"
)


def test_state_overwritten_before_it_is_read_comes_out_and_matches(synth: Synthesizer) -> None:
    trace = synth.trace(OVERWRITTEN_STATE)
    assert not any(n.op == "get_attr" and n.target == "hidden" for n in trace.nodes)
    for policy in (LIBRARY, STRICT):
        validate(
            to_candidate(
                synth.synthesize(
                    OVERWRITTEN_STATE, None, variant=Variant(), device="cuda", policy=KernelPolicy(policy)
                )
            )
        )
    synthesis = synth.synthesize(OVERWRITTEN_STATE, None, variant=Variant(), device="cpu")
    mn = load_program(synthesis)
    ref, new = seeded_pair(OVERWRITTEN_STATE, mn, 6, 7)
    for _ in range(2):  # the reference's second call starts from the first call's state, then overwrites it
        x, h0 = torch.rand(3, 6), torch.rand(1, 7)  # h0 broadcast over the batch, as copy_ does
        torch.testing.assert_close(new(x, h0), ref(x, h0), rtol=1e-5, atol=1e-5)


def test_state_assigned_and_never_read_is_no_state(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.proj = nn.Linear(4, 4)\n\n"
        "    def forward(self, x):\n"
        "        self.last = torch.relu(self.proj(x))\n"
        "        return self.last * 2.0\n\n"
        "def get_inputs():\n    return [torch.randn(3, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    synthesis = synth.synthesize(source, None, variant=Variant(), device="cpu")
    assert "ext.forward(x" in synthesis.files["model_new.py"]


def test_tensor_made_from_constants_in_a_specialised_forward_is_refused(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x + torch.linspace(0.0, 1.0, len(x)).unsqueeze(1)\n\n"
        "def get_inputs():\n    return [torch.randn(3, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(TraceError, match="neither an input, a parameter nor a registered buffer"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


# Vision transformers (KernelBench level 3's ViT kinds): patches cut by Tensor.unfold, a class token, torch.nn's
# TransformerEncoder (sequence first) / TransformerEncoderLayer (batch first, pre-norm, GELU) and a
# TransformerDecoderLayer, traced through to the attention, LayerNorm, Linear and activations they are made of.
VIT = HEADER + (
    "class Model(nn.Module):\n"
    "    def __init__(self, p, dim, heads):\n"
    "        super().__init__()\n"
    "        self.p = p\n"
    "        self.embed = nn.Linear(3 * p * p, dim)\n"
    "        self.cls = nn.Parameter(torch.randn(1, 1, dim))\n"
    "        self.pos = nn.Parameter(torch.randn(1, 5, dim))\n"
    "        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.0), 2)\n"
    "        self.pre = nn.TransformerEncoderLayer(dim, heads, 3 * dim, dropout=0.0, activation='gelu',\n"
    "                                              batch_first=True, norm_first=True)\n"
    "        self.dec = nn.TransformerDecoderLayer(dim, heads, 2 * dim, dropout=0.0, batch_first=True)\n"
    "        self.head = nn.Linear(dim, 3)\n\n"
    "    def forward(self, img):\n"
    "        p = self.p\n"
    "        x = img.unfold(2, p, p).unfold(3, p, p).reshape(img.shape[0], -1, p * p * img.shape[1])\n"
    "        x = torch.cat((self.cls.expand(img.shape[0], -1, -1), self.embed(x)), dim=1) + self.pos\n"
    "        x = self.encoder(x.transpose(0, 1)).transpose(0, 1)\n"
    "        x = self.pre(x)\n"
    "        x = self.dec(x, x[:, 1:])\n"
    "        return self.head(x[:, 0])\n\n"
    "def get_inputs():\n    return [torch.rand(2, 3, 8, 8)]\n\n"
    "def get_init_inputs():\n    return [4, 16, 4]\n"
)


def test_vision_transformer_with_torch_transformer_layers_matches(synth: Synthesizer) -> None:
    for policy in (LIBRARY, STRICT):
        validate(
            to_candidate(
                synth.synthesize(VIT, None, variant=Variant(), device="cuda", policy=KernelPolicy(policy))
            )
        )
    synthesis = synth.synthesize(VIT, None, variant=Variant(), device="cpu")
    host = synthesis.files["forward.cpp"]
    assert ".unfold(2, 4, 4)" in host and "at::multi_head_attention" not in host
    mn = load_program(synthesis)
    ref, new = seeded_pair(VIT, mn, 4, 16, 4)
    img = torch.rand(2, 3, 8, 8)
    torch.testing.assert_close(new(img), ref(img), rtol=1e-4, atol=1e-4)


def test_functional_unfold_is_refused_by_name(synth: Synthesizer) -> None:
    source = HEADER + (
        "class Model(nn.Module):\n"
        "    def forward(self, x):\n"
        "        return F.unfold(x, kernel_size=2)\n\n"
        "def get_inputs():\n    return [torch.randn(1, 2, 4, 4)]\n\n"
        "def get_init_inputs():\n    return []\n"
    )
    with pytest.raises(Unsupported, match=r"im2col"):
        synth.synthesize(source, None, variant=Variant(), device="cpu")


# Stochastic depth as timm writes it (Swin, ConvNeXt): a per-sample keep mask drawn in the forward, its shape
# built by tuple arithmetic, floored in place.
DROP_PATH = HEADER + (
    "def drop_path(x, drop_prob=0.0, training=False):\n"
    "    if drop_prob == 0.0 or not training:\n"
    "        return x\n"
    "    keep_prob = 1 - drop_prob\n"
    "    shape = (x.shape[0],) + (1,) * (x.ndim - 1)\n"
    "    random_tensor = keep_prob + torch.rand(shape, dtype=x.dtype, device=x.device)\n"
    "    random_tensor.floor_()\n"
    "    return x.div(keep_prob) * random_tensor\n\n"
    "class Model(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(8, 8)\n\n"
    "    def forward(self, x):\n"
    "        return x + drop_path(self.fc(x), 0.5, self.training)\n\n"
    "def get_inputs():\n    return [torch.rand(16, 4, 8)]\n\n"
    "def get_init_inputs():\n    return []\n"
)


def test_stochastic_depth_draws_what_the_reference_draws(synth: Synthesizer) -> None:
    synthesis = synth.synthesize(DROP_PATH, None, variant=Variant(), device="cpu")
    mn = load_program(synthesis)
    ref, new = seeded_pair(DROP_PATH, mn)
    x = torch.rand(16, 4, 8)
    for seed in (5, 6):
        torch.manual_seed(seed)
        want = ref(x)
        torch.manual_seed(seed)
        got = new(x)
        dropped = int(((want - x).abs().amax(dim=(1, 2)) == 0).sum())
        assert 0 < dropped < 16  # some samples dropped, some kept: the in-place floor_ took effect
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
