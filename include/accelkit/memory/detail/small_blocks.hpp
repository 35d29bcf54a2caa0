// accelkit: the caching allocator's small blocks.
//
// Blocks of the 2 MiB small segments, which have no records: descriptors in
// their segment (Note [Small arena]), found by address through the small
// block index (Note [Small block index]), parked by size (Note [Parked small
// blocks]). Here: taking a parked block, splitting (carve_small), merging
// into the bins (cache_small, unpark_all), registering a segment's address
// windows, and the free of a small block (free_small).
//
// Note [The last block taken]
// Freeing a small block finds its descriptor from its address (Note
// [Chunk index]), which costs as much as the rest of a free on the hit path
// (allocate and free of one size), where the block freed is the one this
// thread was handed last. So each thread keeps that block's address and
// index (tls_last_small_), and a free of that address tries the index first
// (SmallSegment::index_of(p, hint) checks it against the descriptor there,
// so a stale one, of another allocator or moved since, costs a compare).
// Other frees do not pay for it: their addresses differ, a branch that is
// predicted.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// The most recently parked small block of `gran` granules, handed out
// whole for a request of `requested` bytes.
template <class R>
ACCELKIT_ALWAYS_INLINE auto DeviceCachingAllocator<R>::take_parked(Pool& pool, std::size_t gran,
                                                                   std::size_t requested) -> Allocation {
  using namespace detail::small_block;
  const detail::SmallParking::Entry& e = pool.parked_small.take(gran);
  detail::SmallSegment& seg = *e.seg;
  char* ptr = e.ptr;
  std::size_t j = parked_index(e, gran);
  std::size_t size = gran * kGranule;
  count_inactive(pool, size, BlockKind::small, span_of(seg), Count::out);
  seg.blocks[j] = make(offset(seg.blocks[j]), static_cast<std::uint32_t>(gran), allocated, Uses::none,
                       requested);
  count_alloc(pool, size, requested, BlockKind::small);
  return {nullptr, ptr, size, false, j};
}

// The index in its segment of the block that parking entry `e`, for
// `gran` granules, names; that block is parked and of that size (Note
// [Parked small blocks]).
template <class R>
ACCELKIT_ALWAYS_INLINE std::size_t DeviceCachingAllocator<R>::parked_index(const detail::SmallParking::Entry& e, std::size_t gran) noexcept {
  using namespace detail::small_block;
  std::size_t i = e.seg->index_of(e.ptr, e.hint);
  ACCELKIT_ASSERT(i < e.seg->blocks.size() && state(e.seg->blocks[i]) == parked &&
                      granules(e.seg->blocks[i]) == gran,
                  "a parked small block is where its entry says, parked, of its size");
  static_cast<void>(gran);
  return i;
}

// Under the pool lock: splits block `i` of `seg` (in no bin) to `size`,
// binning the rest, and marks it allocated. On error nothing changed.
template <class R>
inline char* DeviceCachingAllocator<R>::carve_small(Pool& pool, detail::SmallSegment& seg,
                                                    std::size_t i, std::size_t size,
                                                    std::size_t requested) {
  using namespace detail::small_block;
  std::uint32_t off = offset(seg.blocks[i]), total = granules(seg.blocks[i]);
  auto gran = static_cast<std::uint32_t>(size / kGranule);
  if (total > gran) {
    // A parked block may border a binned one (parked blocks do not
    // merge): the rest joins it, keeping binned blocks merged.
    std::size_t n = i + 1;
    bool merge = n < seg.blocks.size() && state(seg.blocks[n]) == binned;
    std::uint32_t rest = total - gran + (merge ? granules(seg.blocks[n]) : 0);
    pool.arena.reserve_bin(rest);
    if (merge) {
      count_inactive(pool, bytes(seg.blocks[n]), BlockKind::small, Span::part_of_segment,
                     Count::out);
      pool.arena.unbin(seg, n);
      seg.move_block(n, make(off + gran, rest, parked, Uses::none, 0));
    } else {
      seg.insert_block(n, make(off + gran, rest, parked, Uses::none, 0));
    }
    pool.arena.bin(seg, n);
    count_inactive(pool, std::size_t{rest} * kGranule, BlockKind::small, Span::part_of_segment,
                   Count::in);
    total = gran;
  }
  seg.blocks[i] = make(off, total, detail::small_block::allocated, Uses::none, requested);
  ACCELKIT_ASSERT(seg.chunks_agree(), "a small segment's chunk index counts its blocks");
  count_alloc(pool, std::size_t{total} * kGranule, requested, BlockKind::small);
  return seg.ptr + std::size_t{off} * kGranule;
}

