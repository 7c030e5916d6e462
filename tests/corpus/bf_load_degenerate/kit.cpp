// Shared CPU kit of the verifier corpus: honest kernels for problems 01, 03, 04, 06 and 11, plus
// kernels that are wrong in ways only run-time checks can see (they are statically clean on purpose).
// Every candidate folder that lists kit.cpp holds a byte-identical copy, so the corpus builds it once.
#include <torch/extension.h>

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kGrain = 4096;

inline float gelu_tanh(float v) {
  const float c = 0.7978845608028654f;
  return 0.5f * v * (1.0f + std::tanh(c * (v + 0.044715f * v * v * v)));
}

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

}  // namespace

// ---- honest kernels -----------------------------------------------------------------------------

// Problem 01: y = gelu_tanh(x * scale + shift) * x in one pass.
void elementwise_chain_out(at::Tensor x, double scale, double shift, at::Tensor out) {
  check_float(x, "x");
  check_float(out, "out");
  TORCH_CHECK(out.numel() == x.numel(), "out has the wrong size");
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float s = static_cast<float>(scale), b = static_cast<float>(shift);
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float v = px[i];
      po[i] = gelu_tanh(v * s + b) * v;
    }
  });
}

at::Tensor elementwise_chain(at::Tensor x, double scale, double shift) {
  at::Tensor out = at::empty_like(x);
  elementwise_chain_out(x, scale, shift, out);
  return out;
}

// Problem 04: softmax over the last dimension (max pass, exp-sum pass in double, normalize).
at::Tensor softmax_rows(at::Tensor x) {
  check_float(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor out = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = px + r * cols;
      float m = row[0];
      for (int64_t c = 1; c < cols; ++c) m = std::max(m, row[c]);
      double z = 0.0;
      for (int64_t c = 0; c < cols; ++c) z += std::exp(static_cast<double>(row[c] - m));
      const double inv = 1.0 / z;
      for (int64_t c = 0; c < cols; ++c) po[r * cols + c] = static_cast<float>(std::exp(static_cast<double>(row[c] - m)) * inv);
    }
  });
  return out;
}

// Problem 04 with another summation order: float partial sums per block of columns, then combined.
at::Tensor softmax_rows_blocked(at::Tensor x, int64_t block) {
  check_float(x, "x");
  TORCH_CHECK(block > 0, "block must be positive");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor out = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* row = px + r * cols;
      float m = row[0];
      for (int64_t c = 1; c < cols; ++c) m = std::max(m, row[c]);
      float z = 0.0f;
      for (int64_t c0 = 0; c0 < cols; c0 += block) {
        float part = 0.0f;
        for (int64_t c = c0; c < std::min(cols, c0 + block); ++c) part += std::exp(row[c] - m);
        z += part;
      }
      for (int64_t c = 0; c < cols; ++c) po[r * cols + c] = std::exp(row[c] - m) / z;
    }
  });
  return out;
}

// Problem 11: mean((p - t)^2), chunked float partial sums combined in double.
at::Tensor mse_loss(at::Tensor p, at::Tensor t) {
  check_float(p, "predictions");
  check_float(t, "targets");
  TORCH_CHECK(p.numel() == t.numel() && p.numel() > 0, "shapes differ");
  const int64_t n = p.numel(), chunk = 1024, chunks = (n + chunk - 1) / chunk;
  std::vector<double> partial(chunks, 0.0);
  const float* pp = p.data_ptr<float>();
  const float* pt = t.data_ptr<float>();
  at::parallel_for(0, chunks, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t c = lo; c < hi; ++c) {
      float acc = 0.0f;
      for (int64_t i = c * chunk; i < std::min(n, (c + 1) * chunk); ++i) {
        const float d = pp[i] - pt[i];
        acc += d * d;
      }
      partial[c] = acc;
    }
  });
  double total = 0.0;
  for (double v : partial) total += v;
  at::Tensor out = at::empty({}, p.options());
  out.data_ptr<float>()[0] = static_cast<float>(total / static_cast<double>(n));
  return out;
}

