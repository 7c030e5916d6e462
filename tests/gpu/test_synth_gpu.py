"""The synthesizer's CUDA programs on a GPU: every suite problem builds, runs on the caller's stream and
matches a float64 evaluation of the reference on fresh and shifted inputs (library and custom GEMMs)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from stitchcuda.coder.synth.synthesizer import Synthesizer  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402
from stitchcuda.shared import cutlass  # noqa: E402
from stitchcuda.verifier import accounting  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

PROBLEMS = Path(__file__).resolve().parents[2] / "benchmarks" / "problems"
SUITE = sorted(p.stem for p in PROBLEMS.glob("[0-9]*.py"))
CUSTOM = ["06_gemm_bias_relu", "07_conv_relu", "08_mlp", "12_attention", "14_lstm", "15_transformer_block"]


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)


def build(synth: Synthesizer, name: str, variant: Variant):  # type: ignore[no-untyped-def]
    source = (PROBLEMS / f"{name}.py").read_text()
    return source, build_source(synth, source, variant)


def build_source(synth: Synthesizer, source: str, variant: Variant):  # type: ignore[no-untyped-def]
    """Synthesizes and builds the CUDA program of a reference (strict policy); returns the synthesis."""
    from torch.utils.cpp_extension import load

    synthesis = synth.synthesize(source, None, variant=variant, device="cuda")
    ext_name = synthesis.build.extension_name
    root = (
        Path(os.environ.get("STITCH_TEST_BUILD_DIR", Path.home() / ".cache" / "stitchcuda-tests")) / ext_name
    )
    root.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (root / path).write_text(content)
    ext = load(
        name=ext_name,
        sources=[str(root / s) for s in synthesis.build.sources],
        extra_cflags=list(synthesis.build.cflags),
        extra_cuda_cflags=[*synthesis.build.cuda_cflags, *cutlass.build_flags(synthesis.files.values())],
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(root),
    )
    sys.modules[ext_name] = ext
    return synthesis


def compare(source: str, model_new: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    ns: dict[str, object] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    mn: dict[str, object] = {"__name__": "model_new"}
    exec(compile(model_new, "model_new.py", "exec"), mn)
    init = ns["get_init_inputs"]()  # type: ignore[operator]
    torch.manual_seed(0)
    ref = ns["Model"](*init).cuda().double()  # type: ignore[operator]
    torch.manual_seed(0)
    new = mn["ModelNew"](*init).cuda()  # type: ignore[operator]
    torch.manual_seed(0)
    ref32 = ns["Model"](*init).cuda()  # type: ignore[operator]
    for seed in (21, 22):
        torch.manual_seed(seed)
        inputs = [x.cuda() for x in ns["get_inputs"]()]  # type: ignore[operator]
        for xs in (inputs, [x * 3 + 0.5 for x in inputs]):
            with torch.no_grad():
                want = ref(*[x.double() for x in xs])
                got = new(*xs)
                own = ((ref32(*xs).double() - want).norm() / want.norm()).item()
            torch.cuda.synchronize()
            assert got.is_cuda and got.dtype == torch.float32 and got.shape == want.shape
            rel = ((got.double() - want).norm() / want.norm()).item()
            # The Verifier's rule: within 1e-5, or 10x the float32 reference's own error (a deep model's:
            # ResNet-101 in training mode, 1e-5 and up).
            assert rel < max(1e-5, 10 * own), f"relative L2 error {rel:.2e} (the reference's own {own:.2e})"


@pytest.mark.parametrize("name", SUITE)
def test_cuda_program_matches_the_reference(synth: Synthesizer, name: str) -> None:
    source, synthesis = build(synth, name, Variant())
    compare(source, synthesis.files["model_new.py"])


@pytest.mark.parametrize("name", ["01_elementwise_chain", "04_softmax", "10_rmsnorm"])
def test_scalar_variant_matches_too(synth: Synthesizer, name: str) -> None:
    source, synthesis = build(synth, name, Variant(vec="1", block="128"))
    compare(source, synthesis.files["model_new.py"])


@pytest.mark.parametrize("name", CUSTOM)
def test_custom_gemm_and_conv_kernels_match(synth: Synthesizer, name: str) -> None:
    source, synthesis = build(synth, name, Variant(gemm="custom"))
    compare(source, synthesis.files["model_new.py"])


CUTLASS_KERNELS = ["cutlass", "cutlass_sm90"]


@pytest.mark.parametrize("kernel", CUTLASS_KERNELS)
@pytest.mark.parametrize("name", ["06_gemm_bias_relu", "08_mlp", "12_attention", "15_transformer_block"])
def test_cutlass_gemms_match(synth: Synthesizer, name: str, kernel: str) -> None:
    """The GEMMs as CUTLASS 3xTF32 templates (variant gemm_kernel=cutlass, or cutlass_sm90: Hopper's wgmma
    over split operands), built with the nvidia-cutlass package's headers; a GEMM CUTLASS cannot take runs on
    the own kernels."""
    source, synthesis = build(synth, name, Variant(gemm="custom", gemm_kernel=kernel))
    assert any(path.endswith("cutlass_gemm.cu") for path in synthesis.files)
    compare(source, synthesis.files["model_new.py"])


CUTLASS_LAYOUTS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b, c):
        # Column-major A, row- and column-major B, and a batched GEMM of odd sizes (the own kernels).
        y = torch.matmul(a.T, b) + torch.matmul(a.T, b.T.contiguous().T)
        return torch.cat([y.flatten(), torch.bmm(c, c.transpose(1, 2)).flatten()])

def get_inputs():
    return [torch.randn(520, 264), torch.randn(520, 392), torch.randn(3, 37, 29)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("kernel", CUTLASS_KERNELS)
def test_cutlass_gemms_of_every_layout_match(synth: Synthesizer, kernel: str) -> None:
    synthesis = build_source(synth, CUTLASS_LAYOUTS, Variant(gemm="custom", gemm_kernel=kernel))
    compare(CUTLASS_LAYOUTS, synthesis.files["model_new.py"])


CUTLASS_LONG_K = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)

def get_inputs():
    return [torch.randn(256, 65536), torch.randn(65536, 200)]

def get_init_inputs():
    return []
"""


