// simdev's native kernels, through accelkit's vendor-kernel API
// (include/accelkit/torch/kernels.hpp): `add` and `relu` of float32 tensors
// run on the current stream's queue, asynchronously, as a device kernel
// would; `mul.Tensor` is opted out of its host kernel (it runs through the
// CPU fallback). Arguments the kernels do not take go to the CPU fallback.
//
// A test knob: they are registered only when SIMDEV_NATIVE_KERNELS=1 at the
// library's load (tests/python/test_simdev_kernels.py), so that the rest of
// the suite keeps testing the host kernels.
#include <accelkit/torch/kernels.hpp>

#include "simdev_runtime.hpp"

#include <ATen/ops/add_ops.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/relu_ops.h>

#include <cstdlib>
#include <cstring>

namespace {
using Sim = simdev::SimRuntime;
using K = accelkit::Kernels<Sim>;

// A float32 contiguous tensor of simdev's (the kernels' one layout).
bool plain(const at::Tensor& t) {
  return t.device().type() == c10::DeviceType::PrivateUse1 && t.scalar_type() == at::kFloat &&
         t.is_contiguous() && !t.is_conj() && !t.is_neg();
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (!plain(self) || !plain(other) || self.device() != other.device() ||
      self.sizes() != other.sizes() || !alpha.equal(1))
    return K::fallback<at::_ops::add_Tensor>(self, other, alpha);
  at::Tensor out = at::empty_like(self);  // the caching pool, on the current stream
  accelkit::KernelStream s = K::current_stream(self);
  // The inputs may come from other streams: the pool must not hand their
  // memory out again before this kernel has read it.
  K::record_stream(self, s);
  K::record_stream(other, s);
  const float* a = self.const_data_ptr<float>();
  const float* b = other.const_data_ptr<float>();
  float* c = out.mutable_data_ptr<float>();
  std::size_t n = static_cast<std::size_t>(self.numel());
  auto& rt = K::runtime();  // the kernel addresses the device's view (mapped mode)
  K::runtime().launch(
      s.device, s.handle, "add",
      [a = rt.device_address(s.device, a), b = rt.device_address(s.device, b),
       c = rt.device_address(s.device, c), n] {
        for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + b[i];
      },
      {{a, n * sizeof(float)}, {b, n * sizeof(float)}, {c, n * sizeof(float)}});
  K::enqueued(s);
  return out;
}

at::Tensor relu(const at::Tensor& self) {
  if (!plain(self)) return K::fallback<at::_ops::relu>(self);
  at::Tensor out = at::empty_like(self);
  accelkit::KernelStream s = K::current_stream(self);
  K::record_stream(self, s);
  const float* a = self.const_data_ptr<float>();
  float* c = out.mutable_data_ptr<float>();
  std::size_t n = static_cast<std::size_t>(self.numel());
  auto& rt = K::runtime();  // the kernel addresses the device's view (mapped mode)
  K::runtime().launch(
      s.device, s.handle, "relu",
      [a = rt.device_address(s.device, a), c = rt.device_address(s.device, c), n] {
        // NaN stays NaN, as the CPU's relu (clamp_min(0)) keeps it.
        for (std::size_t i = 0; i < n; ++i) c[i] = a[i] > 0.0f || a[i] != a[i] ? a[i] : 0.0f;
      },
      {{a, n * sizeof(float)}, {c, n * sizeof(float)}});
  K::enqueued(s);
  return out;
}

bool enabled() {
  const char* v = std::getenv("SIMDEV_NATIVE_KERNELS");
  return v != nullptr && std::strcmp(v, "1") == 0;
}
}  // namespace

ACCELKIT_KERNELS(simdev::SimRuntime, lib) {
  if (!enabled()) return;
  lib.impl("add.Tensor", TORCH_FN(add));
  lib.impl("relu", TORCH_FN(relu));
  lib.fallback("mul.Tensor");
}
