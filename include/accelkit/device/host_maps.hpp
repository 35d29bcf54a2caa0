// accelkit: the open host maps of a backend's devices (HostMaps<R>), for
// devices whose memory the host reaches only between host_map and
// host_unmap (Note [Host access levels] in properties.hpp).
//
// Note [Map scopes]
// Problem: on a device whose host_access is mapped, the host reaches device
// memory only between host_map and host_unmap, and the SDK's host paths
// (host kernels, the zero-copy fallback) touch ranges that nested calls,
// other threads and views of one storage touch too. The driver must see
// each range mapped once at a time, and never a free of mapped memory.
// Decision: a host path opens a map scope (MapScope<R>,
// torch/host_access.hpp), a RAII object of one thread and one device, over
// the ranges it uses, given together and mapped largest first. The scope
// works through HostMaps<R>, which counts the open maps per range: a range
// given again while it is open (by a nested scope, another thread's scope,
// or as a view inside an open range) only counts, and the last release
// unmaps it. Memory freed while a scope holds it is unmapped by the free
// (forget); each open map has its own number, so the scope's later release
// finds it gone. Mapping waits for the device's work on the range (Note
// [Mapped memory and other streams] in torch/host_access.hpp), and the
// SDK's own work on a mapped range is done on the host (Note [Device work
// inside host kernels]). A scope unmaps in reverse order when it ends:
// MapScope::close throws the first unmap that failed, after unmapping the
// rest; a scope left by an exception reports failed unmaps through the
// diagnostics hook. host_map returns the host address of the range, which
// need not be the device pointer (Vulkan's vkMapMemory chooses it): each
// open map keeps its host base, and the host paths reach mapped memory only
// at host_ptr(device, p), the host address of a device pointer inside an
// open map (HostAccess::host_ptr in torch/host_access.hpp).
// Limits: a range that overlaps an open one only in part, or contains one,
// is refused with a RuntimeError (in the caching pool only a from_blob
// tensor over a part of another can make one). An unmap that fails leaves
// the range open without holders, for the next release or the free to unmap
// again. docs/design/kit.md ("Map scopes") has the whole set of cases.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
class HostMaps {
 public:
  // One open map as its holder knows it: the range's start (the key) and
  // the map's number.
  struct Ticket {
    device_index device = 0;
    char* base = nullptr;
    std::uint64_t id = 0;
  };

  static HostMaps& get() {
    static HostMaps* const maps = new HostMaps(Backend<R>::instance());  // never destroyed
    return *maps;
  }
  explicit HostMaps(Backend<R>& backend) : backend_(backend) {}

  // Maps [ptr, ptr + bytes) of `device` for the caller (the runtime's
  // host_map on the first hold), or counts one more hold of the open range
  // that contains it.
  Ticket acquire(device_index device, void* ptr, std::size_t bytes) {
    char* p = static_cast<char*>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = open_.upper_bound({device, p});
    if (next != open_.begin()) {
      auto prev = std::prev(next);
      if (prev->first.first == device && prev->first.second + prev->second.bytes > p) {
        if (p + bytes <= prev->first.second + prev->second.bytes) {
          ++prev->second.holds;
          return {device, prev->first.second, prev->second.id};
        }
        throw_overlap(device, p, bytes, prev->first.second, prev->second.bytes);
      }
    }
    if (next != open_.end() && next->first.first == device && next->first.second < p + bytes)
      throw_overlap(device, p, bytes, next->first.second, next->second.bytes);
    char* host = static_cast<char*>(backend_.host_map(device, p, bytes));
    std::uint64_t id = ++last_id_;
    open_.emplace(std::make_pair(device, p), Open{bytes, 1, id, host});
    count_.fetch_add(1, std::memory_order_relaxed);
    return {device, p, id};
  }

  // acquire() of each range (pointer, bytes) of `device`, largest first, so
  // that a range inside another of them only counts (Note [Map scopes]);
  // appends the tickets to `tickets`. On an error the ranges acquired here
  // stay in `tickets` (their holder releases them) and the error is thrown.
  void acquire_all(device_index device, std::vector<std::pair<void*, std::size_t>> ranges,
                   std::vector<Ticket>& tickets) {
    std::stable_sort(ranges.begin(), ranges.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    for (const auto& [p, bytes] : ranges)
      if (p != nullptr && bytes > 0) tickets.push_back(acquire(device, p, bytes));
  }

  // Ends one hold; the last unmaps the range (the runtime's host_unmap).
  // Nothing when the map was already ended by forget().
  // An unmap that fails (thrown) leaves the range open without holders: a
  // later hold counts it, and its release, or the free of its memory
  // (forget), unmaps it again.
  void release(const Ticket& t) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_.find({t.device, t.base});
    if (it == open_.end() || it->second.id != t.id || it->second.holds == 0) return;
    if (--it->second.holds > 0) return;
    backend_.host_unmap(t.device, t.base, it->second.bytes);
    open_.erase(it);
    count_.fetch_sub(1, std::memory_order_relaxed);
  }

  // Memory at `ptr` is being freed: an open map starting there ends now,
  // whoever holds it.
  void forget(device_index device, void* ptr) {
    if (count_.load(std::memory_order_relaxed) == 0) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_.find({device, static_cast<char*>(ptr)});
    if (it == open_.end()) return;
    std::size_t bytes = it->second.bytes;
    open_.erase(it);
    count_.fetch_sub(1, std::memory_order_relaxed);
    backend_.host_unmap(device, static_cast<char*>(ptr), bytes);
  }

  // The host address of device pointer `p` of `device`, which must lie in
  // an open map (or be its end): its host base plus the offset. A
  // RuntimeError naming the pointer otherwise. Any thread.
  void* host_ptr(device_index device, const void* p) {
    const char* c = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lock(mutex_);
    auto next = open_.upper_bound({device, const_cast<char*>(c)});
    if (next != open_.begin()) {
      auto prev = std::prev(next);
      if (prev->first.first == device && prev->first.second + prev->second.bytes >= c)
        return prev->second.host + (c - prev->first.second);
    }
    throw RuntimeError(R::name,
                       fmt::format("device {}: {} is not inside memory mapped for the host "
                                   "(host_map)",
                                   device, p));
  }

  // Ranges mapped now, on every device (tests).
  std::size_t open_count() const { return count_.load(); }

 private:
  struct Open {
    std::size_t bytes;
    int holds;
    std::uint64_t id;
    char* host;  // host_map's address of the range's first byte
  };
  [[noreturn]] void throw_overlap(device_index device, const char* p, std::size_t bytes,
                                  const char* q, std::size_t open_bytes) const {
    throw RuntimeError(R::name,
                       fmt::format("device {}: cannot map {} bytes at {} for the host: the range "
                                   "overlaps the open map of {} bytes at {} in part",
                                   device, static_cast<const void*>(p), bytes,
                                   static_cast<const void*>(q), open_bytes));
  }

  Backend<R>& backend_;
  std::mutex mutex_;
  std::map<std::pair<device_index, char*>, Open> open_;
  std::uint64_t last_id_ = 0;
  std::atomic<std::size_t> count_{0};
};

ACCELKIT_END_NAMESPACE