// Under the pool lock: merges every parked block into the bins or the
// large set. When it throws (bad_alloc), what it merged stays merged and
// the rest stays parked.
template <class R>
inline void DeviceCachingAllocator<R>::unpark_all(Pool& pool) {
  unpark_records(pool);
  constexpr std::size_t kGranule = detail::small_block::kGranule;
  while (std::size_t gran = pool.parked_small.best_fit(1)) {
    const detail::SmallParking::Entry& e = pool.parked_small.top(gran);
    detail::SmallSegment& seg = *e.seg;
    std::size_t i = parked_index(e, gran);
    pool.arena.reserve_bin(merged(seg, i).granules);  // may throw: nothing changed
    pool.parked_small.take(gran);
    count_inactive(pool, gran * kGranule, BlockKind::small, span_of(seg), Count::out);
    cache_small(pool, seg, i);
  }
}

template <class R>
inline auto DeviceCachingAllocator<R>::merged(const detail::SmallSegment& seg,
                                              std::size_t i) noexcept -> Merge {
  using namespace detail::small_block;
  Merge m{i + 1 < seg.blocks.size() && state(seg.blocks[i + 1]) == binned,
          i > 0 && state(seg.blocks[i - 1]) == binned, granules(seg.blocks[i])};
  if (m.next) m.granules += granules(seg.blocks[i + 1]);
  if (m.prev) m.granules += granules(seg.blocks[i - 1]);
  return m;
}

// Under the pool lock: puts small block `i` of `seg` (in no bin) into the
// bins, merged with binned neighbours.
template <class R>
inline void DeviceCachingAllocator<R>::cache_small(Pool& pool, detail::SmallSegment& seg,
                                                   std::size_t i) {
  using namespace detail::small_block;
  std::uint32_t off = offset(seg.blocks[i]);
  ACCELKIT_ASSERT((i == 0 || offset(seg.blocks[i - 1]) + granules(seg.blocks[i - 1]) == off) &&
                      (i + 1 == seg.blocks.size() ||
                       off + granules(seg.blocks[i]) == offset(seg.blocks[i + 1])),
                  "the descriptors of a small segment tile it (no gap, no overlap)");
  auto [next, prev, total] = merged(seg, i);
  pool.arena.reserve_bin(total);  // nothing below throws
  if (next) {
    count_inactive(pool, bytes(seg.blocks[i + 1]), BlockKind::small, Span::part_of_segment,
                   Count::out);
    pool.arena.unbin(seg, i + 1);
  }
  if (prev) {
    count_inactive(pool, bytes(seg.blocks[i - 1]), BlockKind::small, Span::part_of_segment,
                   Count::out);
    pool.arena.unbin(seg, i - 1);
    off = offset(seg.blocks[i - 1]);
    --i;
  }
  // The descriptors merged into block i go in one move (Note [Moving descriptors]).
  if (std::size_t gone = std::size_t{next} + std::size_t{prev}) seg.erase_blocks(i + 1, gone);
  seg.blocks[i] = make(off, total, parked, Uses::none, 0);
  ACCELKIT_ASSERT(seg.chunks_agree(), "a small segment's chunk index counts its blocks");
  pool.arena.bin(seg, i);
  Span span = span_of(seg);
  count_inactive(pool, std::size_t{total} * kGranule, BlockKind::small, span, Count::in);
  if (span == Span::whole_segment) seg.free_tick = ++tick_;
}

template <class R>
inline void DeviceCachingAllocator<R>::register_windows(Pool& pool,
                                                        const detail::SmallSegment& seg) {
  if (!small_index_.add(pool, seg))
    throw RuntimeError(Backend<R>::name,
                       fmt::format("the driver of {}:{} returned memory at {} that overlaps "
                                   "memory it already gave",
                                   Backend<R>::name, device_, static_cast<void*>(seg.ptr)));
}

