// accelkit: the caching allocator's large blocks.
//
// Blocks with records (Note [Block records]): every block of a segment
// from the large pool, and every block while caching is off. Free records
// sit in the pool's ordered set keyed (size, address), or parked (Note
// [Recently freed blocks]); allocated ones are found through the pointer map
// (Note [Mapped blocks]). Here: the set's insert, unlink and best fit,
// splitting (carve) and merging (cache_block, absorb_next), leaving the
// parking slots, the pointer map's inserts and erases, and the free of a
// record (free_large). Everything marked "under the pool lock" runs under the
// lock of the pool that owns the block.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <cstddef>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// Records are cached only in the large pool: small blocks have none while
// caching is on (Note [Small arena]), and none is cached while it is off.
template <class R>
inline void DeviceCachingAllocator<R>::insert_free(Pool& pool, Block* b) {
  if (!pool.spare_node.empty()) {
    pool.spare_node.value() = b;
    pool.large.insert(std::move(pool.spare_node));
  } else {
    pool.large.insert(b);  // may throw: nothing changed yet
  }
  b->cached = true;
  b->allocated = false;
  count_inactive(pool, b, Count::in);
}

template <class R>
inline void DeviceCachingAllocator<R>::unlink_free(Pool& pool, Block* b) {
  b->cached = false;
  pool.large.erase(b);
  count_inactive(pool, b, Count::out);
}

template <class R>
inline auto DeviceCachingAllocator<R>::find_large(Pool& pool, std::size_t size) -> Block* {
  Block key;
  key.size = size;
  auto it = pool.large.lower_bound(&key);
  if (it == pool.large.end()) return nullptr;
  // An unsplittable block serves only requests that are themselves that
  // large, and only if it is not much larger than asked; the next larger
  // blocks are larger still.
  return fits(size, (*it)->size) ? *it : nullptr;
}

// Under the pool lock: splits `b` (not in the free structures) to `size`
// if the remainder is worth keeping, and marks it allocated.
template <class R>
inline auto DeviceCachingAllocator<R>::carve(Pool& pool, Block* b, std::size_t size,
                                             std::size_t requested) -> Block* {
  std::size_t remaining = b->size - size;
  // Expandable segments split as small ones (Note [Expandable segments]).
  bool split = b->segment->small || b->segment->expandable
                   ? remaining >= memory_constants::kMinBlockSize
                   : remaining > memory_constants::kSmallSize && b->size < config_.max_split_size;
  if (split) {
    Block* r = pool.new_block();
    r->ptr = b->ptr + size;
    r->size = remaining;
    r->segment = b->segment;
    r->prev = b;
    r->next = b->next;
    if (b->next) b->next->prev = r;
    b->next = r;
    b->size = size;
    // A parked block may border a binned one (parked blocks do not merge):
    // keep binned blocks merged with each other.
    if (r->next && r->next->cached) {
      unlink_free(pool, r->next);
      absorb_next(pool, r);
    }
    insert_free(pool, r);
  }
  b->allocated = true;
  b->requested = requested;
  count_alloc(pool, b);
  return b;
}

// Under the pool lock: `b` takes over its next neighbour, which is in no
// free structure (unlinked, or just freed).
template <class R>
inline void DeviceCachingAllocator<R>::absorb_next(Pool& pool, Block* b) {
  Block* nx = b->next;
  b->size += nx->size;
  b->next = nx->next;
  if (nx->next) nx->next->prev = b;
  pool.recycle(nx);
}

// Under the pool lock: puts a free block into the bins or the large set,
// merged with free neighbours.
template <class R>
inline void DeviceCachingAllocator<R>::cache_block(Pool& pool, Block* b) {
  unmap_block(b);  // it may be merged away (Note [Mapped blocks])
  ACCELKIT_ASSERT((!b->prev || b->prev->ptr + b->prev->size == b->ptr) &&
                      (!b->next || b->ptr + b->size == b->next->ptr) &&
                      b->ptr >= b->segment->ptr &&
                      b->ptr + b->size <= b->segment->ptr + b->segment->size,
                  "the blocks of a segment tile it (no gap, no overlap)");
  if (b->prev && b->prev->cached) {
    b = b->prev;
    unlink_free(pool, b);
    absorb_next(pool, b);
  }
  if (b->next && b->next->cached) {
    unlink_free(pool, b->next);
    absorb_next(pool, b);
  }
  insert_free(pool, b);
  if (detail::whole_segment(b)) b->segment->free_tick = ++tick_;
}

template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::leave_parking(Pool& pool, const Block* b) {
  count_inactive(pool, b, Count::out);
}

// Under the pool lock: merges a record that left the parking slots into
// the large set.
template <class R>
inline void DeviceCachingAllocator<R>::evict(Pool& pool, Block* b) {
  leave_parking(pool, b);
  cache_block(pool, b);
}

// Under the pool lock: merges every parked record into the large set.
template <class R>
inline void DeviceCachingAllocator<R>::unpark_records(Pool& pool) {
  while (pool.parked_count) {
    prepare_evict(pool);
    evict(pool, pool.unpark(pool.parked_count - 1));
  }
}

// Before a record is freed (free_block): room for the eviction that
// parking it causes, or, while parking is off, for caching it. Nothing
// has changed when this throws.
template <class R>
inline void DeviceCachingAllocator<R>::make_room(Pool& pool) {
  if (!pool.parking || pool.parked_count == Pool::kParked) prepare_evict(pool);
}

