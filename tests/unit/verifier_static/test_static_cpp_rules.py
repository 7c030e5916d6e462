"""D11 rules over C++/CUDA sources (lexical, on comment- and string-stripped text)."""

import pytest

from stitchcuda.verifier.static_cpp import evaluate, strip

PY = """
class ModelNew(nn.Module):
    def forward(self, x):
        return ext.op(x)
"""

HONEST_CPP = """
#include <torch/extension.h>
#include <ATen/Parallel.h>

namespace {
constexpr int64_t kGrain = 2048;
static constexpr int kUnroll = 4;
}  // namespace

static inline float twice(float v) { return 2.0f * v; }

at::Tensor op(at::Tensor x) {
  static bool warned = false;
  const int half = static_cast<int>(x.size(0) / 2);  // a variable named half is not fp16
  at::Tensor out = at::empty_like(x);
  at::Tensor acc = torch::zeros({x.size(0)}, x.options());
  const float* px = x.contiguous().data_ptr<float>();
  float* po = out.data_ptr<float>();
  at::parallel_for(0, x.numel(), kGrain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) po[i] = twice(px[i]);
  });
  const char* note = "std::thread, at::matmul and getenv( inside a string are ignored";
  // at::matmul(x, x) in a comment is ignored too
  (void)half; (void)note; (void)warned; (void)acc;
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("op", &op); }
"""


def test_honest_cpu_source_is_clean(run_scan):
    s = run_scan(PY, {"kit.cpp": HONEST_CPP})
    assert s.rejects == set() and s.warnings == set(), s


@pytest.mark.parametrize(
    "snippet, rule",
    [
        ("at::Tensor f(at::Tensor a, at::Tensor b) { return at::matmul(a, b); }", "D11.torch-op"),
        ("at::Tensor f(at::Tensor a) { return torch::nn::functional::relu(a); }", "D11.torch-op"),
        ("at::Tensor f(at::Tensor a) { return a.sum(-1); }", "D11.torch-op"),
        (
            "at::Tensor f(at::Tensor a) { auto l = torch::nn::Linear(4, 4); return l->forward(a); }",
            "D11.torch-op",
        ),
        (
            'at::Tensor f(at::Tensor a) {\n  auto op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mm", "");\n'
            "  return a;\n}",
            "D11.torch-op",
        ),
        ("at::Tensor f(at::Tensor a) { return at::_ops::mm::call(a, a); }", "D11.torch-op"),
        (
            "void f(float* a, float* b, float* c) { cublasSgemm(0, 0, 0, 1, 1, 1, 0, a, 1, b, 1, 0, c, 1); }",
            "D11.library-call",
        ),
        ("void f() { std::thread t([] {}); t.detach(); }", "D11.thread"),
        ("#include <future>\nvoid f() { auto r = std::async([] { return 1; }); }", "D11.thread"),
        ('void f() { system("nvidia-smi"); }', "D11.process"),
        ('void f() { FILE* fp = std::fopen("/tmp/x", "r"); }', "D11.io"),
        ('void f() { std::ifstream in("/tmp/x"); }', "D11.io"),
        ("void f() { int s = socket(2, 1, 0); }", "D11.network"),
        ("void f() { std::exit(0); }", "D11.exit"),
        ('void f() { const char* s = getenv("SEED"); }', "D11.environ"),
        ("void f() { at::globalContext().setAllowTF32CuBLAS(true); }", "D11.global-state"),
        ("void f() { at::set_num_threads(1); }", "D11.global-state"),
        ('void f() { auto m = py::module_::import("torch"); }', "D11.dynamic-code"),
        ("at::Tensor f(at::Tensor x) { static at::Tensor cache; return cache; }", "D11.output-cache"),
        ("at::Tensor f(at::Tensor x) { static const void* last = nullptr; return x; }", "D11.output-cache"),
        (
            "std::unordered_map<int64_t, at::Tensor> g_cache;\nat::Tensor f(at::Tensor x) { return x; }",
            "D11.output-cache",
        ),
        ("namespace { at::Tensor g_last; }\nat::Tensor f(at::Tensor x) { return x; }", "D11.output-cache"),
        ("bool f(at::Tensor x, const void* p) { return x.data_ptr() == p; }", "D11.identity-key"),
        ("void f() { torch::manual_seed(42); }", "D11.seed"),
        ("uint64_t f() { return at::detail::getDefaultCPUGenerator().current_seed(); }", "D11.seed"),
        ("float f(float v) { return __half2float(__float2half(v)); }", "D11.precision"),
        ("at::Tensor f(at::Tensor x) { return x.to(at::kHalf); }", "D11.precision"),
        ('void f(float* p) { asm volatile("cvt.rna.tf32.f32 %0, %0;" : "+f"(*p)); }', "D11.precision"),
    ],
)
def test_cpp_hard_rules(run_scan, snippet, rule):
    s = run_scan(PY, {"kit.cpp": "#include <torch/extension.h>\n" + snippet + "\n"})
    assert rule in s.rejects, s


