// ocl's native kernels: OpenCL C kernels for the hot operators of a small
// training step, registered through accelkit's vendor-kernel API
// (include/accelkit/torch/kernels.hpp) and enqueued on the current stream's
// command queue, asynchronously.
//
//   add.Tensor, mul.Tensor     float32 tensors on one ocl device, broadcast
//                              and strided (any layout of at most 6 dims once
//                              mergeable dims are merged), or a float32
//                              tensor and a Python number (a wrapped CPU
//                              scalar); add's alpha any real number
//   relu, threshold_backward   float32, broadcast and strided as above
//   mm, addmm                  2-d float32 matrices of any strides (a
//                              transposed weight included); addmm's bias
//                              broadcastable to the result, beta and alpha
//                              any real numbers (beta 0 ignores the bias)
//   sum, sum.dim_IntList       float32 (dtype unset or float32), any dims,
//                              keepdim, any strides
//
// Everything else (other dtypes: float64, float16, bfloat16, integers,
// bool, complex; a tensor on another device; more than 6 unmergeable dims;
// an input a kernel does not take, such as an out-of-range dim) goes through
// the SDK's CPU fallback (impl_or_fallback), which computes, or raises,
// as the CPU does. Outputs come from the caching pool on the current stream
// (the backend's c10 allocator, laid out as at::empty_like or at::empty
// would, without a dispatcher call: accelkit::empty_output); inputs are
// recorded on that stream (they may come from another); each launch is reported
// (Kernels<R>::enqueued) and becomes the stream's last command
// (OpenCLRuntime::enqueue_kernel, Note [ocl last command]), so stream and
// event queries stay right; on a capturing stream it is recorded into the
// stream's graph instead (Note [ocl graphs]).
//
// The program is built with clBuildProgram once per device, at the first
// launch there (Note [ocl kernel program]). OCL_NATIVE_KERNELS=0 at the
// library's load leaves the kernels unregistered (every operator as
// without them: host kernels or the fallback); OCL_KERNEL_BUILD_OPTIONS adds
// options to clBuildProgram.
//
// Note [ocl kernel program]
// Problem: OpenCL compiles kernels at run time, per device; building at
// load would cost every process the compiler's time, a build per thread
// would race, and a kernel's arguments are state of its cl_kernel object.
// Decision: the source below is compiled for a device the first time one of
// its kernels runs there, under one mutex (a second thread waits for the
// first build rather than building again), with the work-group sizes the
// device allows as defines. A failed build is kept: each later launch on
// that device raises the same RuntimeError (the backend, the device, the
// error and the build log). The cl_kernel objects are shared by all threads:
// each launch sets the arguments and enqueues under the kernel's mutex (then
// the stream's, inside enqueue_kernel; never the other way round).
// Limits: nothing is retried, so a broken compiler fails every native
// operator on that device, the same way each time; launches of one kernel
// are serialized while their arguments are set.
#include <accelkit/torch/native_kernels.hpp>

#include "opencl_kernels.hpp"

