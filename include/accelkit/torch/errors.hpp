// accelkit: the SDK's errors as PyTorch's (Note [Error kinds]), and failures
// where nothing may throw.
#pragma once

#include <accelkit/torch/common.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Raises the PyTorch error that matches an accelkit error's kind (Note
// [Error kinds]): Python sees IndexError, ValueError, torch.OutOfMemoryError,
// torch.AcceleratorError or RuntimeError.
//
// Note [Driver errors in PyTorch]
// Problem: PyTorch raises CUDA's errors, sticky ones included, as
// torch.AcceleratorError (c10::AcceleratorError, a RuntimeError subclass
// carrying the driver's code), and users catch that type to tell a failing
// device from a misuse.
// Decision: every DriverError, a DeviceLostError (Note [Lost devices]) as
// any other, becomes c10::AcceleratorError with the driver's code (clamped
// to 32 bits) and the error's message; the other kinds keep their types.
// Limits: Python code that checks for exactly RuntimeError (type(e) is
// RuntimeError) no longer matches a driver failure; `except RuntimeError`
// does. Where nothing may throw, failures are reported instead
// (reporting_failures).
[[noreturn]] inline void rethrow(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::index: TORCH_CHECK_INDEX(false, e.what());
    case ErrorKind::value: TORCH_CHECK_VALUE(false, e.what());
    case ErrorKind::out_of_memory: TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    case ErrorKind::driver:
      if (const auto* d = dynamic_cast<const DriverError*>(&e)) {
        std::int64_t code = std::clamp<std::int64_t>(d->code(),
                                                     std::numeric_limits<std::int32_t>::min(),
                                                     std::numeric_limits<std::int32_t>::max());
        throw c10::AcceleratorError(
            c10::SourceLocation{__func__, __FILE__, static_cast<std::uint32_t>(__LINE__)},
            static_cast<std::int32_t>(code), e.what());
      }
      TORCH_CHECK(false, e.what());
    default: TORCH_CHECK(false, e.what());
  }
}

// Runs f, translating accelkit errors into PyTorch's.
template <class F>
decltype(auto) translated(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    rethrow(e);
  }
}

// Runs f where nothing may throw (a deleter, a guard's destructor): a
// failure is reported (Note [Diagnostics]), not thrown.
template <class F>
void reporting_failures(F&& f) noexcept {
  try {
    f();
  } catch (const Error& e) {
    report(Severity::error, backend_name(), e.message());
  } catch (const std::exception& e) {
    report(Severity::error, backend_name(), e.what());
  } catch (...) {
    report(Severity::error, backend_name(), "unknown error");
  }
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
