// accelkit: stream order in the caching allocator: stream uses and pending frees.
//
// A block used on streams other than its own (record_stream) goes back to
// the cache only once events recorded on those streams at its free have
// completed (Note [Stream-use recording]); until then it is a pending free
// in its pool's queue, neither allocated again nor freed twice. Here:
// record_stream, recording the events at a free, the queue (cache_or_queue,
// process_pending), and the room a freed block needs in the free structures
// before it is cached (make_room).
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline void DeviceCachingAllocator<R>::record_stream(void* ptr, StreamHandle stream) {
  auto not_live = [&] {
    return RuntimeError(Backend<R>::name,
                        fmt::format("record_stream: {} is not a live allocation on {}:{}", ptr,
                                    Backend<R>::name, device_));
  };
  if (SmallHold h = small_index_.hold(ptr); h.seg) {
    if (!h.allocated()) {
      h.lock.unlock();
      throw not_live();
    }
    if (stream == h.pool->stream) return;
    add_use(*h.pool, ptr, stream);
    h.seg->blocks[h.i] =
        detail::small_block::with_uses(h.seg->blocks[h.i], detail::small_block::Uses::recorded);
    return;
  }
  detail::LiveBlock live = live_.find(ptr);
  if (!live.block) throw not_live();
  detail::Block* b = live.block;
  detail::Pool& pool = *live.pool;
  detail::SpinGuard lock(pool.lock);
  if (!b->allocated || b->ptr != ptr) throw not_live();  // parked (Note [Mapped blocks])
  if (stream == pool.stream) return;
  add_use(pool, b->ptr, stream);
  b->has_uses = true;
}

// Orders the free of the block at `ptr` after its uses on other streams
// (Note [Stream-use recording]); false when it must be quarantined.
template <class R>
inline bool DeviceCachingAllocator<R>::record_uses(char* ptr,
                                                   const std::vector<StreamHandle>& uses,
                                                   std::vector<std::pair<device_index,
                                                   EventHandle>>& events) {
  if (uses.empty()) return true;
  std::vector<std::pair<device_index, StreamHandle>> on_device;
  on_device.reserve(uses.size());
  for (StreamHandle s : uses) on_device.emplace_back(device_, s);
  return detail::record_stream_uses(
      backend_, on_device, [&](device_index) -> EventPool<R>& { return events_; }, events,
      [&] { return fmt::format("device memory at {}", static_cast<void*>(ptr)); });
}

// Note [Frees during capture]
// Work queued on a capturing stream is recorded, not run, and no event may
// be recorded on a capturing stream; in global capture mode the driver also
// refuses event queries and waits on the device (CUDA's rule, Note [Capture
// rules]). So a free of a block used on a capturing stream (record_stream)
// is queued with its streams (PendingFree::deferred) instead of events; a
// free of a block used only on other streams records its events as usual
// (the event pool queries no parked event during a capture). While a
// capture is underway on the device (Backend::capture_underway, one relaxed
// load when none is) pending frees are not drained: no event is queried or
// waited for. Once no capture is underway, the next drain (an allocation
// from that pool, end_allocate_to_pool, empty_cache, release_pool) records
// the deferred events, and the block is reused once they complete, as CUDA
// defers. Release paths never synchronize a capturing stream: empty_cache,
// the out-of-memory retry and garbage collection skip the pool of a
// capturing stream, and a segment whose stream captures waits in limbo
// (Note [Ordered release]). Limits: a pool's pending frees wait for the end
// of every capture on the device, even those no capture touched, as in
// CUDA; the deferred event is recorded after the capture, later in its
// stream than the free, which delays reuse but never makes it early.

// Whether any of `uses` is a capturing stream (Note [Frees during capture]).
template <class R>
inline bool DeviceCachingAllocator<R>::used_while_capturing(const std::vector<StreamHandle>& uses) {
  if (!backend_.capture_underway(device_)) return false;
  return std::any_of(uses.begin(), uses.end(),
                     [&](StreamHandle s) { return backend_.stream_is_capturing(device_, s); });
}

