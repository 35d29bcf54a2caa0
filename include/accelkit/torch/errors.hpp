// accelkit: the SDK's errors as PyTorch's (Note [Error kinds]), and failures
// where nothing may throw.
#pragma once

#include <accelkit/torch/common.hpp>

#include <exception>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Raises the PyTorch error that matches an accelkit error's kind (Note
// [Error kinds]): Python sees IndexError, ValueError, torch.OutOfMemoryError
// or RuntimeError.
[[noreturn]] inline void rethrow(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::index: TORCH_CHECK_INDEX(false, e.what());
    case ErrorKind::value: TORCH_CHECK_VALUE(false, e.what());
    case ErrorKind::out_of_memory: TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
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
