// accelkit: the allocating constructors (empty.memory_format,
// empty_strided): tensors on the caching device allocator, on the device
// asked for or the current one.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <c10/core/DeviceGuard.h>

#include <optional>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct EmptyOps {
  static at::Tensor empty_memory_format(c10::SymIntArrayRef size,
                                        std::optional<c10::ScalarType> dtype,
                                        std::optional<c10::Layout>, std::optional<c10::Device> device,
                                        std::optional<bool>,
                                        std::optional<c10::MemoryFormat> memory_format) {
    std::optional<c10::DeviceGuard> guard;  // only for an explicit index: else current
    if (device && device->has_index()) guard.emplace(*device);
    return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &device_allocator(),
                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     dtype.value_or(at::get_default_dtype_as_scalartype()),
                                     memory_format);
  }

  static at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                  std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                                  std::optional<c10::Device> device, std::optional<bool>) {
    std::optional<c10::DeviceGuard> guard;
    if (device && device->has_index()) guard.emplace(*device);
    return at::detail::empty_strided_generic(
        C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), &device_allocator(),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        dtype.value_or(at::get_default_dtype_as_scalartype()));
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