#include <ATen/ExpandUtils.h>
#include <ATen/core/DimVector.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/threshold_backward_ops.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace ocl::kernels {
namespace {

using K = accelkit::Kernels<OpenCLRuntime>;
using accelkit::empty_output, accelkit::merge_dims, accelkit::real_number;

const char* const kSource = R"CL(
typedef struct { long n, ndim; long size[6], so[6], sa[6], sb[6]; } Geom;

__kernel __attribute__((reqd_work_group_size(EW_WG, 1, 1)))
void elementwise(Geom g, int op, float s, __global float* out, __global const float* a,
                 __global const float* b) {
  long i = get_global_id(0);
  if (i >= g.n) return;
  long oo = 0, oa = 0, ob = 0, r = i;
  for (int d = (int)g.ndim - 1; d >= 0; --d) {
    long c = r % g.size[d];
    r /= g.size[d];
    oo += c * g.so[d];
    oa += c * g.sa[d];
    ob += c * g.sb[d];
  }
  float x = a[oa], y;
  switch (op) {
    case 0: y = s == 1.0f ? x + b[ob] : x + s * b[ob]; break;
    case 1: y = x * b[ob]; break;
    case 2: y = (x > 0.0f || isnan(x)) ? x : 0.0f; break;
    case 3: y = b[ob] <= s ? 0.0f : x; break;
    case 4: y = x + s; break;
    default: y = x * s; break;
  }
  out[oo] = y;
}

__kernel __attribute__((reqd_work_group_size(TILE, TILE, 1)))
void addmm(long m, long n, long k, float alpha, float beta, int has_bias, __global float* c,
           __global const float* a, long sa0, long sa1, __global const float* b, long sb0,
           long sb1, __global const float* bias, long sc0, long sc1) {
  __local float ta[TILE][TILE];
  __local float tb[TILE][TILE];
  int li = get_local_id(1), lj = get_local_id(0);
  long i = (long)get_group_id(1) * TILE + li;
  long j = (long)get_group_id(0) * TILE + lj;
  float acc = 0.0f;
  for (long k0 = 0; k0 < k; k0 += TILE) {
    ta[li][lj] = (i < m && k0 + lj < k) ? a[i * sa0 + (k0 + lj) * sa1] : 0.0f;
    tb[li][lj] = (k0 + li < k && j < n) ? b[(k0 + li) * sb0 + j * sb1] : 0.0f;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int q = 0; q < TILE; ++q) acc += ta[li][q] * tb[q][lj];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (i < m && j < n) {
    float r = alpha == 1.0f ? acc : alpha * acc;
    if (has_bias) {
      float v = bias[i * sc0 + j * sc1];
      r += beta == 1.0f ? v : beta * v;
    }
    c[i * n + j] = r;
  }
}

typedef struct { long nout, nred, nk, nr; long ksize[6], kstride[6], rsize[6], rstride[6]; } Red;

// Each work-item sums its share with Neumaier's compensation, and the
// work-group combines the (sum, compensation) pairs exactly (TwoSum): a
// float32 sum about as accurate as the CPU's cascade summation, not the
// drift of a long serial float sum.
__kernel __attribute__((reqd_work_group_size(RG, 1, 1)))
void sum(Red g, __global float* out, __global const float* a) {
  __local float ps[RG];
  __local float pc[RG];
  long o = get_group_id(0);
  int l = get_local_id(0);
  long base = 0, r = o;
  for (int d = (int)g.nk - 1; d >= 0; --d) {
    base += (r % g.ksize[d]) * g.kstride[d];
    r /= g.ksize[d];
  }
  float s = 0.0f, c = 0.0f;
  for (long e = l; e < g.nred; e += RG) {
    long off = 0, q = e;
    for (int d = (int)g.nr - 1; d >= 0; --d) {
      off += (q % g.rsize[d]) * g.rstride[d];
      q /= g.rsize[d];
    }
    float x = a[base + off], t = s + x;
    c += fabs(s) >= fabs(x) ? (s - t) + x : (x - t) + s;
    s = t;
  }
  ps[l] = s;
  pc[l] = c;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int w = RG / 2; w > 0; w >>= 1) {
    if (l < w) {
      float x = ps[l], y = ps[l + w], t = x + y, v = t - x;
      pc[l] += pc[l + w] + ((x - (t - v)) + (y - v));
      ps[l] = t;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (l == 0) out[o] = isfinite(ps[0]) ? ps[0] + pc[0] : ps[0];  // inf, NaN: as summed
}
)CL";

// The OpenCL C struct Red: a reduction's kept dims (the output's, in order)
// and reduced dims, with the input's strides.
struct Red {
  cl_long nout, nred, nk, nr;
  cl_long ksize[kMaxDims], kstride[kMaxDims], rsize[kMaxDims], rstride[kMaxDims];
};

// ------------------------------------------------------------- counters

enum Counter { c_add, c_mul, c_relu, c_threshold_backward, c_mm, c_addmm, c_sum };
accelkit::LaunchCounters<7> counters{{"add", "mul", "relu", "threshold_backward", "mm", "addmm", "sum"}};

// -------------------------------------------------------------- program

accelkit::PerDevice<Program> programs;  // Note [ocl kernel program]

std::string build_log(cl_program p, cl_device_id id) {
  std::size_t n = 0;
  if (clGetProgramBuildInfo(p, id, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n) != CL_SUCCESS || n == 0)
    return {};
  std::string log(n, '\0');
  clGetProgramBuildInfo(p, id, CL_PROGRAM_BUILD_LOG, n, log.data(), nullptr);
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  return log;
}

// The names of the errors a build may add to the runtime's error_name.
const char* build_error_name(cl_int e) {
  switch (e) {
    case CL_BUILD_PROGRAM_FAILURE: return "CL_BUILD_PROGRAM_FAILURE";
    case CL_INVALID_BUILD_OPTIONS: return "CL_INVALID_BUILD_OPTIONS";
    case CL_COMPILER_NOT_AVAILABLE: return "CL_COMPILER_NOT_AVAILABLE";
    case CL_INVALID_KERNEL_NAME: return "CL_INVALID_KERNEL_NAME";
    default: return error_name(e);
  }
}

// The largest power of two at most `cap` and `limit`.
std::size_t pow2_at_most(std::size_t cap, std::size_t limit) {
  std::size_t v = 1;
  while (v * 2 <= cap && v * 2 <= limit) v *= 2;
  return v;
}

// Builds the program for `device`; the error message of a failure.
std::optional<std::string> build(int device, Program& p) {
  OpenCLRuntime& rt = K::runtime();
  cl_context ctx = K::translated([&] { return rt.cl_context_of(device); });
  cl_device_id id = K::translated([&] { return rt.cl_device_of(device); });
  std::size_t max_wg = 1;
  clGetDeviceInfo(id, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof max_wg, &max_wg, nullptr);
  p.tile = pow2_at_most(16, max_wg);
  while (p.tile * p.tile > max_wg) p.tile /= 2;
  p.reduce_wg = pow2_at_most(64, max_wg);
  std::string options = "-DTILE=" + std::to_string(p.tile) + " -DRG=" + std::to_string(p.reduce_wg) +
                        " -DEW_WG=" + std::to_string(p.reduce_wg);
  if (const char* extra = std::getenv("OCL_KERNEL_BUILD_OPTIONS")) options += std::string(" ") + extra;
  auto failure = [&](const char* fn, cl_int err, const std::string& log) {
    std::string m = "ocl: building the native OpenCL kernels for device " + std::to_string(device) +
                    " failed: " + fn + ": " + build_error_name(err) + " (" + std::to_string(err) +
                    ")";
    constexpr std::size_t kLogShown = 4096;  // a compiler's log may run to megabytes
    if (!log.empty())
      m += "; build log" +
           (log.size() > kLogShown ? " (its first " + std::to_string(kLogShown) + " of " +
                                         std::to_string(log.size()) + " bytes)"
                                   : std::string()) +
           ":\n" + log.substr(0, kLogShown);
    return m;
  };
  cl_int err = CL_SUCCESS;
  const char* src = kSource;
  cl_program prog = clCreateProgramWithSource(ctx, 1, &src, nullptr, &err);
  if (err != CL_SUCCESS) return failure("clCreateProgramWithSource", err, {});
  struct Release {
    cl_program p;
    ~Release() { clReleaseProgram(p); }  // the kernels keep what they need
  } release{prog};
  err = clBuildProgram(prog, 1, &id, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) return failure("clBuildProgram", err, build_log(prog, id));
  for (auto [kernel, name] : {std::pair<Kernel*, const char*>{&p.elementwise, "elementwise"},
                              {&p.addmm, "addmm"}, {&p.sum, "sum"}}) {
    kernel->k = clCreateKernel(prog, name, &err);
    if (err != CL_SUCCESS) return failure("clCreateKernel", err, {});
  }
  return std::nullopt;
}

// ------------------------------------------------------------- launches

void set_arg(cl_kernel k, cl_uint i, std::size_t size, const void* value) {
  cl_int err = clSetKernelArg(k, i, size, value);
  TORCH_CHECK(err == CL_SUCCESS, "ocl: clSetKernelArg(", i, ") failed: ", error_name(err), " (",
              err, ")");
}
template <class T>
void set_arg(cl_kernel k, cl_uint i, const T& value) {
  set_arg(k, i, sizeof(T), &value);
}
void set_ptr(cl_kernel k, cl_uint i, const void* p) {
  cl_int err = clSetKernelArgSVMPointer(k, i, p);
  TORCH_CHECK(err == CL_SUCCESS, "ocl: clSetKernelArgSVMPointer(", i, ") failed: ",
              error_name(err), " (", err, ")");
}

// Sets `kernel`'s arguments and enqueues it on `s`'s queue, as the stream's
// last command, or records it when the stream captures (Note [ocl graphs]);
// then reports the work (Kernels<R>::enqueued).
template <class SetArgs>
void launch(const accelkit::KernelStream& s, Kernel& kernel, Counter counter, cl_uint dims,
            const std::size_t* global, const std::size_t* local, SetArgs&& set_args) {
  {
    std::lock_guard<std::mutex> lock(kernel.mutex);  // Note [ocl kernel program]
    set_args(kernel.k);
    K::translated([&] {
      K::runtime().enqueue_kernel(s.device, s.handle, "clEnqueueNDRangeKernel", kernel.k, dims,
                                  global, local);
    });
  }
  counters.count(counter);
  K::enqueued(s);
}

std::size_t round_up(std::int64_t n, std::size_t m) {
  return (static_cast<std::size_t>(n) + m - 1) / m * m;
}

// A float32 tensor of ocl's device `like` (the kernels' one dtype).
bool f32(const at::Tensor& t, const at::Tensor& like) { return accelkit::dtype_on(t, at::kFloat, like); }
bool f32(const at::Tensor& t) { return f32(t, t); }
// out = op(a, b, s), broadcast; nullopt where the layout does not fit.
std::optional<at::Tensor> elementwise(Op op, Counter counter, const at::Tensor& a,
                                      const at::Tensor* b, float s) {
  Geom g{};
  auto made = accelkit::elementwise_output(a, b, nullptr, g.size, {g.so, g.sa, g.sb}, g.ndim);
  if (!made || made->numel() == 0) return made;
  at::Tensor out = *made;
  g.n = out.numel();
  accelkit::KernelStream st = K::current_stream(a);
  K::record_stream(a, st);  // the inputs may come from another stream
  if (b) K::record_stream(*b, st);
  Program& p = program(st.device);
  std::size_t global = round_up(g.n, p.reduce_wg), local = p.reduce_wg;
  auto code = static_cast<cl_int>(op);
  const void* pa = a.const_data_ptr();
  const void* pb = b ? b->const_data_ptr() : pa;
  void* po = out.mutable_data_ptr();
  launch(st, p.elementwise, counter, 1, &global, &local, [&](cl_kernel k) {
    set_arg(k, 0, g);
    set_arg(k, 1, code);
    set_arg(k, 2, s);
    set_ptr(k, 3, po);
    set_ptr(k, 4, pa);
    set_ptr(k, 5, pb);
  });
  return out;
}

// a op b where b is a tensor of a's device or a Python number.
std::optional<at::Tensor> binary(Op op, Op scalar_op, Counter counter, const at::Tensor& a,
                                 const at::Tensor& b, float s) {
  if (!f32(a)) return std::nullopt;
  if (f32(b, a)) return elementwise(op, counter, a, &b, s);
  if (auto v = accelkit::wrapped_number<float>(b))
    return elementwise(scalar_op, counter, a, nullptr, scalar_op == Op::add_scalar ? s * *v : *v);
  return std::nullopt;
}

std::optional<at::Tensor> add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto s = real_number<float>(alpha);
  return s ? binary(Op::add, Op::add_scalar, c_add, self, other, *s) : std::nullopt;
}