@pytest.mark.parametrize(
    "snippet, rule",
    [
        ('void f() { printf("x\\n"); }', "D11.print"),
        ("void f() { auto t0 = std::chrono::steady_clock::now(); }", "D11.timing"),
        ("float f() { return std::numeric_limits<float>::quiet_NaN(); }", "D11.nan-literal"),
        (
            "void g(float* a) { a[0] = 0.0f; }\nvoid f(float* a) {\n  // g(a);  // disabled for speed\n}",
            "D11.commented-launch",
        ),
    ],
)
def test_cpp_soft_rules(run_scan, snippet, rule):
    s = run_scan(PY, {"kit.cpp": "#include <torch/extension.h>\n" + snippet + "\n"})
    assert rule in s.warnings and s.rejects == set(), s


SPLIT = (
    "void split(float v, float* o) {\n  const float h = nvcuda::wmma::__float_to_tf32(v);\n  o[0] = h;\n"
    "  o[1] = nvcuda::wmma::__float_to_tf32(v - h);\n}\n"
)


def test_tf32_with_its_residual_is_a_warning_and_plain_tf32_a_rejection(run_scan):
    """3xTF32 (hi + lo operands) keeps float32-class accuracy and D3 checks it against float64; TF32 alone,
    or a half-precision cast beside a split, is the precision downgrade of threat #26."""
    split = run_scan(PY, {"k.cu": SPLIT})
    assert "D11.precision-split" in split.warnings and split.rejects == set(), split
    plain = run_scan(PY, {"k.cu": "float f(float v) { return nvcuda::wmma::__float_to_tf32(v); }\n"})
    assert "D11.precision" in plain.rejects, plain
    unrelated = SPLIT.replace("(v - h)", "(v - 1.0f)")
    assert "D11.precision" in run_scan(PY, {"k.cu": unrelated}).rejects
    half = run_scan(PY, {"k.cu": SPLIT + "float g(float v) { return __half2float(__float2half(v)); }\n"})
    assert "D11.precision" in half.rejects, half


KERNELS = """
#include <torch/extension.h>
__global__ void main_kernel(float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 0.0f;
}
__global__ void helper_kernel(float* y) { y[0] = 1.0f; }
"""


def test_kernels_defined_but_never_launched(run_scan):
    none = run_scan(PY, {"k.cu": KERNELS + "void run(float* y, int n) {}\n"})
    assert "D11.no-kernel-launch" in none.rejects, none
    one = run_scan(
        PY,
        {
            "k.cu": KERNELS + "void run(float* y, int n) {\n  main_kernel<<<1, 256>>>(y, n);\n"
            "  C10_CUDA_KERNEL_LAUNCH_CHECK();\n}\n"
        },
    )
    assert "D11.no-kernel-launch" not in one.rules() and "D11.unlaunched-kernel" in one.warnings, one
    commented = run_scan(
        PY,
        {
            "k.cu": KERNELS + "void run(float* y, int n) {\n  // main_kernel<<<1, 256>>>(y, n);\n"
            "  helper_kernel<<<1, 1>>>(y);\n  cudaGetLastError();\n}\n"
        },
    )
    assert {"D11.commented-launch", "D11.unlaunched-kernel"} <= commented.warnings, commented


