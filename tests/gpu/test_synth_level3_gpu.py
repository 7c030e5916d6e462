"""The public KernelBench level-3 problems that come out through the shape-specialised trace, nn.MultiheadAttention
or the meta-device trace of a large model (issue 14 items 2 and 3), on a GPU: each CUDA program (strict
policy: its own GEMMs) within 1e-5 (relative L2) of a float64 evaluation of the reference on fresh and
shifted inputs (`STITCH_KERNELBENCH=<dir with level3/>`, default ../shared/kernelbench beside the checkout)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from test_synth_gpu import build_source, compare  # noqa: E402

from stitchcuda.coder.synth.synthesizer import Synthesizer  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

ROOT = Path(__file__).resolve().parents[2]
KERNELBENCH = Path(os.environ.get("STITCH_KERNELBENCH", ROOT.parent / "shared" / "kernelbench")) / "level3"
# Specialised to their input shapes (sizes as numbers, a loop over the sequence, a device check), then
# Swin-MLP (constant padding too), MultiheadAttention, an 8 GiB MLP traced on the meta device, then Mamba-2
# (einops, a mask made in the forward, many-operand einsums), then ResNet-101 (724 launches of 19 kernels).
PUBLIC = ["43_MinGPTCausalAttention", "44_MiniGPTBlock", "50_ReLUSelfAttention", "34_VanillaRNNHidden",
          "46_NetVladWithGhostClusters", "47_NetVladNoGhostClusters", "29_SwinMLP", "31_VisionAttention", "2_ShallowWideMLP",
          "48_Mamba2ReturnY", "49_Mamba2ReturnFinalState", "10_ResNet101"]  # fmt: skip


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    # Public benchmark references, read as data on the GPU machine: traced in this process like the
    # other GPU tests.
    return Synthesizer(in_process=True)


@pytest.mark.parametrize("name", PUBLIC)
def test_public_level3_problem_matches_the_reference(synth: Synthesizer, name: str) -> None:
    path = KERNELBENCH / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"{path} is not here")
    source = path.read_text()
    synthesis = build_source(synth, source, Variant())
    compare(source, synthesis.files["model_new.py"])
