"""The synthesizer's CUDA reductions on a GPU: every reduction kind along the innermost, middle and outermost
dims, over several dims and over everything, at odd sizes (tile edges, scalar paths) and at sizes that take the
block-split and grid-wide paths, each output within 1e-5 (relative L2) of a float64 evaluation, indices exact;
and sums over 10^8 elements within 1e-6."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coder"))

from reduce_problems import SMALL, layouts, problem  # noqa: E402
from test_synth_gpu import synth  # noqa: E402, F401  (the module's Synthesizer fixture)

from stitchcuda.coder.synth.synthesizer import Synthesizer  # noqa: E402
from stitchcuda.coder.synth.variants import Variant  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

# Sizes that take the paths the small ones do not: few long rows (split and grid-wide passes, odd and
# multiple-of-4 extents), few outputs of a long column (block partials), many outputs (no split).
LARGE = {
    f"large_{name}": source
    for name, source in layouts(
        "(4, 3, 300001)", "(16, 2999, 33)", "(20011, 7)", "(8, 65, 33, 31)", "(3, 1001, 997)"
    ).items()
}
ALIGNED = {
    f"aligned_{name}": source
    for name, source in layouts(
        "(4, 3, 300000)", "(64, 513, 1024)", "(4096, 96)", "(8, 64, 32, 32)", "(4, 1024, 1024)"
    ).items()
}
CASES = {**SMALL, **LARGE, **ALIGNED}

# 10^8 positive elements: a float accumulator over them drifts by ~1e-3 relative (the Frobenius-norm bug).
ACCURACY = problem(
    "(torch.sum(x), torch.mean(x, 0), torch.sum(x, 1), x / torch.norm(x), torch.sum(x.view(100, -1), 0))",
    "[torch.rand(10000, 10001) + 1]",
)


def build_source(synth: Synthesizer, source: str, variant: Variant) -> str:  # noqa: F811
    """Builds the program of a reference source like test_synth_gpu.build; returns model_new.py."""
    from torch.utils.cpp_extension import load

    synthesis = synth.synthesize(source, None, variant=variant, device="cuda")
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
        extra_cuda_cflags=list(synthesis.build.cuda_cflags),
        extra_ldflags=list(synthesis.build.ldflags),
        build_directory=str(root),
    )
    return synthesis.files["model_new.py"]


def compare_all(source: str, model_new: str, tolerance: float) -> None:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(model_new, "model_new.py", "exec"), mn)
    ref, new = ns["Model"]().cuda(), mn["ModelNew"]().cuda()
    for seed in (31, 32):
        torch.manual_seed(seed)
        inputs = [x.cuda() for x in ns["get_inputs"]()]
        with torch.no_grad():
            got = new(*inputs)
            want = ref(*[x.double() for x in inputs])
        torch.cuda.synchronize()
        for j, (g, w) in enumerate(zip(got, want, strict=True)):
            assert g.is_cuda and g.shape == w.shape, f"output {j}: shape {tuple(g.shape)} != {tuple(w.shape)}"
            if w.dtype == torch.int64:
                assert torch.equal(g, w), f"output {j}: {int((g != w).sum())} indices differ"
            else:
                assert g.dtype == torch.float32
                rel = ((g.double() - w).norm() / w.norm()).item()
                assert rel < tolerance, f"output {j}: relative L2 error {rel:.2e}"


@pytest.mark.parametrize("name", list(CASES))
def test_reductions_match_float64(synth: Synthesizer, name: str) -> None:  # noqa: F811
    compare_all(CASES[name], build_source(synth, CASES[name], Variant()), 1e-5)


@pytest.mark.parametrize("name", ["inner", "middle"])
def test_scalar_and_unsplit_variants_match_too(synth: Synthesizer, name: str) -> None:  # noqa: F811
    source = LARGE[f"large_{name}"]
    compare_all(source, build_source(synth, source, Variant(vec="1", split="off")), 1e-5)


def test_sums_over_a_hundred_million_elements_keep_fp32_accuracy(synth: Synthesizer) -> None:  # noqa: F811
    compare_all(ACCURACY, build_source(synth, ACCURACY, Variant()), 1e-6)
