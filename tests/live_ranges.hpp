// Test helper: the address ranges a test holds from an allocator, from
// many threads, counting any new range that overlaps one still held.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>

class LiveRanges {
 public:
  void add(const void* p, std::size_t size) {
    auto start = reinterpret_cast<std::uintptr_t>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = live_.lower_bound(start);
    if (next != live_.end() && next->first < start + size) ++overlaps_;
    if (next != live_.begin() && std::prev(next)->second > start) ++overlaps_;
    live_.emplace(start, start + size);
  }
  void remove(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.erase(reinterpret_cast<std::uintptr_t>(p));
  }
  long overlaps() const { return overlaps_.load(); }

 private:
  std::mutex mutex_;
  std::map<std::uintptr_t, std::uintptr_t> live_;  // start -> end
  std::atomic<long> overlaps_{0};
};
