// accelkit: the first loss of each device, which Backend<R> keeps and
// answers later work with (Note [Lost devices] in error.hpp).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Thread-safe. While no device is lost, check() is one atomic load.
class LostDevices {
 public:
  // True once any device is lost.
  bool any() const noexcept { return any_.load(std::memory_order_acquire); }

  // Throws the refusal of `call` when `device` is lost.
  void check(device_index device, std::string_view call) const {
    if (!any()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = first_.find(device);
    if (it != first_.end()) throw DeviceLostError(it->second, device, call);
  }

  // Whether `device` is lost.
  bool lost(device_index device) const {
    if (!any()) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    return first_.count(device) != 0;
  }

  // The first loss of `device`, if it is lost.
  std::optional<DeviceLostError> first(device_index device) const {
    if (!any()) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = first_.find(device);
    if (it == first_.end()) return std::nullopt;
    return it->second;
  }

  // A DeviceLostError `e` that a call of `device` (`call`) threw: kept when
  // it is the device's first loss and thrown naming the device; else the
  // loss is a later report of the one kept, and `call` is refused naming
  // that, or, for a release (which the runtime was asked to do), `e` is
  // thrown as it is. An SDK's refusal or report (device() set) is thrown as
  // it is.
  [[noreturn]] void report(device_index device, const DeviceLostError& e, std::string_view call,
                           bool release = false) {
    if (e.device() >= 0) throw e;
    std::unique_lock<std::mutex> lock(mutex_);
    auto [it, fresh] = first_.try_emplace(device, e, device);
    any_.store(true, std::memory_order_release);
    DeviceLostError kept = it->second;
    lock.unlock();
    if (fresh) throw kept;
    if (release) throw e;
    throw DeviceLostError(kept, device, call);
  }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> any_{false};
  std::map<device_index, DeviceLostError> first_;  // the loss, named with its device
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
