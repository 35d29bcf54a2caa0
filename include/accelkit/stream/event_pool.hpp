// accelkit: a per-device pool of driver events.
//
// Creating a driver event costs microseconds; the memory pool needs one for
// every free of a block used on another stream. Events are taken from this
// pool and returned to it once they have completed, never created per use.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <mutex>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
class EventPool {
 public:
  EventPool(Backend<R>& backend, device_index device, EventFlags flags = EventFlags::none)
      : backend_(backend), device_(device), flags_(flags) {}
  ~EventPool() {
    for (EventHandle e : free_) {
      try {
        backend_.event_destroy(device_, e);
      } catch (...) {
        // At teardown a dead driver cannot take the event back; nothing to do.
      }
    }
  }
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, created only when the pool has none.
  EventHandle acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        EventHandle e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    EventHandle e = backend_.event_create(device_, flags_);
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      free_.reserve(created_ + 1);  // so that release() never allocates
    } catch (...) {
      backend_.event_destroy(device_, e);
      throw;
    }
    ++created_;
    return e;
  }

  // Returns an event whose last record has completed (or that was never
  // recorded) for reuse. Never throws: room was made when it was created.
  void release(EventHandle e) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(e);
  }

  std::size_t created() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return created_;
  }
  std::size_t cached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return free_.size();
  }
  device_index device() const noexcept { return device_; }

 private:
  Backend<R>& backend_;
  device_index device_;
  EventFlags flags_;
  mutable std::mutex mutex_;
  std::vector<EventHandle> free_;
  std::size_t created_ = 0;
};

ACCELKIT_END_NAMESPACE
