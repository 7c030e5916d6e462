"""Large problems: outputs checked against summaries of their float64 ground truth, input sets made again
by the candidate's runner. The summary check must pass honest float32 results and catch the wrong ones a
whole-tensor check catches: a zeroed region the sample misses, a sign flip, a wrong tail, a NaN."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from verifier_support import FIXTURES, REF01, fast_settings, rejects, variant

from stitchcuda.api.v1 import plan_pb2
from stitchcuda.shared.artifacts import LocalArtifactStore
from stitchcuda.shared.candidate import read_dir
from stitchcuda.verifier import compare
from stitchcuda.verifier.harness import sketch
from stitchcuda.verifier.sandbox import Outcome, Sandbox
from stitchcuda.verifier.service import VerifierService

SPEC = {"samples": 1024, "blocks": 256, "edge": 64, "seed": 12345}


def reference(shape: tuple[int, ...] = (300, 1000)) -> tuple[torch.Tensor, dict, compare.Tolerance]:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ref32 = torch.nn.functional.gelu(x * 1.5 + 0.25, approximate="tanh") * x
    ref64 = torch.nn.functional.gelu(x.double() * 1.5 + 0.25, approximate="tanh") * x.double()
    summary = sketch.reference_summary(ref32, ref64, SPEC)
    tol = compare.tolerances([([summary], [None])], floor=1e-5, max_floor=1e-4, factor=10.0)[0]
    return ref32, summary, tol


def reduced(c: torch.Tensor, summary: dict) -> dict:
    return sketch.summarize(c, summary["idx"], len(summary["block_norms"]), len(summary["head"]))


def check(c: torch.Tensor, summary: dict, tol: compare.Tolerance) -> compare.OutputCheck:
    return compare.check_output(reduced(c, summary), summary, None, tol)


def test_honest_float32_results_pass_and_the_tolerance_comes_from_the_exact_error() -> None:
    ref32, summary, tol = reference()
    assert 0 < summary["err_l2"] < 1e-6 and tol.rel_l2 == 1e-5
    assert check(ref32, summary, tol).ok
    # a different but honest float32 evaluation order (rounding noise) passes too
    noisy = ref32 * (1 + 1e-7 * torch.randn(ref32.shape, generator=torch.Generator().manual_seed(1)))
    assert check(noisy, summary, tol).ok


def test_a_summary_keeps_no_storage_beyond_its_own_values() -> None:
    """A summary is sent, stored and kept per input set: a view into the float64 target would carry the
    whole target with it (the head and tail of a 128 MB output once made each set's frame 480 MB)."""
    ref32, summary, _ = reference()
    reduced_copy = reduced(ref32.double(), summary)
    for s in (summary, reduced_copy):
        for key in ("samples", "head", "tail", "block_norms", "idx", "samples32"):
            if key not in s:
                continue
            t = s[key]
            assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), key


def test_a_zeroed_region_no_sample_hits_is_caught_by_the_block_norms() -> None:
    ref32, summary, tol = reference()
    idx = summary["idx"]
    gaps = idx[1:] - idx[:-1]
    start = int(idx[int(torch.argmax(gaps))]) + 1
    length = int(gaps.max()) - 1
    assert length >= 500  # 1024 samples over 300k elements leave gaps this wide
    wrong = ref32.clone().reshape(-1)
    wrong[start : start + length] = 0.0
    result = check(wrong.reshape(ref32.shape), summary, tol)
    assert not result.ok and result.rule == "D3.mismatch"
    assert result.stats["sampled_rel_l2"] <= tol.rel_l2 < result.stats["block_energy_rel_l2"]
    assert "blocks" in result.detail


@pytest.mark.parametrize(
    ("name", "wrong", "rule"),
    [
        ("sign flip of a quarter", lambda t: torch.cat([-t[:75], t[75:]]), "D3.mismatch"),
        ("wrong last elements", lambda t: t.reshape(-1).index_fill(0, torch.arange(299_990, 300_000), 7.0).reshape(t.shape), "D3.mismatch"),
        ("a NaN", lambda t: t.reshape(-1).index_fill(0, torch.tensor([5]), float("nan")).reshape(t.shape), "D3.nonfinite"),
        ("flattened", lambda t: t.reshape(-1), "D3.shape"),
        ("float64", lambda t: t.double(), "D3.dtype"),
    ],
)  # fmt: skip
def test_wrong_outputs_are_rejected(name: str, wrong, rule: str) -> None:
    ref32, summary, tol = reference()
    result = check(wrong(ref32), summary, tol)
    assert not result.ok and result.rule == rule, (name, result)