// deallocate() of a small block (Note [Small arena]).
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::free_small(SmallHold& h, char* ptr) {
  Pool& pool = *h.pool;
  detail::SmallSegment& seg = *h.seg;
  std::size_t i = h.i;
  detail::SpinGuard lock = std::move(h.lock);
  if (!h.allocated()) {
    lock.unlock();
    throw not_live(ptr);
  }
  using namespace detail::small_block;
  Desc d = seg.blocks[i];
  std::size_t size = bytes(d), requested = static_cast<std::size_t>(payload(d));
  if (trace_.on()) record_trace(pool, TraceEntry::Action::free_requested, ptr, requested);
  if (has_uses(d)) {
    free_small_used(lock, pool, seg, i, ptr, d);
    return;
  }
  release_small(pool, seg, i, ptr);  // may throw: nothing changed
  count_free(pool, size, requested, BlockKind::small);
}

// The rest of free_small, out of line (so that the common frees do not pay
// for its frame): a block used on other streams is pending (never
// allocated again, nor freed twice) until events on those streams say they
// are past this point; a block of a released private pool may leave its
// segment wholly free, to give back (its flag set by mark_released, Note
// [Private pools]). Called under the pool's lock, held by `lock`, with the
// block's descriptor `d`.
template <class R>
ACCELKIT_NOINLINE void DeviceCachingAllocator<R>::free_small_used(detail::SpinGuard& lock,
                                                                         Pool& pool,
                                                                         detail::SmallSegment& seg,
                                                                         std::size_t i, char* ptr,
                                                                         detail::small_block::Desc d) {
  using namespace detail::small_block;
  std::size_t size = bytes(d), requested = static_cast<std::size_t>(payload(d));
  std::vector<StreamHandle> uses = take_uses(pool, ptr);
  seg.blocks[i] = with_uses(with_state(d, pending), Uses::none);
  lock.unlock();
  std::vector<std::pair<device_index, EventHandle>> events;
  // No event on a capturing stream (Note [Frees during capture]).
  bool defer = used_while_capturing(uses);
  bool safe = defer || record_uses(ptr, uses, events);
  lock.lock();
  count_free(pool, size, requested, BlockKind::small);
  if (!safe) return;  // quarantined: see record_uses
  if (!defer) uses.clear();
  cache_or_queue(pool, {nullptr, &seg, ptr, std::move(events), std::move(uses)});
  if (pool.keep == detail::Keep::give_back) {  // Note [Private pools]
    lock.unlock();
    give_back(pool);
  }
}

// The same as free_block for small block `i` of `seg`, at `ptr`: parked by
// its size (Note [Parked small blocks]) or, where that is full, binned.
// Nothing has changed when this throws.
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::release_small(Pool& pool,
                                                                     detail::SmallSegment& seg,
                                                                     std::size_t i, char* ptr) {
  using namespace detail::small_block;
  Desc d = seg.blocks[i];
  std::size_t size = bytes(d), requested = static_cast<std::size_t>(payload(d));
  if (pool.parked_small.may_park(granules(d), parking_room(pool, size))) {
    seg.blocks[i] = with_payload(with_state(d, parked), 0);
    pool.parked_small.park(granules(d), {&seg, ptr, i});
    count_inactive(pool, size, BlockKind::small, span_of(seg), Count::in);
  } else {
    cache_small(pool, seg, i);  // may throw first
  }
  count_released(pool, ptr, size, requested, BlockKind::small);
}

// What the parked small blocks of `pool` may hold as a block of `size`
// bytes is freed: half its free small memory, that block's included (Note
// [Parked small blocks]).
template <class R>
inline std::size_t DeviceCachingAllocator<R>::parking_room(const Pool& pool,
                                                           std::size_t size) noexcept {
  const PoolStats& s = pool.stats;
  auto allocated = static_cast<std::size_t>(s.allocated_bytes.current[0]);
  return (static_cast<std::size_t>(s.reserved_bytes.current[0]) - allocated + size) / 2;
}

ACCELKIT_END_NAMESPACE
