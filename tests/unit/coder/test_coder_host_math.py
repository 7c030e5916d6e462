"""The synthesizer's host exp/tanh (stitch_runtime.h): libm's accuracy and special values, built as the CPU
back end builds them (its flags, a cloned __restrict__ loop)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.cpp_extension import load

from stitchcuda.coder.synth.cpu import CFLAGS, LDFLAGS
from stitchcuda.coder.synth.runtime import HEADER, HEADER_NAME

pytestmark = pytest.mark.slow

SOURCE = r"""
#include "stitch_runtime.h"
#include <ATen/ops/empty_like.h>
#include <torch/csrc/utils/pybind.h>
using namespace stitch;
STITCH_CPU_CLONES static void run(const float* __restrict__ x, float* __restrict__ e,
                                  float* __restrict__ t, int64_t n) {
  for (int64_t i = 0; i < n; ++i) { e[i] = st_expf(x[i]); t[i] = st_tanhf(x[i]); }
}
std::vector<at::Tensor> both(at::Tensor x) {
  auto e = at::empty_like(x), t = at::empty_like(x);
  run(x.data_ptr<float>(), e.data_ptr<float>(), t.data_ptr<float>(), x.numel());
  return {e, t};
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("both", &both); }
"""


@pytest.fixture(scope="module")
def ext(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    folder: Path = tmp_path_factory.mktemp("host_math")
    (folder / HEADER_NAME).write_text(HEADER)
    (folder / "math.cpp").write_text(SOURCE)
    return load(
        name="stitch_test_host_math",
        sources=[str(folder / "math.cpp")],
        extra_cflags=[*CFLAGS, f"-I{folder}"],
        extra_ldflags=LDFLAGS,
        build_directory=str(folder),
    )


def test_exp_and_tanh_are_as_accurate_as_libm(ext) -> None:  # type: ignore[no-untyped-def]
    x = torch.cat([torch.randn(100_000) * 4, torch.linspace(-90.0, 90.0, 20_001)])
    e, t = ext.both(x)
    x64 = x.double()
    ok = x64 < 88.0  # float32 exp overflows above ~88.7
    rel_e = (e.double() - x64.exp()).abs() / x64.exp()
    assert rel_e[ok & (x64 > -87.0)].max() < 2e-7
    assert ((t.double() - x64.tanh()).abs() / x64.tanh().abs().clamp_min(1e-30)).max() < 3e-7


def test_special_values_follow_libm(ext) -> None:  # type: ignore[no-untyped-def]
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-8, -1e-8, 200.0, -200.0])
    e, t = ext.both(x)
    torch.testing.assert_close(e, torch.exp(x), equal_nan=True, rtol=1e-6, atol=0.0)
    torch.testing.assert_close(t, torch.tanh(x), equal_nan=True, rtol=1e-6, atol=0.0)
    assert torch.isnan(t[4]) and torch.isnan(e[4])