@pytest.mark.parametrize("kernel", CUTLASS_KERNELS)
def test_cutlass_split_k_gemm_matches(synth: Synthesizer, kernel: str) -> None:
    """Four output tiles over a K of 65536: the GEMM is split along K (serial split-K, slices added in order;
    SM90: stream-K)."""
    synthesis = build_source(synth, CUTLASS_LONG_K, Variant(gemm="custom", gemm_kernel=kernel))
    compare(CUTLASS_LONG_K, synthesis.files["model_new.py"])


SM90_SHAPES = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(29, 61)
        self.w = nn.Parameter(torch.randn(96, 128))

    def forward(self, x, y):
        # Odd M, N and K with a bias (rows of 61 floats: TMA stores a padded copy, then the rows are copied
        # out); a batched GEMM whose B is shared by every batch (batch stride 0).
        return torch.cat([self.fc(x).flatten(), torch.matmul(y, self.w).flatten()])

def get_inputs():
    return [torch.randn(37, 29), torch.randn(4, 65, 96)]

def get_init_inputs():
    return []
"""


def test_sm90_gemm_runs_wgmma_on_hopper(synth: Synthesizer) -> None:
    """On compute capability 9.0 the Hopper GEMM, not a fallback, computes the result: the split pass and
    CUTLASS's kernel are the ones launched (the device runs the program's sm_90a code)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs compute capability 9.0 (H100/H200)")
    synthesis = build_source(synth, SM90_SHAPES, Variant(gemm="custom", gemm_kernel="cutlass_sm90"))
    compare(SM90_SHAPES, synthesis.files["model_new.py"])
    inputs = [torch.randn(37, 29, device="cuda"), torch.randn(4, 65, 96, device="cuda")]
    kernels = set(own_kernels_launched(synthesis, inputs))
    assert any("stitch_tf32x3_split" in n for n in kernels), sorted(kernels)
    assert any("GemmUniversal" in n for n in kernels), sorted(kernels)
    assert any("stitch_sm90_unpad" in n for n in kernels), "N = 61 ran on the Hopper GEMM, padded"


def own_kernels_launched(synthesis: Any, inputs: list[Any]) -> list[str]:
    """The names of the kernels one call of the built program launches, after checking that the Verifier
    counts none of them as a library's (D6), CUTLASS's instantiations (named mangled) included."""
    mn: dict[str, object] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    model = mn["ModelNew"]().cuda()  # type: ignore[operator]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        model(*inputs)
        torch.cuda.synchronize()
    kernels = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    symbols = accounting.global_symbols(dict(synthesis.files))
    library = [
        n for n in kernels if accounting.GPU_LIBRARY.search(n) and not accounting._defined_by(n, symbols)
    ]
    assert library == [], sorted(set(kernels))
    return kernels


