// accelkit: the caching allocator's pool of each stream.
//
// Each stream has its own pool (Note [Caching device allocator]), made the
// first time the stream allocates and kept until the allocator goes. A
// thread finds a stream's pool in its own cache of the last four pools it
// used (tls_pools_, keyed by allocator and stream, scanned inline on every
// allocation), and otherwise in the allocator's map under pools_mutex_.
// While a route to a private pool is active the cache is bypassed, and the
// routes are asked first (Note [Private pools]).
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// The pool of `stream`: the thread's cache scanned inline, the map read out
// of line (GCC at -O3 called all of it out of line otherwise).
template <class R>
ACCELKIT_ALWAYS_INLINE auto DeviceCachingAllocator<R>::pool_for(StreamHandle stream) -> Pool& {
  std::uint64_t key = cache_key_.load(std::memory_order_relaxed);  // kRouting: no entry
  for (const PoolCacheEntry& e : tls_pools_)
    if (e.owner == key && e.stream == stream.value) return *e.pool;
  return pool_from_map(stream);
}

template <class R>
ACCELKIT_NOINLINE auto DeviceCachingAllocator<R>::pool_from_map(StreamHandle stream) -> Pool& {
  if (cache_key_.load(std::memory_order_relaxed) == kRouting)
    if (Pool* routed = routed_pool(stream)) return *routed;
  Pool* p;
  {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    auto& slot = pools_by_stream_[stream.value];
    if (!slot) {
      slot = std::make_unique<Pool>(stream);
      pools_.push_back(slot.get());
    }
    p = slot.get();
  }
  tls_pools_[tls_next_++ % tls_pools_.size()] = {id_, stream.value, p};
  return *p;
}

// Every pool, for the walks over all of them (statistics, release); the
// list only grows, and each pool outlives the walk.
template <class R>
inline auto DeviceCachingAllocator<R>::pools_snapshot() -> std::vector<Pool*> {
  std::lock_guard<std::mutex> lock(pools_mutex_);
  return pools_;
}

ACCELKIT_END_NAMESPACE
