// accelkit: the error types every layer throws.
//
// Note [Error kinds]
// PyTorch users expect specific Python exception types: IndexError for a bad
// device index, ValueError for a malformed argument or environment variable,
// torch.OutOfMemoryError when memory runs out, RuntimeError for the rest.
// The core is torch-free, so it throws accelkit::Error subclasses that carry
// an ErrorKind; the torch adapters translate the kind into the matching c10
// error (and so the Python type) at the boundary. Every message starts with
// the backend's name and names the offending value, so a user who runs two
// backends in one process knows which one complained and about what.
#pragma once

#include <accelkit/config.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

enum class ErrorKind {
  index,          // Python IndexError: a device index out of range
  value,          // Python ValueError: a malformed argument, size or variable
  runtime,        // Python RuntimeError: bad state (use after free, forked child)
  out_of_memory,  // torch.OutOfMemoryError
  not_supported,  // RuntimeError: an optional capability the backend lacks
  driver,         // RuntimeError: the vendor driver reported a failure
};

constexpr std::string_view to_string(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::index: return "IndexError";
    case ErrorKind::value: return "ValueError";
    case ErrorKind::runtime: return "RuntimeError";
    case ErrorKind::out_of_memory: return "OutOfMemoryError";
    case ErrorKind::not_supported: return "NotSupportedError";
    case ErrorKind::driver: return "DriverError";
  }
  return "Error";
}

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string_view backend, std::string_view message)
      : std::runtime_error(compose(backend, message)),
        kind_(kind),
        backend_(backend),
        message_(message) {}

  ErrorKind kind() const noexcept { return kind_; }
  // The backend that raised the error ("simdev"); empty for backend-neutral
  // helpers such as the environment-variable parser used on its own.
  const std::string& backend() const noexcept { return backend_; }
  // The message without the "backend: " prefix.
  const std::string& message() const noexcept { return message_; }

 private:
  static std::string compose(std::string_view backend, std::string_view message) {
    std::string s;
    s.reserve(backend.size() + message.size() + 2);
    if (!backend.empty()) {
      s.append(backend);
      s.append(": ");
    }
    s.append(message);
    return s;
  }

  ErrorKind kind_;
  std::string backend_;
  std::string message_;
};

#define ACCELKIT_DEFINE_ERROR_(Name, Kind)                          \
  class Name : public Error {                                       \
   public:                                                          \
    Name(std::string_view backend, std::string_view message)        \
        : Error(ErrorKind::Kind, backend, message) {}               \
  };

ACCELKIT_DEFINE_ERROR_(IndexError, index)
ACCELKIT_DEFINE_ERROR_(ValueError, value)
ACCELKIT_DEFINE_ERROR_(RuntimeError, runtime)
ACCELKIT_DEFINE_ERROR_(OutOfMemoryError, out_of_memory)
ACCELKIT_DEFINE_ERROR_(NotSupportedError, not_supported)
#undef ACCELKIT_DEFINE_ERROR_

// A failure reported by the vendor's driver: the one error type a runtime
// throws from its members. Carries the driver's own code and message, and the
// contract member that failed.
class DriverError : public Error {
 public:
  DriverError(std::string_view backend, std::int64_t code, std::string_view call,
              std::string_view driver_message)
      : Error(ErrorKind::driver, backend, describe(backend, code, call, driver_message)),
        code_(code),
        call_(call),
        driver_message_(driver_message) {}

  std::int64_t code() const noexcept { return code_; }
  const std::string& call() const noexcept { return call_; }
  const std::string& driver_message() const noexcept { return driver_message_; }

 private:
  // "driver error 999 in memcpy_async: ..." (what() adds "backend: " once).
  static std::string describe(std::string_view, std::int64_t code, std::string_view call,
                              std::string_view driver_message) {
    std::string s = "driver error ";
    s += std::to_string(code);
    if (!call.empty()) {
      s += " in ";
      s.append(call);
    }
    if (!driver_message.empty()) {
      s += ": ";
      s.append(driver_message);
    }
    return s;
  }

  std::int64_t code_;
  std::string call_;
  std::string driver_message_;
};

ACCELKIT_END_NAMESPACE