std::optional<at::Tensor> mul(const at::Tensor& self, const at::Tensor& other) {
  return binary(Op::mul, Op::mul_scalar, c_mul, self, other, 1.0f);
}

std::optional<at::Tensor> relu(const at::Tensor& self) {
  return f32(self) ? elementwise(Op::relu, c_relu, self, nullptr, 0.0f) : std::nullopt;
}

std::optional<at::Tensor> threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                                             const at::Scalar& threshold) {
  auto t = real_number<float>(threshold);
  if (!t || !f32(grad) || !f32(self, grad)) return std::nullopt;
  return elementwise(Op::threshold_backward, c_threshold_backward, grad, &self, *t);
}

// beta * bias + alpha * (a @ b); bias undefined for mm.
std::optional<at::Tensor> matmul(Counter counter, const at::Tensor& bias, const at::Tensor& a,
                                 const at::Tensor& b, const at::Scalar& beta,
                                 const at::Scalar& alpha) {
  auto r = accelkit::matmul_args<float>(bias, a, b, beta, alpha, at::kFloat);
  if (!r) return std::nullopt;
  std::int64_t m = r->m, n = r->n, k = r->k;
  bool has_bias = r->has_bias;
  std::array<std::int64_t, 2> mn = {m, n}, sc = r->bias_strides;
  at::Tensor out = empty_output(a, mn, nullptr);
  if (out.numel() == 0) return out;
  accelkit::KernelStream st = K::current_stream(a);
  K::record_stream(a, st);
  K::record_stream(b, st);
  if (has_bias) K::record_stream(bias, st);
  Program& p = program(st.device);
  std::size_t global[2] = {round_up(n, p.tile), round_up(m, p.tile)}, local[2] = {p.tile, p.tile};
  cl_long lm = m, ln = n, lk = k;
  cl_long sa0 = a.stride(0), sa1 = a.stride(1), sb0 = b.stride(0), sb1 = b.stride(1);
  cl_long sc0 = sc[0], sc1 = sc[1];
  cl_int hb = has_bias ? 1 : 0;
  float al = r->alpha, be = r->beta;
  const void* pa = a.const_data_ptr();
  const void* pb = b.const_data_ptr();
  const void* pc = has_bias ? bias.const_data_ptr() : pa;  // pa: never read
  void* po = out.mutable_data_ptr();
  launch(st, p.addmm, counter, 2, global, local, [&](cl_kernel kn) {
    set_arg(kn, 0, lm);
    set_arg(kn, 1, ln);
    set_arg(kn, 2, lk);
    set_arg(kn, 3, al);
    set_arg(kn, 4, be);
    set_arg(kn, 5, hb);
    set_ptr(kn, 6, po);
    set_ptr(kn, 7, pa);
    set_arg(kn, 8, sa0);
    set_arg(kn, 9, sa1);
    set_ptr(kn, 10, pb);
    set_arg(kn, 11, sb0);
    set_arg(kn, 12, sb1);
    set_ptr(kn, 13, pc);
    set_arg(kn, 14, sc0);
    set_arg(kn, 15, sc1);
  });
  return out;
}

