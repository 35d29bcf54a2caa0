// accelkit: returning the caching allocator's memory to the driver.
//
// Note [Ordered release]
// Memory goes back to the driver only after the work that used it: a
// driver's free may take memory away at once (OpenCL's clSVMFree does;
// cudaFree waits for the device), and queued work may still read a cached
// segment whose blocks were freed in stream order. A segment is detached
// from its pool first (so nothing can allocate from it), then the stream
// that owns the pool is synchronized (blocks used on other streams reach
// the cache only after events on those streams completed), then it is
// freed. A segment whose stream cannot be synchronized, or that the
// driver refuses to free, is kept in limbo_: still counted as reserved (the
// driver holds it), never allocated from, and tried again by the next
// release (empty_cache, the out-of-memory retry); the error is thrown to
// the caller once. A capturing stream is never synchronized (Note [Frees
// during capture]): its segments wait in limbo too, without an error.
// Statistics count a segment out when the driver has it back.
//
// Here: ordered release (free_segments), emptying the cache (release_all),
// garbage collection, the uncached path's frees, and the destructor.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <mutex>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline DeviceCachingAllocator<R>::~DeviceCachingAllocator() {
  release_ranges_at_exit();  // Note [Expandable segments]
  for (const Detached& d : limbo_) {
    try {
      if (!d.range) backend_.raw_free(device_, d.ptr, d.size);
    } catch (...) {
      // As below.
    }
    delete d.record;
  }
  for (Pool* each : pools_) {  // the streams' and the private pools
    detail::Pool& pool = *each;
    for (detail::PendingFree& p : pool.pending)
      for (auto [device, e] : p.events) events_.release(e);
    for (detail::Segment* s : pool.segments) {
      try {
        if (!s->expandable) backend_.raw_free(device_, s->ptr, s->size);
      } catch (...) {
        // The driver refused at teardown; the process is exiting or the
        // device is gone, and a destructor cannot report it.
      }
      delete s;
    }
    pool.arena.for_each_segment([&](detail::SmallSegment& s) {
      try {
        backend_.raw_free(device_, s.ptr, s.size());
      } catch (...) {
        // As above.
      }
    });
  }
}

// Under release_mutex_: returns detached segments to the driver after
// synchronizing the streams that own them and the streams in `also`
// (Note [Ordered release]). Throws the first error, after every segment
// is freed or in limbo_.
template <class R>
inline void DeviceCachingAllocator<R>::free_segments(Released& r,
                                                     const std::vector<StreamHandle>& also) {
  std::exception_ptr first;
  std::vector<StreamHandle> streams(also), failed;
  for (const Detached& d : r)
    if (std::find(streams.begin(), streams.end(), d.pool->stream) == streams.end())
      streams.push_back(d.pool->stream);
  for (StreamHandle s : streams) {
    if (backend_.stream_is_capturing(device_, s)) {  // Note [Frees during capture]
      failed.push_back(s);
      continue;
    }
    try {
      backend_.stream_synchronize(device_, s);
    } catch (const DeviceLostError& e) {
      // A lost device runs no more work (Note [Lost devices]): nothing
      // queued touches the memory again, so it goes back to the driver;
      // the loss itself (not a refusal naming it) is thrown at the end.
      if (e.refused().empty() && !first) first = std::current_exception();
    } catch (...) {
      if (!first) first = std::current_exception();
      failed.push_back(s);
    }
  }
  auto did_fail = [&](StreamHandle s) {
    return std::find(failed.begin(), failed.end(), s) != failed.end();
  };
  bool also_failed = std::any_of(also.begin(), also.end(), did_fail);
  // Room first, so that keeping a segment cannot fail.
  limbo_.reserve(limbo_.size() + r.size());
  for (Detached& d : r) {
    bool ordered = !also_failed && !did_fail(d.pool->stream);
    if (d.range) {  // expandable pages (Note [Expandable segments])
      if (!ordered || !free_expandable(d, first)) limbo_.push_back(d);
      continue;
    }
    if (ordered) {
      try {
        backend_.raw_free(device_, d.ptr, d.size);
      } catch (const std::exception& e) {
        if (backend_.is_lost(device_)) {
          // Never to be tried again (Note [Lost devices]): out of the pool,
          // reported, the driver's to keep.
          report(Severity::warning, Backend<R>::name,
                 fmt::format("device {} is lost, and its driver did not take back {} bytes at "
                             "{}: they are left to it: {}",
                             device_, d.size, static_cast<void*>(d.ptr), e.what()));
        } else {
          if (!first) first = std::current_exception();
          ordered = false;
        }
      }
    }
    if (!ordered) {
      limbo_.push_back(d);
      continue;
    }
    reserved_.fetch_sub(d.size);
    {
      detail::SpinGuard lock(d.pool->lock);
      count_segment(*d.pool, d.size, d.kind, d.oversize, Count::out);
    }
    if (trace_.on()) record_trace(*d.pool, TraceEntry::Action::segment_free, d.ptr, d.size);
    delete d.record;
  }
  r.clear();
  if (first) std::rethrow_exception(first);
}

