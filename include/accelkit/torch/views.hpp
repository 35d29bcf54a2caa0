// accelkit: the native operators that change only a tensor's metadata over
// memory it already has: the views PyTorch's kernels give per device
// (as_strided, view, _reshape_alias) and set_ onto a storage.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/view_native.h>

#include <cstdint>
#include <optional>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct ViewOps {
  static at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset) {
    return at::native::as_strided_tensorimpl(
        self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
        offset ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
  }

  static at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
    return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
  }

  static at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                                  c10::SymIntArrayRef stride) {
    return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
  }

  static at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                 c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
    return at::native::set_storage_cpu_(self, source, offset.expect_int(),
                                        C10_AS_INTARRAYREF_SLOW(size),
                                        C10_AS_INTARRAYREF_SLOW(stride));
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
