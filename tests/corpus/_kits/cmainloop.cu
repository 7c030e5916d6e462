// Row 17 on the GPU (Sakana-style): the GEMM main-loop launch is commented out; only the bias + ReLU
// epilogue runs, in place, over an output that came from at::empty.
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAException.h>

namespace {

__global__ void gemm_mainloop(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ out,
                              int M, int N, int K) {
  const int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= M || col >= N) return;
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) acc = fmaf(x[(int64_t)row * K + k], w[(int64_t)col * K + k], acc);
  out[(int64_t)row * N + col] = acc;
}

__global__ void bias_relu_epilogue(float* __restrict__ out, const float* __restrict__ b, int64_t total, int N) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    out[i] = fmaxf(out[i] + b[i % N], 0.0f);
  }
}

}  // namespace

at::Tensor gemm_bias_relu(at::Tensor x, at::Tensor w, at::Tensor b) {
  const int M = static_cast<int>(x.size(0)), K = static_cast<int>(x.size(1)), N = static_cast<int>(w.size(0));
  at::Tensor out = at::empty({M, N}, x.options());
  auto stream = c10::cuda::getCurrentCUDAStream();
  dim3 block(16, 16), grid((N + 15) / 16, (M + 15) / 16);
  // gemm_mainloop<<<grid, block, 0, stream>>>(x.data_ptr<float>(), w.data_ptr<float>(), out.data_ptr<float>(), M, N, K);
  (void)grid;
  (void)block;
  (void)K;
  const int64_t total = static_cast<int64_t>(M) * N;
  bias_relu_epilogue<<<static_cast<int>(std::min<int64_t>((total + 255) / 256, 4096)), 256, 0, stream>>>(
      out.data_ptr<float>(), b.data_ptr<float>(), total, N);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("gemm_bias_relu", &gemm_bias_relu); }
