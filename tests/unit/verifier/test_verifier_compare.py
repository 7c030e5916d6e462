"""D3 comparisons in the parent: tolerance from the fp32 reference's error, NaN rules, null models."""

from __future__ import annotations

import pytest
import torch

from stitchcuda.verifier import compare


def _input(seed, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).float()


def _refs(fn, seeds=(1, 2, 3), shape=(64, 128)):
    """(fp32 outputs, fp64 outputs) of fn on seeded inputs, like the reference runner makes them."""
    return [([fn(_input(s, shape))], [fn(_input(s, shape).double())]) for s in seeds]


def _tols(refs, precision=""):
    return compare.tolerances(refs, floor=1e-5, max_floor=1e-4, factor=10.0, precision=precision)


def test_tolerance_derives_from_fp32_error_and_honest_fp32_passes():
    refs = _refs(lambda x: torch.tanh(x) * x)
    tols = _tols(refs)
    assert tols[0].rel_l2 == 1e-5  # fp32 error is ~1e-8: the floor decides
    ref32, ref64 = refs[0]
    # An honest float32 kernel computing in another order: different rounding, still passes.
    x = _input(1, (64, 128))
    candidate = [x * torch.tanh(x) + 0.0]
    assert compare.check_set(candidate, ref32, ref64, tols).ok


def test_a_float32_target_without_a_float64_twin_widens_the_floors():
    # A random reference has no float64 twin: the target carries float32 error of its own.
    refs = [(r32, None) for r32, _ in _refs(lambda x: torch.tanh(x) * x)]
    tols = _tols(refs)
    assert tols[0].rel_l2 == pytest.approx(1e-4) and tols[0].rel_max == pytest.approx(1e-3)
    # ... and a wrong program is still far outside them.
    x = _input(1, (64, 128))
    assert not compare.check_set([torch.tanh(x) * x * (1 + 1e-3)], refs[0][0], None, tols).ok
    assert compare.check_set([torch.tanh(x) * x * (1 + 5e-5)], refs[0][0], None, tols).ok
    # A summary of a large output says whether its error was measured against float64.
    summary = {"kind": compare.sketch.MARK, "err_l2": 0.0, "err_max": 0.0, "measured": False}
    assert _tols([([summary], None)])[0].rel_l2 == pytest.approx(1e-4)
    assert _tols([([dict(summary, measured=True)], None)])[0].rel_l2 == 1e-5


def test_precision_downgrade_is_caught_but_allowed_when_declared():
    refs = _refs(lambda x: x @ x.T)
    ref32, ref64 = refs[0]
    x32 = _input(1, (64, 128))
    downgraded = [(x32.bfloat16() @ x32.bfloat16().T).float()]
    check = compare.check_set(downgraded, ref32, ref64, _tols(refs))
    assert not check.ok and check.worst.rule == "D3.mismatch"
    assert compare.check_set(downgraded, ref32, ref64, _tols(refs, precision="bf16")).ok


def test_nan_where_reference_is_finite_fails_even_with_huge_tolerance():
    refs = _refs(torch.sin)
    ref32, ref64 = refs[0]
    bad = ref32[0].clone()
    bad[3, 7] = float("nan")
    loose = [compare.Tolerance(1e9, 1e9, 0.0, 0.0)]
    check = compare.check_set([bad], ref32, ref64, loose)
    assert not check.ok
    assert check.worst.rule == "D3.nonfinite"
    all_nan = [torch.full_like(ref32[0], float("nan"))]
    assert not compare.check_set(all_nan, ref32, ref64, loose).ok


def test_nan_must_match_reference_nan():
    x = torch.tensor([1.0, -1.0, 4.0])
    ref32 = [torch.sqrt(x)]
    ref64 = [torch.sqrt(x.double())]
    tols = [compare.Tolerance(1e-5, 1e-4, 0.0, 0.0)]
    assert compare.check_set([torch.sqrt(x)], ref32, ref64, tols).ok
    assert not compare.check_set([torch.tensor([1.0, 0.0, 2.0])], ref32, ref64, tols).ok


def test_dtype_shape_and_structure_must_match_exactly():
    refs = _refs(torch.cos)
    ref32, ref64 = refs[0]
    tols = _tols(refs)
    assert compare.check_set([ref32[0].double()], ref32, ref64, tols).worst.rule == "D3.dtype"
    assert compare.check_set([ref32[0].reshape(-1)], ref32, ref64, tols).worst.rule == "D3.shape"
    assert compare.check_set([ref32[0], ref32[0]], ref32, ref64, tols).worst.rule == "D3.structure"


