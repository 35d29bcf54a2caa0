// accelkit: a per-device pool of driver events.
//
// Creating a driver event costs microseconds; the memory pool needs one for
// every free of a block used on another stream. Events are taken from this
// pool and returned to it, never created per use.
//
// Note [Pooled event reuse]
// Problem: an event may be handed back while its last record is still
// pending (a wait_stream's event right after the wait was queued, a
// torch.Event destroyed before its stream reached it), and not every driver
// keeps a queued wait tied to the record it saw: where a wait reads the
// event's state when it runs (an event as one completion counter),
// recording the same event again elsewhere would release that wait early.
// Decision: a returned event is reused only once the driver says its record
// has completed: release() parks it, and acquire() takes parked events
// back, oldest first, after an event_query; with none ready it creates a
// new one. An error from that query belongs to earlier queued work: it is
// passed to the caller of acquire(), once, and the event stays parked.
// While a capture is underway on the device no parked event is queried (an
// event query may be refused then and invalidate the capture: Note [Capture
// rules]); the pool creates events instead, as CUDA's allocator stops
// processing its events during a capture.
// Limits: a pool grows by as many events as are parked behind pending work
// at once, and by the events acquired during captures; a record that never
// completes keeps its event parked for the pool's life.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/assert.hpp>
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
    for (EventHandle e : returned_) free_.push_back(e);
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

  // A free event, created only when the pool has none whose last record
  // has completed (Note [Pooled event reuse]).
  EventHandle acquire() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ACCELKIT_ASSERT(free_.size() + returned_.size() <= created_,
                      "an event pool holds only events it created, each once");
      if (free_.empty() && !backend_.capture_underway(device_)) reclaim();
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
        // So that release() and reclaim() never allocate: room for every
        // event created, in both lists.
        std::size_t room = std::max<std::size_t>(8, 2 * created_ + 2);
        if (free_.capacity() <= created_) free_.reserve(room);
        if (returned_.capacity() <= created_) returned_.reserve(room);
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

  // An event of the pool recorded on `stream` (of this pool's device); if
  // the record fails, the event goes back to the pool and the error is
  // thrown.
  EventHandle record(StreamHandle stream) {
    EventHandle e = acquire();
    try {
      backend_.event_record(device_, e, stream);
    } catch (...) {
      release(e);
      throw;
    }
    return e;
  }

  // Returns an event from acquire() of this pool, once; it is reused when
  // its last record has completed (Note [Pooled event reuse]). `completed`:
  // the caller saw that record complete (a query said so, or a synchronize
  // returned, after it), so no query is needed before reuse. Never
  // allocates: room was made when it was created.
  void release(EventHandle e, bool completed = false) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    (completed ? free_ : returned_).push_back(e);
  }

  std::size_t created() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return created_;
  }
  // Events held by the pool: reusable, or waiting for their record.
  std::size_t cached() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return free_.size() + returned_.size();
  }
  device_index device() const noexcept { return device_; }

 private:
  // Under mutex_: moves returned events whose record has completed to
  // free_, oldest first, stopping at the first that has not (the rest were
  // most likely recorded later). Never allocates: free_ has room for every
  // event created.
  void reclaim() {
    std::size_t done = 0;
    try {
      while (done < returned_.size() && backend_.event_query(device_, returned_[done])) ++done;
    } catch (...) {
      take_front(done);
      throw;
    }
    take_front(done);
  }
  void take_front(std::size_t n) {
    free_.insert(free_.end(), returned_.begin(),
                 returned_.begin() + static_cast<std::ptrdiff_t>(n));
    returned_.erase(returned_.begin(), returned_.begin() + static_cast<std::ptrdiff_t>(n));
  }

  Backend<R>& backend_;
  device_index device_;
  EventFlags flags_;
  mutable std::mutex mutex_;
  std::vector<EventHandle> free_;
  std::vector<EventHandle> returned_;  // released, last record perhaps pending
  std::size_t created_ = 0;
};

ACCELKIT_END_NAMESPACE
