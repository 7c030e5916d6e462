"""Recurrent layers (nn.LSTM, nn.GRU): the host loop over layers, directions and time steps, and the fused
cell kernels, per back end.

Per layer and direction, the input projection of every time step is one library GEMM (with b_ih in its
epilogue); each step then runs a library GEMM for h @ W_hh^T and one custom kernel that adds b_hh, applies
the gate activations (LSTM: i, f, g, o; GRU: r, z, n, all as in PyTorch), and updates the state in place,
writing h straight into its direction's half of the output sequence. On CUDA, up to 16 batch rows (an RNN's
usual batch), the two are one kernel a time step (STEP_KERNEL): a block computes every gate's recurrent sum of
its hidden units, then their cell, reading the previous state from the previous step's output. Sequences
stay in the caller's layout (batch- or time-major): nothing is transposed. The state buffers are h_n (and
c_n) themselves, one (B, H) slice per layer and direction, so the final states cost no copy.
"""

from __future__ import annotations

# `zero`: the state before this step is zero (the first step without an initial state): no recurrent
# GEMM was run (hh is null) and the previous h and c are not read.
LSTM_CELL_MATH = r"""
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
    const float cn = zero ? ig * gg : fg * c[idx] + ig * gg;
    c[idx] = cn;
    const float hn = og * tanhf(cn);
    h[idx] = hn;
    y[b * y_stride + j] = hn;
"""

LSTM_CELL_PARAMS = (
    "const float* __restrict__ xp, int64_t xp_stride, const float* __restrict__ hh, "
    "const float* __restrict__ bhh, float* __restrict__ c, float* __restrict__ h, "
    "float* __restrict__ y, int64_t y_stride, int64_t B, int64_t H, bool zero"
)

# The recurrent term of n is W_hn h + b_hn, scaled by r before it joins the input term (PyTorch's GRU).
GRU_CELL_MATH = r"""
    const float* xr = xp + b * xp_stride;
    const float* hr = hh == nullptr ? nullptr : hh + b * 3 * H;
    float rec[3];
    for (int g = 0; g < 3; ++g) {
      float v = hr == nullptr ? 0.0f : hr[g * H + j];
      if (bhh != nullptr) v += bhh[g * H + j];
      rec[g] = v;
    }
    const float rg = st_sigmoid(xr[j] + rec[0]);
    const float zg = st_sigmoid(xr[H + j] + rec[1]);
    const float ng = tanhf(xr[2 * H + j] + rg * rec[2]);
    const float hp = zero ? 0.0f : h[idx];
    const float hn = (1.0f - zg) * ng + zg * hp;
    h[idx] = hn;
    y[b * y_stride + j] = hn;
"""

GRU_CELL_PARAMS = (
    "const float* __restrict__ xp, int64_t xp_stride, const float* __restrict__ hh, "
    "const float* __restrict__ bhh, float* __restrict__ h, float* __restrict__ y, int64_t y_stride, "
    "int64_t B, int64_t H, bool zero"
)

CELLS = (
    ("lstm_cell", "one LSTM time step", LSTM_CELL_PARAMS, LSTM_CELL_MATH),
    ("gru_cell", "one GRU time step", GRU_CELL_PARAMS, GRU_CELL_MATH),
)

# Per time step: the recurrent GEMM, then the cell kernel.
STEPS = r"""      for (int64_t i = 0; i < T; ++i) {
        const int64_t t = d == 0 ? i : T - 1 - i;
        const bool zero = i == 0 && !given;
        at::Tensor hh;
        if (!zero) hh = at::mm(h, w_hh.t());
        const float* xs = xp.data_ptr<float>() + t * step * gates * H;
        const float* hs = zero ? nullptr : hh.data_ptr<float>();
        float* ys = y.data_ptr<float>() + t * step * dirs * H + d * H;
        const int64_t ys_stride = per_b * dirs * H;
        if (lstm) {
          lstm_cell_launch(xs, per_b * 4 * H, hs, bhh, c, h.data_ptr<float>(), ys, ys_stride, B, H, zero);
        } else {
          gru_cell_launch(xs, per_b * 3 * H, hs, bhh, h.data_ptr<float>(), ys, ys_stride, B, H, zero);
        }
      }"""

