"""Stop 31's Coder additions on a GPU: torch.nn Transformer layers traced through with Tensor.unfold patches
(a ViT), a Swin-V2 style attention whose relative position bias is picked by an int64 index buffer (the
gather kernel), torch.roll and a whole compact Swin-V2, and a KernelBench-style RNN cell whose state attribute is overwritten by an input before it is
read. Each CUDA program (strict policy: its own GEMMs) within 1e-5 (relative L2) of a float64 evaluation of the
reference on fresh and shifted inputs. The models are the CPU tests' (tests/unit/coder)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coder"))

from test_coder_indexing import ROLL, SWIN_V2, SWIN_V2_MODEL  # noqa: E402
from test_coder_trace_level3 import OVERWRITTEN_STATE, VIT  # noqa: E402
from test_synth_gpu import build_source, compare  # noqa: E402

from stitchcuda.coder.synth.synthesizer import Synthesizer  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MODELS = {
    "vit": VIT,
    "swin_v2_attention": SWIN_V2,
    "overwritten_state": OVERWRITTEN_STATE,
    "roll": ROLL,
    # A whole compact Swin-V2 without stochastic depth: compare() evaluates the reference in float64, whose
    # draws differ from float32 ones (the CPU test checks the draws in training mode).
    "swin_v2": SWIN_V2_MODEL.replace(", 0.1)", ", 0.0)"),
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the tests' own references


@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_program_matches_the_reference(synth: Synthesizer, name: str) -> None:
    synthesis = build_source(synth, MODELS[name], Variant())
    compare(MODELS[name], synthesis.files["model_new.py"])
