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
// Decision (CUDA's): a private pool is a Pool not keyed by a stream, named
// by a MempoolId, with a use count. begin_allocate_to_pool(id, filter) adds
// a route: while one is active, an allocation on a stream that a route's
// filter accepts comes from that route's pool and from nothing else (the
// route begun last is asked first); no stream's pool serves it, and the
// private pool serves no request no route sent. The hot path pays one
// relaxed load (routes_active_) while no route is active. A block knows its
// pool through its segment, so a block freed during or after capture goes
// back to its private pool only. A private pool's stream (Pool::stream) is
// that of its first allocation; a routed allocation on another stream is
// recorded as used on that stream too (record_stream), so its reuse waits
// for both. Its segments stay reserved while its use count is above 0:
// release paths (empty_cache, the out-of-memory retry, garbage collection)
// skip it (Keep::reserve). When release_pool brings the count to 0 its
// wholly free segments go back to the driver at once, ordered after its
// stream (Note [Ordered release]; the caller has synchronized the streams
// its replays ran on), and each later free that leaves a segment wholly
// free gives that back too (Keep::give_back), as does empty_cache. A pool
// at 0 with nothing reserved and no route is forgotten: its id is unknown
// again, its figures join the device's retired totals, and the Pool is kept
// for the next private pool, so that pools made and released in a loop do
// not grow the allocator.
// Limits: a filter runs under private_mutex_ on every allocation of every
// thread while a route is active, so it must be cheap and must not call the
// allocator; a routed request that finds no room in its pool asks the
// driver, then returns the other pools' free memory and retries, but never
// takes a block another pool has cached; a free that gives memory back
// synchronizes the pool's stream (not while it captures: Note [Frees
// during capture]), in the free's thread.
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

// Under private_mutex_: adds a use of pool `id`, made (or an idle Pool
// reused) if it is new, and kept reserved from now on.
template <class R>
inline auto DeviceCachingAllocator<R>::incref_pool(MempoolId id) -> Pool& {
  if (PrivateEntry* e = find_private(id)) {
    if (e->use_count++ == 0) {  // released, with memory still out: in use again
      detail::SpinGuard lock(e->pool->lock);
      e->pool->keep = detail::Keep::reserve;
    }
    return *e->pool;
  }
  private_pools_.reserve(private_pools_.size() + 1);
  Pool* pool;
  if (!idle_pools_.empty()) {
    pool = idle_pools_.back();
    idle_pools_.pop_back();
  } else {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    pools_.reserve(pools_.size() + 1);
    auto made = std::make_unique<Pool>(StreamHandle{});
    pool = made.get();
    private_owned_.push_back(std::move(made));
    pools_.push_back(pool);
    // So that forgetting a pool cannot fail (forget_if_idle).
    idle_pools_.reserve(private_owned_.size());
  }
  {
    detail::SpinGuard lock(pool->lock);
    pool->id = id;
    pool->has_stream = false;
    pool->keep = detail::Keep::reserve;
  }
  private_pools_.push_back({id, pool, 1});
  return *pool;
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
inline void DeviceCachingAllocator<R>::release_pool(MempoolId id) {
  Pool* pool;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    PrivateEntry* e = id.is_default() ? nullptr : find_private(id);
    if (!e || e->use_count == 0) throw not_private("release_pool", id);
    if (--e->use_count > 0) return;
    pool = e->pool;
    detail::SpinGuard lock(pool->lock);
    pool->keep = detail::Keep::give_back;
  }
  release_pool_memory(*pool, detail::Drain::wait_for_all);
  forget_if_idle(*pool);
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
  routes_.reserve(routes_.size() + 1);  // so that nothing fails after the use is added
  Pool& pool = incref_pool(id);
  routes_.push_back({id, &pool, std::move(filter)});
  routes_active_.store(routes_.size(), std::memory_order_relaxed);
}

template <class R>
inline void DeviceCachingAllocator<R>::end_allocate_to_pool(MempoolId id) {
  Pool* pool;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    auto it = std::find_if(routes_.rbegin(), routes_.rend(),
                           [&](const Route& r) { return r.id == id; });
    if (it == routes_.rend())
      throw ValueError(Backend<R>::name,
                       fmt::format("end_allocate_to_pool on {}:{}: no allocation is routed to "
                                   "pool ({}, {})",
                                   Backend<R>::name, device_, id.first, id.second));
    pool = it->pool;
    routes_.erase(std::next(it).base());
    routes_active_.store(routes_.size(), std::memory_order_relaxed);
  }
  // Frees deferred during the capture get their events now, if no other
  // capture is underway (Note [Frees during capture]). A driver error here
  // is one of earlier work; the next drain meets it again.
  try {
    detail::SpinGuard lock(pool->lock);
    if (!pool->pending.empty()) process_pending(*pool, detail::Drain::completed);
  } catch (const std::exception& e) {
    report(Severity::warning, Backend<R>::name,
           fmt::format("device {}: pending frees of pool ({}, {}) wait for a later drain: {}",
                       device_, id.first, id.second, e.what()));
  }
  forget_if_idle(*pool);
}