def test_tiny_magnitude_outputs_judged_relatively():
    # softmax over wide rows: every value is ~1e-5, far below any absolute tolerance.
    refs = _refs(lambda x: torch.softmax(x, dim=-1), shape=(4, 65536))
    ref32, ref64 = refs[0]
    tols = _tols(refs)
    assert compare.check_set([ref32[0].clone()], ref32, ref64, tols).ok
    assert not compare.check_set([torch.zeros_like(ref32[0])], ref32, ref64, tols).ok
    wrong = ref32[0] * 4  # the missing cross-block combine of VERIFIER_THREATS row 11
    assert not compare.check_set([wrong], ref32, ref64, tols).ok


def test_single_element_change_is_caught():
    refs = _refs(torch.tanh, shape=(512, 512))
    ref32, ref64 = refs[0]
    stale = ref32[0].clone()
    stale[100, 200] += 0.5
    assert not compare.check_set([stale], ref32, ref64, _tols(refs)).ok


def test_null_model_flags_constant_and_input_independent_references():
    refs = _refs(lambda x: torch.softmax(x, dim=-1).mean(dim=-1, keepdim=True))
    warnings = compare.null_model_warnings(refs, _tols(refs))
    assert any("constant" in w for w in warnings)
    assert any("same output for different inputs" in w for w in warnings)
    assert compare.null_model_warnings(_refs(torch.sin), _tols(_refs(torch.sin))) == []


def test_identical_outputs_detects_input_independent_candidates():
    t = torch.ones(3)
    assert compare.identical_outputs([[t], [t.clone()], [t.clone()]])
    assert not compare.identical_outputs([[t], [t + 1]])


def test_integer_outputs_compare_exactly():
    ref = [torch.tensor([1, 2, 3])]
    tols = [compare.Tolerance(1.0, 1.0, 0.0, 0.0)]
    assert compare.check_set([torch.tensor([1, 2, 3])], ref, None, tols).ok
    assert not compare.check_set([torch.tensor([1, 2, 4])], ref, None, tols).ok


def whole_array_errors(candidate: torch.Tensor, target: torch.Tensor) -> tuple[float, float, float]:
    """The definition, in one float64 pass over finite positions (what the chunked version must equal)."""
    c, t = candidate.double().reshape(-1), target.double().reshape(-1)
    keep = torch.isfinite(c) & torch.isfinite(t)
    c, t = c[keep], t[keep]
    diff = (c - t).abs()
    max_abs = float(diff.max())
    return float(diff.norm() / t.norm()), max_abs / float(t.abs().max()), max_abs


def test_errors_over_chunks_equal_the_whole_array_definition():
    torch.manual_seed(3)
    n = 3 * compare.ERROR_CHUNK + 1234  # a partial last chunk
    target = torch.randn(n, dtype=torch.float64) * torch.logspace(-3, 3, n, dtype=torch.float64)
    candidate = (target + 1e-6 * torch.randn(n, dtype=torch.float64)).float()
    # Non-finite values on both sides of chunk boundaries are left out, as in the whole-array definition.
    for i in (compare.ERROR_CHUNK - 1, compare.ERROR_CHUNK, 2 * compare.ERROR_CHUNK + 7):
        candidate[i] = float("nan")
    target[5] = float("inf")
    candidate[n - 1] = 1e3  # the worst element, in the last partial chunk
    got, want = compare.errors(candidate, target), whole_array_errors(candidate, target)
    for g, w in zip(got, want, strict=True):
        assert abs(g - w) <= 1e-12 * max(abs(w), 1e-30), (got, want)
    # A float64 candidate is the caller's tensor: the check must not change it.
    before = target.clone()
    compare.errors(target, target * (1 + 1e-9))
    assert torch.equal(target, before)


def test_all_finite_is_exact_where_the_fast_sum_cannot_tell():
    assert compare.all_finite(torch.randn(1000))
    assert not compare.all_finite(torch.tensor([1.0, float("nan")]))
    assert not compare.all_finite(torch.tensor([float("inf"), -float("inf")]))  # the sum is NaN
    assert not compare.all_finite(torch.tensor([1.0, float("inf")], dtype=torch.float64))
    # Finite values whose float64 sum overflows: the exact test decides.
    assert compare.all_finite(torch.tensor([1.7e308, 1.7e308], dtype=torch.float64))
    assert compare.all_finite(torch.tensor([3.0e38, 3.0e38]))  # float32 values summed in float64
    assert compare.all_finite(torch.tensor([1, 2, 3]))
    assert not compare.all_finite(torch.tensor([complex(1.0, float("nan"))]))
