// Shared CUDA kit of the verifier corpus: honest kernels for problems 01, 04, 06 and 11 (the MSE uses
// atomicAdd partial sums, so its last bits vary between runs). Every CUDA candidate folder that lists
// ckit.cu holds a byte-identical copy, so the corpus builds it once.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;
constexpr int kTile = 16;

__device__ __forceinline__ float gelu_tanh(float v) {
  const float c = 0.7978845608028654f;
  return 0.5f * v * (1.0f + tanhf(c * (v + 0.044715f * v * v * v)));
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

__global__ void elementwise_chain_kernel(const float* __restrict__ x, float* __restrict__ y, float s, float b,
                                         int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float v = x[i];
    y[i] = gelu_tanh(v * s + b) * v;
  }
}

// One block per row: a max pass and a sum pass, each reduced through shared memory.
__global__ void softmax_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float red[32];
  __shared__ float bcast;
  const float* row = x + blockIdx.x * cols;
  float* out = y + blockIdx.x * cols;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;

  float m = -INFINITY;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = warp_max(m);
  if (lane == 0) red[warp] = m;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? red[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) bcast = v;
  }
  __syncthreads();
  m = bcast;

  float z = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) z += expf(row[c] - m);
  z = warp_sum(z);
  __syncthreads();
  if (lane == 0) red[warp] = z;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? red[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) bcast = v;
  }
  __syncthreads();
  const float inv = 1.0f / bcast;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) out[c] = expf(row[c] - m) * inv;
}

__global__ void mse_atomic_kernel(const float* __restrict__ p, const float* __restrict__ t, float* acc, int64_t n) {
  float part = 0.0f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float d = p[i] - t[i];
    part += d * d;
  }
  part = warp_sum(part);
  if (threadIdx.x % 32 == 0) atomicAdd(acc, part);
}

__global__ void scale_kernel(float* acc, float factor) { acc[0] *= factor; }

__global__ void gemm_bias_relu_kernel(const float* __restrict__ x, const float* __restrict__ w,
                                      const float* __restrict__ b, float* __restrict__ out, int M, int N, int K) {
  __shared__ float xs[kTile][kTile];
  __shared__ float ws[kTile][kTile + 1];
  const int row = blockIdx.y * kTile + threadIdx.y, col = blockIdx.x * kTile + threadIdx.x;
  float acc = 0.0f;
  for (int k0 = 0; k0 < K; k0 += kTile) {
    xs[threadIdx.y][threadIdx.x] = (row < M && k0 + threadIdx.x < K) ? x[(int64_t)row * K + k0 + threadIdx.x] : 0.0f;
    const int wrow = blockIdx.x * kTile + threadIdx.y;
    ws[threadIdx.y][threadIdx.x] = (wrow < N && k0 + threadIdx.x < K) ? w[(int64_t)wrow * K + k0 + threadIdx.x] : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile; ++k) acc = fmaf(xs[threadIdx.y][k], ws[threadIdx.x][k], acc);
    __syncthreads();
  }
  if (row < M && col < N) out[(int64_t)row * N + col] = fmaxf(acc + b[col], 0.0f);
}

void check(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

int blocks_for(int64_t n) { return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, 4096)); }

}  // namespace

void elementwise_chain_out(at::Tensor x, double scale, double shift, at::Tensor out) {
  check(x, "x");
  check(out, "out");
  TORCH_CHECK(out.numel() == x.numel(), "out has the wrong size");
  const int64_t n = x.numel();
  if (n == 0) return;
  elementwise_chain_kernel<<<blocks_for(n), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), out.data_ptr<float>(), static_cast<float>(scale), static_cast<float>(shift), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor elementwise_chain(at::Tensor x, double scale, double shift) {
  at::Tensor out = at::empty_like(x);
  elementwise_chain_out(x, scale, shift, out);
  return out;
}

at::Tensor softmax_rows(at::Tensor x) {
  check(x, "x");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor out = at::empty_like(x);
  softmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), out.data_ptr<float>(), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor mse_loss(at::Tensor p, at::Tensor t) {
  check(p, "predictions");
  check(t, "targets");
  TORCH_CHECK(p.numel() == t.numel() && p.numel() > 0, "shapes differ");
  const int64_t n = p.numel();
  at::Tensor acc = at::zeros({}, p.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  mse_atomic_kernel<<<blocks_for(n), kThreads, 0, stream>>>(p.data_ptr<float>(), t.data_ptr<float>(),
                                                            acc.data_ptr<float>(), n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  scale_kernel<<<1, 1, 0, stream>>>(acc.data_ptr<float>(), static_cast<float>(1.0 / static_cast<double>(n)));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return acc;
}

at::Tensor gemm_bias_relu(at::Tensor x, at::Tensor w, at::Tensor b) {
  check(x, "x");
  check(w, "weight");
  check(b, "bias");
  const int M = static_cast<int>(x.size(0)), K = static_cast<int>(x.size(1)), N = static_cast<int>(w.size(0));
  TORCH_CHECK(w.size(1) == K && b.numel() == N, "shapes do not match");
  at::Tensor out = at::empty({M, N}, x.options());
  dim3 block(kTile, kTile), grid((N + kTile - 1) / kTile, (M + kTile - 1) / kTile);
  gemm_bias_relu_kernel<<<grid, block, 0, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), w.data_ptr<float>(), b.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("elementwise_chain", &elementwise_chain);
  m.def("elementwise_chain_out", &elementwise_chain_out);
  m.def("softmax_rows", &softmax_rows);
  m.def("mse_loss", &mse_loss);
  m.def("gemm_bias_relu", &gemm_bias_relu);
}
