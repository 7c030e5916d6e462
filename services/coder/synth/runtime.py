"""The C++ header every synthesized extension includes: float32 op semantics and strided addressing."""

from __future__ import annotations

import re

HEADER_NAME = "stitch_runtime.h"

HEADER = r"""// stitch_runtime.h: shared by the host code and the kernels of a synthesized extension.
#pragma once
// The tensor type and the checks only, never torch/extension.h (30-90 s of parsing per translation unit);
// per-operator headers come with the source that calls them. A CUDA extension's kernels are a translation
// unit of their own that sees no torch header at all (nvcc defines __CUDACC__ there).
#if !defined(__CUDACC__)
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/Optional.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <vector>

#if defined(__CUDACC__)
#define STITCH_HD __host__ __device__ __forceinline__
#define STITCH_UNROLL _Pragma("unroll")
#else
#define STITCH_HD inline
#define STITCH_UNROLL
#endif

// The CPU kernels' range functions are built twice, for x86-64-v3 (AVX2 + FMA) and for the baseline,
// and the loader picks one for the machine: one binary, vector speed wherever it runs.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__) && __GNUC__ >= 11
#define STITCH_CPU_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define STITCH_CPU_CLONES
#endif

namespace stitch {

// ---- exp and tanh: the device's own in kernels; on the host, branch-free forms (about 1 ulp) ----
// libm's expf/tanhf are calls, which keep every loop that uses them scalar; these inline to plain
// arithmetic that the compiler vectorizes (with -fno-trapping-math). NaN and +-Inf as in libm.
inline float st_bits_to_float(uint32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline uint32_t st_float_to_bits(float f) {
  uint32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}
STITCH_HD float st_expf(float x) {
#if defined(__CUDA_ARCH__)
  return expf(x);
#else
  float xc = x < -87.0f ? -87.0f : x;
  xc = xc > 88.0f ? 88.0f : xc;
  // round(x / ln 2) by adding 1.5 * 2^23: no float-to-int conversion, so no branch in the loop.
  const float shifted = xc * 1.44269504088896341f + 12582912.0f;
  const float n = shifted - 12582912.0f;
  float r = xc - n * 0.693359375f;  // Cody-Waite: ln 2 in two parts
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;  // minimax polynomial for (e^r - 1 - r) / r^2 on [-ln2/2, ln2/2]
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = st_bits_to_float((st_float_to_bits(shifted) - 0x4B400000u + 127u) << 23);
  float y = p * scale;
  y = x > 88.7228f ? std::numeric_limits<float>::infinity() : y;
  y = x < -103.97f ? 0.0f : y;
  return x != x ? x : y;
#endif
}
STITCH_HD float st_tanhf(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  const float a = fabsf(x);
  const float z = x * x;
  float s = -5.70498872745e-3f;  // odd polynomial below 0.625, where 1 - 2/(e^2x + 1) cancels
  s = s * z + 2.06390887954e-2f;
  s = s * z - 5.37397155531e-2f;
  s = s * z + 1.33314422036e-1f;
  s = s * z - 3.33332819422e-1f;
  const float small = s * z * x + x;
  const float e = st_expf(2.0f * (a < 9.0f ? a : 9.0f));
  const float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
  const float y = a < 0.625f ? small : big;
  return x != x ? x : y;  // NaN in, NaN out (the clamp above would turn it into +-1)
#endif
}

// ---- float32 semantics of the elementwise ops (NaN propagation as in PyTorch) ----
STITCH_HD float st_relu(float x) { return x < 0.f ? 0.f : x; }
STITCH_HD float st_clamp(float x, float lo, float hi) { return x < lo ? lo : (x > hi ? hi : x); }
STITCH_HD float st_clamp_min(float x, float lo) { return x < lo ? lo : x; }
STITCH_HD float st_clamp_max(float x, float hi) { return x > hi ? hi : x; }
STITCH_HD float st_leaky_relu(float x, float s) { return x > 0.f ? x : x * s; }
STITCH_HD float st_sigmoid(float x) { return 1.f / (1.f + st_expf(-x)); }
STITCH_HD float st_silu(float x) { return x / (1.f + st_expf(-x)); }
STITCH_HD float st_gelu(float x) { return 0.5f * x * (1.f + erff(x * 0.70710678118654752440f)); }
STITCH_HD float st_gelu_tanh(float x) {
  const float inner = 0.79788456080286535588f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.f + st_tanhf(inner));
}
STITCH_HD float st_softplus(float x, float beta, float threshold) {
  return (x * beta) > threshold ? x : log1pf(st_expf(x * beta)) / beta;
}
STITCH_HD float st_mish(float x) { return x * st_tanhf(st_softplus(x, 1.f, 20.f)); }
STITCH_HD float st_hardsigmoid(float x) { return st_clamp(x + 3.f, 0.f, 6.f) / 6.f; }
STITCH_HD float st_hardswish(float x) { return x * st_clamp(x + 3.f, 0.f, 6.f) / 6.f; }
STITCH_HD float st_elu(float x, float alpha) { return x > 0.f ? x : alpha * expm1f(x); }
STITCH_HD float st_selu(float x) {
  return 1.0507009873554804934193349852946f * (x > 0.f ? x : 1.6732632423543772848170429916717f * expm1f(x));
}
STITCH_HD float st_celu(float x, float alpha) {
  return (x > 0.f ? x : 0.f) + fminf(0.f, alpha * expm1f(x / alpha));
}
STITCH_HD float st_logsigmoid(float x) { return fminf(x, 0.f) - log1pf(st_expf(-fabsf(x))); }
STITCH_HD float st_sign(float x) { return (x > 0.f) ? 1.f : ((x < 0.f) ? -1.f : x); }
STITCH_HD float st_maximum(float a, float b) { return (a != a || a > b) ? a : b; }
STITCH_HD float st_minimum(float a, float b) { return (a != a || a < b) ? a : b; }
STITCH_HD float st_remainder(float a, float b) {
  float m = fmodf(a, b);
  if (m != 0.f && ((b < 0.f) != (m < 0.f))) m += b;
  return m;
}
STITCH_HD float st_div_floor(float a, float b) {
  if (b == 0.f) return a / b;
  const float m = fmodf(a, b);
  float d = (a - m) / b;
  if (m != 0.f && ((b < 0.f) != (m < 0.f))) d -= 1.f;
  float f = floorf(d);
  if (d - f > 0.5f) f += 1.f;
  return f;
}
STITCH_HD float st_max_nan(float a, float b) { return (a != a || a > b) ? a : b; }
STITCH_HD float st_min_nan(float a, float b) { return (a != a || a < b) ? a : b; }

// argmax/argmin accumulators: the first index of the extreme value; NaN counts as the maximum.
struct ArgAcc {
  float v;
  int64_t i;
};
STITCH_HD ArgAcc arg_combine(ArgAcc a, ArgAcc b, bool want_max) {
  const bool an = a.v != a.v, bn = b.v != b.v;
  if (an || bn) return (an && (!bn || a.i < b.i)) ? a : b;
  const bool better = want_max ? (b.v > a.v) : (b.v < a.v);
  if (better || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

// ---- strided addressing ----
// A Desc maps a (row, col) position of a kernel's iteration domain to an element offset of one
// operand: offset = sum_k ((row / rdiv[k]) % rmod[k]) * rstr[k] + the same over col (rmod 0: no
// modulo, the segment reaches the extent; rdiv 1: no division). Broadcast
// dims have stride 0 and are dropped; adjacent dims that are contiguous with each other are merged.
constexpr int kMaxSeg = 6;
struct Desc {
  int32_t nr;
  int32_t nc;
  int64_t rdiv[kMaxSeg], rmod[kMaxSeg], rstr[kMaxSeg];
  int64_t cdiv[kMaxSeg], cmod[kMaxSeg], cstr[kMaxSeg];
};

template <typename I>
STITCH_HD int64_t seg_off(const int64_t* div, const int64_t* mod, const int64_t* str, int n, I x) {
  int64_t off = 0;
  // div 1 and mod 0 (the outermost segment) skip their 64-bit divisions: the branches are uniform
  // across a launch, and a plain contiguous operand (a norm's weight) costs one multiply-add.
#if defined(__CUDA_ARCH__)
  // A loop, not unrolled: unrolled over kMaxSeg for each element of each strided operand, the
  // divisions made a row kernel too large for the instruction cache (LayerNorm: 9,455 PTX lines).
#pragma unroll 1
  for (int k = 0; k < n; ++k) {
#else
  for (int k = 0; k < kMaxSeg && k < n; ++k) {
#endif
    I q = div[k] == 1 ? x : x / static_cast<I>(div[k]);
    if (mod[k] != 0) q = q % static_cast<I>(mod[k]);
    off += static_cast<int64_t>(q) * str[k];
  }
  return off;
}
template <typename I>
STITCH_HD int64_t row_off(const Desc& d, I r) { return seg_off<I>(d.rdiv, d.rmod, d.rstr, d.nr, r); }
template <typename I>
STITCH_HD int64_t col_off(const Desc& d, I c) { return seg_off<I>(d.cdiv, d.cmod, d.cstr, d.nc, c); }

#if !defined(__CUDACC__)
// ---- host helpers (the host translation unit only) ----
// The broadcast of several shapes (numpy rules), checked.
inline std::vector<int64_t> broadcast(std::initializer_list<at::IntArrayRef> shapes) {
  size_t rank = 0;
  for (const auto& s : shapes) rank = std::max(rank, s.size());
  std::vector<int64_t> out(rank, 1);
  for (const auto& s : shapes) {
    const size_t off = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      const int64_t v = s[i];
      if (v == 1) continue;
      TORCH_CHECK(out[off + i] == 1 || out[off + i] == v, "shapes do not broadcast");
      out[off + i] = v;
    }
  }
  return out;
}

inline int64_t prod(const std::vector<int64_t>& s, const std::vector<int>& dims) {
  int64_t p = 1;
  for (int d : dims) p *= s[d];
  return p;
}

inline std::vector<int64_t> reduced(const std::vector<int64_t>& s, const std::vector<int>& dims,
    bool keepdim) {
  std::vector<int64_t> out;
  for (int i = 0; i < static_cast<int>(s.size()); ++i) {
    bool red = false;
    for (int d : dims) red = red || d == i;
    if (!red) out.push_back(s[i]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

inline void fill_segments(const at::Tensor& t, const std::vector<int64_t>& S, const std::vector<int>& dims,
                          int32_t* n, int64_t* div, int64_t* mod, int64_t* str) {
  const int rank = static_cast<int>(S.size());
  const int trank = static_cast<int>(t.dim());
  TORCH_CHECK(trank <= rank, "operand has more dims than the kernel domain");
  int64_t below = 1;
  int count = 0;
  // Walk the dims innermost first so each segment knows the product of the sizes below it.
  std::vector<int64_t> sdiv, smod, sstr;
  for (int j = static_cast<int>(dims.size()) - 1; j >= 0; --j) {
    const int d = dims[j];
    const int td = d - (rank - trank);
    const int64_t size = S[d];
    int64_t stride = 0;
    if (td >= 0 && t.size(td) != 1) {
      TORCH_CHECK(t.size(td) == size, "operand does not broadcast to the kernel domain");
      stride = t.stride(td);
    }
    if (stride != 0 && size != 1) {
      if (!sdiv.empty() && sstr.back() * smod.back() == stride && sdiv.back() * smod.back() == below) {
        smod.back() *= size;
      } else {
        sdiv.push_back(below);
        smod.push_back(size);
        sstr.push_back(stride);
      }
    }
    below *= size;
  }
  count = static_cast<int>(sdiv.size());
  TORCH_CHECK(count <= kMaxSeg, "operand layout has too many strided segments");
  for (int k = 0; k < count; ++k) {
    div[k] = sdiv[k];
    // A segment spanning up to the domain's extent never wraps: 0 = no modulo (positions < below).
    mod[k] = sdiv[k] * smod[k] >= below ? 0 : smod[k];
    str[k] = sstr[k];
  }
  *n = count;
}

inline Desc make_desc(const at::Tensor& t, const std::vector<int64_t>& S, const std::vector<int>& row_dims,
                      const std::vector<int>& col_dims) {
  Desc d{};
  fill_segments(t, S, row_dims, &d.nr, d.rdiv, d.rmod, d.rstr);
  fill_segments(t, S, col_dims, &d.nc, d.cdiv, d.cmod, d.cstr);
  return d;
}

inline std::vector<int> range(int begin, int end) {
  std::vector<int> out;
  for (int i = begin; i < end; ++i) out.push_back(i);
  return out;
}

inline int64_t pool_out(int64_t in, int64_t k, int64_t pad, int64_t stride, int64_t dil, bool ceil_mode) {
  const int64_t num = in + 2 * pad - dil * (k - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  int64_t out = (num >= 0 ? num / stride : -((-num + stride - 1) / stride)) + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

#endif  // !__CUDACC__

}  // namespace stitch
"""


