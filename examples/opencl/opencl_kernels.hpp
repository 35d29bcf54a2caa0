// ocl's native kernels (opencl_kernels.cpp): what the test and benchmark
// operators (opencl_test_ops.cpp) reach of them.
#pragma once

#include "opencl_runtime.hpp"

#include <cstdint>
#include <mutex>
#include <string_view>

namespace ocl::kernels {

// The shape and element strides of an elementwise kernel's operands, dims
// merged where all operands allow (at most kMaxDims after merging); the
// same layout as the OpenCL C struct Geom (all 64-bit, no padding).
inline constexpr int kMaxDims = 6;
struct Geom {
  cl_long n;     // elements
  cl_long ndim;  // 0..kMaxDims
  cl_long size[kMaxDims];
  cl_long so[kMaxDims];  // the output's strides
  cl_long sa[kMaxDims];  // the first input's (0 where broadcast)
  cl_long sb[kMaxDims];  // the second input's
};

// What the elementwise kernel computes: out = f(a, b, s).
enum class Op : cl_int {
  add = 0,                 // a + s * b
  mul = 1,                 // a * b
  relu = 2,                // a > 0 or NaN ? a : 0
  threshold_backward = 3,  // b <= s ? 0 : a
  add_scalar = 4,          // a + s
  mul_scalar = 5,          // a * s
};

// One cl_kernel: OpenCL's kernel arguments are state of the kernel object,
// so setting them and enqueueing happen under its mutex.
struct Kernel {
  cl_kernel k = nullptr;
  std::mutex mutex;
};

// The program built for one (physical) device and its kernels.
struct Program {
  Kernel elementwise, addmm, sum;
  std::size_t tile = 16;       // addmm's work-group edge
  std::size_t reduce_wg = 64;  // sum's work-group size
};

// The program of a physical device, built at the first call (once per
// device, thread-safe); a build failure is a RuntimeError naming the
// backend, the device and the build log, raised again at each later call.
Program& program(int device);

// How many times each native kernel ran since the library was loaded:
// kernel "add", "mul", "relu", "threshold_backward", "mm", "addmm", "sum",
// or "" for all (ValueError for another name).
std::int64_t launches(std::string_view kernel);

// Whether the kernels were registered (OCL_NATIVE_KERNELS, read at load).
bool enabled();

}  // namespace ocl::kernels
