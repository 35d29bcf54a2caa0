// accelkit: the caching allocator's segments: memory from the driver.
//
// Segments are what the allocator holds from the driver: large segments
// with a record (Segment, a list of block records), small ones in the small
// arena. Here: asking the driver within the memory fraction (driver_alloc),
// adding a segment to a pool, the uncached path's one-block segments,
// detaching a wholly free segment from its pool (Note [Ordered release]
// returns it), and contains().
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline bool DeviceCachingAllocator<R>::contains(const void* ptr) {
  auto inside = [p = reinterpret_cast<std::uintptr_t>(ptr)](const void* base, std::size_t size) {
    auto b = reinterpret_cast<std::uintptr_t>(base);
    return p >= b && p - b < size;
  };
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    for (const detail::Segment* s : pool->segments) {
      if (!inside(s->ptr, s->size)) continue;
      if (!s->expandable) return true;
      for (const detail::Block* b = s->head; b; b = b->next)  // holes are not memory
        if (inside(b->ptr, b->size)) return !b->hole;
    }
    bool found = false;
    pool->arena.for_each_segment(
        [&](const detail::SmallSegment& s) { found = found || inside(s.ptr, s.size()); });
    if (found) return true;
  }
  return false;
}

template <class R>
inline SegmentSpan DeviceCachingAllocator<R>::segment_of(const void* ptr) {
  auto p = reinterpret_cast<std::uintptr_t>(ptr);
  auto inside = [p](const void* base, std::size_t size) {
    auto b = reinterpret_cast<std::uintptr_t>(base);
    return p >= b && p - b < size;
  };
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    for (const detail::Segment* s : pool->segments)
      if (inside(s->ptr, s->size)) return SegmentSpan{s->ptr, s->size, s->expandable};
    SegmentSpan found;
    pool->arena.for_each_segment([&](const detail::SmallSegment& s) {
      if (!found.base && inside(s.ptr, s.size())) found = SegmentSpan{s.ptr, s.size(), false};
    });
    if (found.base) return found;
  }
  return {};
}

// Memory from the driver within the limit, or nullptr when either says no.
template <class R>
inline char* DeviceCachingAllocator<R>::driver_alloc(std::size_t n) {
  std::size_t cur = reserved_.load();
  do {
    if (cur + n > limit_.load()) return nullptr;
  } while (!reserved_.compare_exchange_weak(cur, cur + n));
  try {
    return static_cast<char*>(backend_.raw_malloc(device_, n));
  } catch (const OutOfMemoryError&) {
    reserved_.fetch_sub(n);
    return nullptr;
  } catch (...) {
    reserved_.fetch_sub(n);
    throw;
  }
}

template <class R>
inline auto DeviceCachingAllocator<R>::add_segment(Pool& pool, char* ptr, std::size_t size,
                                                   bool small) -> Block* {
  auto* seg = new Segment();
  seg->pool = &pool;
  seg->ptr = ptr;
  seg->size = size;
  seg->small = small;
  seg->oversize = size >= config_.max_split_size;
  seg->index = pool.segments.size();
  Block* b = pool.new_block();
  b->ptr = ptr;
  b->size = size;
  b->segment = seg;
  seg->head = b;
  pool.segments.push_back(seg);
  count_segment(pool, seg, Count::in);
  if (trace_.on()) record_trace(pool, TraceEntry::Action::segment_alloc, ptr, size);
  return b;
}

// Under the pool lock: a new small segment at `ptr`, from the driver,
// carved for the request. On error the memory goes back to the driver.
template <class R>
inline auto DeviceCachingAllocator<R>::add_small_segment(Pool& pool, char* ptr, std::size_t size,
                                                         std::size_t requested) -> Allocation {
  constexpr std::size_t n = memory_constants::kSmallBuffer;
  detail::SmallSegment* seg = nullptr;
  char* p = nullptr;
  try {
    pool.parked_small.reserve();
    seg = pool.arena.add_segment(ptr);
    register_windows(pool, *seg);
    try {
      p = carve_small(pool, *seg, 0, size, requested);
    } catch (...) {
      small_index_.remove(pool, *seg);
      throw;
    }
  } catch (...) {
    if (seg) pool.arena.discard_segment(seg);
    try {
      backend_.raw_free(device_, ptr, n);
    } catch (...) {
    }
    reserved_.fetch_sub(n);
    throw;
  }
  count_segment(pool, n, BlockKind::small, n >= config_.max_split_size, Count::in);
  if (trace_.on()) record_trace(pool, TraceEntry::Action::segment_alloc, ptr, n);
  return {nullptr, p, size};
}