# CUDA, up to kRnnRows batch rows: one launch a time step (rnn step kernels below). The previous state is
# read where no block of this step writes it: the output of the previous step, or a dense copy of h0.
FUSED_STEPS = (
    r"""      if (B <= kRnnRows) {
        const at::Tensor w_hh_d = stitch_dense(w_hh);
        const at::Tensor hh_buf = at::empty({B, gates * H}, x.options());
        const int64_t ys_stride = per_b * dirs * H, xs_stride = per_b * gates * H;
        const float* wh = w_hh_d.data_ptr<float>();
        float* buf = hh_buf.data_ptr<float>();
        float* hs = h.data_ptr<float>();
        for (int64_t i = 0; i < T; ++i) {
          const int64_t t = d == 0 ? i : T - 1 - i, t_prev = d == 0 ? t - 1 : t + 1;
          const bool zero = i == 0 && !given;
          const float* xs = xp.data_ptr<float>() + t * step * gates * H;
          float* ys = y.data_ptr<float>() + t * step * dirs * H + d * H;
          const float* hp = zero ? nullptr
                            : i == 0 ? h0_d.data_ptr<float>() + (l * dirs + d) * B * H
                                     : y.data_ptr<float>() + t_prev * step * dirs * H + d * H;
          const int64_t hp_stride = i == 0 ? H : ys_stride;
          if (lstm) {
            lstm_step_launch(hp, hp_stride, wh, buf, xs, xs_stride, bhh, c, hs, ys, ys_stride, B, H, zero);
          } else {
            gru_step_launch(hp, hp_stride, wh, buf, xs, xs_stride, bhh, hs, ys, ys_stride, B, H, zero);
          }
        }
        continue;
      }
"""
    + STEPS
)

HOST_LOOP = r"""
// nn.LSTM (4 gates) or nn.GRU (3 gates) forward -> {output, h_n[, c_n]}. An undefined h0 (and c0) is a
// zero initial state. w holds, per layer and direction (forward, then reverse), w_ih, w_hh[, b_ih, b_hh].
std::vector<at::Tensor> stitch_rnn(const at::Tensor& x, const std::vector<at::Tensor>& w,
                                   const at::Tensor& h0, const at::Tensor& c0, int64_t gates, int64_t layers,
                                   int64_t dirs, bool bias, bool batch_first) {
  TORCH_CHECK(x.dim() == 3, "recurrent input must be 3-D");
  const bool lstm = gates == 4;
  at::Tensor seq = stitch_dense(x);
  const int64_t B = batch_first ? seq.size(0) : seq.size(1);
  const int64_t T = batch_first ? seq.size(1) : seq.size(0);
  const int64_t H = w[1].size(1);
  const int64_t per = bias ? 4 : 2;
  at::Tensor hn = at::empty({layers * dirs, B, H}, x.options());
  at::Tensor cn = lstm ? at::empty({layers * dirs, B, H}, x.options()) : at::Tensor();
  const bool given = h0.defined();
__H0__
  TORCH_CHECK(!lstm || c0.defined() == given, "an LSTM's initial state is both h0 and c0");
  if (given) {
    TORCH_CHECK(h0.sizes() == hn.sizes(), "h0 must be (layers * directions, batch, hidden)");
    hn.copy_(h0);
    if (lstm) {
      TORCH_CHECK(c0.sizes() == cn.sizes(), "c0 must be (layers * directions, batch, hidden)");
      cn.copy_(c0);
    }
  }
  // Row of (b, t) in the projection and the output: b * T + t (batch-major) or t * B + b.
  const int64_t step = batch_first ? 1 : B;
  const int64_t per_b = batch_first ? T : 1;
  for (int64_t l = 0; l < layers; ++l) {
    const at::Tensor in2 = seq.reshape({B * T, seq.size(2)});
    at::Tensor y = batch_first ? at::empty({B, T, dirs * H}, x.options())
                               : at::empty({T, B, dirs * H}, x.options());
    for (int64_t d = 0; d < dirs; ++d) {
      const int64_t k = (l * dirs + d) * per;
      const at::Tensor& w_hh = w[k + 1];
      const at::Tensor xp = bias ? at::addmm(w[k + 2], in2, w[k].t()) : at::mm(in2, w[k].t());
      const float* bhh = bias ? w[k + 3].data_ptr<float>() : nullptr;
      at::Tensor h = hn.select(0, l * dirs + d);
      float* c = lstm ? cn.select(0, l * dirs + d).data_ptr<float>() : nullptr;
__STEPS__
    }
    seq = y;
  }
  if (lstm) return {seq, hn, cn};
  return {seq, hn};
}
"""