std::optional<at::Tensor> mm(const at::Tensor& self, const at::Tensor& mat2) {
  return matmul(c_mm, at::Tensor(), self, mat2, 0, 1);
}

std::optional<at::Tensor> addmm(const at::Tensor& self, const at::Tensor& mat1,
                                const at::Tensor& mat2, const at::Scalar& beta,
                                const at::Scalar& alpha) {
  return matmul(c_addmm, self, mat1, mat2, beta, alpha);
}

// The sum of `self` over `dims` (none: all).
std::optional<at::Tensor> sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dims,
                                     bool keepdim, std::optional<at::ScalarType> dtype) {
  if (!f32(self) || (dtype && *dtype != at::kFloat)) return std::nullopt;
  auto l = accelkit::reduction_layout(self, dims, keepdim);
  if (!l) return std::nullopt;  // the CPU's error
  at::Tensor out = empty_output(self, l->shape, nullptr);
  if (out.numel() == 0) return out;
  Red g{};
  if (!merge_dims<1>(l->kept_sizes, {l->kept_strides.data()}, g.ksize, {g.kstride}, g.nk) ||
      !merge_dims<1>(l->reduced_sizes, {l->reduced_strides.data()}, g.rsize, {g.rstride}, g.nr))
    return std::nullopt;
  g.nout = out.numel();
  g.nred = 1;
  for (std::int64_t v : l->reduced_sizes) g.nred *= v;
  accelkit::KernelStream st = K::current_stream(self);
  K::record_stream(self, st);
  Program& p = program(st.device);
  std::size_t local = p.reduce_wg, global = static_cast<std::size_t>(g.nout) * local;
  const void* pa = self.const_data_ptr();
  void* po = out.mutable_data_ptr();
  launch(st, p.sum, c_sum, 1, &global, &local, [&](cl_kernel k) {
    set_arg(k, 0, g);
    set_ptr(k, 1, po);
    set_ptr(k, 2, pa);
  });
  return out;
}

