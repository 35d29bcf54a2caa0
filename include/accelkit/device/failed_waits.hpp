// accelkit: the streams that waited for a host signal completed with an
// error (Note [Failed waits]), for Backend<R>.
//
// Note [Failed waits]
// Problem: a host signal completed with an error (a collective on host
// threads that failed after a stream was made to wait for it; Note [Host
// signals]) is reported by a runtime as one asynchronous error, once, to
// whichever call comes first: another thread's unrelated synchronize (or
// copy) can consume it, and the thread that waited for the collective then
// reads its output, never written, with no error.
// Decision: the SDK keeps the failure, and completes the runtime's signal
// as a success. While the signal lives, every synchronize and query of a
// stream that waited for it, and every synchronize of its device, throws a
// RuntimeError naming the stream and the failure's reason, after the
// runtime's own call has waited for the work; it is never consumed, so
// every thread that synchronizes with that stream gets it. Destroying the
// signal ends the failure (accelkit.distributed keeps a failed collective's
// signals until its process group is destroyed); destroying the stream
// forgets it. A wait queued on a signal that failed already fails its
// stream at once.
// Limits: only the SDK's own synchronizations see it (through Backend<R>).
// Work queued on the failed stream still runs, on whatever the failed work
// left in memory; a vendor kernel that never synchronizes through the SDK
// sees nothing until the next synchronize; events recorded on the stream
// are not marked. Runtimes without the signal members wait on the host,
// where the wait itself throws; nothing is tracked for them.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

class FailedWaits {
 public:
  explicit FailedWaits(std::string_view backend) : backend_(backend) {}

  // Whether any failed signal is alive: the check's fast path, one load.
  bool any() const noexcept { return failed_.load(std::memory_order_acquire) != 0; }

  // `stream` of `device` waits for `signal`.
  void waited(device_index device, StreamHandle stream, SignalHandle signal) {
    std::lock_guard<std::mutex> lock(mutex_);
    Signal& s = signals_[{device, signal.value}];
    if (std::find(s.streams.begin(), s.streams.end(), stream.value) == s.streams.end())
      s.streams.push_back(stream.value);
  }

  // `signal` was completed with `error` (not 0): the streams that waited for
  // it fail, and so does any that waits for it later.
  void failed(device_index device, SignalHandle signal, int error, std::string reason) {
    std::lock_guard<std::mutex> lock(mutex_);
    Signal& s = signals_[{device, signal.value}];
    if (s.failed) return;
    s.failed = true;
    s.error = error;
    s.reason = std::move(reason);
    failed_.fetch_add(1, std::memory_order_release);
  }

  // What is known of `signal`, which is being destroyed: forgotten (its
  // failure ends), and handed back for restore() should the destroy fail.
  struct Entry {
    bool known = false;
    std::vector<std::uintptr_t> streams;
    bool failed = false;
    int error = 0;
    std::string reason;
  };
  Entry take(device_index device, SignalHandle signal) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = signals_.find({device, signal.value});
    if (it == signals_.end()) return {};
    Signal& s = it->second;
    Entry e{true, std::move(s.streams), s.failed, s.error, std::move(s.reason)};
    if (s.failed) failed_.fetch_sub(1, std::memory_order_release);
    signals_.erase(it);
    return e;
  }
  void restore(device_index device, SignalHandle signal, Entry e) {
    if (!e.known) return;
    std::lock_guard<std::mutex> lock(mutex_);
    Signal& s = signals_[{device, signal.value}];
    s.streams = std::move(e.streams);
    s.failed = e.failed;
    s.error = e.error;
    s.reason = std::move(e.reason);
    if (s.failed) failed_.fetch_add(1, std::memory_order_release);
  }

  // `stream` of `device` was destroyed: its handle may be reused.
  void forget_stream(device_index device, StreamHandle stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, s] : signals_)
      if (key.first == device)
        s.streams.erase(std::remove(s.streams.begin(), s.streams.end(), stream.value),
                        s.streams.end());
  }

  // Throws when `stream` of `device` waited for a failed signal; `call`
  // names the SDK call that found it.
  void check(device_index device, StreamHandle stream, std::string_view call) const {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, s] : signals_)
      if (s.failed && key.first == device &&
          std::find(s.streams.begin(), s.streams.end(), stream.value) != s.streams.end())
        throw_failed(call, device, stream.value, key.second, s);
  }

  // Throws when any stream of `device` waited for a failed signal.
  void check(device_index device, std::string_view call) const {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [key, s] : signals_)
      if (s.failed && key.first == device && !s.streams.empty())
        throw_failed(call, device, s.streams.front(), key.second, s);
  }

 private:
  struct Signal {
    std::vector<std::uintptr_t> streams;  // the streams that waited for it
    bool failed = false;
    int error = 0;
    std::string reason;
  };

  [[noreturn]] void throw_failed(std::string_view call, device_index device,
                                 std::uintptr_t stream, std::uintptr_t signal,
                                 const Signal& s) const {
    throw RuntimeError(
        backend_,
        fmt::format("{}: stream {:#x} of device {} waited for work on the host that failed "
                    "(signal {:#x}, error {}){}{}; the stream reports it until the signal is "
                    "released (a collective's: when its process group is destroyed)",
                    call, stream, device, signal, s.error, s.reason.empty() ? "" : ": ",
                    s.reason));
  }

  std::string_view backend_;
  mutable std::mutex mutex_;
  std::map<std::pair<device_index, std::uintptr_t>, Signal> signals_;
  std::atomic<int> failed_{0};  // failed signals alive
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
