// accelkit: the allocating constructors (empty.memory_format,
// empty_strided): tensors on the caching device allocator, on the device
// asked for or the current one, filled as CUDA fills them under
// torch.utils.deterministic.fill_uninitialized_memory (Note [Deterministic
// fill of new memory]).
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <ATen/Context.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/DeviceGuard.h>

#include <optional>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Deterministic fill of new memory]
// Problem: under torch.use_deterministic_algorithms(True) with
// torch.utils.deterministic.fill_uninitialized_memory (its default), PyTorch
// promises that memory a tensor gets uninitialized reads the same in every
// run: the CPU's and CUDA's empty, empty_strided and resize_ fill it; a
// cached block handed out again would otherwise show whatever its last
// user wrote.
// Decision: the operators empty.memory_format and empty_strided fill the
// tensor they make with PyTorch's own at::native::fill_empty_deterministic_
// (NaN for floating and complex types, the largest value for integers and
// bool), and resize_ the elements its growth added
// (at::native::fill_resize_deterministic_), under the same condition as
// CUDA's empty_cuda and resize_cuda_ (both flags read at the call): the fill
// is the device's fill_, queued on the current stream like any write.
// Limits: as on CUDA, only these operators fill: memory an operator
// allocates for its own output (a kernel's result, which it writes whole),
// a storage's resize (storage.resize_) and the caching pool's blocks as
// such are not filled.
inline bool fill_uninitialized_memory() {
  const at::Context& context = at::globalContext();
  return context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory();
}

struct EmptyOps {
  static at::Tensor empty_memory_format(c10::SymIntArrayRef size,
                                        std::optional<c10::ScalarType> dtype,
                                        std::optional<c10::Layout>, std::optional<c10::Device> device,
                                        std::optional<bool>,
                                        std::optional<c10::MemoryFormat> memory_format) {
    std::optional<c10::DeviceGuard> guard;  // only for an explicit index: else current
    if (device && device->has_index()) guard.emplace(*device);
    at::Tensor t = at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &device_allocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                             dtype.value_or(at::get_default_dtype_as_scalartype()),
                                             memory_format);
    if (C10_UNLIKELY(fill_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
    return t;
  }

  static at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                  std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                                  std::optional<c10::Device> device, std::optional<bool>) {
    std::optional<c10::DeviceGuard> guard;
    if (device && device->has_index()) guard.emplace(*device);
    at::Tensor t = at::detail::empty_strided_generic(
        C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), &device_allocator(),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        dtype.value_or(at::get_default_dtype_as_scalartype()));
    if (C10_UNLIKELY(fill_uninitialized_memory())) at::native::fill_empty_deterministic_(t);
    return t;
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
