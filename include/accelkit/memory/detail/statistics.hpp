// accelkit: the caching allocator's statistics and snapshot.
//
// Note [Sharded statistics]
// Statistics are kept per pool (each stream's, each private pool's), under
// the lock that pool already holds, and summed on request. Current values
// and totals are exact. A peak is summed too: exact when one pool
// allocates, an upper bound on the true device-wide peak when several do,
// since their peaks need not coincide. A private pool made idle (Note
// [Private pools]) leaves its totals and peaks in retired_stats_, so that
// the device's figures never go back.
//
// Here: the counting that every block operation does under its pool's lock
// (allocations, frees, segments, inactive split blocks), the device-wide
// figures summed from the pools (stats, the resets), and snapshot().
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// Adds to / subtracts from a statistic at the aggregate and at the pool type.
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_up(KindStat& a, BlockKind kind,
                                                                std::int64_t n) noexcept {
  a.increase(kind == BlockKind::small, n);
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_down(KindStat& a, BlockKind kind,
                                                                  std::int64_t n) noexcept {
  a.decrease(kind == BlockKind::small, n);
}

template <class R>
inline auto DeviceCachingAllocator<R>::kind_of(const Block* b) noexcept -> BlockKind {
  return kind_of(b->segment);
}
template <class R>
inline auto DeviceCachingAllocator<R>::kind_of(const Segment* seg) noexcept -> BlockKind {
  return seg->small ? BlockKind::small : BlockKind::large;
}
template <class R>
inline auto DeviceCachingAllocator<R>::span_of(const Block* b) noexcept -> Span {
  return detail::whole_segment(b) ? Span::whole_segment : Span::part_of_segment;
}
template <class R>
inline auto DeviceCachingAllocator<R>::span_of(const detail::SmallSegment& seg) noexcept -> Span {
  return seg.blocks.size() == 1 ? Span::whole_segment : Span::part_of_segment;
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_alloc(Pool& pool, const Block* b) {
  count_alloc(pool, b->size, b->requested, kind_of(b));
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_alloc(Pool& pool, std::size_t size,
                                                                   std::size_t requested, BlockKind kind) {
  auto n = static_cast<std::int64_t>(size);
  PoolStats& s = pool.stats;
  count_up(s.allocation, kind, 1);
  count_up(s.allocated_bytes, kind, n);
  count_up(s.active, kind, 1);
  count_up(s.active_bytes, kind, n);
  count_up(s.requested_bytes, kind, static_cast<std::int64_t>(requested));
  if (size >= config_.max_split_size) s.oversize_allocations.increase(1);
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_free(Pool& pool, const Block* b) {
  count_free(pool, b->size, b->requested, kind_of(b));
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_free(Pool& pool, std::size_t size,
                                                                  std::size_t requested, BlockKind kind) {
  PoolStats& s = pool.stats;
  count_down(s.allocation, kind, 1);
  count_down(s.allocated_bytes, kind, static_cast<std::int64_t>(size));
  count_down(s.requested_bytes, kind, static_cast<std::int64_t>(requested));
  if (size >= config_.max_split_size) s.oversize_allocations.decrease(1);
  ACCELKIT_ASSERT(s.allocation.total() >= 0 && s.allocated_bytes.total() >= 0 &&
                      s.requested_bytes.total() >= 0,
                  "a pool's statistics balance (no more freed than allocated)");
}

template <class R>
inline void DeviceCachingAllocator<R>::count_segment(Pool& pool, const Segment* seg, Count count) {
  count_segment(pool, seg->size, kind_of(seg), seg->oversize, count);
}

template <class R>
inline void DeviceCachingAllocator<R>::count_segment(Pool& pool, std::size_t size, BlockKind kind,
                                                     bool oversize, Count count) {
  auto n = static_cast<std::int64_t>(size);
  PoolStats& s = pool.stats;
  bool added = count == Count::in;
  if (added) {
    count_up(s.segment, kind, 1);
    count_up(s.reserved_bytes, kind, n);
  } else {
    count_down(s.segment, kind, 1);
    count_down(s.reserved_bytes, kind, n);
  }
  if (oversize) {
    if (added) s.oversize_segments.increase(1);
    else s.oversize_segments.decrease(1);
  }
  if (added) ++s.num_device_alloc;
  else ++s.num_device_free;
}

// A free block inside a partly used segment counts as inactive split,
// whether binned or parked.
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_inactive(Pool& pool, const Block* b,
                                                                      Count count) {
  count_inactive(pool, b->size, kind_of(b), span_of(b), count);
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_inactive(Pool& pool, std::size_t size,
                                                                      BlockKind kind, Span span,
                                                                      Count count) {
  if (span == Span::whole_segment) return;
  auto n = static_cast<std::int64_t>(size);
  if (count == Count::in) {
    count_up(pool.stats.inactive_split, kind, 1);
    count_up(pool.stats.inactive_split_bytes, kind, n);
  } else {
    count_down(pool.stats.inactive_split, kind, 1);
    count_down(pool.stats.inactive_split_bytes, kind, n);
  }
}

// Under the pool lock: the counts of a block that is no longer in use
// (freed, and past its pending stream uses), whether parked or binned.
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::count_released(Pool& pool, char* ptr,
                                                                      std::size_t size,
                                                                      std::size_t requested,
                                                                      BlockKind kind) {
  count_down(pool.stats.active, kind, 1);
  count_down(pool.stats.active_bytes, kind, static_cast<std::int64_t>(size));
  if (trace_.on()) record_trace(pool, TraceEntry::Action::free_completed, ptr, requested);
}

template <class R>
inline void DeviceCachingAllocator<R>::record_trace(const Pool& pool, TraceEntry::Action action,
                                                   const void* ptr, std::size_t size,
                                                   std::size_t device_free) noexcept {
  static const std::shared_ptr<HistoryContext> none;
  const std::shared_ptr<HistoryContext>* context = detail::tls_history_context;
  trace_.record(action, ptr, size, pool.stream, pool.id, context ? *context : none, device_free);
}

template <class R>
inline DeviceStats DeviceCachingAllocator<R>::stats() {
  DeviceStats out;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    out.merge(retired_stats_);
  }
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    out.merge(pool->stats.device_stats());
  }
  out.max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                           ? -1
                           : static_cast<std::int64_t>(config_.max_split_size);
  return out;
}

template <class R>
inline void DeviceCachingAllocator<R>::reset_peak_stats() {
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    retired_stats_.reset_peak();
  }
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    pool->stats.reset_peak();
  }
}

template <class R>
inline void DeviceCachingAllocator<R>::reset_accumulated_stats() {
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    retired_stats_.reset_accumulated();
  }
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    pool->stats.reset_accumulated();
  }
}

