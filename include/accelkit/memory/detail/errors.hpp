// accelkit: the caching allocator's error messages.
//
// The messages of out-of-memory errors (a request larger than the device's
// largest allocation; no room after the cache went back to the driver, with
// the figures that say why) and of frees of memory that is not a live
// allocation.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline OutOfMemoryError DeviceCachingAllocator<R>::too_large(std::size_t bytes) const {
  return OutOfMemoryError(
      Backend<R>::name,
      fmt::format("cannot allocate {} ({} bytes) on {}:{}: larger than the device's largest "
                  "single allocation, {} (capacity {})",
                  detail::format_bytes(bytes), bytes, Backend<R>::name, device_,
                  detail::format_bytes(max_allocation_), detail::format_bytes(total_memory_)));
}

template <class R>
inline OutOfMemoryError DeviceCachingAllocator<R>::out_of_memory(std::size_t bytes,
                                                                 std::size_t rounded) {
  DeviceStats s = stats();
  std::uint64_t driver_free = 0;
  try {
    driver_free = backend_.memory_info(device_).free;
  } catch (...) {
  }
  std::size_t limit = limit_.load();
  std::string limit_note =
      limit < total_memory_
          ? fmt::format("; the memory fraction caps this process at {}", detail::format_bytes(limit))
          : std::string();
  return OutOfMemoryError(
      Backend<R>::name,
      fmt::format("out of memory on {}:{}: tried to allocate {} ({} bytes, {} after rounding). "
                  "The device has {} in total, {} free; this process's memory pool has {} "
                  "reserved, {} of it allocated{}. If reserved but unallocated memory is "
                  "large, set {}_ALLOC_CONF=max_split_size_mb:<n> to limit fragmentation",
                  Backend<R>::name, device_, detail::format_bytes(bytes), bytes, rounded,
                  detail::format_bytes(total_memory_), detail::format_bytes(driver_free),
                  detail::format_bytes(reserved_.load()),
                  detail::format_bytes(static_cast<std::uint64_t>(s.allocated_bytes[0].current)),
                  limit_note, detail::upper(Backend<R>::name)));
}

template <class R>
inline RuntimeError DeviceCachingAllocator<R>::not_live(const void* ptr) const {
  return RuntimeError(
      Backend<R>::name,
      fmt::format("free of {} on {}:{}: not a live allocation of this allocator (double free, "
                  "or memory from elsewhere)",
                  ptr, Backend<R>::name, device_));
}

ACCELKIT_END_NAMESPACE
