// accelkit/support: a runtime's record that one of its devices is lost: the
// first failure, which every later call that would run work on the device
// is refused with (Note [Lost devices] in error.hpp says what the SDK does
// with the DeviceLostError those calls throw).
//
//   support::LostState lost;                      // one per device
//   // where the driver reports the loss (VK_ERROR_DEVICE_LOST, a failed event):
//   lost.lose(fmt::format("{} in {}", what, call));
//   device_lost(code, call, what);
//   // at the start of every call that runs work:
//   if (auto first = lost.first()) device_lost(code, call, "lost earlier (" + *first + ")");
//
// Thread-safe; while the device is not lost, lost() and first() are one
// atomic load. A device stays lost for the object's life.
#pragma once

#include <accelkit/config.hpp>

#include <atomic>
#include <mutex>
#include <optional>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

class LostState {
 public:
  bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }

  // Keeps `what` when it is the first failure; returns the one kept.
  std::string lose(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!lost_.load(std::memory_order_relaxed)) {
      first_ = std::move(what);
      lost_.store(true, std::memory_order_release);
    }
    return first_;
  }

  // The first failure, once lost; nothing before.
  std::optional<std::string> first() const {
    if (!lost()) return std::nullopt;
    std::lock_guard<std::mutex> lock(mutex_);
    return first_;
  }

 private:
  mutable std::mutex mutex_;
  std::string first_;
  std::atomic<bool> lost_{false};
};

}  // namespace support
ACCELKIT_END_NAMESPACE