def test_unchecked_launch_is_info(run_scan):
    s = run_scan(
        PY,
        {
            "k.cu": KERNELS + "void run(float* y, int n) {\n  main_kernel<<<1, 256>>>(y, n);\n"
            "  helper_kernel<<<1, 1>>>(y);\n}\n"
        },
    )
    assert "D11.unchecked-launch" in s.rules(1), s


def test_shared_memory_limits(run_scan):
    static = """
    constexpr int kTile = 128;
    __global__ void k(float* y) { __shared__ float tile[kTile][kTile + 1]; y[0] = tile[0][0]; }
    void run(float* y) { k<<<1, 1>>>(y); }
    """
    assert "D11.smem-limit" in run_scan(PY, {"k.cu": static}).rejects
    dynamic = """
    #define SMEM (64 * 1024 + 256)
    __global__ void k(float* y) { extern __shared__ float s[]; y[0] = s[0]; }
    void run(float* y) { k<<<1, 256, SMEM>>>(y); }
    """
    assert "D11.smem-limit" in run_scan(PY, {"k.cu": dynamic}).rejects
    opted = dynamic.replace(
        "void run(float* y) {",
        "void run(float* y) {\n  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM);",
    )
    assert "D11.smem-limit" not in run_scan(PY, {"k.cu": opted}).rules()
    too_big = opted.replace("(64 * 1024 + 256)", "(240 * 1024)")
    assert "D11.smem-limit" in run_scan(PY, {"k.cu": too_big}).rejects
    small = "__global__ void k(float* y) { __shared__ float s[32]; y[0] = s[0]; }\nvoid run(float* y) { k<<<1, 32, 0>>>(y); }"
    assert "D11.smem-limit" not in run_scan(PY, {"k.cu": small}).rules()


def test_cpp_streams_unjoined_and_joined(run_scan):
    src = """
    void run(float* y) {
      c10::cuda::CUDAStream s = c10::cuda::getStreamFromPool(true);
      k<<<1, 1, 0, s.stream()>>>(y);
    }
    __global__ void k(float* y) { y[0] = 0.0f; }
    """
    assert "D11.stream-unjoined" in run_scan(PY, {"k.cu": src}).rejects
    joined = src.replace(
        "k<<<1, 1, 0, s.stream()>>>(y);", "k<<<1, 1, 0, s.stream()>>>(y);\n  cudaStreamSynchronize(s);"
    )
    s = run_scan(PY, {"k.cu": joined})
    assert "D11.stream-unjoined" not in s.rules() and "D11.stream" in s.warnings, s
    created = "void run() { cudaStream_t s; cudaStreamCreate(&s); }"
    assert "D11.stream-unjoined" in run_scan(PY, {"k.cu": created}).rejects


def test_strip_keeps_lines_and_collects_comments():
    code, comments = strip('int a; // one\n/* two\n three */ const char* s = "x // y";\nint b;')
    assert code.count("\n") == 3
    assert "one" not in code and "x // y" not in code and "int b;" in code
    assert [c[0] for c in comments] == [1, 2, 3]


def test_constant_evaluation():
    consts = {"kTile": "32", "SMEM": "(kTile * kTile * sizeof(float))"}
    assert evaluate("SMEM + 16", consts) == 32 * 32 * 4 + 16
    assert evaluate("1 << 16", {}) == 65536
    assert evaluate("n * 4", {}) is None
    assert evaluate("__import__('os')", {}) is None


def test_member_calls_on_non_tensors_are_not_aten(run_scan):
    src = """
    struct Acc { double v = 0; void add(double x) { v += x; } double mean(int n) const { return v / n; } };
    at::Tensor f(at::Tensor x) {
      Acc acc;
      acc.add(1.0);
      at::Tensor out = at::empty({1}, x.options());
      out.data_ptr<float>()[0] = static_cast<float>(acc.mean(1));
      return out;
    }
    """
    s = run_scan(PY, {"kit.cpp": "#include <torch/extension.h>\n" + src})
    assert "D11.torch-op" not in s.rules(), s
    chained = run_scan(
        PY,
        {
            "kit.cpp": "#include <torch/extension.h>\nat::Tensor f(at::Tensor x) { return x.contiguous().exp(); }\n"
        },
    )
    assert "D11.torch-op" in chained.rejects, chained
