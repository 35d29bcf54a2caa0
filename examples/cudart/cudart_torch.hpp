// cudart's torch side: the runtime and its ATen kernels, included by the
// one translation unit that accelkit_add_torch_backend generates (its
// HEADER), so that the backend's library is a single torch translation unit
// (one to two minutes of the CI's build rather than twice that). Include it
// in exactly one translation unit: it registers the kernels.
//
// The kernels, through accelkit's vendor-kernel API
// (include/accelkit/torch/kernels.hpp): add.Tensor, mul.Tensor and relu of
// same-device, same-shape, contiguous float32, float16 and bfloat16 tensors
// run as CUDA kernels (cudart_kernels.cu) on the SDK's current stream,
// asynchronously. Anything else they do not take (broadcasting, other
// dtypes, alpha != 1, a scalar operand) goes to the SDK's CPU fallback, as
// does every other operator.
#pragma once

#include <accelkit/torch/kernels.hpp>

#include "cudart_kernels.hpp"
#include "cudart_runtime.hpp"

#include <ATen/ops/add_ops.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/relu_ops.h>

#include <optional>

namespace cudart_torch {
using Rt = cudart::CudaRuntime;
using K = accelkit::Kernels<Rt>;

std::optional<cudart::Element> element_of(const at::Tensor& t) {
  if (t.device().type() != c10::DeviceType::PrivateUse1 || !t.is_contiguous() || t.is_conj() ||
      t.is_neg())
    return std::nullopt;
  switch (t.scalar_type()) {
    case at::kFloat: return cudart::Element::float32;
    case at::kHalf: return cudart::Element::float16;
    case at::kBFloat16: return cudart::Element::bfloat16;
    default: return std::nullopt;
  }
}

const char* launch_name(cudart::Elementwise op) {
  switch (op) {
    case cudart::Elementwise::add: return "the add kernel's launch";
    case cudart::Elementwise::mul: return "the mul kernel's launch";
    case cudart::Elementwise::relu: return "the relu kernel's launch";
  }
  return "a kernel launch";
}

// Launches `op` on the current stream of `a`'s device into a new tensor.
at::Tensor run(cudart::Elementwise op, cudart::Element type, const at::Tensor& a,
               const at::Tensor* b) {
  at::Tensor out = at::empty_like(a);  // the caching pool, on the current stream
  accelkit::KernelStream s = K::current_stream(a);
  // The inputs may come from other streams: their memory must not be handed
  // out again before this kernel has read it.
  K::record_stream(a, s);
  if (b) K::record_stream(*b, s);
  Rt::Guard device(s.device, "kernel");  // a launch goes to the current device's context
  Rt::check(cudart::launch_elementwise(op, type, a.const_data_ptr(),
                                       b ? b->const_data_ptr() : nullptr, out.mutable_data_ptr(),
                                       static_cast<std::size_t>(a.numel()), Rt::cuda(s.handle)),
            "kernel", launch_name(op));
  K::enqueued(s);
  return out;
}

bool same_shape(const at::Tensor& a, const at::Tensor& b) {
  return a.device() == b.device() && a.scalar_type() == b.scalar_type() &&
         a.sizes() == b.sizes();
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  auto t = element_of(self);
  if (!t || !element_of(other) || !same_shape(self, other) || !alpha.equal(1))
    return K::fallback<at::_ops::add_Tensor>(self, other, alpha);
  return run(cudart::Elementwise::add, *t, self, &other);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  auto t = element_of(self);
  if (!t || !element_of(other) || !same_shape(self, other))
    return K::fallback<at::_ops::mul_Tensor>(self, other);
  return run(cudart::Elementwise::mul, *t, self, &other);
}

at::Tensor relu(const at::Tensor& self) {
  auto t = element_of(self);
  if (!t) return K::fallback<at::_ops::relu>(self);
  return run(cudart::Elementwise::relu, *t, self, nullptr);
}
}  // namespace cudart_torch

ACCELKIT_KERNELS(cudart::CudaRuntime, lib) {
  lib.impl("add.Tensor", TORCH_FN(cudart_torch::add));
  lib.impl("mul.Tensor", TORCH_FN(cudart_torch::mul));
  lib.impl("relu", TORCH_FN(cudart_torch::relu));
}
