"""The synthesizer's recurrent layers on a GPU (strict policy: its own GEMMs and cell kernels): nn.GRU and
nn.LSTM, multi-layer, bidirectional, batch- or time-major, with and without initial states, their output
sequences and final states each within 1e-5 (relative L2) of a float64 evaluation of the reference on
fresh and shifted inputs; then the public KernelBench level-3 GRU/LSTM problems where they are present
(`STITCH_KERNELBENCH=<dir with level3/>`, default ../shared/kernelbench beside the checkout)."""

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
# 35_LSTM draws its initial state with torch.randn inside forward: not traceable, not comparable.
PUBLIC = ["36_LSTMHn", "37_LSTMCn", "38_LSTMBidirectional", "39_GRU", "40_GRUHidden", "41_GRUBidirectional",
          "42_GRUBidirectionalHidden"]  # fmt: skip


def problem(layer: str, forward: str, args: str, inputs: str) -> str:
    """A reference around one recurrent layer; results that are several tensors are returned flattened
    into one (test_synth_gpu.compare compares one tensor)."""
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def __init__(self):\n        super().__init__()\n        self.rnn = {layer}\n\n"
        f"    def forward(self, {args}):\n{forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return []\n"
    )


PROBLEMS = {
    "gru_bidirectional_batch_first_h0": problem(
        "nn.GRU(64, 128, 2, batch_first=True, bidirectional=True)",
        "        output, h_n = self.rnn(x, h0)\n        return torch.cat([output.flatten(), h_n.flatten()])",
        "x, h0",
        "[torch.randn(16, 40, 64), torch.randn(4, 16, 128)]",
    ),
    "gru_three_layers_no_bias": problem(
        "nn.GRU(64, 96, 3, bias=False)", "        return self.rnn(x)[1]", "x", "[torch.randn(40, 16, 64)]"
    ),
    # 2100 x 512 (batch x hidden) cells: more than one pass of the cell kernel's grid-stride loop.
    "gru_wide_batch": problem(
        "nn.GRU(32, 512, 1)",
        "        return self.rnn(x, h0)[0]",
        "x, h0",
        "[torch.randn(4, 2100, 32), torch.randn(1, 2100, 512)]",
    ),
    "lstm_state_batch_first": problem(
        "nn.LSTM(64, 128, 2, batch_first=True)",
        "        out, (h, c) = self.rnn(x, (h0, c0))\n"
        "        return torch.cat([out[:, -1].flatten(), h.flatten(), c.flatten()])",
        "x, h0, c0",
        "[torch.randn(16, 40, 64), torch.randn(2, 16, 128), torch.randn(2, 16, 128)]",
    ),
    "lstm_bidirectional_zero": problem(
        "nn.LSTM(64, 128, 2, bidirectional=True)",
        "        return self.rnn(x)[0]",
        "x",
        "[torch.randn(40, 16, 64)]",
    ),
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references are this test's own or public benchmark files


def check(synth: Synthesizer, source: str) -> None:
    synthesis = build_source(synth, source, Variant())
    host = synthesis.files["forward.cpp"]
    assert "stitch_rnn(" in host and "at::mm(" not in host and "at::addmm(" not in host
    compare(source, synthesis.files["model_new.py"])


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_recurrent_layers_match(synth: Synthesizer, name: str) -> None:
    check(synth, PROBLEMS[name])


@pytest.mark.parametrize("name", PUBLIC)
def test_public_level3_recurrent_problems_match(synth: Synthesizer, name: str) -> None:
    path = KERNELBENCH / f"{name}.py"
    if not path.is_file():
        pytest.skip(f"no {path}")
    check(synth, path.read_text())