// nullptr where the driver has no room and NoRoom::return_null.
template <class R>
inline auto DeviceCachingAllocator<R>::allocate_uncached(Pool& pool, std::size_t bytes,
                                                         NoRoom no_room) -> Block* {
  std::size_t size = (bytes + memory_constants::kMinBlockSize - 1) /
                     memory_constants::kMinBlockSize * memory_constants::kMinBlockSize;
  char* p = driver_alloc(size);
  if (!p && no_room == NoRoom::return_null) return nullptr;
  if (!p) {
    {
      detail::SpinGuard lock(pool.lock);
      ++pool.stats.num_ooms;
    }
    throw out_of_memory(pool, bytes, size);
  }
  // Each allocation is its own segment, so that the block knows its pool.
  auto* seg = new Segment();
  seg->pool = &pool;
  seg->ptr = p;
  seg->size = size;
  seg->small = size <= memory_constants::kSmallSize;
  detail::SpinGuard lock(pool.lock);
  Block* b = pool.new_block();
  b->ptr = p;
  b->size = size;
  b->requested = bytes;
  b->segment = seg;
  seg->head = b;
  b->allocated = true;
  count_alloc(pool, b);
  PoolStats& s = pool.stats;
  count_up(s.segment, kind_of(b), 1);
  count_up(s.reserved_bytes, kind_of(b), static_cast<std::int64_t>(size));
  ++s.num_device_alloc;
  return b;
}

// Under the pool lock: removes a wholly free small segment from the pool
// and deletes its bookkeeping; its memory is the caller's to return (it
// stays counted as reserved until then: Note [Ordered release]).
template <class R>
inline auto DeviceCachingAllocator<R>::detach_small(Pool& pool,
                                                    detail::SmallSegment* seg) -> Detached {
  constexpr std::size_t n = memory_constants::kSmallBuffer;
  small_index_.remove(pool, *seg);
  Detached d{&pool, seg->ptr, n, BlockKind::small, n >= config_.max_split_size, nullptr};
  pool.arena.remove_segment(seg);
  return d;
}

// Under the pool lock: removes a wholly free segment from the pool; its
// memory is the caller's to return (Note [Ordered release]).
template <class R>
inline auto DeviceCachingAllocator<R>::detach_segment(Pool& pool, Segment* seg) -> Detached {
  // An expandable segment's free blocks may lie between holes (Note
  // [Expandable segments]); other segments are one free block.
  for (Block* b = seg->head; b;) {
    Block* next = b->next;
    if (b->cached) unlink_free(pool, b);
    pool.recycle(b);
    b = next;
  }
  Segment* last = pool.segments.back();
  pool.segments[seg->index] = last;
  last->index = seg->index;
  pool.segments.pop_back();
  Detached d{&pool, seg->ptr, seg->size, kind_of(seg), seg->oversize, seg};
  if (seg->expandable) {  // its pages, then its range (Note [Expandable segments])
    if (pool.growing == seg) pool.growing = nullptr;
    d.range = seg->range;
    d.page_count = seg->size / seg->range->page;
  }
  return d;
}

template <class R>
inline bool DeviceCachingAllocator<R>::wholly_free(const Segment* seg) noexcept {
  if (seg->head->cached && detail::whole_segment(seg->head)) return true;
  if (!seg->expandable) return false;
  // Free blocks and holes only (Note [Expandable segments]).
  for (const Block* b = seg->head; b; b = b->next)
    if (!b->cached && !b->hole) return false;
  return true;
}

ACCELKIT_END_NAMESPACE