// Problem 06: relu(x @ w^T + b) with double accumulation (slow but exact enough), w is [N, K].
void gemm_bias_relu_out(at::Tensor x, at::Tensor w, at::Tensor b, at::Tensor out) {
  check_float(x, "x");
  check_float(w, "weight");
  check_float(b, "bias");
  check_float(out, "out");
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  TORCH_CHECK(w.size(1) == K && b.numel() == N && out.numel() == M * N, "shapes do not match");
  const float* px = x.data_ptr<float>();
  const float* pw = w.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        double acc = pb[j];
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(px[i * K + k]) * pw[j * K + k];
        po[i * N + j] = acc > 0.0 ? static_cast<float>(acc) : 0.0f;
      }
    }
  });
}

at::Tensor gemm_bias_relu(at::Tensor x, at::Tensor w, at::Tensor b) {
  at::Tensor out = at::empty({x.size(0), w.size(0)}, x.options());
  gemm_bias_relu_out(x, w, b, out);
  return out;
}

// Problem 06 with a pre-transposed weight wt [K, N] (the candidate caches wt from its parameters).
at::Tensor gemm_bias_relu_kn(at::Tensor x, at::Tensor wt, at::Tensor b) {
  check_float(x, "x");
  check_float(wt, "weight_t");
  check_float(b, "bias");
  const int64_t M = x.size(0), K = x.size(1), N = wt.size(1);
  TORCH_CHECK(wt.size(0) == K && b.numel() == N, "shapes do not match");
  at::Tensor out = at::empty({M, N}, x.options());
  const float* px = x.data_ptr<float>();
  const float* pw = wt.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, M, 1, [&](int64_t lo, int64_t hi) {
    std::vector<double> acc(N);
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t j = 0; j < N; ++j) acc[j] = pb[j];
      for (int64_t k = 0; k < K; ++k) {
        const double a = px[i * K + k];
        const float* wrow = pw + k * N;
        for (int64_t j = 0; j < N; ++j) acc[j] += a * wrow[j];
      }
      for (int64_t j = 0; j < N; ++j) po[i * N + j] = acc[j] > 0.0 ? static_cast<float>(acc[j]) : 0.0f;
    }
  });
  return out;
}

// In-place ReLU (a trivial epilogue on its own).
at::Tensor relu_inplace(at::Tensor y) {
  check_float(y, "y");
  float* p = y.data_ptr<float>();
  at::parallel_for(0, y.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) p[i] = p[i] > 0.0f ? p[i] : 0.0f;
  });
  return y;
}

// Problem 03: sum over the last dimension.
at::Tensor row_sum(at::Tensor x) {
  check_float(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor out = at::empty({rows}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      double acc = 0.0;
      for (int64_t c = 0; c < cols; ++c) acc += px[r * cols + c];
      po[r] = static_cast<float>(acc);
    }
  });
  return out;
}

// A cheap kernel that reads a few elements (a "prefetch" or "checksum" decoy).
at::Tensor touch(at::Tensor x) {
  check_float(x, "x");
  const float* px = x.data_ptr<float>();
  double acc = 0.0;
  for (int64_t i = 0; i < std::min<int64_t>(64, x.numel()); ++i) acc += px[i];
  at::Tensor out = at::empty({}, x.options());
  out.data_ptr<float>()[0] = static_cast<float>(acc);
  return out;
}

// ---- statically clean, wrong at run time --------------------------------------------------------

// Writes one value everywhere (a constant output that never reads the inputs).
void fill_value(at::Tensor out, double value) {
  check_float(out, "out");
  float* p = out.data_ptr<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = static_cast<float>(value);
}

