// accelkit: where the SDK reports what it cannot throw.
//
// Note [Diagnostics]
// A library does not print. Some failures happen where nothing can be thrown
// (a tensor's deleter, a device guard restoring the previous device, a free
// whose memory must wait for a later empty_cache) or must not stop the
// operation that met them; the SDK reports those here, with the
// backend's name. The default handler drops them; the torch adapters install
// one that raises a PyTorch warning (TORCH_WARN, a Python UserWarning), and
// a program or test can install its own. Limits: one handler per process,
// shared by every backend (hence the backend's name in each report), called
// on whatever thread met the failure.
#pragma once

#include <accelkit/config.hpp>

#include <atomic>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE

enum class Severity { warning, error };

// Called from any thread; must not throw (what it throws is dropped).
using DiagnosticHandler = void (*)(Severity severity, std::string_view backend,
                                   std::string_view message);

namespace detail {
inline std::atomic<DiagnosticHandler>& diagnostic_handler() noexcept {
  static std::atomic<DiagnosticHandler> handler{nullptr};
  return handler;
}
}  // namespace detail

// Installs `handler` (nullptr: drop reports) and returns the previous one.
inline DiagnosticHandler set_diagnostic_handler(DiagnosticHandler handler) noexcept {
  return detail::diagnostic_handler().exchange(handler);
}

// Reports a failure that is not thrown (Note [Diagnostics]).
inline void report(Severity severity, std::string_view backend, std::string_view message) noexcept {
  if (DiagnosticHandler h = detail::diagnostic_handler().load()) {
    try {
      h(severity, backend, message);
    } catch (...) {
    }
  }
}

ACCELKIT_END_NAMESPACE
