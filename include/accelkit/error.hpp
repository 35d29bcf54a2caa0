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

 protected:
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

  // A driver failure whose message the subclass words.
  struct Worded {};
  DriverError(Worded, std::string_view backend, std::int64_t code, std::string_view call,
              std::string_view driver_message, std::string_view message)
      : Error(ErrorKind::driver, backend, message),
        code_(code),
        call_(call),
        driver_message_(driver_message) {}

 private:
  std::int64_t code_;
  std::string call_;
  std::string driver_message_;
};

// Note [Lost devices]
// Problem: some failures end a device: after Vulkan's VK_ERROR_DEVICE_LOST,
// or CUDA's sticky errors (an illegal address, a launch failure), the
// device runs no more work until the process ends, and every later call
// fails. A caller told only "driver error" retries, or reads memory the
// device never wrote.
// Decision: a runtime reports such a failure as a DeviceLostError (a
// DriverError: Runtime<Self>::device_lost(code, call, message)), from the
// member that saw it, the failure of queued work included; from then on it
// runs no work on that device (each call fails with a DriverError). Backend<R>
// keeps each device's first loss: the caller gets it once, naming the
// device; every later call that would run work on the device (allocations,
// copies, fills, streams, events, waits, synchronizes, graphs, virtual and
// shared memory, host maps) is refused at once with a DeviceLostError
// naming the backend, the device, the first failure and the call refused,
// without calling the runtime. Releases (free, host_free, stream and event
// destroy, vm_unmap, vm_release, vm_destroy, graph and signal destroys,
// ipc_mem_close, host_unmap) still call the runtime; one that fails keeps
// its resource out of every pool and is reported through the diagnostics
// hook where nothing may throw. Other devices keep working. PyTorch users
// get torch.AcceleratorError (a RuntimeError).
// Limits: a loss is the device's for the rest of the process (a new process
// makes a new context). A runtime member a vendor kernel calls directly
// bypasses Backend<R>: its loss is kept when the runtime reports it again,
// at the device's next call through the SDK. A loss seen by a call of two
// devices (a peer copy, a cross-device wait) is kept for the device the call
// is ordered on.
class DeviceLostError : public DriverError {
 public:
  // The loss, as a runtime reports it: "device lost: driver error <code> in
  // <call>: <message>".
  DeviceLostError(std::string_view backend, std::int64_t code, std::string_view call,
                  std::string_view driver_message)
      : DriverError(Worded{}, backend, code, call, driver_message,
                    "device lost: " + describe(backend, code, call, driver_message)) {}

  // The loss of logical device `device`, as the SDK reports it the one
  // time: "device <i> lost: driver error <code> in <call>: <message>".
  DeviceLostError(const DriverError& first, int device)
      : DriverError(Worded{}, first.backend(), first.code(), first.call(), first.driver_message(),
                    "device " + std::to_string(device) + " lost: " +
                        describe(first.backend(), first.code(), first.call(),
                                 first.driver_message())),
        device_(device) {}

  // The SDK's refusal of `refused` on lost device `device`: "device <i> is
  // lost (driver error <code> in <call>: <message>); <refused> refused: ...".
  // code(), call() and driver_message() are the first failure's.
  DeviceLostError(const DriverError& first, int device, std::string_view refused)
      : DriverError(Worded{}, first.backend(), first.code(), first.call(), first.driver_message(),
                    "device " + std::to_string(device) + " is lost (" +
                        describe(first.backend(), first.code(), first.call(),
                                 first.driver_message()) +
                        "); " + std::string(refused) +
                        " refused: a lost device runs no more work in this process"),
        device_(device),
        refused_(refused) {}

  // The logical device, or -1 where the runtime reported it (the runtime
  // knows physical ordinals only).
  int device() const noexcept { return device_; }
  // The call the SDK refused; empty for the loss itself.
  const std::string& refused() const noexcept { return refused_; }

 private:
  int device_ = -1;
  std::string refused_;
};

ACCELKIT_END_NAMESPACE