def _loop(custom: bool, fused: bool = False) -> str:
    steps = FUSED_STEPS if fused else STEPS
    h0 = "  const at::Tensor h0_d = given ? stitch_dense(h0) : at::Tensor();" if fused else ""
    loop = HOST_LOOP.replace("__STEPS__", steps).replace("__H0__\n", h0 + "\n" if h0 else "")
    if not custom:
        return loop
    return loop.replace("at::addmm(", "stitch_addmm(").replace("at::mm(", "stitch_mm(")


def _cpu_cell(name: str, what: str, params: str, math: str) -> str:
    return "\n".join(
        [
            f"// {name}: {what} for every (batch, hidden) element.",
            f"static void {name}_launch({params}) {{",
            "  at::parallel_for(0, B * H, 4096, [&](int64_t i0, int64_t i1) {",
            "  for (int64_t idx = i0; idx < i1; ++idx) {",
            "    const int64_t b = idx / H;",
            "    const int64_t j = idx - b * H;",
            math.rstrip(),
            "  }",
            "  });",
            "}",
        ]
    )


def _cuda_cell(name: str, what: str, params: str, math: str) -> str:
    args = ", ".join(p.split()[-1] for p in params.split(","))
    return "\n".join(
        [
            f"// {name}: {what}, one thread per (batch, hidden) element.",
            f"__global__ void __launch_bounds__(256) {name}_kernel({params}) {{",
            "  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;",
            "       idx < B * H;",
            "       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {",
            "    const int64_t b = idx / H;",
            "    const int64_t j = idx - b * H;",
            math.rstrip(),
            "  }",
            "}",
            "",
            f"static void {name}_launch({params}) {{",
            "  const int64_t n = B * H;",
            "  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>((n + 255) / 256, 4096));",
            f"  {name}_kernel<<<blocks, 256, 0, stitch::current_stream()>>>({args});",
            "  STITCH_LAUNCH_CHECK();",
            "}",
        ]
    )


# The fused step's limits: batch rows (a thread keeps one partial sum of each), hidden units a block, and
# slices of K a gate row.
STEP_CONSTANTS = "constexpr int kRnnRows = 16, kRnnUnits = 2, kRnnSlices = 32;"

