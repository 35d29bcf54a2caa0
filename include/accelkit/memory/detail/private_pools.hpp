// accelkit: the caching allocator's private pools.
//
// Note [Private pools]
// Problem: a graph captured on a stream replays its work later, reading and
// writing the addresses its captured allocations had at capture. That
// memory must stay the graph's until the graph goes: a stream's pool would
// hand a block freed during capture to the next request, eager or not. Two
// graphs may share memory they never use at once (their replays are
// ordered), and a user may pick which allocations come from which memory
// (torch.cuda.MemPool).
// Decision (CUDA's): a private pool is memory not keyed by a stream, named
// by a MempoolId, with a use count. begin_allocate_to_pool(id, filter) adds
// a route: while one is active, an allocation on a stream that a route's
// filter accepts comes from that route's pool and from nothing else (the
// route begun last is asked first); no stream's pool serves it, and the
// private pool serves no request no route sent. While a route is active the
// threads' caches of stream pools are keyed by kRouting, which no entry
// holds, so every allocation asks pool_from_map, which asks the routes; so
// the hot path pays one relaxed load (cache_key_, read where id_ was) while
// no route is active. Inside, the pool keeps a Pool for each stream it
// served (Pool::stream), as CUDA's private pools key blocks by stream: a
// block is reused in the order of the stream it was allocated on, and
// release orders a segment after that stream. A block knows its Pool
// through its segment, so a block freed during or after capture goes back
// to its private pool only. The pool's segments stay reserved while its use
// count is above 0: release paths (empty_cache, the out-of-memory retry,
// garbage collection) skip it (Keep::reserve). When release_pool brings the
// count to 0 its wholly free segments go back to the driver at once,
// ordered after their streams (Note [Ordered release]; the caller has
// synchronized the streams its replays ran on), and each later free that
// leaves a segment wholly free gives that back too (Keep::give_back), as
// does empty_cache; the blocks still allocated at release are flagged so
// that only their frees, out of line, check for this (mark_released). A
// pool at 0 with nothing reserved and no route is forgotten: its id is
// unknown again, its figures join the device's retired totals, and its
// Pools are kept for the next private pool, so that pools made and released
// in a loop do not grow the allocator.
// Limits: a block allocated from a pool after its release (a route still
// active on it) is given back at the next empty_cache, not at its free; a
// filter runs under private_mutex_ on every allocation of every thread
// while a route is active, so it must be cheap and must not call the
// allocator, and those allocations skip the threads' caches; a routed
// request that finds no room in its pool asks the driver, then returns the
// other pools' free memory and retries, but never takes a block another
// pool (or another stream's part of its own) has cached; a free that gives
// memory back synchronizes the block's stream (not while it captures: Note
// [Frees during capture]), in the free's thread. Evidence: the hit path of
// bench/memory_bench.cpp, whose instruction counts (bench/alloc_counts.py)
// the routing check leaves as they were.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline ValueError DeviceCachingAllocator<R>::not_private(std::string_view call,
                                                        MempoolId id) const {
  return ValueError(Backend<R>::name,
                    fmt::format("{} on {}:{}: pool ({}, {}) {}", call, Backend<R>::name, device_,
                                id.first, id.second,
                                id.is_default() ? "names the streams' pools, not a private pool"
                                                : "is not a private pool in use"));
}

// Under private_mutex_: pool `id`'s entry, or nullptr.
template <class R>
inline auto DeviceCachingAllocator<R>::find_private(MempoolId id) -> PrivateEntry* {
  for (PrivateEntry& e : private_pools_)
    if (e.id == id) return &e;
  return nullptr;
}

// Under private_mutex_: adds a use of pool `id`, made if it is new; its
// memory is kept reserved from now on.
template <class R>
inline void DeviceCachingAllocator<R>::incref_pool(MempoolId id) {
  if (PrivateEntry* e = find_private(id)) {
    if (e->use_count++ == 0) {  // released, with memory still out: in use again
      for (Pool* pool : e->pools) {
        detail::SpinGuard lock(pool->lock);
        pool->keep = detail::Keep::reserve;
      }
    }
    return;
  }
  private_pools_.push_back({id, 1, {}});
}

// Pool `id`'s Pools (one a stream it served); none if unknown.
template <class R>
inline auto DeviceCachingAllocator<R>::pools_of(MempoolId id) -> std::vector<Pool*> {
  std::lock_guard<std::mutex> guard(private_mutex_);
  PrivateEntry* e = find_private(id);
  return e ? e->pools : std::vector<Pool*>{};
}

template <class R>
inline void DeviceCachingAllocator<R>::create_pool(MempoolId id) {
  if (id.is_default()) throw not_private("create_pool", id);
  std::lock_guard<std::mutex> guard(private_mutex_);
  incref_pool(id);
}

template <class R>
inline int DeviceCachingAllocator<R>::pool_use_count(MempoolId id) {
  std::lock_guard<std::mutex> guard(private_mutex_);
  PrivateEntry* e = find_private(id);
  return e ? e->use_count : 0;
}

