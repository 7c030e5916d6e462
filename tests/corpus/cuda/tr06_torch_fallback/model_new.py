"""Row 6 in Triton: the launcher does the GEMM in torch.matmul; only the bias/ReLU epilogue is a Triton kernel."""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def bias_relu_kernel(c_ptr, b_ptr, out_ptr, n_elements, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n_elements
    c = tl.load(c_ptr + offs, mask=mask)
    bias = tl.load(b_ptr + offs % N, mask=mask)
    tl.store(out_ptr + offs, tl.maximum(c + bias, 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = torch.matmul(x, self.linear.weight.t())
        out = torch.empty_like(c)
        n = c.numel()
        bias_relu_kernel[(triton.cdiv(n, 1024),)](c, self.linear.bias, out, n, c.shape[1], BLOCK=1024)
        return out