// Returns every wholly free segment of every stream to the driver.
template <class R>
inline void DeviceCachingAllocator<R>::release_all(detail::Drain drain) {
  std::lock_guard<std::mutex> serial(release_mutex_);
  Released freed;
  freed.swap(limbo_);  // tried again (Note [Ordered release])
  try {
    release_into(freed, drain);
  } catch (...) {
    free_segments(freed);  // what was detached before the failure
    throw;
  }
  free_segments(freed);
}

template <class R>
inline void DeviceCachingAllocator<R>::release_into(Released& freed, detail::Drain drain) {
  for (Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    if (!kept_from_release(*pool)) detach_free(*pool, freed, drain);
  }
}

// Under the pool lock: whether a release leaves `pool` alone: a private
// pool in use (Note [Private pools]), or the pool of a capturing stream
// (Note [Frees during capture]).
template <class R>
inline bool DeviceCachingAllocator<R>::kept_from_release(const Pool& pool) {
  return pool.keep == detail::Keep::reserve || capturing(pool);
}

// Whether the stream that orders `pool` is capturing.
template <class R>
inline bool DeviceCachingAllocator<R>::capturing(const Pool& pool) {
  return backend_.stream_is_capturing(device_, pool.stream);
}

// Under the pool lock: drains `pool`'s pending frees, then detaches its
// wholly free segments into `freed`.
template <class R>
inline void DeviceCachingAllocator<R>::detach_free(Pool& pool, Released& freed,
                                                   detail::Drain drain) {
  if (!pool.pending.empty()) {
    if (drain == detail::Drain::wait_for_all) ++pool.stats.num_sync_all_streams;
    process_pending(pool, drain);
  }
  unpark_all(pool);
  for (std::size_t i = pool.segments.size(); i-- > 0;) {
    Segment* s = pool.segments[i];
    if (wholly_free(s)) freed.push_back(detach_segment(pool, s));
    else if (s->expandable) shrink_tail(pool, s, freed);  // Note [Expandable segments]
  }
  std::vector<detail::SmallSegment*> empty;
  pool.arena.for_each_segment([&](detail::SmallSegment& s) {
    if (s.wholly_free()) empty.push_back(&s);
  });
  freed.reserve(freed.size() + empty.size());
  for (detail::SmallSegment* s : empty) freed.push_back(detach_small(pool, s));
}