template <class R>
inline std::vector<MempoolId> DeviceCachingAllocator<R>::pool_ids() {
  std::lock_guard<std::mutex> guard(private_mutex_);
  std::vector<MempoolId> out;
  out.reserve(private_pools_.size());
  for (const PrivateEntry& e : private_pools_) out.push_back(e.id);
  return out;
}

template <class R>
inline void DeviceCachingAllocator<R>::release_pool(MempoolId id) {
  std::vector<Pool*> pools;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    PrivateEntry* e = id.is_default() ? nullptr : find_private(id);
    if (!e || e->use_count == 0) throw not_private("release_pool", id);
    if (--e->use_count > 0) return;
    pools = e->pools;
    for (Pool* pool : pools) {
      detail::SpinGuard lock(pool->lock);
      pool->keep = detail::Keep::give_back;
      mark_released(*pool);
    }
  }
  std::exception_ptr first;
  for (Pool* pool : pools) {
    try {
      release_pool_memory(*pool, detail::Drain::wait_for_all);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  forget_if_idle(id);
  if (first) std::rethrow_exception(first);
}

template <class R>
inline void DeviceCachingAllocator<R>::begin_allocate_to_pool(
    MempoolId id, std::function<bool(StreamHandle)> filter) {
  if (id.is_default()) throw not_private("begin_allocate_to_pool", id);
  if (!filter)
    throw ValueError(Backend<R>::name,
                     fmt::format("begin_allocate_to_pool on {}:{}: pool ({}, {}) needs a filter",
                                 Backend<R>::name, device_, id.first, id.second));
  std::lock_guard<std::mutex> guard(private_mutex_);
  // Room first, so that nothing fails after the use is added.
  routes_.reserve(routes_.size() + 1);
  private_pools_.reserve(private_pools_.size() + 1);
  incref_pool(id);
  routes_.push_back({id, std::move(filter)});
  cache_key_.store(kRouting, std::memory_order_relaxed);
}

template <class R>
inline void DeviceCachingAllocator<R>::end_allocate_to_pool(MempoolId id) {
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    auto it = std::find_if(routes_.rbegin(), routes_.rend(),
                           [&](const Route& r) { return r.id == id; });
    if (it == routes_.rend())
      throw ValueError(Backend<R>::name,
                       fmt::format("end_allocate_to_pool on {}:{}: no allocation is routed to "
                                   "pool ({}, {})",
                                   Backend<R>::name, device_, id.first, id.second));
    routes_.erase(std::next(it).base());
    if (routes_.empty()) cache_key_.store(id_, std::memory_order_relaxed);
  }
  // Frees deferred during the capture get their events now, if no other
  // capture is underway (Note [Frees during capture]). A driver error here
  // is one of earlier work; the next drain meets it again.
  for (Pool* pool : pools_of(id)) {
    try {
      detail::SpinGuard lock(pool->lock);
      if (!pool->pending.empty()) process_pending(*pool, detail::Drain::completed);
    } catch (const std::exception& e) {
      report(Severity::warning, Backend<R>::name,
             fmt::format("device {}: pending frees of pool ({}, {}) wait for a later drain: {}",
                         device_, id.first, id.second, e.what()));
    }
  }
  forget_if_idle(id);
}

template <class R>
inline void DeviceCachingAllocator<R>::empty_cache(MempoolId id) {
  if (id.is_default()) return empty_cache();
  std::vector<Pool*> pools;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    PrivateEntry* e = find_private(id);
    if (!e || e->use_count > 0) return;  // unknown, or reserved while in use
    pools = e->pools;
  }
  for (Pool* pool : pools) release_pool_memory(*pool, detail::Drain::wait_for_all);
  forget_if_idle(id);
}

template <class R>
inline DeviceStats DeviceCachingAllocator<R>::stats(MempoolId id) {
  DeviceStats out;
  if (id.is_default()) {
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      if (pool->id.is_default()) out.merge(pool->stats.device_stats());  // idle ones hold zeros
    }
  } else {
    std::lock_guard<std::mutex> guard(private_mutex_);
    if (PrivateEntry* e = find_private(id)) {
      for (Pool* pool : e->pools) {
        detail::SpinGuard lock(pool->lock);
        out.merge(pool->stats.device_stats());
      }
    }
  }
  out.max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                           ? -1
                           : static_cast<std::int64_t>(config_.max_split_size);
  return out;
}

