"""KernelBench's fast_p and the geometric mean as `stitchcuda bench` scores them, and the report's plots."""

import math

import pytest

from stitchcuda.bench import discover, fast_p, geomean, level_of, summary_by_level
from stitchcuda.bench_report import distribution_svg, fast_p_svg
from stitchcuda.shared.errors import InvalidRequest


def row(level, verified, eager=None, compile_=None):
    return {
        "level": level,
        "verified": verified,
        "speedup_vs_eager": eager,
        "speedup_vs_compile": compile_,
        "wall_s": 1.0,
    }


ROWS = [
    row("level1", True, 2.5, 1.2),
    row("level1", True, 0.9, 0.0),  # torch.compile not timed
    row("level1", False),
    row("level2", True, 1.5, 0.5),
]


def test_fast_p_counts_all_problems_in_the_denominator():
    assert fast_p(ROWS, "eager", 0) == 3 / 4  # fast_0 is the verified rate
    assert fast_p(ROWS, "eager", 0.8) == 3 / 4
    assert fast_p(ROWS, "eager", 1) == 2 / 4
    assert fast_p(ROWS, "eager", 1.5) == 1 / 4  # strictly faster: 1.5x is not > 1.5
    assert fast_p(ROWS, "eager", 2) == 1 / 4
    assert fast_p([], "eager", 1) == 0.0


def test_an_unmeasured_baseline_is_not_faster_but_still_correct():
    assert fast_p(ROWS, "compile", 0) == 3 / 4
    assert fast_p(ROWS, "compile", 0.4) == 2 / 4
    assert fast_p(ROWS, "compile", 1) == 1 / 4


def test_geomean_leaves_out_unmeasured_values():
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert geomean([2.0, 0.0, None]) == pytest.approx(2.0)
    assert geomean([]) == 0.0


def test_summary_per_level_and_overall():
    s = summary_by_level(ROWS)
    assert set(s["levels"]) == {"level1", "level2"}
    lv1 = s["levels"]["level1"]
    assert (lv1["problems"], lv1["verified"]) == (3, 2)
    assert lv1["fast_p"]["eager"]["1"] == pytest.approx(1 / 3)
    assert lv1["geomean_vs_eager"] == pytest.approx(math.sqrt(2.5 * 0.9))
    assert lv1["geomean_vs_compile"] == pytest.approx(1.2)
    assert s["overall"]["verified_rate"] == 3 / 4
    assert s["overall"]["geomean_vs_eager"] == pytest.approx((2.5 * 0.9 * 1.5) ** (1 / 3))


def test_plots_are_inline_svg():
    dist, curves = str(distribution_svg(ROWS)), str(fast_p_svg(ROWS))
    assert dist.startswith("<svg") and dist.count('class="bar-eager"') == 8
    assert curves.startswith("<svg") and 'class="curve-compile"' in curves


def test_levels_come_from_folder_names(tmp_path):
    for rel in ("level1/a.py", "level2/b.py", "c.py", "level1/__init__.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    tasks = discover(tmp_path, "**/*.py")
    assert [(t.level, t.name) for t in tasks] == [("level1", "a"), ("level2", "b"), ("suite", "c")]
    assert level_of(tmp_path / "level2" / "b.py", tmp_path / "level2") == "level2"
    assert [t.name for t in discover(tmp_path, "level*/*.py", limit=1)] == ["a"]
    with pytest.raises(InvalidRequest):
        discover(tmp_path / "missing", "*.py")
    with pytest.raises(InvalidRequest):
        discover(tmp_path, "*.txt")


def test_workers_at_once_share_the_cores_unless_the_user_says_otherwise():
    from stitchcuda.bench import worker_env

    assert worker_env(4, {"PATH": "/bin"}, 16) == {"PATH": "/bin", "OMP_NUM_THREADS": "4"}
    assert worker_env(3, {}, 2)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in worker_env(1, {}, 16)
    assert worker_env(4, {"OMP_NUM_THREADS": "8"}, 16)["OMP_NUM_THREADS"] == "8"