# __WHAT__ fused with its recurrent GEMM hp @ W_hh^T (hp: the previous state's B rows, hp_stride apart; null
# for a zero state: no GEMM). A block takes kRnnUnits hidden units, every gate of each: its threads split K
# (the hidden size) into kRnnSlices slices per gate row, a warp's lanes reading one W_hh row along K, each
# thread summing every batch row's products over its slice. The slices are summed in shared memory into
# hh_buf [B, gates * H]; after a barrier the same block runs the cell of its units. One launch a time step,
# where the GEMM and the cell took two. The loops stride by blockDim and gridDim, so the same text runs with
# any number of threads and blocks.
STEP_KERNEL = r"""// __WHAT__ fused with its recurrent GEMM: one launch a time step.
__global__ void __launch_bounds__(256) __BASE___step_kernel(__PARAMS__) {
  constexpr int kGates = __GATES__, kCols = kGates * kRnnUnits, kVirt = kCols * kRnnSlices;
  // One partial sum per batch row and (column, slice) pair; rows padded by one against bank conflicts.
  __shared__ float part[kRnnRows][kVirt + 1];
  const float* hh = hp == nullptr ? nullptr : hh_buf;
  const int64_t tiles = (H + kRnnUnits - 1) / kRnnUnits;
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t j0 = tile * kRnnUnits;
    if (hp != nullptr) {
      for (int v = threadIdx.x; v < kVirt; v += blockDim.x) {
        const int slice = v % kRnnSlices, col = v / kRnnSlices;
        const int64_t j = j0 + col % kRnnUnits;
        float acc[kRnnRows];
#pragma unroll
        for (int m = 0; m < kRnnRows; ++m) acc[m] = 0.f;
        if (j < H) {
          const float* wr = w_hh + ((col / kRnnUnits) * H + j) * H;
          for (int64_t k = slice; k < H; k += kRnnSlices) {
            const float wv = __ldg(wr + k);
#pragma unroll
            for (int m = 0; m < kRnnRows; ++m)
              if (m < B) acc[m] = fmaf(__ldg(hp + m * hp_stride + k), wv, acc[m]);
          }
        }
#pragma unroll
        for (int m = 0; m < kRnnRows; ++m) part[m][v] = acc[m];
      }
      __syncthreads();
      for (int p = threadIdx.x; p < kRnnRows * kCols; p += blockDim.x) {
        const int m = p / kCols, col = p - (p / kCols) * kCols;
        const int64_t j = j0 + col % kRnnUnits;
        if (m < B && j < H) {
          float sum = 0.f;
          for (int sl = 0; sl < kRnnSlices; ++sl) sum += part[m][col * kRnnSlices + sl];
          hh_buf[m * kGates * H + (col / kRnnUnits) * H + j] = sum;
        }
      }
      __syncthreads();
    }
    for (int p = threadIdx.x; p < B * kRnnUnits; p += blockDim.x) {
      const int64_t b = p / kRnnUnits, j = j0 + p % kRnnUnits, idx = b * H + j;
      if (j < H) {
__MATH__
      }
    }
    __syncthreads();  // the next tile reuses the partial sums
  }
}

static void __BASE___step_launch(__PARAMS__) {
  const int64_t tiles = (H + kRnnUnits - 1) / kRnnUnits;
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(tiles, static_cast<int64_t>(sm_count()) * 8));
  __BASE___step_kernel<<<blocks, 256, 0, stitch::current_stream()>>>(__ARGS__);
  STITCH_LAUNCH_CHECK();
}
"""


def _cuda_step(name: str, what: str, params: str, math: str, gates: int) -> str:
    """`name`'s time step fused with its recurrent GEMM (STEP_KERNEL; the host's FUSED_STEPS)."""
    params = "const float* __restrict__ hp, int64_t hp_stride, const float* __restrict__ w_hh, " + (
        "float* __restrict__ hh_buf, " + params.replace("const float* __restrict__ hh, ", "")
    )
    args = ", ".join(p.split()[-1] for p in params.split(","))
    return (
        STEP_KERNEL.replace("__WHAT__", what[0].upper() + what[1:])
        .replace("__BASE__", name.removesuffix("_cell"))
        .replace("__PARAMS__", params)
        .replace("__ARGS__", args)
        .replace("__GATES__", str(gates))
        .replace("__MATH__", math.strip("\n"))
    )


def cpu_helper(*, custom: bool = False) -> str:
    """Both cells and the host loop: the CPU translation unit's part."""
    return "\n\n".join([*(_cpu_cell(*cell) for cell in CELLS), _loop(custom)])


def cuda_device() -> str:
    """The cell kernels, the fused step kernels and their raw-pointer launchers: the CUDA translation unit's
    part."""
    steps = [_cuda_step(*cell, gates=gates) for cell, gates in zip(CELLS, (4, 3), strict=True)]
    return "\n\n".join([STEP_CONSTANTS, *(_cuda_cell(*cell) for cell in CELLS), *steps])


def cuda_host(*, custom: bool = False) -> str:
    """The time loop over the step launchers: the host translation unit's part."""
    return "\n".join([STEP_CONSTANTS, _loop(custom, fused=True)])
