// accelkit: the device pool's allocation history, a ring of its last
// entries (torch.<name>.memory._record_memory_history).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/snapshot.hpp>
#include <accelkit/types.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

class TraceRing {
 public:
  // Keeps the last `capacity` entries from now on; 0 stops recording.
  void start(std::size_t capacity) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_.clear();
    entries_.reserve(capacity);
    capacity_ = capacity;
    next_ = 0;
    on_.store(capacity > 0, std::memory_order_relaxed);
  }

  // Whether entries are being recorded (the pool's hot paths ask first).
  bool on() const noexcept { return on_.load(std::memory_order_relaxed); }

  void record(TraceEntry::Action action, const void* ptr, std::size_t size, StreamHandle stream) {
    auto now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
                   .count();
    std::lock_guard<std::mutex> lock(mutex_);
    if (capacity_ == 0) return;
    TraceEntry e{action, reinterpret_cast<std::uintptr_t>(ptr), size, stream, now};
    if (entries_.size() < capacity_) {
      entries_.push_back(e);
    } else {
      entries_[next_] = e;
      next_ = (next_ + 1) % capacity_;
    }
  }

  // The entries, oldest first.
  std::vector<TraceEntry> entries() const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (entries_.size() < capacity_) return entries_;
    std::vector<TraceEntry> out(entries_.begin() + static_cast<std::ptrdiff_t>(next_),
                                entries_.end());
    out.insert(out.end(), entries_.begin(),
               entries_.begin() + static_cast<std::ptrdiff_t>(next_));
    return out;
  }

 private:
  std::atomic<bool> on_{false};
  mutable std::mutex mutex_;
  std::vector<TraceEntry> entries_;
  std::size_t capacity_ = 0;
  std::size_t next_ = 0;  // the oldest entry once the ring is full
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
