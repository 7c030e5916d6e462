"""The synthesizer's scan, flip and triangle kernels on a GPU: rows spanning several tiles of the blocked scan
(with a partial last tile), rows shorter than a warp, strided lines of a middle dim, reverse/exclusive/masked
forms, each output within 1e-5 (relative L2) of a float64 evaluation of the reference."""

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

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def problem(forward: str, inputs: str, args: str = "x") -> str:
    return (
        "import torch\nimport torch.nn as nn\n\n"
        "class Model(nn.Module):\n"
        f"    def forward(self, {args}):\n        return {forward}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n"
        "def get_init_inputs():\n    return []\n"
    )


PROBLEMS = {
    # 5000 = four full tiles of 1024 and a partial one; factors near 1 (an input, so the float64 reference
    # multiplies the same values) keep the products finite over the row.
    "long_rows": problem(
        "(torch.cumsum(x, -1), torch.cumprod(y, -1), torch.cumsum(x.flip(-1), -1).flip(-1), "
        "torch.cumsum(x, -1) - x)",
        "[torch.rand(64, 5000), torch.rand(64, 5000) * 0.02 + 0.99]",
        args="x, y",
    ),
    "short_rows": problem("(torch.cumsum(x, 1), torch.cumprod(x, 1))", "[torch.rand(1000, 3)]"),
    # Strided lines: the scan dim is not the last.
    "columns": problem(
        "(torch.cumsum(x, 1), torch.cumsum(x.flip(1), 1).flip(1), torch.cumprod(x * 0.1 + 0.95, 0))",
        "[torch.rand(3, 3000, 7)]",
    ),
    "masked_flip_triangles": problem(
        "(torch.cumsum(x * mask, 1), torch.flip(x, [0, 1]), torch.triu(x, 1), torch.tril(x, -1))",
        "[torch.rand(33, 65), torch.randint(0, 2, (33, 65)).bool()]",
        args="x, mask",
    ),
}


@pytest.fixture(scope="module")
def synth() -> Synthesizer:
    return Synthesizer(in_process=True)  # the references above are this test's own


def build(synth: Synthesizer, source: str) -> dict[str, Any]:
    """Builds the CUDA program; returns model_new's namespace."""
    from torch.utils.cpp_extension import load

    synthesis = synth.synthesize(source, None, variant=Variant(), device="cuda")
    ext_name = synthesis.build.extension_name
    root = (
        Path(os.environ.get("STITCH_TEST_BUILD_DIR", Path.home() / ".cache" / "stitchcuda-tests")) / ext_name
    )
    root.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (root / path).write_text(content)
    sys.modules[ext_name] = load(
        name=ext_name,
        sources=[str(root / s) for s in synthesis.build.sources],
        extra_cflags=list(synthesis.build.cflags),
        extra_cuda_cflags=[*synthesis.build.cuda_cflags, *cutlass.build_flags(synthesis.files.values())],
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(root),
    )
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(synthesis.files["model_new.py"], "model_new.py", "exec"), mn)
    return mn


@pytest.mark.parametrize("name", list(PROBLEMS))
def test_cuda_program_matches_the_reference(synth: Synthesizer, name: str) -> None:
    source = PROBLEMS[name]
    mn = build(synth, source)
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    ref, new = ns["Model"](), mn["ModelNew"]()
    for seed in (31, 32):
        torch.manual_seed(seed)
        inputs = [x.cuda() for x in ns["get_inputs"]()]
        with torch.no_grad():
            want = ref(*[x.double() if x.is_floating_point() else x for x in inputs])
            got = new(*inputs)
        torch.cuda.synchronize()
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.is_cuda and g.dtype == torch.float32 and g.shape == w.shape
            rel = ((g.double() - w).norm() / w.norm()).item()
            assert rel < 1e-5, f"{name} output {i}: relative L2 error {rel:.2e}"