SM90_CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        # Hopper's convolution: channels 64 -> 96 (tiles 3/4 full), 3-D strided, a dilated 5x5 over 6 input
        # channels (split channels padded to 20), 61 output channels (padded to 64, stored unpadded); the
        # last one too shallow for it (27 products an output element: the own kernels). A transposed one of
        # stride 1 (the flipped kernel's direct convolution) too; a strided one stays with the own kernels.
        self.a = nn.Conv2d(64, 96, 3, padding=1)
        self.b = nn.Conv3d(16, 64, 3, stride=2, padding=1)
        self.c = nn.Conv2d(6, 128, 5, stride=2, padding=2, dilation=2)
        self.d = nn.Conv2d(32, 61, 3, padding=1, bias=False)
        self.e = nn.Conv2d(3, 8, 3)
        self.f = nn.ConvTranspose2d(64, 48, 3, padding=1)
        self.g = nn.ConvTranspose2d(64, 32, 2, stride=2)

    def forward(self, x, v, u, t):
        return torch.cat([torch.relu(self.a(x)).flatten(), torch.tanh(self.b(v)).flatten(),
                          self.c(u).flatten(), self.d(t).flatten(), self.e(t[:, :3]).flatten(),
                          self.f(x).flatten(), self.g(x).flatten()])

def get_inputs():
    return [torch.randn(8, 64, 64, 64), torch.randn(4, 16, 32, 64, 64), torch.randn(32, 6, 128, 128),
            torch.randn(16, 32, 96, 96)]

def get_init_inputs():
    return []
"""


def test_sm90_conv_runs_wgmma_on_hopper(synth: Synthesizer) -> None:
    """Variant conv_kernel=cutlass_sm90 on compute capability 9.0: the direct convolutions run on CUTLASS's
    Hopper implicit GEMM over split channels (the split passes, CUTLASS's kernel and the store launched), as
    accurate as the float32 reference, and the Verifier counts none of them as a library's."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs compute capability 9.0 (H100/H200)")
    synthesis = build_source(synth, SM90_CONV, Variant(gemm="custom", conv_kernel="cutlass_sm90"))
    compare(SM90_CONV, synthesis.files["model_new.py"])
    ns: dict[str, object] = {}
    exec(compile(SM90_CONV, "reference.py", "exec"), ns)
    torch.manual_seed(0)
    kernels = own_kernels_launched(synthesis, [x.cuda() for x in ns["get_inputs"]()])  # type: ignore[operator]
    # The GEMM's split pass, twice a convolution (its input and its weight).
    assert sum("stitch_tf32x3_split" in n for n in kernels) == 10, sorted(set(kernels))
    assert sum("stitch_conv_tc_store" in n for n in kernels) == 5, sorted(set(kernels))
    assert sum("ConvUniversal" in n or "conv6kernel" in n for n in kernels) == 5, sorted(set(kernels))


SM90_PANELS = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16384, 16384)

    def forward(self, x, a, b):
        # Split operands past the 1 GiB a split may take at once: B (the weight) in column panels, then A in
        # row panels.
        return torch.cat([self.fc(x).flatten(), torch.matmul(a, b).flatten()])

def get_inputs():
    return [torch.randn(64, 16384), torch.randn(12000, 8192), torch.randn(8192, 256)]

def get_init_inputs():
    return []
"""


def test_sm90_gemm_of_operands_past_the_split_limit_runs_in_panels(synth: Synthesizer) -> None:
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs compute capability 9.0 (H100/H200)")
    synthesis = build_source(synth, SM90_PANELS, Variant(gemm="custom", gemm_kernel="cutlass_sm90"))
    compare(SM90_PANELS, synthesis.files["model_new.py"])


# A network of many small layers (48 launches): the default program replays its calls from a CUDA graph.
DEEP_BN = """import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()) for _ in range(8)
        ])

    def forward(self, x):
        return self.layers(x).mean(dim=(2, 3))

def get_inputs():
    return [torch.randn(4, 16, 24, 24)]

def get_init_inputs():
    return []
"""


def test_graph_replay_runs_each_call_once_on_its_inputs(synth: Synthesizer) -> None:
    """Calls 2.. replay a CUDA graph: each output matches the reference on that call's inputs, and the
    training-mode batch norms' running statistics after five calls match the reference's (each call ran once)."""
    synthesis = build_source(synth, DEEP_BN, Variant())
    assert "self._stitch_replay([x], [" in synthesis.files["model_new.py"]
    compare(DEEP_BN, synthesis.files["model_new.py"])
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(DEEP_BN, "reference.py", "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    torch.manual_seed(0)
    ref = ns["Model"]().cuda()
    torch.manual_seed(0)
    new = mn["ModelNew"]().cuda()
    with torch.no_grad():
        for i in range(5):
            x = torch.randn(4, 16, 24, 24, device="cuda") * (i + 1)
            torch.testing.assert_close(new(x), ref(x), rtol=1e-4, atol=1e-4)
    assert new._stitch_graph is not None
    for (name, got), (_, want) in zip(new.state_dict().items(), ref.state_dict().items(), strict=True):
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4, msg=name)