// Problem 11 by moments: var(p) + var(t) + (mean p - mean t)^2, dropping the cross term.
at::Tensor mse_moments(at::Tensor p, at::Tensor t) {
  check_float(p, "predictions");
  check_float(t, "targets");
  const int64_t n = p.numel();
  const float* pp = p.data_ptr<float>();
  const float* pt = t.data_ptr<float>();
  double sp = 0, st = 0, sp2 = 0, st2 = 0;
  for (int64_t i = 0; i < n; ++i) {
    sp += pp[i];
    st += pt[i];
    sp2 += static_cast<double>(pp[i]) * pp[i];
    st2 += static_cast<double>(pt[i]) * pt[i];
  }
  const double mp = sp / n, mt = st / n;
  const double value = (sp2 / n - mp * mp) + (st2 / n - mt * mt) + (mp - mt) * (mp - mt);
  at::Tensor out = at::empty({}, p.options());
  out.data_ptr<float>()[0] = static_cast<float>(value);
  return out;
}

// Problem 11 over every `every`-th chunk of 256 elements only ("unbiased" subsampling).
at::Tensor mse_sampled(at::Tensor p, at::Tensor t, int64_t every) {
  check_float(p, "predictions");
  check_float(t, "targets");
  const int64_t n = p.numel(), chunk = 256;
  const float* pp = p.data_ptr<float>();
  const float* pt = t.data_ptr<float>();
  double acc = 0.0;
  int64_t seen = 0;
  for (int64_t c0 = 0; c0 < n; c0 += chunk * every) {
    for (int64_t i = c0; i < std::min(n, c0 + chunk); ++i) {
      const double d = static_cast<double>(pp[i]) - pt[i];
      acc += d * d;
      ++seen;
    }
  }
  at::Tensor out = at::empty({}, p.options());
  out.data_ptr<float>()[0] = static_cast<float>(acc / static_cast<double>(std::max<int64_t>(seen, 1)));
  return out;
}

// Problem 04 with the normalizer replaced by its expectation for N(0, 1) inputs: D * e^(1/2).
at::Tensor softmax_analytic(at::Tensor x) {
  check_float(x, "x");
  const int64_t cols = x.size(-1);
  at::Tensor out = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  const float inv_z = static_cast<float>(1.0 / (static_cast<double>(cols) * std::exp(0.5)));
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) po[i] = std::exp(px[i]) * inv_z;
  });
  return out;
}

// Problem 04 where each slice of a row is normalized on its own (the cross-slice combine is missing).
at::Tensor softmax_sliced(at::Tensor x, int64_t slices) {
  check_float(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols, width = (cols + slices - 1) / slices;
  at::Tensor out = at::empty_like(x);
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t c0 = 0; c0 < cols; c0 += width) {
        const int64_t c1 = std::min(cols, c0 + width);
        float m = px[r * cols + c0];
        for (int64_t c = c0; c < c1; ++c) m = std::max(m, px[r * cols + c]);
        double z = 0.0;
        for (int64_t c = c0; c < c1; ++c) z += std::exp(static_cast<double>(px[r * cols + c] - m));
        for (int64_t c = c0; c < c1; ++c) po[r * cols + c] = static_cast<float>(std::exp(px[r * cols + c] - m) / z);
      }
    }
  });
  return out;
}

// A cheap content signature: the sum of 256 evenly spaced elements.
double fingerprint(at::Tensor x) {
  check_float(x, "x");
  const float* px = x.data_ptr<float>();
  const int64_t n = x.numel(), stride = std::max<int64_t>(1, n / 256);
  double acc = 0.0;
  for (int64_t i = 0; i < n; i += stride) acc += px[i] * static_cast<double>(i % 7 + 1);
  return acc;
}

// Zeroes its input in place and returns zeros: relu/gelu-style references of a zeroed input agree.
at::Tensor scrub(at::Tensor x) {
  check_float(x, "x");
  std::memset(x.data_ptr<float>(), 0, sizeof(float) * x.numel());
  return at::zeros_like(x);
}

