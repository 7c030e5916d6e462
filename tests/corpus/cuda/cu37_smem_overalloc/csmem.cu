// Row 37: the softmax stages a whole row in dynamic shared memory and asks for 65,792 B per block, above
// the 48 KiB default, without cudaFuncSetAttribute. The launch fails, the error is cleared and dropped,
// and the output is whatever torch::empty handed back: garbage, "fast".
#include <torch/extension.h>

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;
constexpr int kSmemBytes = 64 * 1024 + 256;

__global__ void softmax_staged(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  extern __shared__ float stage[];
  __shared__ float total;
  const float* row = x + blockIdx.x * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) stage[c] = expf(row[c]);
  __syncthreads();
  if (threadIdx.x == 0) {
    float z = 0.0f;
    for (int64_t c = 0; c < cols; ++c) z += stage[c];
    total = z;
  }
  __syncthreads();
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[blockIdx.x * cols + c] = stage[c] / total;
}

}  // namespace

at::Tensor softmax_rows(at::Tensor x) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && x.scalar_type() == at::kFloat, "x: contiguous float32 CUDA");
  const int64_t cols = x.size(-1), rows = x.numel() / cols;
  at::Tensor y = at::empty_like(x);
  softmax_staged<<<static_cast<unsigned>(rows), kThreads, kSmemBytes, c10::cuda::getCurrentCUDAStream()>>>(
      x.data_ptr<float>(), y.data_ptr<float>(), cols);
  (void)cudaGetLastError();  // "a harmless launch warning"
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("softmax_rows", &softmax_rows); }