// Block states as CUDA's snapshot names them: allocated; freed but waiting
// for its uses on other streams (a pending free); free in the cache.
template <class R>
inline MemorySnapshot DeviceCachingAllocator<R>::snapshot() {
  MemorySnapshot out;
  bool recording = trace_.on();
  detail::ContextTable blocks, segments;  // Note [History contexts]
  if (recording) std::tie(blocks, segments) = trace_.contexts();
  auto context_in = [](const detail::ContextTable& t, const void* p) {
    auto it = t.find(reinterpret_cast<std::uintptr_t>(p));
    return it == t.end() ? nullptr : it->second;
  };
  std::size_t total_active = 0;
  for (detail::Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    std::vector<const detail::Block*> pending;
    for (const detail::PendingFree& p : pool->pending)
      if (p.block) pending.push_back(p.block);
    for (const detail::Segment* s : pool->segments) {
      // An expandable segment shows as one segment per run of mapped
      // blocks, as CUDA's snapshot gives it: a hole (unmapped pages, Note
      // [Expandable segments]) ends a run, and its bytes are in none.
      auto start = [&](const detail::Block* first) {
        SegmentSnapshot seg{device_, reinterpret_cast<std::uintptr_t>(first->ptr), 0, 0, 0, 0,
                            pool->stream, s->small ? "small" : "large", {}, pool->id};
        seg.expandable = s->expandable;
        seg.context = context_in(segments, first->ptr);
        return seg;
      };
      auto finish = [&](SegmentSnapshot& seg) {
        if (seg.blocks.empty()) return;
        total_active += seg.active_size;
        out.segments.push_back(std::move(seg));
      };
      SegmentSnapshot seg = start(s->head);
      for (const detail::Block* b = s->head; b; b = b->next) {
        if (b->hole) {
          finish(seg);
          if (b->next) seg = start(b->next);
          else seg.blocks.clear();
          continue;
        }
        seg.total_size += b->size;
        bool is_pending = std::find(pending.begin(), pending.end(), b) != pending.end();
        bool active = b->allocated || is_pending;
        std::string_view state = b->allocated ? "active_allocated"
                                 : is_pending ? "active_pending_free"
                                              : "inactive";
        seg.blocks.push_back({reinterpret_cast<std::uintptr_t>(b->ptr), b->size,
                              active ? b->requested : 0, state,
                              active ? context_in(blocks, b->ptr) : nullptr});
        if (b->allocated) seg.allocated_size += b->size;
        if (active) {
          seg.active_size += b->size;
          seg.requested_size += b->requested;
        }
      }
      finish(seg);
    }
    pool->arena.for_each_segment([&](const detail::SmallSegment& s) {
      using namespace detail::small_block;
      SegmentSnapshot seg{device_, reinterpret_cast<std::uintptr_t>(s.ptr), s.size(), 0, 0, 0,
                          pool->stream, "small", {}, pool->id};
      seg.context = context_in(segments, s.ptr);
      for (std::size_t i = 0; i < s.blocks.size(); ++i) {
        Desc d = s.blocks[i];
        bool allocated = state(d) == detail::small_block::allocated;
        bool is_pending = state(d) == detail::small_block::pending;
        bool active = allocated || is_pending;
        std::size_t requested = active ? static_cast<std::size_t>(payload(d)) : 0;
        seg.blocks.push_back({reinterpret_cast<std::uintptr_t>(s.address(i)), bytes(d), requested,
                              allocated    ? "active_allocated"
                              : is_pending ? "active_pending_free"
                                           : "inactive",
                              active ? context_in(blocks, s.address(i)) : nullptr});
        if (allocated) seg.allocated_size += bytes(d);
        if (active) {
          seg.active_size += bytes(d);
          seg.requested_size += requested;
        }
      }
      total_active += seg.active_size;
      out.segments.push_back(std::move(seg));
    });
  }
  std::sort(out.segments.begin(), out.segments.end(),
            [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
  // As CUDA: the snapshot is an entry of the history it returns.
  if (recording) trace_.record(TraceEntry::Action::snapshot, nullptr, total_active, {}, {}, nullptr);
  out.trace = trace_.entries();
  return out;
}

ACCELKIT_END_NAMESPACE
