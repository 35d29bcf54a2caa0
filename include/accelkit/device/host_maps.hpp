// accelkit: the open host maps of a backend's devices (HostMaps<R>), for
// devices whose memory the host reaches only between host_map and
// host_unmap (Note [Host access levels] in properties.hpp).
//
// Note [Map scopes]
// The SDK's host paths (host kernels, the zero-copy fallback) open a map
// scope over the device memory they touch on a device whose host_access is
// mapped: a RAII object of one thread and one device (torch/host_access.hpp,
// MapScope<R>) that maps each range it is given and unmaps it when it ends.
// The scope works through HostMaps<R>, which counts the open maps per range,
// so that
//   - the runtime sees each range mapped once at a time: a range given again
//     while it is open (by a nested scope, by another thread's scope, or as a
//     part of an open range: a view) only counts; the last release unmaps it
//     (if that unmap fails, the range stays open without holders, for the
//     next release or the free of its memory to unmap again: the driver may
//     still have it mapped, and must not see a free of mapped memory);
//     A range that overlaps an open one only in part, or contains one, is
//     refused with a RuntimeError (no two storages of the caching pool
//     overlap; only a tensor made with from_blob over a part of another
//     could): the open one may be in use by its holder, so it can be neither
//     unmapped for the larger map nor mapped twice (host_map's contract);
//   - the ranges of one scope are given together (acquire_all: a host
//     kernel's arguments, the fallback's tensors) and mapped largest first,
//     so a range inside another of the same scope only counts, whatever the
//     order of the arguments (t[1:] then t, or t then t[1:], alike);
//   - memory freed while a scope still holds it (a temporary a host kernel
//     allocated and dropped) is unmapped by the free, before the caching
//     pool may hand it out again or return it to the driver (forget); the
//     scope's later release finds the map gone (each open map has its own
//     number, so a new map of the same address is not mistaken for it);
//   - scopes nest (a host kernel whose CPU kernel calls another), and any
//     number of threads may hold scopes over the same memory at once.
// Mapping happens after the device's work on the range is done (the scope's
// owner waits for every stream of the device first: Note [Mapped memory and
// other streams] in torch/host_access.hpp; a read another thread queues on
// the range in between coexists with the map), and the
// SDK does its own work on a range it holds mapped on the host, never as
// queued device work (Note [Device work inside host kernels]). Order: a
// scope maps when it is given a range and unmaps everything it mapped when
// it ends, in reverse order. A scope that ends on the success path
// (MapScope::close) throws the first unmap that failed, after unmapping the
// rest: the host's writes may not have reached the device, so the operator
// fails. A scope left by an exception reports failed unmaps through the
// diagnostics hook (it ends in a destructor; the exception in flight is the
// operator's error).
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
    backend_.host_map(device, p, bytes);
    std::uint64_t id = ++last_id_;
    open_.emplace(std::make_pair(device, p), Open{bytes, 1, id});
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

  // Ranges mapped now, on every device (tests).
  std::size_t open_count() const { return count_.load(); }

 private:
  struct Open {
    std::size_t bytes;
    int holds;
    std::uint64_t id;
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
