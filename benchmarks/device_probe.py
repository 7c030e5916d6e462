"""Probes a GPU machine for what the Verifier relies on: toolchain, sandbox, profilers and device ceilings."""

import json
import os
import shutil
import subprocess
import sys
import time

import torch


def run(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        return (out.stdout + out.stderr).strip()[:400]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"failed: {exc}"


def ceilings() -> dict[str, float]:
    dev = torch.device("cuda")
    n = 1 << 28  # 1 GiB of float32
    a = torch.randn(n, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    copy_s = start.elapsed_time(end) / 1000 / 20
    result = {"copy_gbs": 2 * a.numel() * 4 / copy_s / 1e9}
    for name, dtype, tf32 in (
        ("fp32", torch.float32, False),
        ("tf32", torch.float32, True),
        ("bf16", torch.bfloat16, False),
    ):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        m = 8192
        x = torch.randn(m, m, device=dev, dtype=dtype)
        y = torch.randn(m, m, device=dev, dtype=dtype)
        for _ in range(3):
            x @ y
        torch.cuda.synchronize()
        start.record()
        for _ in range(10):
            x @ y
        end.record()
        torch.cuda.synchronize()
        result[f"matmul_{name}_tflops"] = 2 * m**3 / (start.elapsed_time(end) / 1000 / 10) / 1e12
    torch.backends.cuda.matmul.allow_tf32 = False
    return result


def main() -> None:
    info = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "nvcc": run(["nvcc", "--version"]).splitlines()[-1:],
        "ncu": run(["ncu", "--version"]).splitlines()[-1:] if shutil.which("ncu") else "absent",
        "compute-sanitizer": bool(shutil.which("compute-sanitizer")),
        "bwrap": shutil.which("bwrap") or "absent",
        "kernel": os.uname().release,
        "nproc": os.cpu_count(),
    }
    deb = next((f for f in os.listdir(".whl/deb")), None) if os.path.isdir(".whl/deb") else None
    if deb:
        subprocess.run(["dpkg", "-x", f".whl/deb/{deb}", "/tmp/bw"], check=False)
        bw = "/tmp/bw/usr/bin/bwrap"
        info["carried_bwrap"] = (
            run([bw, "--unshare-net", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "true"])
            or "ok"
        )
    from torch.utils.cpp_extension import load_inline

    t0 = time.time()
    cuda_src = """
    __global__ void add1(const float* x, float* y, int n) {
      int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i] + 1.f; }
    torch::Tensor add_one(torch::Tensor x) { auto y = torch::empty_like(x); int n = x.numel();
      add1<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n); return y; }
    """
    ext = load_inline(
        name="probe_ext",
        cpp_sources="torch::Tensor add_one(torch::Tensor x);",
        cuda_sources=cuda_src,
        functions=["add_one"],
        extra_cuda_cflags=["-O3", "-gencode=arch=compute_90,code=sm_90"],
        build_directory=None,
        verbose=False,
    )
    info["cuda_ext_build_s"] = round(time.time() - t0, 1)
    x = torch.randn(1000, device="cuda")
    info["cuda_ext_ok"] = bool(torch.equal(ext.add_one(x), x + 1))
    info.update(ceilings())
    print(json.dumps(info, indent=2))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "device_probe.json"), "w") as fh:
            json.dump(info, fh, indent=2)


if __name__ == "__main__":
    main()
