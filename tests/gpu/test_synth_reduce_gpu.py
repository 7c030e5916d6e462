"""The synthesizer's CUDA reductions on a GPU: every reduction kind along the innermost, middle and outermost
dims, over several dims and over everything, at odd sizes (tile edges, scalar paths) and at sizes that take the
block-split and grid-wide paths, each output within 1e-5 (relative L2) of a float64 evaluation, indices exact;
and sums over 10^8 elements within 1e-6."""

from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import Future, ProcessPoolExecutor, wait
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "coder"))

from reduce_problems import KINDS, POOLING, SMALL, layouts, problem  # noqa: E402

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
# Rows enough for a warp per row (rows >= 64 per SM): odd rows (scalar loads), rows a warp caches, longer ones.
MANY_ROWS = {
    f"many_rows_{shape}": problem("(" + KINDS.format(d=-1) + ")", f"[torch.randn{shape}]")
    for shape in ("(300, 31, 33)", "(100, 90, 256)", "(100, 90, 516)")
}
# Normalizations whose mean and variance take one pass (sums of x and x^2 in double), on data far from zero:
# a LayerNorm over 65536 positions of 4 rows (grid-wide passes), a GroupNorm (a block per group), a LayerNorm
# over rows of 300 (a warp per row).
NORMS = (
    "import torch\nimport torch.nn as nn\n\n"
    "class Model(nn.Module):\n"
    "    def __init__(self):\n        super().__init__()\n"
    "        self.ln = nn.LayerNorm((64, 32, 32))\n        self.gn = nn.GroupNorm(4, 64)\n"
    "        self.rows = nn.LayerNorm(300)\n\n"
    "    def forward(self, x, y):\n        return self.ln(x), self.gn(x), self.rows(y)\n\n"
    "def get_inputs():\n    return [torch.randn(4, 64, 32, 32) * 3 + 100, torch.randn(9000, 300) - 50]\n\n"
    "def get_init_inputs():\n    return []\n"
)
CASES = {**SMALL, **LARGE, **ALIGNED, **MANY_ROWS, "norms": NORMS, "pooling": POOLING}

# 10^8 positive elements: a float accumulator over them drifts by ~1e-3 relative (the Frobenius-norm bug).
ACCURACY = problem(
    "(torch.sum(x), torch.mean(x, 0), torch.sum(x, 1), x / torch.norm(x), torch.sum(x.view(100, -1), 0))",
    "[torch.rand(10000, 10001) + 1]",
)


def build_job(source: str, variant: Variant) -> dict[str, Any]:
    """Worker process: synthesizes and builds one program as test_synth_gpu.build does; returns the load()
    arguments (a second load() in the test process finds the build up to date) and model_new.py."""
    from torch.utils.cpp_extension import load

    synthesis = Synthesizer(in_process=True).synthesize(source, None, variant=variant, device="cuda")
    ext_name = synthesis.build.extension_name
    root = (
        Path(os.environ.get("STITCH_TEST_BUILD_DIR", Path.home() / ".cache" / "stitchcuda-tests")) / ext_name
    )
    root.mkdir(parents=True, exist_ok=True)
    for path, content in synthesis.files.items():
        (root / path).write_text(content)
    spec = {
        "name": ext_name,
        "sources": [str(root / s) for s in synthesis.build.sources],
        "extra_cflags": list(synthesis.build.cflags),
        "extra_cuda_cflags": list(synthesis.build.cuda_cflags),
        "extra_ldflags": list(synthesis.build.ldflags),
        "build_directory": str(root),
    }
    load(**spec)
    return {"load": spec, "model_new": synthesis.files["model_new.py"]}


# Softmax rows with -inf (masked), all -inf, NaN and +inf entries: a warp per row (9000 rows of 300) and a
# block per row (64 rows of 1000); the program must match torch's own result, NaNs included. (logsumexp is
# left out: torch masks an infinite maximum to 0 there, which the synthesizer's lowering does not.)
SPECIAL = {
    shape: problem(
        "(torch.softmax(x, -1), torch.log_softmax(x, -1), torch.logsumexp(x, -1))", f"[torch.randn{shape}]"
    )
    for shape in ("(9000, 300)", "(64, 1000)")
}

JOBS = {
    **{(name, "default"): (source, Variant()) for name, source in CASES.items()},
    **{
        (f"large_{name}", "scalar_unsplit"): (LARGE[f"large_{name}"], Variant(vec="1", split="off"))
        for name in ("inner", "middle")
    },
    ("accuracy", "default"): (ACCURACY, Variant()),
    **{(f"special_{shape}", "default"): (source, Variant()) for shape, source in SPECIAL.items()},
}


@pytest.fixture(scope="module")
def programs() -> dict[tuple[str, str], Future[dict[str, Any]]]:
    """Every program of this module, built in parallel worker processes (spawned: no CUDA context)."""
    workers = max(2, (os.cpu_count() or 4) // 2)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {key: pool.submit(build_job, *job) for key, job in JOBS.items()}
        wait(list(futures.values()))
    return futures


def built(programs: dict[tuple[str, str], Future[dict[str, Any]]], key: tuple[str, str]) -> str:
    from torch.utils.cpp_extension import load

    result = programs[key].result()  # a failed synthesis or build raises here, in its own test
    sys.modules[result["load"]["name"]] = load(**result["load"])
    return str(result["model_new"])


def compare_all(source: str, model_new: str, tolerance: float) -> None:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(source, "reference.py", "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(model_new, "model_new.py", "exec"), mn)
    torch.manual_seed(0)
    ref = ns["Model"]().cuda().double()
    torch.manual_seed(0)
    new = mn["ModelNew"]().cuda()
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
def test_reductions_match_float64(programs: dict[tuple[str, str], Any], name: str) -> None:
    compare_all(CASES[name], built(programs, (name, "default")), 1e-5)


@pytest.mark.parametrize("name", ["inner", "middle"])
def test_scalar_and_unsplit_variants_match_too(programs: dict[tuple[str, str], Any], name: str) -> None:
    source = LARGE[f"large_{name}"]
    compare_all(source, built(programs, (f"large_{name}", "scalar_unsplit")), 1e-5)


def test_sums_over_a_hundred_million_elements_keep_fp32_accuracy(
    programs: dict[tuple[str, str], Any],
) -> None:
    compare_all(ACCURACY, built(programs, ("accuracy", "default")), 1e-6)


@pytest.mark.parametrize("shape", list(SPECIAL))
def test_softmax_rows_with_infinities_and_nan_match_torch(
    programs: dict[tuple[str, str], Any], shape: str
) -> None:
    ns: dict[str, Any] = {"__name__": "reference"}
    exec(compile(SPECIAL[shape], "reference.py", "exec"), ns)
    mn: dict[str, Any] = {"__name__": "model_new"}
    exec(compile(built(programs, (f"special_{shape}", "default")), "model_new.py", "exec"), mn)
    torch.manual_seed(41)
    (x,) = [t.cuda() for t in ns["get_inputs"]()]
    half = x.shape[1] // 2
    x[0, :half] = -torch.inf  # a masked half
    x[1] = -torch.inf  # all masked: NaN in torch
    x[2, 7] = torch.nan
    x[3, 5] = torch.inf
    x[4, 3:] = -torch.inf  # one finite element left
    with torch.no_grad():
        got, want = mn["ModelNew"]().cuda()(x), ns["Model"]().cuda()(x)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6, equal_nan=True)
