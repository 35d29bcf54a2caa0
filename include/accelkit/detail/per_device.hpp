// accelkit: one object per device, made at first use (the memory pools, the
// stream tables, the event pools, the capability schema).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/types.hpp>

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Note [Per-device slots]
// Every operation looks up its device's pools, tables and schema, so the
// lookup must cost no lock, while the objects are made only when a device
// is first used (making one may call the driver). get() finds a made object
// with one acquire load; the first call for a device makes it under the
// holder's lock. A make() that throws leaves the slot empty and the next
// get() tries again, so a driver error at first use is not remembered as a
// broken device. replace() puts a new object in a slot and keeps the old one
// alive (a racing reader may still hold it). Limits: objects, replaced ones
// included, live until the holder is destroyed; the caller checks the device
// index; the number of slots is fixed at the first get().
template <class T>
class PerDevice {
 public:
  PerDevice() = default;
  PerDevice(const PerDevice&) = delete;
  PerDevice& operator=(const PerDevice&) = delete;

  // Device d's object, made by make() (returning std::unique_ptr<T>) the
  // first time; `count` is the number of devices (0 <= d < count).
  template <class Make>
  ACCELKIT_ALWAYS_INLINE T& get(device_index d, int count, Make&& make) {
    if (T* t = find(d)) return *t;
    return make_once(d, count, make);  // out of line: keeps callers' fast paths small
  }

  // Device d's object if made, else nullptr.
  ACCELKIT_ALWAYS_INLINE T* find(device_index d) const noexcept {
    if (d < 0 || d >= size_.load(std::memory_order_acquire)) return nullptr;
    return slots_[static_cast<std::size_t>(d)].load(std::memory_order_acquire);
  }

  // Puts make()'s object in device d's slot; the one it replaces stays
  // alive until the holder is destroyed.
  template <class Make>
  T& replace(device_index d, int count, Make&& make) {
    std::unique_ptr<T> fresh = make();
    std::lock_guard<std::mutex> lock(mutex_);
    return install(slot_of(d, count), std::move(fresh));
  }

  // f(device, object) for each device's current object, under the lock (no
  // object is made or replaced meanwhile).
  template <class F>
  void for_each(F&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    int n = size_.load(std::memory_order_relaxed);
    for (int d = 0; d < n; ++d)
      if (T* t = slots_[static_cast<std::size_t>(d)].load(std::memory_order_relaxed))
        f(static_cast<device_index>(d), *t);
  }

 private:
  template <class Make>
  ACCELKIT_NOINLINE T& make_once(device_index d, int count, Make& make) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::atomic<T*>& slot = slot_of(d, count);
    if (T* t = slot.load(std::memory_order_relaxed)) return *t;
    return install(slot, make());
  }
  // Under the lock.
  std::atomic<T*>& slot_of(device_index d, int count) {
    if (!slots_) {
      slots_ = std::make_unique<std::atomic<T*>[]>(static_cast<std::size_t>(count));
      size_.store(count, std::memory_order_release);
    }
    return slots_[static_cast<std::size_t>(d)];
  }
  T& install(std::atomic<T*>& slot, std::unique_ptr<T> object) {
    owned_.reserve(owned_.size() + 1);  // so that keeping it cannot throw after the move
    T* t = object.get();
    owned_.push_back(std::move(object));
    slot.store(t, std::memory_order_release);
    return *t;
  }

  std::mutex mutex_;
  std::unique_ptr<std::atomic<T*>[]> slots_;
  std::atomic<int> size_{0};
  std::vector<std::unique_ptr<T>> owned_;  // every object made, replaced ones too
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