BINDING_FILE = "binding.cpp"
# A translation unit compiled at -O1 by GCC (its own flags stay the build's).
GCC_O1 = ["#if defined(__GNUC__) && !defined(__clang__)", '#pragma GCC optimize("O1")', "#endif"]


def binding_source(ext_name: str, ret: str, params: list[str], what: str) -> str:
    """binding.cpp: forward()'s Python binding in a translation unit of its own, compiled at -O1.

    pybind11 and torch's casters are most of a host file's compile time: the header alone took 6.9 s
    here and the binding 9.9 s at -O3, 6.4 s at -O1, with the same cost per call (0.45 against 0.39-0.46
    us, interleaved; -O0 cost 1.3-1.7 us). The host code beside it parses only ATen's tensor headers, and
    the build compiles both (and kernels.cu) in parallel.
    """
    if len(params) > MANY_PARAMS:
        binding = unpacked_binding(ext_name, params, what)
    else:
        binding = [f'  m.def("forward", &forward, "{ext_name} forward ({what})");']
    return "\n".join(
        [
            f"// {ext_name}: the Python binding of forward(), a translation unit of its own (pybind11's",
            "// templates compiled at -O1, in parallel with the optimised host code).",
            *GCC_O1,
            "#include <torch/csrc/utils/pybind.h>",
            "",
            "#include <tuple>",
            "",
            f"{ret} forward({', '.join(params)});",
            "",
            "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {",
            *binding,
            "}",
            "",
        ]
    )


