"""Row 26 in Triton: the GEMM rounds its fp32 operands to TF32 in tl.dot (input_precision="tf32")."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BM": 64, "BN": 64, "BK": 32}, num_warps=4, num_stages=3),
        triton.Config({"BM": 128, "BN": 64, "BK": 32}, num_warps=8, num_stages=3),
        triton.Config({"BM": 32, "BN": 64, "BK": 32}, num_warps=4, num_stages=2),
    ],
    key=["M", "N", "K"],
)
@triton.jit
def gemm_bias_relu_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
    sxm, sxk, swn, swk, som, son,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + rk
        a = tl.load(x_ptr + rm[:, None] * sxm + ks[None, :] * sxk, mask=(rm[:, None] < M) & (ks[None, :] < K), other=0.0)
        # The weight is (N, K): its transpose is read in place.
        b = tl.load(w_ptr + ks[:, None] * swk + rn[None, :] * swn, mask=(ks[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="tf32")
    bias = tl.load(b_ptr + rn, mask=rn < N, other=0.0)
    acc = tl.maximum(acc + bias[None, :], 0.0)
    tl.store(out_ptr + rm[:, None] * som + rn[None, :] * son, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.linear.weight, self.linear.bias
        m, k = x.shape
        n = w.shape[0]
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)

        def grid(meta):
            return (triton.cdiv(m, meta["BM"]), triton.cdiv(n, meta["BN"]))

        gemm_bias_relu_kernel[grid](
            x, w, b, out, m, n, k,
            x.stride(0), x.stride(1), w.stride(0), w.stride(1), out.stride(0), out.stride(1),
        )
        return out
