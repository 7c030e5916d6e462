"""The Verifier's CUDA path on a real GPU: an honest kernel passes; side-stream and timer hacks do not.

Run on the H200 device machine: `pytest tests/gpu/test_verifier_runtime_gpu.py -m gpu -q`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from stitchcuda.api.v1 import verify_pb2
from stitchcuda.shared.candidate import read_dir
from stitchcuda.shared.gpu_slots import visible_gpus
from stitchcuda.verifier.service import VerifierService
from stitchcuda.verifier.settings import VerifierSettings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

REF01 = Path(__file__).resolve().parents[2] / "benchmarks" / "problems" / "01_elementwise_chain.py"

KERNEL = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

__global__ void fused_chain_kernel(const float* __restrict__ x, float* __restrict__ out, long n,
                                   float scale, float shift, int spin) {
  long stride = (long)blockDim.x * gridDim.x;
  for (long i = blockIdx.x * (long)blockDim.x + threadIdx.x; i < n; i += stride) {
    float v = x[i];
    float y = v * scale + shift;
    float inner = 0.7978845608028654f * (y + 0.044715f * y * y * y);
    float r = 0.5f * y * (1.0f + tanhf(inner)) * v;
    for (int k = 0; k < spin; ++k) r = r * 1.0000001f / 1.0000001f;  // makes a racing side stream visible
    out[i] = r;
  }
}

torch::Tensor fused_forward(torch::Tensor x, double scale, double shift) {
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "x must be a float32 CUDA tensor");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const at::cuda::OptionalCUDAGuard guard(xc.device());
  const long n = xc.numel();
  const int threads = 256;
  const int blocks = (int)std::min<long>((n + threads - 1) / threads, 4096);
  STREAM_SETUP
  fused_chain_kernel<<<blocks, threads, 0, stream>>>(xc.data_ptr<float>(), out.data_ptr<float>(), n,
                                                     (float)scale, (float)shift, SPIN);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  STREAM_JOIN
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fused_forward", &fused_forward); }
"""

CURRENT = "cudaStream_t stream = at::cuda::getCurrentCUDAStream();"
SIDE = (
    "auto side = at::cuda::getStreamFromPool(); cudaStream_t stream = side.stream();"
    " cudaEvent_t ready; cudaEventCreateWithFlags(&ready, cudaEventDisableTiming);"
    " cudaEventRecord(ready, at::cuda::getCurrentCUDAStream()); cudaStreamWaitEvent(stream, ready, 0);"
    " cudaEventDestroy(ready);"
)
JOIN = (
    "cudaEvent_t done; cudaEventCreateWithFlags(&done, cudaEventDisableTiming); cudaEventRecord(done, stream);"
    " cudaStreamWaitEvent(at::cuda::getCurrentCUDAStream(), done, 0); cudaEventDestroy(done);"
)

MODEL_NEW = """
import torch.nn as nn
{prelude}
import {ext} as ext


class ModelNew(nn.Module):
    def __init__(self, scale, shift):
        super().__init__()
        self.scale, self.shift = float(scale), float(shift)

    def forward(self, x):
        return ext.fused_forward(x, self.scale, self.shift)
"""


def candidate_dir(
    tmp: Path, name: str, *, stream: str = CURRENT, join: str = "", spin: int = 0, prelude: str = ""
) -> Path:
    folder = tmp / name
    folder.mkdir(parents=True, exist_ok=True)
    ext = f"sc_gpu_{name}"
    source = KERNEL.replace("STREAM_SETUP", stream).replace("STREAM_JOIN", join).replace("SPIN", str(spin))
    (folder / "kernel.cu").write_text(source)
    (folder / "model_new.py").write_text(MODEL_NEW.format(prelude=prelude, ext=ext))
    manifest = {
        "extension_name": ext,
        "sources": ["kernel.cu"],
        "cflags": ["-O3"],
        "cuda_cflags": ["-O3"],
        "ldflags": [],
        "backend": "cuda",
    }
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def rejects(verdict: verify_pb2.Verdict) -> set[str]:
    return {f.rule for f in verdict.findings if f.severity == verify_pb2.SEVERITY_REJECT}


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> VerifierService:
    home = tmp_path_factory.mktemp("verifier-gpu")
    return VerifierService(
        VerifierSettings(home=home, compile_baseline=False, ncu="off", reference_reuse=100)
    )