// Note [Garbage collection threshold]
// A process that runs close to its memory limit with a large cache would
// otherwise reach the out-of-memory path (the whole cache returned, then a
// retry) on the first request that needs a new segment. With
// garbage_collection_threshold set, a pool about to grow past that fraction
// of the limit first returns wholly free segments, least recently freed
// first, then the free pages at the end of expandable segments (Note
// [Expandable segments]), until the new segment fits under it. Limits: only
// wholly free segments and free end pages go back, so a fragmented cache may
// stay above the threshold; a release the driver refuses is reported, not
// thrown (Note [Ordered release]).
template <class R>
inline void DeviceCachingAllocator<R>::collect_garbage(std::size_t incoming) {
  auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                            static_cast<double>(limit_.load()));
  if (reserved_.load() + incoming <= threshold) return;
  std::lock_guard<std::mutex> serial(release_mutex_);
  struct Candidate {
    std::uint64_t tick;
    Pool* pool;
    Segment* seg;    // a record's segment, or
    SmallRef small;  // a small segment
    bool tail;       // seg's free end pages only (expandable)
  };
  std::vector<Candidate> candidates;
  for (Pool* pool : pools_snapshot()) {
    detail::SpinGuard lock(pool->lock);
    if (kept_from_release(*pool)) continue;
    unpark_all(*pool);
    for (Segment* s : pool->segments) {
      if (wholly_free(s)) candidates.push_back({s->free_tick, pool, s, {}, false});
      else if (s->expandable) candidates.push_back({~std::uint64_t{0}, pool, s, {}, true});
    }
    pool->arena.for_each_segment([&](detail::SmallSegment& s) {
      if (s.wholly_free())
        candidates.push_back({s.free_tick, pool, nullptr, {pool, s.ptr, s.id}, false});
    });
  }
  std::sort(candidates.begin(), candidates.end(),
            [](const Candidate& a, const Candidate& b) { return a.tick < b.tick; });
  Released freed;
  std::size_t releasing = 0;
  for (const Candidate& c : candidates) {
    if (reserved_.load() - releasing + incoming <= threshold) break;
    detail::SpinGuard lock(c.pool->lock);
    if (kept_from_release(*c.pool)) continue;  // a route took it since, say
    if (c.tail) {
      std::size_t n = freed.size();
      shrink_tail(*c.pool, c.seg, freed);
      if (freed.size() > n) releasing += freed.back().size;
    } else if (c.seg) {
      // Segments are deleted only under release_mutex_, so c.seg is valid.
      if (!wholly_free(c.seg)) continue;
      releasing += c.seg->size;
      freed.push_back(detach_segment(*c.pool, c.seg));
    } else {
      detail::SmallSegment* s = detail::SmallIndex::segment_of(c.small);
      if (!s || !s->wholly_free()) continue;
      freed.push_back(detach_small(*c.pool, s));
      releasing += memory_constants::kSmallBuffer;
    }
  }
  // Collection is opportunistic: a release the driver refuses (its
  // segments stay reserved, Note [Ordered release]) is reported, and the
  // allocation that triggered it goes on.
  try {
    free_segments(freed);
  } catch (const std::exception& e) {
    report(Severity::warning, Backend<R>::name,
           fmt::format("device {}: garbage collection could not return memory: {}", device_,
                       e.what()));
  }
}

// Without caching every free goes to the driver, ordered after the
// block's stream and the streams it was used on (Note [Ordered release]);
// a failure leaves it in limbo_ (tried again by empty_cache) and is
// reported through the diagnostics hook: a free must not throw for the
// driver's sake (it runs in tensor deleters).
template <class R>
inline void DeviceCachingAllocator<R>::free_uncached(Pool& pool, Block* b,
                                                     const std::vector<StreamHandle>& uses) {
  char* ptr = b->ptr;
  std::size_t size = b->size;
  Released r;
  {
    detail::SpinGuard lock(pool.lock);
    count_free(pool, b);
    auto n = static_cast<std::int64_t>(b->size);
    BlockKind kind = kind_of(b);
    count_down(pool.stats.active, kind, 1);
    count_down(pool.stats.active_bytes, kind, n);
    r.push_back(Detached{&pool, b->ptr, b->size, kind, /*oversize=*/false, b->segment});
    pool.recycle(b);
  }
  std::lock_guard<std::mutex> serial(release_mutex_);
  try {
    free_segments(r, uses);
  } catch (const std::exception& e) {
    report(Severity::warning, Backend<R>::name,
           fmt::format("device {}: the free of {} ({} bytes) waits for a later empty_cache: {}",
                       device_, static_cast<void*>(ptr), size, e.what()));
  }
}

ACCELKIT_END_NAMESPACE
