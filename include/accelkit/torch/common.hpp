// accelkit: what every torch adapter header includes first: the CPU stub
// macros (before any PyTorch header), PyTorch's headers the adapters use,
// the device type, and the conversion of streams. The adapters are plain
// code over the module's backend (Note [Backend interface] in
// torch/backend_interface.hpp), compiled once in the SDK's library sources.
//
// Note [fmt beside libtorch]: the wheel's include directory carries its own
// fmt headers, which shadow the system fmt in any translation unit that
// includes PyTorch, while its compiled fmt is not exported. Translation units
// that include this header must define FMT_HEADER_ONLY (the accelkit::torch
// CMake target does).
//
// Note [CPU kernel stubs]: PyTorch's x86-64 builds compile every
// TensorIterator kernel stub for AVX2 and AVX512 and export the stub lookup
// with those variants in its signature; the macros that say so are not part
// of the installed headers. Host kernels (host_kernels.hpp) call stubs, so
// they are defined here, before any PyTorch header: include accelkit's torch
// headers first in a translation unit (a PyTorch header included before them
// shows as an undefined at::native::DispatchStubImpl::get_call_ptr at link).

#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#ifndef HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif
#ifndef HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#define ACCELKIT_TORCH_CPU_STUBS 1
#endif
#include <accelkit/accelkit.hpp>
#include <accelkit/torch/backend_interface.hpp>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <c10/core/Stream.h>
#include <torch/library.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

inline constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

// A stream of the backend as PyTorch's, and back.
inline c10::Stream to_c10(const Stream& s) {
  return c10::Stream(c10::Stream::UNSAFE,
                     c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(s.device)), s.id);
}

inline Stream from_c10(const c10::Stream& s) {
  return Stream{static_cast<device_index>(s.device_index()), s.id()};
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
