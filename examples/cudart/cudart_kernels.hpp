// cudart's device kernels (cudart_kernels.cu), as plain launchers: no
// PyTorch header here, so nvcc compiles the kernels without libtorch's
// headers and the ATen side (cudart_kernels.cpp) without CUDA's device code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace cudart {

enum class Elementwise { add, mul, relu };
enum class Element { float32, float16, bfloat16 };

// Enqueues out[i] = a[i] op b[i] (relu: out[i] = max(a[i], 0), NaN kept; b
// unused) for i < n on `stream`; returns the launch's status
// (cudaGetLastError after the launch).
cudaError_t launch_elementwise(Elementwise op, Element type, const void* a, const void* b,
                               void* out, std::size_t n, cudaStream_t stream);

}  // namespace cudart
