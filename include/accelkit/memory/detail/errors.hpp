// accelkit: the caching allocator's error messages.
//
// The messages of out-of-memory errors (a request larger than the device's
// largest allocation; no room after the cache went back to the driver, with
// the figures that say why: Note [Out-of-memory message]), the observers
// of the latter, and the messages of frees of memory that is not a live
// allocation.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

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

// The largest free block in the cache (parked or binned, not awaiting its
// stream uses), over every pool; for the out-of-memory message.
template <class R>
inline std::size_t DeviceCachingAllocator<R>::largest_free_block() {
  std::size_t largest = 0;
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    for (const detail::Segment* s : pool->segments)
      for (const detail::Block* b = s->head; b; b = b->next)
        if (b->cached) largest = std::max(largest, b->size);
    for (std::size_t i = 0; i < pool->parked_count; ++i)
      largest = std::max(largest, pool->parked[i]->size);
    pool->arena.for_each_segment([&](const detail::SmallSegment& s) {
      using namespace detail::small_block;
      for (std::size_t i = 0; i < s.blocks.size(); ++i) {
        Desc d = s.blocks[i];
        if (state(d) == binned || state(d) == parked) largest = std::max(largest, bytes(d));
      }
    });
  }
  return largest;
}

// Note [Out-of-memory message]
// What a user needs to act on an out-of-memory error, as CUDA's message
// gives it: the request, the device's total and free memory, what this
// process's pool holds (allocated, and reserved but unallocated, with the
// largest free cached block: a large remainder in small pieces is
// fragmentation), how to record the history that shows where memory went,
// and the setting that reduces fragmentation: expandable segments where the
// runtime has the virtual-memory members (Note [Virtual memory]) and they
// are off, and max_split_size_mb. The observers (attach_oom_observer) are called first,
// with no lock held.
template <class R>
inline OutOfMemoryError DeviceCachingAllocator<R>::out_of_memory(const Pool& pool,
                                                                 std::size_t bytes,
                                                                 std::size_t rounded) {
  DeviceStats s = stats();
  std::uint64_t driver_free = 0;
  try {
    driver_free = backend_.memory_info(device_).free;
  } catch (...) {
  }
  auto allocated = static_cast<std::size_t>(std::max<std::int64_t>(s.allocated_bytes[0].current, 0));
  std::size_t reserved = reserved_.load();
  std::size_t largest = largest_free_block();
  if (trace_.on())
    record_trace(pool, TraceEntry::Action::oom, nullptr, rounded,
                 static_cast<std::size_t>(driver_free));
  std::vector<OomObserver> observers;
  {
    std::lock_guard<std::mutex> lock(oom_mutex_);
    observers = oom_observers_;
  }
  OomInfo info{device_, bytes, allocated, static_cast<std::size_t>(driver_free)};
  for (const OomObserver& observe : observers) {
    try {
      observe(info);
    } catch (...) {  // the out-of-memory error is what the caller gets
    }
  }
  std::size_t limit = limit_.load();
  std::string limit_note =
      limit < total_memory_
          ? fmt::format("; the memory fraction caps this process at {}", detail::format_bytes(limit))
          : std::string();
  std::string conf = detail::upper(Backend<R>::name) + "_ALLOC_CONF";
  std::string hint =
      detail::has_virtual_memory<R> && !config_.expandable_segments
          ? fmt::format("set {0}=expandable_segments:True to avoid fragmentation, or "
                        "{0}=max_split_size_mb:<n> to limit it",
                        conf)
          : fmt::format("set {}=max_split_size_mb:<n> to limit fragmentation", conf);
  return OutOfMemoryError(
      Backend<R>::name,
      fmt::format("out of memory on {}:{}: tried to allocate {} ({} bytes, {} after rounding). "
                  "The device has {} in total, {} free; this process's memory pool has {} "
                  "reserved, {} of it allocated{}; {} is reserved but unallocated, the largest "
                  "free cached block is {}. If reserved but unallocated memory is large, {}. "
                  "To see where the memory went, record its history with "
                  "torch.{}.memory._record_memory_history() and save a snapshot with "
                  "torch.{}.memory._dump_snapshot()",
                  Backend<R>::name, device_, detail::format_bytes(bytes), bytes, rounded,
                  detail::format_bytes(total_memory_), detail::format_bytes(driver_free),
                  detail::format_bytes(reserved), detail::format_bytes(allocated), limit_note,
                  detail::format_bytes(reserved > allocated ? reserved - allocated : 0),
                  detail::format_bytes(largest), hint, Backend<R>::name, Backend<R>::name));
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
