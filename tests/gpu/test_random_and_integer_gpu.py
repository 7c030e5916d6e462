"""Random references and integer targets on a GPU, through the Verifier: the built-in Coder's program for a
reference that draws an LSTM's initial states in forward and drops out in training mode (KernelBench level 3
35's and level 2 66's kinds) is accepted on CUDA (torch's Philox draws and fused dropout, seeded per input set
for the reference and the candidate alike), and its cross-entropy program with int64 targets too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stitchcuda.coder.synth.synthesizer import Synthesizer, to_candidate  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402
from stitchcuda.shared.policy import STRICT, KernelPolicy  # noqa: E402
from stitchcuda.verifier.service import VerifierService  # noqa: E402
from stitchcuda.verifier.settings import VerifierSettings  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

RANDOM = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, hidden, p):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, features)
        self.drop = nn.Dropout(p)

    def forward(self, x):
        h0 = torch.randn(1, x.size(0), self.lstm.hidden_size, device=x.device)
        c0 = torch.randn(1, x.size(0), self.lstm.hidden_size, device=x.device)
        out, _ = self.lstm(x, (h0, c0))
        return torch.softmax(self.drop(self.head(out[:, -1, :])), dim=1)


def get_inputs():
    return [torch.rand(64, 32, 128)]


def get_init_inputs():
    return [128, 256, 0.2]
"""

CROSS_ENTROPY = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, logits, labels):
        return torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.05)


def get_inputs():
    return [torch.randn(4096, 1000), torch.randint(0, 1000, (4096,))]


def get_init_inputs():
    return []
"""


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VerifierService]:
    home = Path(tmp_path_factory.mktemp("verifier-home"))
    svc = VerifierService(VerifierSettings(home=home))
    yield svc
    svc.close()


@pytest.mark.parametrize("source", [RANDOM, CROSS_ENTROPY], ids=["random", "cross_entropy"])
def test_the_coders_program_is_accepted_on_the_gpu(service: VerifierService, source: str) -> None:
    synthesis = Synthesizer(in_process=True).synthesize(
        source, None, variant=Variant(), device="cuda", policy=KernelPolicy(STRICT)
    )
    verdict = service.verify(source, to_candidate(synthesis), device="cuda")
    assert verdict.accepted, verdict.feedback
    print(f"speedup vs eager {verdict.speedup_vs_eager:.2f}x, vs compile {verdict.speedup_vs_compile:.2f}x")