// Under the pool lock: frees pending blocks whose events have completed
// (all of them, waiting, when `wait`); nothing while a capture is underway
// (Note [Frees during capture]).
template <class R>
inline void DeviceCachingAllocator<R>::process_pending(Pool& pool, detail::Drain drain) {
  if (backend_.capture_underway(device_)) return;
  bool wait = drain == detail::Drain::wait_for_all;
  detail::drain_pending(
      pool.pending, wait,
      [&](detail::PendingFree& p) {
        if (!p.deferred.empty()) {
          // Its events, deferred while a capture was underway.
          if (!record_uses(p.ptr, p.deferred, p.events)) p.quarantined = true;
          p.deferred.clear();
          if (p.quarantined) return true;
        }
        // A driver error (one of earlier queued work, say) goes to the
        // caller; the entry stays queued.
        for (auto [device, e] : p.events) {
          if (wait) backend_.event_synchronize(device, e);
          if (!backend_.event_query(device, e)) return false;
        }
        return true;
      },
      [&](detail::PendingFree& p) {
        if (p.quarantined) return;  // never reused: see record_uses
        // The free first: if it throws, nothing changed and p stays queued.
        make_room(pool, p);
        cache_freed(pool, p);
        for (auto [device, e] : p.events) events_.release(e, /*completed=*/true);
      });
}

// Under the pool lock, after make_room(): returns a freed block whose
// stream uses are past to the cache (free_block or release_small).
template <class R>
inline void DeviceCachingAllocator<R>::cache_freed(Pool& pool, const detail::PendingFree& p) {
  if (p.seg) release_small(pool, *p.seg, p.seg->index_of(p.ptr), p.ptr);
  else free_block(pool, p.block);
}

// Under the pool lock, after record_uses(): caches the block now when
// there are no events to wait for and room for it; otherwise queues it,
// and process_pending caches it once its events complete.
template <class R>
inline void DeviceCachingAllocator<R>::cache_or_queue(Pool& pool, detail::PendingFree p) {
  if (p.events.empty() && p.deferred.empty() && try_make_room(pool, p)) {
    cache_freed(pool, p);
    return;
  }
  pool.pending.push_back(std::move(p));
}

// Under the pool lock: the streams a freed block was used on, leaving none
// recorded for it (none at all for a block flagged only because its
// private pool was released: mark_released).
template <class R>
inline std::vector<StreamHandle> DeviceCachingAllocator<R>::take_uses(Pool& pool, const void* ptr) {
  auto it = pool.uses.find(ptr);
  if (it == pool.uses.end()) return {};
  std::vector<StreamHandle> uses = std::move(it->second);
  pool.uses.erase(it);
  return uses;
}

// Under the pool lock: records that the block at `ptr` is used on `stream`.
template <class R>
inline void DeviceCachingAllocator<R>::add_use(Pool& pool, const void* ptr, StreamHandle stream) {
  std::vector<StreamHandle>& uses = pool.uses[ptr];
  if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
}

// Before pending free `p` is returned to the cache (cache_freed): the
// same for a record; for a small block, room in the bin it enters merged
// should it not be parked (release_small).
template <class R>
inline void DeviceCachingAllocator<R>::make_room(Pool& pool, const detail::PendingFree& p) {
  if (!p.seg) return make_room(pool);
  std::size_t i = p.seg->index_of(p.ptr);
  pool.arena.reserve_bin(merged(*p.seg, i).granules);
}

template <class R>
inline bool DeviceCachingAllocator<R>::try_make_room(Pool& pool,
                                                     const detail::PendingFree& p) noexcept {
  try {
    make_room(pool, p);
    return true;
  } catch (...) {
    return false;
  }
}

ACCELKIT_END_NAMESPACE
