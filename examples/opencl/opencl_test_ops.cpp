// Operators for ocl's tests and benchmarks (torch.ops.ocl_kernels), beside
// the native kernels of opencl_kernels.cpp:
// - launches(kernel='') counts the native kernels' launches ("add", ...,
//   "" for all), so a test can tell a kernel ran, not the fallback;
//   enabled() says whether they were registered (OCL_NATIVE_KERNELS);
// - gate = hold() stops the current stream at this point (a barrier on an
//   OpenCL user event) until release(gate);
// - add_directly(a, b, out, iters, track=0) enqueues the native `add`
//   kernel on the current stream's queue `iters` times with raw OpenCL
//   calls (arguments set, clEnqueueNDRangeKernel without an event, one
//   clFlush at the end); `track` adds what the runtime's enqueue adds per
//   launch: 1 an event asked for and the previous one released, 2 a
//   clFlush, 3 both; and
//   add_through_backend(a, b, iters) calls at::add `iters` times from C++:
//   the benchmark's baseline, its decomposition and its C++ loop
//   (bench/opencl_bench.py). The direct enqueues bypass the stream's
//   last-command tracking, so synchronize the device (torch.ocl.synchronize)
//   after them;
// - OCL_TEST_SECOND_RELU=1 at load registers a second vendor kernel for
//   `relu` (returning its input): the SDK refuses it and reports both
//   places through the diagnostics hook (Note [Vendor kernel registration]).
#include <accelkit/torch/kernels.hpp>

#include "opencl_kernels.hpp"

#include <ATen/ops/add.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

namespace {
using K = accelkit::Kernels<ocl::OpenCLRuntime>;

std::mutex gates_mutex;
std::map<std::int64_t, cl_event> gates;
std::int64_t next_gate = 1;

void check(cl_int err, const char* what) {
  TORCH_CHECK(err == CL_SUCCESS, "ocl: ", what, " failed: ", ocl::error_name(err), " (", err, ")");
}

std::int64_t hold() {
  accelkit::KernelStream s = K::current_stream();
  cl_context ctx = K::translated([&] { return K::runtime().cl_context_of(s.device); });
  cl_int err = CL_SUCCESS;
  cl_event user = clCreateUserEvent(ctx, &err);
  check(err, "clCreateUserEvent");
  try {
    K::translated([&] {
      K::runtime().enqueue_on(s.device, s.handle, "clEnqueueBarrierWithWaitList",
                              [&](cl_command_queue q, cl_event* e) {
                                return clEnqueueBarrierWithWaitList(q, 1, &user, e);
                              });
    });
  } catch (...) {
    clReleaseEvent(user);
    throw;
  }
  std::lock_guard<std::mutex> lock(gates_mutex);
  gates[next_gate] = user;
  return next_gate++;
}

void release(std::int64_t id) {
  cl_event user = nullptr;
  {
    std::lock_guard<std::mutex> lock(gates_mutex);
    auto it = gates.find(id);
    TORCH_CHECK_VALUE(it != gates.end(), "ocl: release: no held gate ", id);
    user = it->second;
    gates.erase(it);
  }
  cl_int err = clSetUserEventStatus(user, CL_COMPLETE);
  clReleaseEvent(user);
  check(err, "clSetUserEventStatus");
}

void add_directly(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                  std::int64_t iters, std::int64_t track) {
  TORCH_CHECK_VALUE(track >= 0 && track <= 3, "ocl: add_directly: track=", track,
                    ": expected 0, 1 (an event), 2 (a clFlush) or 3 (both)");
  bool event = (track & 1) != 0, flush = (track & 2) != 0;
  for (const at::Tensor* t : {&a, &b, &out})
    TORCH_CHECK_VALUE(t->device().type() == c10::DeviceType::PrivateUse1 &&
                          t->scalar_type() == at::kFloat && t->is_contiguous() &&
                          t->numel() == a.numel() && t->device() == a.device(),
                      "ocl: add_directly: expected contiguous float32 ocl tensors of one size");
  if (a.numel() == 0) return;
  accelkit::KernelStream s = K::current_stream(a);
  ocl::kernels::Program& p = ocl::kernels::program(s.device);
  cl_command_queue q = K::translated([&] { return K::runtime().queue(s.device, s.handle); });
  ocl::kernels::Geom g{};
  g.n = a.numel();
  g.ndim = 1;
  g.size[0] = g.n;
  g.so[0] = g.sa[0] = g.sb[0] = 1;
  auto op = static_cast<cl_int>(ocl::kernels::Op::add);
  float one = 1.0f;
  std::size_t local = p.reduce_wg;
  std::size_t global = (static_cast<std::size_t>(g.n) + local - 1) / local * local;
  std::lock_guard<std::mutex> lock(p.elementwise.mutex);
  cl_kernel k = p.elementwise.k;
  cl_event last = nullptr;  // with an event per launch: the last one
  struct Release {
    cl_event& e;
    ~Release() {
      if (e) clReleaseEvent(e);
    }
  } release{last};
  for (std::int64_t i = 0; i < iters; ++i) {
    check(clSetKernelArg(k, 0, sizeof g, &g), "clSetKernelArg");
    check(clSetKernelArg(k, 1, sizeof op, &op), "clSetKernelArg");
    check(clSetKernelArg(k, 2, sizeof one, &one), "clSetKernelArg");
    check(clSetKernelArgSVMPointer(k, 3, out.data_ptr()), "clSetKernelArgSVMPointer");
    check(clSetKernelArgSVMPointer(k, 4, a.data_ptr()), "clSetKernelArgSVMPointer");
    check(clSetKernelArgSVMPointer(k, 5, b.data_ptr()), "clSetKernelArgSVMPointer");
    cl_event e = nullptr;
    check(clEnqueueNDRangeKernel(q, k, 1, nullptr, &global, &local, 0, nullptr,
                                 event ? &e : nullptr),
          "clEnqueueNDRangeKernel");
    if (event) {
      if (last) clReleaseEvent(last);
      last = e;
    }
    if (flush) check(clFlush(q), "clFlush");
  }
  check(clFlush(q), "clFlush");
}

void add_through_backend(const at::Tensor& a, const at::Tensor& b, std::int64_t iters) {
  for (std::int64_t i = 0; i < iters; ++i) at::add(a, b);
}
}  // namespace

TORCH_LIBRARY(ocl_kernels, m) {
  m.def("launches(str kernel='') -> int",
        [](c10::string_view k) { return ocl::kernels::launches(std::string_view(k.data(), k.size())); });
  m.def("enabled() -> bool", [] { return ocl::kernels::enabled(); });
  m.def("hold() -> int", &hold);
  m.def("release(int gate) -> ()", &release);
  m.def("add_directly(Tensor a, Tensor b, Tensor(a!) out, int iters, int track=0) -> ()",
        &add_directly);
  m.def("add_through_backend(Tensor a, Tensor b, int iters) -> ()", &add_through_backend);
}

ACCELKIT_KERNELS(ocl::OpenCLRuntime, lib) {
  const char* v = std::getenv("OCL_TEST_SECOND_RELU");
  if (v == nullptr || std::strcmp(v, "1") != 0) return;
  lib.impl("relu", [](const at::Tensor& self) { return self; });
}