def test_a_candidate_output_of_another_size_stays_whole_and_fails_on_shape() -> None:
    ref32, summary, tol = reference()
    result = compare.check_output(ref32[:10], summary, None, tol)
    assert not result.ok and result.rule == "D3.shape"


def test_constant_outputs_across_sets_are_seen_on_summaries() -> None:
    ref32, summary, _ = reference()
    a, b = reduced(ref32, summary), reduced(ref32.clone(), summary)
    assert compare.identical_outputs([[a], [b]])
    assert not compare.identical_outputs([[a], [reduced(ref32 * 2, summary)]])


LARGE_REF = REF01.read_text().replace("(256, 1024)", "(1024, 2048)")
LARGE_PLAN = plan_pb2.Plan(
    input_bytes=1024 * 2048 * 4,
    outputs=[plan_pb2.TensorSpec(name="out", shape=[1024, 2048], dtype="float32")],
)


@pytest.mark.slow
def test_a_large_problem_verifies_on_summaries_and_remade_inputs(
    tmp_path: Path, build_store: LocalArtifactStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Thresholds small enough that this 8 MiB problem is "large": what a 6 GiB one does on a GPU host,
    # its outputs coming back as sealed memory files.
    settings = fast_settings(
        tmp_path,
        standby=False,
        summary_min_numel=1 << 20,
        summary_samples=1 << 14,
        regen_input_mb=4,
        shared_memory_min_mb=1,
    )
    shared: list[int] = []
    finish = Sandbox.finish

    def counted(self: Sandbox, *args: object, **kwargs: object) -> Outcome:
        outcome = finish(self, *args, **kwargs)  # type: ignore[arg-type]
        shared.append(outcome.shared_bytes)
        return outcome

    monkeypatch.setattr(Sandbox, "finish", counted)
    service = VerifierService(settings, artifacts=build_store)
    try:
        verdict = service.verify(LARGE_REF, read_dir(FIXTURES / "honest_cpu"), device="cpu", plan=LARGE_PLAN)
        assert verdict.accepted, verdict.feedback
        assert not rejects(verdict)
        # every recorded output (8 MiB each) came over shared memory, none through the pipe
        assert max(shared) >= 6 * 1024 * 2048 * 4, shared
        _entry, ref = next(iter(service._refs.values()))
        assert all(data.inputs is None and sketch.is_summary(data.ref32[0]) for data in ref.sets.values())
        names = {t.name for t in verdict.correctness.trials}
        assert {"trial0", "trial1", "refill", "perturb", "shift", "late"} <= names
        # the wrong answer of the whole-tensor tests is as wrong on a summary
        wrong = variant(
            tmp_path,
            "import torch.nn as nn\nimport sc_test_elementwise as ext\n\n\n"
            "class ModelNew(nn.Module):\n"
            "    def __init__(self, scale, shift):\n"
            "        super().__init__()\n"
            "        self.scale, self.shift = float(scale), float(shift)\n\n"
            "    def forward(self, x):\n"
            "        out = ext.fused_forward(x, self.scale, self.shift)\n"
            "        out[-1, -8:] = 0.0\n"
            "        return out\n",
        )
        bad = service.verify(LARGE_REF, read_dir(wrong), device="cpu", plan=LARGE_PLAN)
        assert not bad.accepted and bad.reason.startswith("D3.mismatch"), bad.reason
        assert "sampled elements" in bad.reason
    finally:
        service.close()


def test_the_fast_float32_summary_matches_the_exact_float64_one() -> None:
    """Summaries of float32 outputs take float32 partial norms (the parent summarises GiBs per
    verification): block norms within 1e-7 of the float64 ones, peak and samples exact, and any
    non-finite value (or a square that overflows float32) sends its block down the exact path."""
    gen = torch.Generator().manual_seed(3)
    c = torch.randn(64 * 5000 + 77, generator=gen).exp()  # blocks of 5000: whole pieces and a remainder
    c[1234] = 3e20  # finite, but its float32 square overflows
    c[200_000] = float("nan")
    c[300_000] = float("-inf")
    idx = sketch.positions(c.numel(), 512, 9)
    fast = sketch.summarize(c, idx, 64, 32)
    exact = sketch.summarize(c.double(), idx, 64, 32)
    finite = torch.isfinite(exact["block_norms"])
    assert bool(finite.all())
    rel = (fast["block_norms"] - exact["block_norms"]).abs() / exact["block_norms"]
    assert float(rel.max()) < 1e-7
    assert fast["peak"] == exact["peak"] == pytest.approx(3e20)
    assert (fast["nan"], fast["posinf"], fast["neginf"]) == (1, 0, 1)
    assert torch.equal(fast["samples"].nan_to_num(), exact["samples"].nan_to_num())
