"""Recurrent layers: the host loop over time steps and the fused LSTM cell kernel, per back end.

Per layer, the input projection of every time step is one library GEMM (with b_ih in its epilogue);
each step then runs a library GEMM for h @ W_hh^T and one custom kernel that adds b_hh, applies the
gate activations (i, f, g, o as in PyTorch), and updates c and h, writing h straight into the output
sequence. Sequences stay in the caller's layout (batch- or time-major): nothing is transposed.
"""

from __future__ import annotations

CELL_MATH = r"""
    const float* xr = xp + b * xp_stride;
    const float* hr = hh == nullptr ? nullptr : hh + b * 4 * H;
    float gate[4];
    for (int g = 0; g < 4; ++g) {
      float v = xr[g * H + j];
      if (hr != nullptr) v += hr[g * H + j];
      if (bhh != nullptr) v += bhh[g * H + j];
      gate[g] = v;
    }
    const float ig = st_sigmoid(gate[0]);
    const float fg = st_sigmoid(gate[1]);
    const float gg = tanhf(gate[2]);
    const float og = st_sigmoid(gate[3]);
    const float cn = first ? ig * gg : fg * c[idx] + ig * gg;
    c[idx] = cn;
    const float hn = og * tanhf(cn);
    h[idx] = hn;
    y[b * y_stride + j] = hn;
"""

CELL_PARAMS = (
    "const float* __restrict__ xp, int64_t xp_stride, const float* __restrict__ hh, "
    "const float* __restrict__ bhh, float* __restrict__ c, float* __restrict__ h, "
    "float* __restrict__ y, int64_t y_stride, int64_t B, int64_t H, bool first"
)

HOST_LOOP = r"""
// nn.LSTM forward (zero initial state): library GEMMs for the projections, lstm_cell for each step.
at::Tensor stitch_lstm(const at::Tensor& x, const std::vector<at::Tensor>& w, int64_t layers, bool bias,
                       bool batch_first) {
  TORCH_CHECK(x.dim() == 3, "LSTM input must be 3-D");
  at::Tensor seq = x.contiguous();
  const int64_t B = batch_first ? seq.size(0) : seq.size(1);
  const int64_t T = batch_first ? seq.size(1) : seq.size(0);
  const int per = bias ? 4 : 2;
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor& w_ih = w[l * per];
    const at::Tensor& w_hh = w[l * per + 1];
    const int64_t H = w_hh.size(1);
    const at::Tensor in2 = seq.reshape({B * T, seq.size(2)});
    const at::Tensor xp = bias ? at::addmm(w[l * per + 2], in2, w_ih.t()) : at::mm(in2, w_ih.t());
    at::Tensor y = batch_first ? at::empty({B, T, H}, x.options()) : at::empty({T, B, H}, x.options());
    at::Tensor h = at::empty({B, H}, x.options());
    at::Tensor c = at::empty({B, H}, x.options());
    const float* bhh = bias ? w[l * per + 3].data_ptr<float>() : nullptr;
    // Row of (b, t) in the projection and the output: b * T + t (batch-major) or t * B + b.
    const int64_t step = batch_first ? 1 : B;
    const int64_t per_b = batch_first ? T : 1;
    for (int64_t t = 0; t < T; ++t) {
      at::Tensor hh;
      if (t > 0) hh = at::mm(h, w_hh.t());
      lstm_cell_launch(xp.data_ptr<float>() + t * step * 4 * H, per_b * 4 * H,
                       t > 0 ? hh.data_ptr<float>() : nullptr, bhh, c.data_ptr<float>(), h.data_ptr<float>(),
                       y.data_ptr<float>() + t * step * H, per_b * H, B, H, t == 0);
    }
    seq = y;
  }
  return seq;
}
"""


def _loop(custom: bool) -> str:
    if not custom:
        return HOST_LOOP
    return HOST_LOOP.replace("at::addmm(", "stitch_addmm(").replace("at::mm(", "stitch_mm(")


def cpu_helper(*, custom: bool = False) -> str:
    return (
        "\n".join(
            [
                "// lstm_cell: one LSTM time step for every (batch, hidden) element.",
                f"static void lstm_cell_launch({CELL_PARAMS}) {{",
                "  at::parallel_for(0, B * H, 4096, [&](int64_t i0, int64_t i1) {",
                "  for (int64_t idx = i0; idx < i1; ++idx) {",
                "    const int64_t b = idx / H;",
                "    const int64_t j = idx - b * H;",
                CELL_MATH.rstrip(),
                "  }",
                "  });",
                "}",
            ]
        )
        + "\n"
        + _loop(custom)
    )


def cuda_device() -> str:
    """The LSTM cell kernel and its raw-pointer launcher: the CUDA translation unit's part."""
    return "\n".join(
        [
            "// lstm_cell: one LSTM time step, one thread per (batch, hidden) element.",
            f"__global__ void __launch_bounds__(256) lstm_cell_kernel({CELL_PARAMS}) {{",
            "  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;",
            "       idx < B * H;",
            "       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {",
            "    const int64_t b = idx / H;",
            "    const int64_t j = idx - b * H;",
            CELL_MATH.rstrip(),
            "  }",
            "}",
            "",
            f"static void lstm_cell_launch({CELL_PARAMS}) {{",
            "  const int64_t n = B * H;",
            "  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 4096));",
            "  lstm_cell_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(",
            "      xp, xp_stride, hh, bhh, c, h, y, y_stride, B, H, first);",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
    )


def cuda_host(*, custom: bool = False) -> str:
    """The LSTM's time loop over the cell launcher: the host translation unit's part."""
    return _loop(custom)