// While a route is active (pool_from_map): the Pool for `stream` of the
// private pool of the route begun last whose filter accepts `stream`, made
// (or an idle one reused) on the pool's first request on that stream; or
// nullptr, the stream's own pool then serving the request.
template <class R>
inline auto DeviceCachingAllocator<R>::routed_pool(StreamHandle stream) -> Pool* {
  std::lock_guard<std::mutex> guard(private_mutex_);
  auto route = std::find_if(routes_.rbegin(), routes_.rend(),
                            [&](const Route& r) { return r.filter(stream); });
  if (route == routes_.rend()) return nullptr;
  PrivateEntry* e = find_private(route->id);
  ACCELKIT_ASSERT(e, "a route's pool has an entry while the route is active");
  for (Pool* pool : e->pools)
    if (pool->stream == stream) return pool;
  e->pools.reserve(e->pools.size() + 1);
  Pool* pool;
  if (!idle_pools_.empty()) {
    pool = idle_pools_.back();
    idle_pools_.pop_back();
  } else {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    pools_.reserve(pools_.size() + 1);
    auto made = std::make_unique<Pool>(stream);
    pool = made.get();
    private_owned_.push_back(std::move(made));
    pools_.push_back(pool);
    // So that forgetting a pool cannot fail (forget_if_idle).
    idle_pools_.reserve(private_owned_.size());
  }
  {
    detail::SpinGuard lock(pool->lock);
    pool->stream = stream;
    pool->id = e->id;
    pool->keep = e->use_count > 0 ? detail::Keep::reserve : detail::Keep::give_back;
  }
  e->pools.push_back(pool);
  return pool;
}

// Returns the wholly free segments of `pool` to the driver if its use
// count is 0 and its stream is not capturing (Note [Private pools]).
template <class R>
inline void DeviceCachingAllocator<R>::release_pool_memory(Pool& pool, detail::Drain drain) {
  std::lock_guard<std::mutex> serial(release_mutex_);
  Released freed;
  try {
    detail::SpinGuard lock(pool.lock);
    if (pool.keep == detail::Keep::give_back && !capturing(pool))
      detach_free(pool, freed, drain);
  } catch (...) {
    free_segments(freed);  // what was detached before the failure
    throw;
  }
  free_segments(freed);
}

// Under the pool lock, as `pool` is released: flags its allocated blocks as
// used elsewhere, so that their frees take the out-of-line path, which
// gives memory back (free_small_used, free_large's), and the hit path pays
// nothing for released pools (Note [Private pools]). A flagged block with no
// streams recorded (take_uses) is freed as any other.
template <class R>
inline void DeviceCachingAllocator<R>::mark_released(Pool& pool) {
  using namespace detail::small_block;
  for (Segment* seg : pool.segments)
    for (Block* b = seg->head; b; b = b->next)
      if (b->allocated) b->has_uses = true;
  pool.arena.for_each_segment([](detail::SmallSegment& seg) {
    for (std::size_t i = 0; i < seg.blocks.size(); ++i)
      if (state(seg.blocks[i]) == allocated) seg.blocks[i] = with_uses(seg.blocks[i], Uses::recorded);
  });
}

// After a free into `pool` (Keep::give_back): what became wholly free goes
// back to the driver. A free must not throw for the driver's sake, so a
// failure is reported; the memory waits for a later empty_cache.
template <class R>
ACCELKIT_NOINLINE void DeviceCachingAllocator<R>::give_back(Pool& pool) noexcept {
  try {
    release_pool_memory(pool, detail::Drain::completed);
    MempoolId id;
    {
      detail::SpinGuard lock(pool.lock);
      id = pool.id;
    }
    if (!id.is_default()) forget_if_idle(id);
  } catch (const std::exception& e) {
    report(Severity::warning, Backend<R>::name,
           fmt::format("device {}: memory of a released pool waits for a later empty_cache: {}",
                       device_, e.what()));
  } catch (...) {
    report(Severity::warning, Backend<R>::name,
           fmt::format("device {}: memory of a released pool waits for a later empty_cache",
                       device_));
  }
}

// Forgets pool `id` if its use count is 0, no route names it and its Pools
// hold nothing from the driver: the id becomes unknown, its figures join
// retired_stats_, and its Pools wait in idle_pools_ for the next private
// pool (Note [Private pools]).
template <class R>
inline void DeviceCachingAllocator<R>::forget_if_idle(MempoolId id) {
  std::lock_guard<std::mutex> guard(private_mutex_);
  PrivateEntry* e = find_private(id);
  if (!e || e->use_count > 0) return;
  for (const Route& r : routes_)
    if (r.id == id) return;
  for (Pool* pool : e->pools) {
    detail::SpinGuard lock(pool->lock);
    if (pool->stats.reserved_bytes.total() != 0) return;  // limbo_ counts too
  }
  for (Pool* pool : e->pools) {
    detail::SpinGuard lock(pool->lock);
    ACCELKIT_ASSERT(pool->pending.empty() && pool->segments.empty(),
                    "a pool that holds nothing from the driver has no blocks");
    retired_stats_.merge(pool->stats.device_stats());
    pool->stats = PoolStats{};
    pool->keep = detail::Keep::cache;
    pool->id = MempoolId{};
    pool->parking = true;
    pool->frees_counted = 0;
    pool->parked_hits = 0;
    idle_pools_.push_back(pool);  // has room: routed_pool reserved it
  }
  private_pools_.erase(private_pools_.begin() + (e - private_pools_.data()));
}

// After empty_cache(): forgets the released pools it emptied.
template <class R>
inline void DeviceCachingAllocator<R>::forget_idle_pools() {
  std::vector<MempoolId> released;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    for (const PrivateEntry& e : private_pools_)
      if (e.use_count == 0) released.push_back(e.id);
  }
  for (MempoolId id : released) forget_if_idle(id);
}

ACCELKIT_END_NAMESPACE
