// accelkit: run-once initialization whose work may throw.
#pragma once

#include <accelkit/config.hpp>

#include <atomic>
#include <mutex>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Like std::once_flag with std::call_once, for work that may throw (a driver
// call creating streams, a configuration that is malformed): an exceptional
// call leaves the flag unset, and the next call tries again. std::call_once
// promises the same, but after an exceptional call it deadlocks under
// ThreadSanitizer and in some C++ runtimes, so the SDK does not rely on it
// where the work can fail. After the first success, a call is one acquire
// load.
class Once {
 public:
  template <class F>
  void call(F&& f) {
    if (done_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_.load(std::memory_order_relaxed)) return;
    f();
    done_.store(true, std::memory_order_release);
  }
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }

 private:
  std::atomic<bool> done_{false};
  std::mutex mutex_;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