// A spare node for the large set, so that caching a record that leaves
// the parking slots cannot throw.
template <class R>
inline void DeviceCachingAllocator<R>::prepare_evict(Pool& pool) {
  if (pool.spare_node.empty())
    pool.spare_node = pool.large.extract(pool.large.insert(&pool.node_probe).first);
}

// Note [Prefetching the next eviction]: merging an evicted block reads its
// neighbours' records, which with many live blocks are rarely in cache
// (three quarters of a free's time at 100,000 live blocks). The next block
// to be evicted is known one free ahead, so its neighbours are fetched now
// and have arrived when it goes. Limits: a fetch is wasted when that block
// is taken back before it is evicted.
template <class R>
inline void DeviceCachingAllocator<R>::prefetch_neighbours(const Block* b) noexcept {
  if (!b) return;
  if (b->prev) ACCELKIT_PREFETCH(b->prev);
  if (b->next) ACCELKIT_PREFETCH(b->next);
}

// After allocate() took record `b` and unlocked its pool: puts the block
// into the pointer map (Note [Mapped blocks]). When the map cannot grow,
// the block is freed again and the error thrown.
template <class R>
inline void DeviceCachingAllocator<R>::map_block(Pool& pool, Block* b) {
  ACCELKIT_ASSERT(b->segment->pool == &pool, "a block is mapped to its own pool");
  try {
    live_.insert(b->ptr, {b, &pool});
  } catch (...) {
    if (!config_.caching) {
      {
        detail::SpinGuard lock(pool.lock);
        b->mapped = false;
      }
      free_uncached(pool, b, {});
      throw;
    }
    detail::SpinGuard lock(pool.lock);
    b->mapped = false;
    b->allocated = false;
    count_free(pool, b);
    cache_or_queue(pool, {b, nullptr, b->ptr, {}});
    throw;
  }
}

// Under the pool lock: takes record `b` out of the pointer map.
template <class R>
inline void DeviceCachingAllocator<R>::unmap_block(Block* b) noexcept {
  if (!b->mapped) return;
  live_.erase(b->ptr);
  b->mapped = false;
}

// deallocate() of a block with a record (Note [Mapped blocks]); out of
// line, so that freeing a small block does not pay for its frame.
template <class R>
ACCELKIT_NOINLINE void DeviceCachingAllocator<R>::free_large(void* ptr) {
  detail::LiveBlock live = live_.find(ptr);  // Note [Mapped blocks]
  if (!live.block) throw not_live(ptr);
  detail::Block* b = live.block;
  detail::Pool& pool = *live.pool;
  std::vector<StreamHandle> uses;
  {
    detail::SpinGuard lock(pool.lock);
    // A second free (the block may be parked) or a stale map read.
    if (!b->allocated || b->ptr != ptr) throw not_live(ptr);
    if (trace_.on()) record_trace(pool, TraceEntry::Action::free_requested, b->ptr, b->requested);
    if (b->has_uses) {
      uses = take_uses(pool, b->ptr);
      b->has_uses = false;
    } else if (config_.caching) {
      make_room(pool);  // may throw: nothing changed
      b->allocated = false;
      count_free(pool, b);
      free_block(pool, b);  // parked, it stays mapped
      return;
    }
    // Its free now waits for other streams, or goes to the driver. No
    // longer allocated from here on: a second free racing this one is
    // refused above, by whichever of the two takes the lock second.
    b->allocated = false;
    unmap_block(b);
  }
  if (!config_.caching) {
    free_uncached(pool, b, uses);
    return;
  }
  std::vector<std::pair<device_index, EventHandle>> events;
  // No event on a capturing stream (Note [Frees during capture]).
  bool defer = used_while_capturing(uses);
  bool safe = defer || record_uses(b->ptr, uses, events);
  detail::SpinGuard lock(pool.lock);
  count_free(pool, b);
  if (!safe) return;  // quarantined: see record_uses
  if (!defer) uses.clear();
  cache_or_queue(pool, {b, nullptr, b->ptr, std::move(events), std::move(uses)});
  if (pool.keep != detail::Keep::give_back) return;
  lock.unlock();
  give_back(pool);  // Note [Private pools]
}

// Under the pool lock: a block that is no longer in use (freed, and past
// its pending stream uses) is parked (Note [Recently freed blocks]),
// evicting the oldest parked block into the bins when all slots are full,
// or, while its pool does not park, goes into the bins. The caller has
// called make_room() first, before changing anything.
template <class R>
ACCELKIT_ALWAYS_INLINE void DeviceCachingAllocator<R>::free_block(Pool& pool, Block* b) {
  std::size_t size = b->size;
  BlockKind kind = kind_of(b);
  Span span = span_of(b);
  count_released(pool, b->ptr, size, b->requested, kind);
  ++pool.frees_counted;
  if (!pool.parking) {  // straight into the large set (Note [Parking pays for itself])
    cache_block(pool, b);
    return;
  }
  if (pool.parked_count == Pool::kParked) {
    Block* victim = pool.parked[pool.parked_victim];
    pool.park(pool.parked_victim, b, size);
    pool.parked_victim = (pool.parked_victim + 1) % Pool::kParked;
    evict(pool, victim);
    prefetch_neighbours(pool.parked[pool.parked_victim]);
  } else {
    pool.park(pool.parked_count++, b, size);
  }
  count_inactive(pool, size, kind, span, Count::in);
}

ACCELKIT_END_NAMESPACE
