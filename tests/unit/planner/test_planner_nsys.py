"""The nsys adapter: its CSV summary parsed per forward, and a clean skip where nsys is absent."""

from __future__ import annotations

import pytest
from planner_support import fast_settings

from stitchcuda.planner import nsys
from stitchcuda.planner.runner import ReferenceRunner

CSV = """\
Generating SQLite file timeline.sqlite from timeline.nsys-rep
Processing [timeline.sqlite] with [cuda_gpu_kern_sum.py]...
Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name
80.0,8000000,40,200000.0,200000.0,190000,210000,100.0,"ampere_sgemm_128x64_tn"
20.0,2000000,40,50000.0,50000.0,49000,51000,10.0,"void at::native::vectorized_elementwise_kernel<4, relu>(int, T1, T2)"
"""


def test_kernel_summary_is_per_forward() -> None:
    kernels = nsys.parse_kernel_summary(CSV, iters=20)
    assert [k.name for k in kernels] == [
        "ampere_sgemm_128x64_tn",
        "void at::native::vectorized_elementwise_kernel<4, relu>(int, T1, T2)",
    ]
    assert kernels[0].ms == pytest.approx(0.4) and kernels[0].calls == 2.0
    assert nsys.parse_kernel_summary("no table here", iters=1) == []


def test_missing_nsys_is_a_note_not_a_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsys.shutil, "which", lambda name: None)
    settings = fast_settings(nsys_enabled=True)
    profiler = nsys.NsysProfiler(settings, ReferenceRunner(settings))
    summary = profiler.summarise("irrelevant", "cuda")
    assert summary.kernels == [] and summary.warning == ""
    assert "not installed" in summary.note
    assert profiler.summarise("irrelevant", "cpu").note == ""