def test_honest_cuda_candidate_is_accepted(service: VerifierService, tmp_path: Path) -> None:
    verdict = service.verify_dir(REF01, candidate_dir(tmp_path, "honest"), device="cuda")
    assert verdict.accepted, verdict.feedback
    assert verdict.compiled and verdict.correct
    assert verdict.custom_kernel_share >= 0.5, verdict.feedback
    assert any(k.origin == "custom" and "fused_chain_kernel" in k.name for k in verdict.profile.kernels)
    assert verdict.timing.median_ms > 0 and verdict.timing.wall_median_ms > 0
    assert verdict.environment.device_name and verdict.environment.cuda_version
    print(verdict.feedback)


def test_joined_side_stream_is_legitimate(service: VerifierService, tmp_path: Path) -> None:
    verdict = service.verify_dir(
        REF01, candidate_dir(tmp_path, "joined", stream=SIDE, join=JOIN), device="cuda"
    )
    assert verdict.accepted, verdict.feedback
    assert "D6.unjoined-stream" not in rejects(verdict)


def test_unjoined_side_stream_is_rejected(service: VerifierService, tmp_path: Path) -> None:
    verdict = service.verify_dir(
        REF01, candidate_dir(tmp_path, "sidestream", stream=SIDE, spin=5000), device="cuda"
    )
    assert not verdict.accepted, verdict.feedback
    assert rejects(verdict) & {"D6.unjoined-stream", "D7.clock-disagree", "D3.mismatch"}, verdict.feedback


def test_patched_cuda_timer_is_rejected(service: VerifierService, tmp_path: Path) -> None:
    prelude = "import torch\ntorch.cuda.Event.elapsed_time = lambda self, end: 0.0001\n"
    verdict = service.verify_dir(REF01, candidate_dir(tmp_path, "timerpatch", prelude=prelude), device="cuda")
    assert not verdict.accepted, verdict.feedback
    assert rejects(verdict) & {"D8.function-replaced", "D8.patch"}, verdict.feedback
    # The verifier timed with its own saved function: the patched one did not shrink the time.
    assert verdict.timing.median_ms > 0.001


def test_same_build_is_reused(service: VerifierService, tmp_path: Path) -> None:
    cand = read_dir(candidate_dir(tmp_path, "honest"))
    first = service.build(cand, device="cuda")
    again = service.build(cand, device="cuda")
    assert first.ok and again.ok and again.cached


def test_timings_wait_for_the_gpu_alone(tmp_path: Path) -> None:
    """Another process working on the GPU (holding the node's turn shared) holds the verification's timings
    back, never its work: the reference waits for the device alone before it times eager, and the verdict
    comes once the other work is done."""
    slots = tmp_path / "slots"
    gpu = visible_gpus()[0]
    hold_s = 12.0
    code = (
        "import sys, time; from stitchcuda.verifier.harness import turns; "
        "t = turns.Turns.at(sys.argv[1], sys.argv[2]); t.take(turns.SHARED); print('held', flush=True); "
        "time.sleep(float(sys.argv[3]))"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(slots), gpu, str(hold_s)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        svc = VerifierService(
            VerifierSettings(home=tmp_path / "home", compile_baseline=False, ncu="off", gpu_slot_dir=slots)
        )
        verdict = svc.verify_dir(REF01, candidate_dir(tmp_path, "turned"), device="cuda")
        waited = time.monotonic() - started
    finally:
        holder.kill()
    assert verdict.accepted, verdict.feedback
    assert waited >= hold_s - 2.0, f"the verification finished in {waited:.1f} s beside another's GPU work"
    assert holder.wait(10) is not None
