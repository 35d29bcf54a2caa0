// cudart's elementwise kernels: add, mul and relu of float32, float16 and
// bfloat16, computed in float, one grid-stride loop each.
#include "cudart_kernels.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

namespace cudart {
namespace {

template <class T> __device__ float load(T v);
template <> __device__ float load<float>(float v) { return v; }
template <> __device__ float load<__half>(__half v) { return __half2float(v); }
template <> __device__ float load<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <class T> __device__ T store(float v);
template <> __device__ float store<float>(float v) { return v; }
template <> __device__ __half store<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __nv_bfloat16 store<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <Elementwise Op, class T>
__global__ void elementwise(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                            std::size_t n) {
  std::size_t stride = static_cast<std::size_t>(blockDim.x) * gridDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    float x = load<T>(a[i]);
    float r;
    if constexpr (Op == Elementwise::add) r = x + load<T>(b[i]);
    else if constexpr (Op == Elementwise::mul) r = x * load<T>(b[i]);
    else r = x > 0.0f || x != x ? x : 0.0f;  // NaN stays NaN, as PyTorch's relu
    out[i] = store<T>(r);
  }
}

template <Elementwise Op, class T>
cudaError_t launch(const void* a, const void* b, void* out, std::size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  constexpr unsigned threads = 256;
  std::size_t want = (n + threads - 1) / threads;
  unsigned blocks = static_cast<unsigned>(std::min<std::size_t>(want, 65535));
  elementwise<Op, T><<<blocks, threads, 0, s>>>(static_cast<const T*>(a),
                                                static_cast<const T*>(b), static_cast<T*>(out), n);
  return cudaGetLastError();
}

template <Elementwise Op>
cudaError_t by_type(Element t, const void* a, const void* b, void* out, std::size_t n,
                    cudaStream_t s) {
  switch (t) {
    case Element::float32: return launch<Op, float>(a, b, out, n, s);
    case Element::float16: return launch<Op, __half>(a, b, out, n, s);
    case Element::bfloat16: return launch<Op, __nv_bfloat16>(a, b, out, n, s);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t launch_elementwise(Elementwise op, Element type, const void* a, const void* b,
                               void* out, std::size_t n, cudaStream_t stream) {
  switch (op) {
    case Elementwise::add: return by_type<Elementwise::add>(type, a, b, out, n, stream);
    case Elementwise::mul: return by_type<Elementwise::mul>(type, a, b, out, n, stream);
    case Elementwise::relu: return by_type<Elementwise::relu>(type, a, b, out, n, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace cudart