std::optional<at::Tensor> sum(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return sum_dim(self, std::nullopt, false, dtype);
}

std::atomic<bool> registered{false};

}  // namespace

Program& program(int device) {
  return programs.get(device, [](int device) {
    auto p = std::make_unique<Program>();
    if (auto error = build(device, *p)) throw std::runtime_error(*error);
    return p;
  });
}

std::int64_t launches(std::string_view kernel) { return counters.launches(kernel); }

bool enabled() { return registered.load(); }

}  // namespace ocl::kernels

ACCELKIT_KERNELS(ocl::OpenCLRuntime, lib) {
  namespace k = ocl::kernels;
  if (!accelkit::kernels_enabled("OCL_NATIVE_KERNELS")) return;
  using namespace at::_ops;
  using R = ocl::OpenCLRuntime;
  accelkit::impl_or_fallback<R, add_Tensor, &k::add>(lib);
  accelkit::impl_or_fallback<R, mul_Tensor, &k::mul>(lib);
  accelkit::impl_or_fallback<R, relu, &k::relu>(lib);
  accelkit::impl_or_fallback<R, threshold_backward, &k::threshold_backward>(lib);
  accelkit::impl_or_fallback<R, mm, &k::mm>(lib);
  accelkit::impl_or_fallback<R, addmm, &k::addmm>(lib);
  accelkit::impl_or_fallback<R, sum_dim_IntList, &k::sum_dim>(lib);
  accelkit::impl_or_fallback<R, sum, &k::sum>(lib);
  k::registered = true;
}