// An output full of NaN, computed without a literal (0/0 at run time).
at::Tensor nan_like(at::Tensor x) {
  at::Tensor out = at::empty_like(x);
  float* p = out.data_ptr<float>();
  const float zero = static_cast<float>(x.numel() - x.numel());
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = zero / zero;
  return out;
}

// Problem 06 with compile-time dimensions (K = 512, N = 256), no bounds checks.
at::Tensor gemm_fixed(at::Tensor x, at::Tensor w, at::Tensor b) {
  constexpr int64_t kK = 512, kN = 256;
  at::Tensor out = at::empty({x.size(0), w.size(0)}, x.options());
  const float* px = x.data_ptr<float>();
  const float* pw = w.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, x.size(0), 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      for (int64_t j = 0; j < kN; ++j) {
        double acc = pb[j];
        for (int64_t k = 0; k < kK; ++k) acc += static_cast<double>(px[i * kK + k]) * pw[j * kK + k];
        po[i * kN + j] = acc > 0.0 ? static_cast<float>(acc) : 0.0f;
      }
    }
  });
  return out;
}

// Problem 06 whose main loop never runs: the epilogue works on whatever the allocator handed back.
at::Tensor gemm_epilogue_only(at::Tensor x, at::Tensor w, at::Tensor b) {
  at::Tensor out = at::empty({x.size(0), w.size(0)}, x.options());
  float* po = out.data_ptr<float>();
  const float* pb = b.data_ptr<float>();
  const int64_t N = w.size(0);
  for (int64_t i = 0; i < out.numel(); ++i) {
    const float v = po[i] + pb[i % N];
    po[i] = v > 0.0f ? v : 0.0f;
  }
  return out;
}

// Problem 03 reading 8 elements past the end of every row (the last row reads past the buffer).
at::Tensor row_sum_overread(at::Tensor x) {
  check_float(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor out = at::empty({rows}, x.options());
  const float* px = x.data_ptr<float>();
  float* po = out.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double acc = 0.0;
    for (int64_t c = 0; c < cols + 8; ++c) acc += px[r * cols + c];
    po[r] = static_cast<float>(acc);
  }
  return out;
}

// Problem 06 that insists on a column-major weight, so it raises on every benchmark input.
at::Tensor gemm_bias_relu_colmajor(at::Tensor x, at::Tensor w, at::Tensor b) {
  TORCH_CHECK(w.stride(0) == 1, "gemm_bias_relu_colmajor expects a column-major weight");
  return gemm_bias_relu(x, w.t().contiguous(), b);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("elementwise_chain", &elementwise_chain);
  m.def("elementwise_chain_out", &elementwise_chain_out);
  m.def("softmax_rows", &softmax_rows);
  m.def("softmax_rows_blocked", &softmax_rows_blocked);
  m.def("mse_loss", &mse_loss);
  m.def("gemm_bias_relu", &gemm_bias_relu);
  m.def("gemm_bias_relu_out", &gemm_bias_relu_out);
  m.def("gemm_bias_relu_kn", &gemm_bias_relu_kn);
  m.def("relu_inplace", &relu_inplace);
  m.def("row_sum", &row_sum);
  m.def("touch", &touch);
  m.def("fill_value", &fill_value);
  m.def("mse_moments", &mse_moments);
  m.def("mse_sampled", &mse_sampled);
  m.def("softmax_analytic", &softmax_analytic);
  m.def("softmax_sliced", &softmax_sliced);
  m.def("fingerprint", &fingerprint);
  m.def("scrub", &scrub);
  m.def("nan_like", &nan_like);
  m.def("gemm_fixed", &gemm_fixed);
  m.def("gemm_epilogue_only", &gemm_epilogue_only);
  m.def("row_sum_overread", &row_sum_overread);
  m.def("gemm_bias_relu_colmajor", &gemm_bias_relu_colmajor);
}
