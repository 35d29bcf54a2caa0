// accelkit: a per-device pool of driver events.
//
// Creating a driver event costs microseconds; the memory pool needs one for
// every free of a block used on another stream. Events are taken from this
// pool and returned to it once they have completed, never created per use.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/types.hpp>

#include <algorithm>
#include <cstddef>
#include <mutex>
#include <new>
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
    bool room = true;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        // So that release() never allocates: room for every event created.
        if (free_.capacity() <= created_) free_.reserve(std::max<std::size_t>(8, 2 * created_ + 2));
        ++created_;
      } catch (const std::bad_alloc&) {
        room = false;
      }
    }
    if (!room) {
      try {
        backend_.event_destroy(device_, e);
      } catch (...) {
      }
      throw std::bad_alloc();
    }
    return e;
  }

  // Returns an event from acquire() of this pool whose last record has
  // completed (or that was never recorded), once, for reuse. Never
  // allocates: room was made when it was created.
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
