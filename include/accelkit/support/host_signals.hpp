// accelkit/support: host signals' bookkeeping for a runtime's signal_create,
// stream_wait_signal, signal_complete and signal_destroy (Note [Host
// signals] in device/backend.hpp).
//
//   HostSignalTable<> signals{"acme", {ACME_BAD_HANDLE, ACME_BAD_VALUE,
//                                      ACME_BAD_VALUE, ACME_NOT_PERMITTED}};
//   SignalHandle h = signals.create(device);
//   // stream_wait_signal: queue a wait that blocks the stream
//   auto g = signals.get(h, "stream_wait_signal");
//   signals.check_stream_device(*g, device);
//   if (g->add_waiter()) enqueue(stream, [g] { int error = g->wait(); ... });
//   signals.complete(h, device, error);   // releases the waits
//   signals.destroy(h, device);           // refused while waits are pending
//
// What the table does is what every runtime's signals must do: a signal
// belongs to the device it was created for, is completed once, and is not
// destroyed while it is not completed and queued waits wait for it (a
// driver's user event released then leaves its waiters waiting forever).
// How a stream waits is the runtime's: a worker blocked in wait() (a
// simulator, CUDA's host functions), or a driver primitive (an OpenCL
// barrier on a user event kept as the signal's payload), whose waits are
// counted with add_waiter and never end: for those the count only says that
// some wait may still be pending.
//
// Errors are DriverErrors with the runtime's codes (HostSignalCodes); a table
// made without codes throws ValueError instead, for signals the SDK keeps
// itself. Thread-safe: the table has a lock, each signal one of its own, and
// a destroyed signal's state lives on for the waits that hold it.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/support/handle_table.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

// The driver codes of the four misuses the table refuses.
struct HostSignalCodes {
  std::int64_t unknown;          // a handle that names no live signal
  std::int64_t wrong_device;     // a signal used as another device's
  std::int64_t completed_twice;  // signal_complete of a completed signal
  std::int64_t busy;             // signal_destroy while it is not completed and waited for
};

// A signal without a payload of the runtime's.
struct NoPayload {};

template <class Payload>
class HostSignalTable;

// One signal's state, shared by its table and the waits queued on it.
template <class Payload = NoPayload>
class HostSignal {
 public:
  HostSignal(int device, Payload payload) : device_(device), payload_(std::move(payload)) {}
  HostSignal(const HostSignal&) = delete;
  HostSignal& operator=(const HostSignal&) = delete;

  int device() const noexcept { return device_; }
  // The runtime's own state of the signal (an OpenCL user event).
  Payload& payload() noexcept { return payload_; }

  // Counts one wait about to be queued. False, counting nothing, when the
  // signal has completed with success already: there is nothing to wait for.
  bool add_waiter() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_ && error_ == 0) return false;
    ++waiters_;
    return true;
  }
  // Takes back a wait that add_waiter counted and that could not be queued.
  void cancel_waiter() {
    std::lock_guard<std::mutex> lock(mutex_);
    --waiters_;
  }
  // Blocks until the signal is completed, ends one wait that add_waiter
  // counted, and returns the signal's error (0: success).
  int wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return done_; });
    --waiters_;
    return error_;
  }
  // The error once completed; nothing while not.
  std::optional<int> result() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_ ? std::optional<int>(error_) : std::nullopt;
  }

 private:
  friend class HostSignalTable<Payload>;

  int device_;
  Payload payload_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  int error_ = 0;
  int waiters_ = 0;  // counted by add_waiter, not yet ended by wait
};

template <class Payload = NoPayload>
class HostSignalTable {
 public:
  using Signal = HostSignal<Payload>;

  // A runtime's signals: misuse is a DriverError with `codes`.
  HostSignalTable(std::string_view backend, HostSignalCodes codes)
      : codes_(codes), signals_(backend, "signal", codes.unknown) {}
  // Signals the SDK keeps itself: misuse is a ValueError.
  explicit HostSignalTable(std::string_view backend) : signals_(backend, "signal") {}

  SignalHandle create(int device, Payload payload = {}) {
    return signals_.add(std::make_shared<Signal>(device, std::move(payload)));
  }

  // The live signal of `h`; an error for a handle that names none.
  std::shared_ptr<Signal> get(SignalHandle h, std::string_view call) const {
    return signals_.get(h, call);
  }

  // A stream of `device` may wait only for a signal of `device`.
  void check_stream_device(const Signal& g, int device) const {
    if (g.device_ != device)
      fail(&HostSignalCodes::wrong_device, "stream_wait_signal",
           fmt::format("signal of device {} waited for on a stream of device {}", g.device_,
                       device));
  }

  // Completes the signal with `error` (0: success) and releases its waits.
  // `before(Signal&)` runs first, under the signal's lock (a driver call that
  // sets the runtime's own event); if it throws, the signal stays as it was.
  template <class Before>
  void complete(SignalHandle h, int device, int error, Before&& before) {
    std::shared_ptr<Signal> g = get(h, "signal_complete");
    if (g->device_ != device)
      fail(&HostSignalCodes::wrong_device, "signal_complete",
           fmt::format("signal of device {} completed as device {}'s", g->device_, device));
    std::lock_guard<std::mutex> lock(g->mutex_);
    if (g->done_)
      fail(&HostSignalCodes::completed_twice, "signal_complete",
           fmt::format("signal {:#x} was completed already", h.value));
    before(*g);
    g->done_ = true;
    g->error_ = error;
    g->cv_.notify_all();
  }
  void complete(SignalHandle h, int device, int error) {
    complete(h, device, error, [](Signal&) {});
  }

  // Forgets the signal; refused, the signal left as it was, while it is not
  // completed and counted waits are pending. Returns its state, which lives
  // on while queued waits hold it.
  std::shared_ptr<Signal> destroy(SignalHandle h, int device) {
    return signals_.remove(h, "signal_destroy", -1, [&](const Signal& g) {
      if (g.device_ != device)
        fail(&HostSignalCodes::wrong_device, "signal_destroy",
             fmt::format("signal of device {} destroyed as device {}'s", g.device_, device));
      std::lock_guard<std::mutex> lock(g.mutex_);
      if (!g.done_ && g.waiters_ > 0)
        fail(&HostSignalCodes::busy, "signal_destroy",
             fmt::format("signal {:#x} is not completed and {} queued wait(s) still wait for "
                         "it: complete it first",
                         h.value, g.waiters_));
    });
  }

  std::size_t size() const { return signals_.size(); }

 private:
  [[noreturn]] void fail(std::int64_t HostSignalCodes::*code, std::string_view call,
                         const std::string& what) const {
    if (codes_) throw DriverError(signals_.backend(), (*codes_).*code, call, what);
    throw ValueError(signals_.backend(), fmt::format("{}: {}", call, what));
  }

  std::optional<HostSignalCodes> codes_;
  HandleTable<SignalHandle, Signal> signals_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