template <class R>
inline void DeviceCachingAllocator<R>::empty_cache(MempoolId id) {
  if (id.is_default()) return empty_cache();
  Pool* pool;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    PrivateEntry* e = find_private(id);
    if (!e || e->use_count > 0) return;  // unknown, or reserved while in use
    pool = e->pool;
  }
  release_pool_memory(*pool, detail::Drain::wait_for_all);
  forget_if_idle(*pool);
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
      detail::SpinGuard lock(e->pool->lock);
      out = e->pool->stats.device_stats();
    }
  }
  out.max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                           ? -1
                           : static_cast<std::int64_t>(config_.max_split_size);
  return out;
}

// allocate() while a route is active: the pool of the route begun last
// whose filter accepts `stream`, else the stream's own pool.
template <class R>
ACCELKIT_NOINLINE void* DeviceCachingAllocator<R>::allocate_routed(std::size_t bytes,
                                                                   StreamHandle stream,
                                                                   NoRoom no_room) {
  Pool* routed = nullptr;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    for (auto it = routes_.rbegin(); it != routes_.rend(); ++it) {
      if (!it->filter(stream)) continue;
      routed = it->pool;
      if (!routed->has_stream) {
        detail::SpinGuard lock(routed->lock);
        routed->stream = stream;
        routed->has_stream = true;
      }
      break;
    }
  }
  if (!routed) return allocate_in(pool_for(stream), bytes, stream, no_room);
  void* p = allocate_in(*routed, bytes, stream, no_room);
  if (p && stream != routed->stream) {
    // Reused only once both streams are past it (Note [Private pools]).
    try {
      record_stream(p, stream);
    } catch (...) {
      deallocate(p);
      throw;
    }
  }
  return p;
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

// After a free into `pool` (Keep::give_back): what became wholly free goes
// back to the driver. A free must not throw for the driver's sake, so a
// failure is reported; the memory waits for a later empty_cache.
template <class R>
ACCELKIT_NOINLINE void DeviceCachingAllocator<R>::give_back(Pool& pool) noexcept {
  try {
    release_pool_memory(pool, detail::Drain::completed);
    forget_if_idle(pool);
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

// Forgets `pool` if its use count is 0, no route names it and it holds
// nothing from the driver: its id becomes unknown and the Pool waits in
// idle_pools_ for the next private pool (Note [Private pools]).
template <class R>
inline void DeviceCachingAllocator<R>::forget_if_idle(Pool& pool) {
  std::lock_guard<std::mutex> guard(private_mutex_);
  auto e = std::find_if(private_pools_.begin(), private_pools_.end(),
                        [&](const PrivateEntry& x) { return x.pool == &pool; });
  if (e == private_pools_.end() || e->use_count > 0) return;
  for (const Route& r : routes_)
    if (r.pool == &pool) return;
  {
    detail::SpinGuard lock(pool.lock);
    if (pool.stats.reserved_bytes.total() != 0) return;  // limbo_ counts too
    ACCELKIT_ASSERT(pool.pending.empty() && pool.segments.empty(),
                    "a pool that holds nothing from the driver has no blocks");
    retired_stats_.merge(pool.stats.device_stats());
    pool.stats = PoolStats{};
    pool.keep = detail::Keep::cache;
    pool.id = MempoolId{};
    pool.has_stream = false;
    pool.parking = true;
    pool.frees_counted = 0;
    pool.parked_hits = 0;
  }
  private_pools_.erase(e);
  idle_pools_.push_back(&pool);  // has room: incref_pool reserved it
}

// After empty_cache(): forgets the released pools it emptied.
template <class R>
inline void DeviceCachingAllocator<R>::forget_idle_pools() {
  std::vector<Pool*> released;
  {
    std::lock_guard<std::mutex> guard(private_mutex_);
    for (const PrivateEntry& e : private_pools_)
      if (e.use_count == 0) released.push_back(e.pool);
  }
  for (Pool* pool : released) forget_if_idle(*pool);
}

ACCELKIT_END_NAMESPACE