# pybind11 builds a function's signature at compile time, one recursion level an argument: a deep model's
# forward() (ResNet-101: 300 weights, 100 BatchNorm momenta and epsilons) exceeds the compiler's constexpr
# depth. Past this many arguments the binding takes *args and casts each argument itself.
MANY_PARAMS = 64


def unpacked_binding(ext_name: str, params: list[str], what: str) -> list[str]:
    """The m.def lines binding forward() as a function of *args that casts each argument to its type."""
    n = len(params)
    args = []
    for i, p in enumerate(params):
        ctype, name = p.rsplit(" ", 1)
        args.append(f"            a[{i}].cast<{ctype}>(){',' if i < n - 1 else ''}  // {name}")
    return [
        "  m.def(",
        '      "forward",',
        "      [](pybind11::args a) {",
        f'        TORCH_CHECK(a.size() == {n}, "forward() takes {n} arguments, got ", a.size());',
        "        return forward(",
        *args,
        "        );",
        "      },",
        f'      "{ext_name} forward ({what}), {n} arguments");',
    ]


# `at::` names in host code that are not operators with a header of their own under ATen/ops/.
_NOT_OPERATORS = frozenset({"parallel_for", "get_num_threads", "IntArrayRef", "Tensor", "TensorOptions"})
_AT_CALL = re.compile(r"\bat::([a-z_][a-z0-9_]*)\s*\(")


def operator_includes(source: str) -> list[str]:
    """Preprocessor lines that include the per-operator header of every `at::op(` the host code calls.

    Each falls back to ATen/Functions.h (every operator) where a torch lacks that header, so the
    source builds on any torch; with the headers, the host translation unit parses a small part of ATen.
    """
    lines: list[str] = []
    for name in sorted(set(_AT_CALL.findall(source)) - _NOT_OPERATORS):
        lines += [
            f"#if __has_include(<ATen/ops/{name}.h>)",
            f"#include <ATen/ops/{name}.h>",
            "#else",
            "#include <ATen/Functions.h>",
            "#endif",
        ]
    return lines
