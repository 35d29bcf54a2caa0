// accelkit: the caching device allocator every backend gets.
//
// Note [Caching device allocator]
// The design follows what PyTorch's CUDA caching allocator does (sizes
// rounded to 512 B; requests up to 1 MiB served from 2 MiB "small" segments,
// 1-10 MiB from large_segment_size segments, larger ones rounded to 2 MiB;
// best fit; split and merge of neighbours; stream-ordered reuse; free and
// retry before out-of-memory) with four changes aimed at its known costs:
//  - Each stream has its own pool (Pool) with its own lock, cached
//    blocks and statistics. CUDA's allocator already keys cached blocks by
//    stream, so nothing is shared between streams on the hot path, and two
//    threads allocating on two streams do not contend. A segment belongs to
//    the pool of the stream that first needed it.
//  - Small blocks have no per-block records: each small segment keeps a
//    sorted array of 8-byte descriptors, and free small blocks sit in 4096
//    exact size bins (one per 512 B step up to the 2 MiB segment) with a
//    two-level bitmap, so best fit is a couple of bit scans (Note [Small
//    arena]). Large blocks have records and sit in an ordered set keyed
//    (size, address) whose nodes are recycled. No operation scans a list.
//  - Large blocks are found through a sharded open-addressing map read
//    without a lock (Note [Pointer map], Note [Mapped blocks]); small ones
//    through an index of the 2 MiB address windows their segments cover
//    (Note [Small block index]).
//  - Note [Recently freed blocks]: blocks freed on a stream are parked
//    unmerged, and a request of exactly their size takes one back without a
//    split or a merge: the common "free, then allocate the same shape again"
//    of a training loop costs neither (a small request also takes a parked
//    block of up to a sixteenth more whole, Note [Parked small blocks]).
//    Large blocks (records) park in eight slots, the last eight freed; a
//    stream whose freed large sizes do not come back stops parking them for
//    a while (Note [Parking pays for itself]). Small blocks park by size,
//    four of a size, while the parked ones hold at most half the pool's free
//    small memory (Note [Parked small blocks]). Parked blocks merge into the
//    bins when evicted, when a request finds nothing else (before the pool
//    grows), and before any memory goes back to the driver.
// Blocks that were used on other streams (record_stream) are returned to the
// cache only after events recorded on those streams at free time complete;
// the events come from a pool (EventPool).

// Note [Sharded statistics]
// Statistics are kept per stream pool, under the lock that pool already
// holds, and summed on request. Current values and totals are exact. A peak
// is summed too: exact when one stream allocates, an upper bound on the true
// device-wide peak when several do, since their peaks need not coincide.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/assert.hpp>
#include <accelkit/detail/format.hpp>
#include <accelkit/detail/pending.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/detail/pointer_map.hpp>
#include <accelkit/detail/spinlock.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/diagnostics.hpp>
#include <accelkit/error.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/detail/pool.hpp>
#include <accelkit/memory/detail/small_index.hpp>
#include <accelkit/memory/detail/trace_ring.hpp>
#include <accelkit/memory/small_arena.hpp>
#include <accelkit/memory/snapshot.hpp>
#include <accelkit/memory/stats.hpp>
#include <accelkit/memory/stream_uses.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
class DeviceCachingAllocator {
 public:
  DeviceCachingAllocator(Backend<R>& backend, device_index device, AllocatorConfig config)
      : backend_(backend),
        device_(device),
        config_(config),
        id_(next_id()),
        own_events_(std::make_unique<EventPool<R>>(backend, device)),
        events_(*own_events_) {
    const DeviceProperties& p = backend.properties(device);
    total_memory_ = p.total_memory;
    max_allocation_ = p.max_allocation;
    limit_ = fraction_limit(config.memory_fraction);
    fraction_ = config.memory_fraction;
  }
  // The same, taking the events that order stream uses from a shared pool
  // (the device's pool in Streams<R>, so the stream layer and the allocator
  // use one set of driver events). `events` must outlive the allocator.
  DeviceCachingAllocator(Backend<R>& backend, device_index device, AllocatorConfig config,
                         EventPool<R>& events)
      : backend_(backend), device_(device), config_(config), id_(next_id()), events_(events) {
    if (events.device() != device)
      throw ValueError(Backend<R>::name,
                       fmt::format("the allocator of {}:{} was given the event pool of {}:{}",
                                   Backend<R>::name, device, Backend<R>::name, events.device()));
    const DeviceProperties& p = backend.properties(device);
    total_memory_ = p.total_memory;
    max_allocation_ = p.max_allocation;
    limit_ = fraction_limit(config.memory_fraction);
    fraction_ = config.memory_fraction;
  }
  DeviceCachingAllocator(const DeviceCachingAllocator&) = delete;
  DeviceCachingAllocator& operator=(const DeviceCachingAllocator&) = delete;

  // Returns every segment to the driver. Blocks still allocated are lost.
  ~DeviceCachingAllocator() {
    for (const Detached& d : limbo_) {
      try {
        backend_.raw_free(device_, d.ptr, d.size);
      } catch (...) {
        // As below.
      }
      delete d.record;
    }
    for (auto& kv : pools_by_stream_) {
      detail::Pool& pool = *kv.second;
      for (detail::PendingFree& p : pool.pending)
        for (auto [device, e] : p.events) events_.release(e);
      for (detail::Segment* s : pool.segments) {
        try {
          backend_.raw_free(device_, s->ptr, s->size);
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

  device_index device() const noexcept { return device_; }
  const AllocatorConfig& config() const noexcept { return config_; }

  // `bytes` of device memory usable in order on `stream`. nullptr for 0
  // bytes. OutOfMemoryError when the device (or the memory fraction) has no
  // room even after the cache was returned to the driver; DriverError when
  // the driver fails otherwise. On error nothing changes.
  void* allocate(std::size_t bytes, StreamHandle stream) {
    return allocate_or(bytes, stream, true);
  }
  // As allocate, but nullptr where the device has no room without returning
  // the cache to the driver: nothing is released, retried or counted as out
  // of memory (for memory that may as well live elsewhere: Note [CPU results
  // in device memory] in torch/host_results.hpp). DriverError as allocate.
  void* try_allocate(std::size_t bytes, StreamHandle stream) {
    return allocate_or(bytes, stream, false);
  }

 private:
  // allocate (`must`) or try_allocate.
  ACCELKIT_ALWAYS_INLINE void* allocate_or(std::size_t bytes, StreamHandle stream, bool must) {
    if (bytes == 0) return nullptr;
    if (bytes > max_allocation_) {
      if (!must) return nullptr;
      throw too_large(bytes);
    }
    detail::Pool& pool = pool_for(stream);
    Allocation t;
    if (!config_.caching) {
      detail::Block* b = allocate_uncached(pool, bytes, must);
      if (!b) return nullptr;
      detail::SpinGuard lock(pool.lock);  // allocation_of marks it
      t = allocation_of(b);
    } else {
      std::size_t size = config_.round_size(bytes);
      {
        detail::SpinGuard lock(pool.lock);
        if (!pool.pending.empty()) process_pending(pool, false);
        t = take_cached(pool, size, bytes);
      }
      if (!t.ptr) {
        t = allocate_slow(pool, size, bytes, must);
        if (!t.ptr) return nullptr;  // only where not `must`
      }
    }
    // Small blocks are found through their segment (Note [Small arena]).
    if (t.unmapped) map_block(pool, t.block);
    if (!t.block) tls_last_small_ = {t.ptr, t.index};
    if (trace_.on())
      trace_.record(TraceEntry::Action::alloc, t.ptr, t.size, stream);
    return t.ptr;
  }

 public:
  // Returns memory from allocate(). The block is cached for its stream, or,
  // if it was used on other streams, once those reach this point. Throws
  // RuntimeError for a pointer that is not a live allocation (double free);
  // driver failures while recording stream uses are handled here (the free
  // falls back to synchronizing those streams).
  void deallocate(void* ptr) {
    if (!ptr) return;
    std::size_t hint = ptr == tls_last_small_.ptr ? tls_last_small_.index : kNoHint;
    if (SmallHold h = small_index_.hold(ptr, hint); h.seg) {
      free_small(h, static_cast<char*>(ptr));
      return;
    }
    free_large(ptr);
  }

  // Whether `ptr` is the start of a live allocation of this allocator.
  bool owns(const void* ptr) {
    if (SmallHold h = small_index_.hold(ptr); h.seg) return h.allocated();
    detail::LiveBlock live = live_.find(ptr);
    if (!live.block) return false;
    detail::SpinGuard lock(live.pool->lock);
    return live.block->allocated && live.block->ptr == ptr;
  }

  // Whether `ptr` lies anywhere inside memory this allocator holds from the
  // driver (a segment), allocated or not. Walks every segment: for the
  // rare questions (which device is this pointer on?), not for hot paths.
  bool contains(const void* ptr) {
    auto inside = [p = reinterpret_cast<std::uintptr_t>(ptr)](const void* base, std::size_t size) {
      auto b = reinterpret_cast<std::uintptr_t>(base);
      return p >= b && p - b < size;
    };
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      for (const detail::Segment* s : pool->segments)
        if (inside(s->ptr, s->size)) return true;
      bool found = false;
      pool->arena.for_each_segment(
          [&](const detail::SmallSegment& s) { found = found || inside(s.ptr, s.size()); });
      if (found) return true;
    }
    return false;
  }

  // Marks `ptr` as used on `stream` too: when freed it is not reused before
  // `stream` has passed the point of the free.
  void record_stream(void* ptr, StreamHandle stream) {
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
      h.seg->blocks[h.i] = detail::small_block::with_uses(h.seg->blocks[h.i], true);
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

  // Returns every unused cached segment to the driver, after waiting for
  // pending stream uses. Reserved memory drops to what allocations need.
  void empty_cache() { release_all(true); }

  // Statistics summed over streams (Note [Sharded statistics]).
  DeviceStats stats() {
    DeviceStats out;
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      out.merge(pool->stats.device_stats());
    }
    out.max_split_size = config_.max_split_size == std::numeric_limits<std::size_t>::max()
                             ? -1
                             : static_cast<std::int64_t>(config_.max_split_size);
    return out;
  }
  void reset_peak_stats() {
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      pool->stats.reset_peak();
    }
  }
  void reset_accumulated_stats() {
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      pool->stats.reset_accumulated();
    }
  }

  // Bytes held from the driver by this allocator.
  std::size_t reserved_bytes() const noexcept { return reserved_.load(); }
  // The cap on reserved memory: memory fraction times total memory.
  std::size_t memory_limit() const noexcept { return limit_.load(); }

  // Caps reserved memory at `fraction` of the device's total memory.
  // ValueError unless 0 < fraction <= 1.
  void set_memory_fraction(double fraction) {
    if (!(fraction > 0.0 && fraction <= 1.0))
      throw ValueError(Backend<R>::name,
                       fmt::format("memory fraction {} for {}:{} is outside (0, 1]", fraction,
                                   Backend<R>::name, device_));
    limit_ = fraction_limit(fraction);
    fraction_ = fraction;
  }
  // The fraction set last (AllocatorConfig's per_process_memory_fraction
  // until then).
  double memory_fraction() const noexcept { return fraction_.load(); }

  // Keeps the last `max_entries` allocation events for snapshot(); 0 stops.
  void record_history(std::size_t max_entries) { trace_.start(max_entries); }

  MemorySnapshot snapshot() {
    MemorySnapshot out;
    for (detail::Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      std::vector<const detail::Block*> pending;
      for (const detail::PendingFree& p : pool->pending)
        if (p.block) pending.push_back(p.block);
      for (const detail::Segment* s : pool->segments) {
        SegmentSnapshot seg{device_, reinterpret_cast<std::uintptr_t>(s->ptr), s->size, 0, 0, 0,
                            pool->stream, s->small ? "small" : "large", {}};
        for (const detail::Block* b = s->head; b; b = b->next) {
          bool is_pending = std::find(pending.begin(), pending.end(), b) != pending.end();
          std::string_view state = b->allocated ? "active_allocated"
                                   : is_pending ? "active_pending_free"
                                                : "inactive";
          seg.blocks.push_back(
              {reinterpret_cast<std::uintptr_t>(b->ptr), b->size, b->allocated ? b->requested : 0,
               state});
          if (b->allocated) {
            seg.allocated_size += b->size;
            seg.requested_size += b->requested;
          }
          if (b->allocated || is_pending) seg.active_size += b->size;
        }
        out.segments.push_back(std::move(seg));
      }
      pool->arena.for_each_segment([&](const detail::SmallSegment& s) {
        using namespace detail::small_block;
        SegmentSnapshot seg{device_, reinterpret_cast<std::uintptr_t>(s.ptr), s.size(), 0, 0, 0,
                            pool->stream, "small", {}};
        for (std::size_t i = 0; i < s.blocks.size(); ++i) {
          Desc d = s.blocks[i];
          bool allocated = state(d) == detail::small_block::allocated;
          bool is_pending = state(d) == detail::small_block::pending;
          std::size_t requested = allocated ? static_cast<std::size_t>(payload(d)) : 0;
          seg.blocks.push_back({reinterpret_cast<std::uintptr_t>(s.address(i)), bytes(d), requested,
                                allocated    ? "active_allocated"
                                : is_pending ? "active_pending_free"
                                             : "inactive"});
          if (allocated) {
            seg.allocated_size += bytes(d);
            seg.requested_size += requested;
          }
          if (allocated || is_pending) seg.active_size += bytes(d);
        }
        out.segments.push_back(std::move(seg));
      });
    }
    std::sort(out.segments.begin(), out.segments.end(),
              [](const SegmentSnapshot& a, const SegmentSnapshot& b) { return a.address < b.address; });
    out.trace = trace_.entries();
    return out;
  }

 private:
  using Block = detail::Block;
  using Pool = detail::Pool;
  using Segment = detail::Segment;

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
  // the caller once. Statistics count a segment out when the driver has it
  // back.
  struct Detached {
    Pool* pool;
    char* ptr;
    std::size_t size;
    bool small;
    bool oversize;
    Segment* record;  // a large segment's record, deleted once freed
  };
  using Released = std::vector<Detached>;

  // An allocated block: a record (large blocks, and every block while
  // caching is off), or a small block (block null, Note [Small arena]).
  struct Allocation {
    Block* block = nullptr;
    char* ptr = nullptr;  // null: nothing was taken
    std::size_t size = 0;
    bool unmapped = false;  // a record not in the pointer map yet (Note [Mapped blocks])
    std::size_t index = 0;  // a small block's index in its segment (Note [The last block taken])
  };
  // Under the pool lock: the allocation of record `b`, which the caller
  // puts into the map (map_block) after unlocking, unless it is there.
  static Allocation allocation_of(Block* b) noexcept {
    bool unmapped = !b->mapped;
    b->mapped = true;
    return {b, b->ptr, b->size, unmapped};
  }

  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  std::size_t fraction_limit(double fraction) const noexcept {
    return fraction >= 1.0 ? total_memory_
                           : static_cast<std::size_t>(fraction * static_cast<double>(total_memory_));
  }

  // --------------------------------------------------------------- pools

  struct PoolCacheEntry {
    std::uint64_t owner = 0;
    std::uintptr_t stream = 0;
    Pool* pool = nullptr;
  };
  static inline thread_local std::array<PoolCacheEntry, 4> tls_pools_{};
  static inline thread_local unsigned tls_next_ = 0;

  // Note [The last block taken]
  // Freeing a small block finds its descriptor from its address (Note
  // [Chunk index]), which costs as much as the rest of a free on the hit path
  // (allocate and free of one size), where the block freed is the one this
  // thread was handed last. So each thread keeps that block's address and
  // index, and a free of that address tries the index first
  // (SmallSegment::index_of(p, hint) checks it against the descriptor there,
  // so a stale one, of another allocator or moved since, costs a compare).
  // Other frees do not pay for it: their addresses differ, a branch that is
  // predicted.
  struct LastSmall {
    const void* ptr = nullptr;
    std::size_t index = 0;
  };
  static constexpr std::size_t kNoHint = ~std::size_t{0};
  static inline thread_local LastSmall tls_last_small_{};

  // The pool of `stream`: the thread's cache scanned inline, the map read out
  // of line (GCC at -O3 called all of it out of line otherwise).
  ACCELKIT_ALWAYS_INLINE Pool& pool_for(StreamHandle stream) {
    for (const PoolCacheEntry& e : tls_pools_)
      if (e.owner == id_ && e.stream == stream.value) return *e.pool;
    return pool_from_map(stream);
  }
  ACCELKIT_NOINLINE Pool& pool_from_map(StreamHandle stream) {
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

  std::vector<Pool*> pools_snapshot() {
    std::lock_guard<std::mutex> lock(pools_mutex_);
    return pools_;
  }

  // ------------------------------------------------------------ statistics

  // Adds to / subtracts from a statistic at the aggregate and at the pool type.
  ACCELKIT_ALWAYS_INLINE static void count_up(KindStat& a, bool small, std::int64_t n) noexcept {
    a.increase(small, n);
  }
  ACCELKIT_ALWAYS_INLINE static void count_down(KindStat& a, bool small, std::int64_t n) noexcept {
    a.decrease(small, n);
  }
  static bool is_small(const Block* b) noexcept { return b->segment->small; }

  ACCELKIT_ALWAYS_INLINE void count_alloc(Pool& pool, const Block* b) {
    count_alloc(pool, b->size, b->requested, is_small(b));
  }
  ACCELKIT_ALWAYS_INLINE void count_alloc(Pool& pool, std::size_t size, std::size_t requested, bool sm) {
    auto n = static_cast<std::int64_t>(size);
    PoolStats& s = pool.stats;
    count_up(s.allocation, sm, 1);
    count_up(s.allocated_bytes, sm, n);
    count_up(s.active, sm, 1);
    count_up(s.active_bytes, sm, n);
    count_up(s.requested_bytes, sm, static_cast<std::int64_t>(requested));
    if (size >= config_.max_split_size) s.oversize_allocations.increase(1);
  }
  ACCELKIT_ALWAYS_INLINE void count_free(Pool& pool, const Block* b) {
    count_free(pool, b->size, b->requested, is_small(b));
  }
  ACCELKIT_ALWAYS_INLINE void count_free(Pool& pool, std::size_t size, std::size_t requested, bool sm) {
    PoolStats& s = pool.stats;
    count_down(s.allocation, sm, 1);
    count_down(s.allocated_bytes, sm, static_cast<std::int64_t>(size));
    count_down(s.requested_bytes, sm, static_cast<std::int64_t>(requested));
    if (size >= config_.max_split_size) s.oversize_allocations.decrease(1);
    ACCELKIT_ASSERT(s.allocation.total() >= 0 && s.allocated_bytes.total() >= 0 &&
                        s.requested_bytes.total() >= 0,
                    "a pool's statistics balance (no more freed than allocated)");
  }
  void count_segment(Pool& pool, const Segment* seg, bool added) {
    count_segment(pool, seg->size, seg->small, seg->oversize, added);
  }
  void count_segment(Pool& pool, std::size_t size, bool small, bool oversize, bool added) {
    auto n = static_cast<std::int64_t>(size);
    PoolStats& s = pool.stats;
    if (added) {
      count_up(s.segment, small, 1);
      count_up(s.reserved_bytes, small, n);
    } else {
      count_down(s.segment, small, 1);
      count_down(s.reserved_bytes, small, n);
    }
    if (oversize) {
      if (added) s.oversize_segments.increase(1);
      else s.oversize_segments.decrease(1);
    }
    if (added) ++s.num_device_alloc;
    else ++s.num_device_free;
  }

  // ------------------------------------------------------ free structures

  // A free block inside a partly used segment counts as inactive split,
  // whether binned or parked.
  ACCELKIT_ALWAYS_INLINE void count_inactive(Pool& pool, const Block* b, bool entering) {
    count_inactive(pool, b->size, b->segment->small, detail::whole_segment(b), entering);
  }
  ACCELKIT_ALWAYS_INLINE void count_inactive(Pool& pool, std::size_t size, bool sm, bool whole,
                                             bool entering) {
    if (whole) return;
    auto n = static_cast<std::int64_t>(size);
    if (entering) {
      count_up(pool.stats.inactive_split, sm, 1);
      count_up(pool.stats.inactive_split_bytes, sm, n);
    } else {
      count_down(pool.stats.inactive_split, sm, 1);
      count_down(pool.stats.inactive_split_bytes, sm, n);
    }
  }
  // Records are cached only in the large pool: small blocks have none while
  // caching is on (Note [Small arena]), and none is cached while it is off.
  void insert_free(Pool& pool, Block* b) {
    if (!pool.spare_node.empty()) {
      pool.spare_node.value() = b;
      pool.large.insert(std::move(pool.spare_node));
    } else {
      pool.large.insert(b);  // may throw: nothing changed yet
    }
    b->cached = true;
    b->allocated = false;
    count_inactive(pool, b, true);
  }
  void unlink_free(Pool& pool, Block* b) {
    b->cached = false;
    pool.large.erase(b);
    count_inactive(pool, b, false);
  }

  Block* find_large(Pool& pool, std::size_t size) {
    Block key;
    key.size = size;
    auto it = pool.large.lower_bound(&key);
    if (it == pool.large.end()) return nullptr;
    // An unsplittable block serves only requests that are themselves that
    // large, and only if it is not much larger than asked; the next larger
    // blocks are larger still.
    return fits(size, (*it)->size) ? *it : nullptr;
  }

  // Under the pool lock: a cached block of at least `size`, split to size
  // and marked allocated, or {} (t.ptr null).
  ACCELKIT_ALWAYS_INLINE Allocation take_cached(Pool& pool, std::size_t size,
                                                std::size_t requested) {
    if (size <= memory_constants::kSmallSize) return take_small(pool, size, requested);
    return take_large(pool, size, requested);
  }

  // take_cached of a small size: a parked block of exactly this size, or
  // of up to a sixteenth more where no binned block fits better, whole
  // (Note [Parked small blocks]), else the best fit among the binned and the
  // parked blocks, split. Inlined into allocate() (out of line such a
  // function cost 45 instructions per random allocation in callgrind: six
  // registers saved and restored, and the Allocation returned through
  // memory); carve_small and cache_small stay out of line, which measured
  // fewer (more inlining, more spills).
  ACCELKIT_ALWAYS_INLINE Allocation take_small(Pool& pool, std::size_t size,
                                               std::size_t requested) {
    using namespace detail::small_block;
    const std::size_t gran = size / kGranule;
    if (pool.parked_small.has(gran)) return take_parked(pool, gran, requested);
    // The smallest parked block that fits, taken whole when at most a
    // sixteenth larger and no binned block fits better (Note [Parked small
    // blocks]).
    std::size_t parked = pool.parked_small.best_fit(gran);
    bool parked_fits = parked && fits(size, parked * kGranule);
    std::size_t binned = pool.arena.best_fit_size(gran);
    if (parked_fits && parked <= gran + gran / kWholeReuse && (!binned || binned >= parked))
      return take_parked(pool, parked, requested);
    detail::SmallSegment* seg = nullptr;
    std::size_t i = 0;
    bool found = binned != 0;
    if (found) i = pool.arena.last_binned(binned, seg);
    // A parked block that fits better than the binned one is split instead.
    if (parked_fits && (!found || parked < binned)) {
      detail::SmallParking::Entry e = pool.parked_small.take(parked);
      std::size_t j = parked_index(e, parked);
      bool whole = e.seg->blocks.size() == 1;
      count_inactive(pool, parked * kGranule, true, whole, false);
      try {
        return {nullptr, carve_small(pool, *e.seg, j, size, requested), size, false, j};
      } catch (...) {
        pool.parked_small.park(parked, e);  // back where it was
        count_inactive(pool, parked * kGranule, true, whole, true);
        throw;
      }
    }
    if (!found && (pool.parked_small.any() || pool.parked_count)) {
      unpark_all(pool);
      found = pool.arena.best_fit(gran, seg, i);
    }
    if (found) {
      pool.arena.unbin(*seg, i);
      std::size_t block = bytes(seg->blocks[i]);
      bool whole = seg->blocks.size() == 1;
      count_inactive(pool, block, true, whole, false);
      try {
        return {nullptr, carve_small(pool, *seg, i, size, requested), size, false, i};
      } catch (...) {
        pool.arena.bin(*seg, i);  // cannot throw: its bin entry was just freed
        count_inactive(pool, block, true, whole, true);
        throw;
      }
    }
    // A small request that finds no small block may take a free large-pool
    // block no bigger than a small segment rather than make a new segment.
    Block* r = find_large(pool, size);
    if (!r || r->size > memory_constants::kSmallBuffer) return {};
    live_.prefetch(r->ptr);
    unlink_free(pool, r);
    return allocation_of(carve(pool, r, size, requested));
  }

  // A parked small block of up to 1/kWholeReuse more granules than asked
  // for is handed out whole (Note [Parked small blocks]).
  static constexpr std::size_t kWholeReuse = 16;

  // The most recently parked small block of `gran` granules, handed out
  // whole for a request of `requested` bytes.
  ACCELKIT_ALWAYS_INLINE Allocation take_parked(Pool& pool, std::size_t gran,
                                                std::size_t requested) {
    using namespace detail::small_block;
    const detail::SmallParking::Entry& e = pool.parked_small.take(gran);
    detail::SmallSegment& seg = *e.seg;
    char* ptr = e.ptr;
    std::size_t j = parked_index(e, gran);
    std::size_t size = gran * kGranule;
    count_inactive(pool, size, true, seg.blocks.size() == 1, false);
    seg.blocks[j] = make(offset(seg.blocks[j]), static_cast<std::uint32_t>(gran), allocated, false,
                         requested);
    count_alloc(pool, size, requested, true);
    return {nullptr, ptr, size, false, j};
  }

  // The index in its segment of the block that parking entry `e`, for
  // `gran` granules, names; that block is parked and of that size (Note
  // [Parked small blocks]).
  ACCELKIT_ALWAYS_INLINE static std::size_t parked_index(const detail::SmallParking::Entry& e,
                                                         std::size_t gran) noexcept {
    using namespace detail::small_block;
    std::size_t i = e.seg->index_of(e.ptr, e.hint);
    ACCELKIT_ASSERT(i < e.seg->blocks.size() && state(e.seg->blocks[i]) == parked &&
                        granules(e.seg->blocks[i]) == gran,
                    "a parked small block is where its entry says, parked, of its size");
    static_cast<void>(gran);
    return i;
  }

  // take_cached of a large size: a parked block of exactly this size (Note
  // [Recently freed blocks]), else the best fit among the large set and the
  // parked blocks, split.
  ACCELKIT_ALWAYS_INLINE Allocation take_large(Pool& pool, std::size_t size,
                                               std::size_t requested) {
    // One pass over the parking slots, most recently parked first: a block
    // of exactly this size is taken; otherwise the smallest larger one (the
    // earliest parked among equals) is remembered, to be split if it fits
    // better than what the large set offers.
    std::size_t parked_best = pool.parked_count;
    std::size_t parked_size = std::numeric_limits<std::size_t>::max();
    for (std::size_t i = pool.parked_count; i-- > 0;) {
      std::size_t key = pool.parked_size[i];
      if (key != size) {
        if (key > size && key <= parked_size) {
          parked_best = i;
          parked_size = key;
        }
        continue;
      }
      Block* b = pool.unpark(i);
      ++pool.parked_hits;
      leave_parking(pool, b);
      b->allocated = true;
      b->requested = requested;
      count_alloc(pool, b);
      return allocation_of(b);
    }
    if (pool.frees_counted >= (pool.parking ? kParkingTrial : kParkingPause)) {
      judge_parking(pool);
      parked_best = pool.parked_count;
      parked_size = std::numeric_limits<std::size_t>::max();
    }
    Block* b = find_large(pool, size);
    // A parked block that fits better than the set's is split instead.
    std::size_t best_size = b ? b->size : std::numeric_limits<std::size_t>::max();
    std::size_t best = better_parked(pool, size, parked_best, parked_size, best_size);
    if (best != pool.parked_count) {
      Block* h = pool.unpark(best);
      leave_parking(pool, h);
      return allocation_of(carve(pool, h, size, requested));
    }
    if (!b && pool.parked_count) {
      unpark_all(pool);
      b = find_large(pool, size);
    }
    if (!b) return {};
    live_.prefetch(b->ptr);  // the insert after carving, overlapped with its reads
    unlink_free(pool, b);
    return allocation_of(carve(pool, b, size, requested));
  }

  // The parking slot `parked_best` (of a block of `parked_size` bytes) if
  // that block fits `size` and is smaller than `best_size` (which it then
  // becomes), else pool.parked_count (no slot).
  ACCELKIT_ALWAYS_INLINE std::size_t better_parked(const Pool& pool, std::size_t size,
                                                   std::size_t parked_best, std::size_t parked_size,
                                                   std::size_t& best_size) const noexcept {
    if (parked_size >= best_size || !fits(size, parked_size)) return pool.parked_count;
    best_size = parked_size;
    return parked_best;
  }

  // Note [Parking pays for itself]
  // Parking a freed record (Note [Recently freed blocks]) pays when requests
  // of its size come back soon: the free and the next allocation then skip a
  // merge and a split. When sizes vary it does not: nearly every parked block
  // is evicted into the large set anyway, and each free and allocation pays
  // for the parking slots on top (measured when small blocks parked in the
  // same eight slots: memory_bench, random sizes up to 64 KiB at N = 1e3, 6%
  // of requests found a parked block of their size, and the allocator took
  // 83-84 ns per operation parking against 67-73 without). So each pool
  // counts its frees of records and the requests that took a parked record
  // of their size. Once kParkingTrial frees have gone by with parking on, it
  // stays on if at least a quarter of them were taken back so; otherwise the
  // parked records go into the large set and frees go there directly, until
  // kParkingPause frees later parking is tried again. The decision is taken
  // on the allocation path, where merging the parked blocks may throw.
  // (Small blocks park by size instead, Note [Parked small blocks].)
  static constexpr std::uint64_t kParkingTrial = 256;
  static constexpr std::uint64_t kParkingPause = 4096;
  void judge_parking(Pool& pool) {
    if (pool.parking && pool.parked_hits * 4 < pool.frees_counted) {
      unpark_records(pool);  // may throw: parking stays on, the blocks merged so far stay merged
      pool.parking = false;
    } else {
      pool.parking = true;
    }
    pool.frees_counted = 0;
    pool.parked_hits = 0;
  }

  // Under the pool lock: splits block `i` of `seg` (in no bin) to `size`,
  // binning the rest, and marks it allocated. On error nothing changed.
  char* carve_small(Pool& pool, detail::SmallSegment& seg, std::size_t i, std::size_t size,
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
        count_inactive(pool, bytes(seg.blocks[n]), true, false, false);
        pool.arena.unbin(seg, n);
        seg.move_block(n, make(off + gran, rest, parked, false, 0));
      } else {
        seg.insert_block(n, make(off + gran, rest, parked, false, 0));
      }
      pool.arena.bin(seg, n);
      count_inactive(pool, std::size_t{rest} * kGranule, true, false, true);
      total = gran;
    }
    seg.blocks[i] = make(off, total, detail::small_block::allocated, false, requested);
    ACCELKIT_ASSERT(seg.chunks_agree(), "a small segment's chunk index counts its blocks");
    count_alloc(pool, std::size_t{total} * kGranule, requested, true);
    return seg.ptr + std::size_t{off} * kGranule;
  }

  // Whether a free block of `block` bytes may serve a request of `size`
  // under max_split_size (always, when it is unlimited).
  bool fits(std::size_t size, std::size_t block) const noexcept {
    if (config_.max_split_size == std::numeric_limits<std::size_t>::max()) return true;
    if (size < config_.max_split_size) return block < config_.max_split_size;
    return block < size + config_.max_non_split_rounding;
  }

  ACCELKIT_ALWAYS_INLINE void leave_parking(Pool& pool, const Block* b) {
    count_inactive(pool, b, false);
  }
  // Under the pool lock: merges a record that left the parking slots into
  // the large set.
  void evict(Pool& pool, Block* b) {
    leave_parking(pool, b);
    cache_block(pool, b);
  }
  // Under the pool lock: merges every parked block into the bins or the
  // large set. When it throws (bad_alloc), what it merged stays merged and
  // the rest stays parked.
  void unpark_all(Pool& pool) {
    unpark_records(pool);
    constexpr std::size_t kGranule = detail::small_block::kGranule;
    while (std::size_t gran = pool.parked_small.best_fit(1)) {
      const detail::SmallParking::Entry& e = pool.parked_small.top(gran);
      detail::SmallSegment& seg = *e.seg;
      std::size_t i = parked_index(e, gran);
      pool.arena.reserve_bin(merged(seg, i).granules);  // may throw: nothing changed
      pool.parked_small.take(gran);
      count_inactive(pool, gran * kGranule, true, seg.blocks.size() == 1, false);
      cache_small(pool, seg, i);
    }
  }
  // Under the pool lock: merges every parked record into the large set.
  void unpark_records(Pool& pool) {
    while (pool.parked_count) {
      prepare_evict(pool);
      evict(pool, pool.unpark(pool.parked_count - 1));
    }
  }
  // Before a record is freed (free_block): room for the eviction that
  // parking it causes, or, while parking is off, for caching it. Nothing
  // has changed when this throws.
  void make_room(Pool& pool) {
    if (!pool.parking || pool.parked_count == Pool::kParked) prepare_evict(pool);
  }
  // Before pending free `p` is returned to the cache (cache_freed): the
  // same for a record; for a small block, room in the bin it enters merged
  // should it not be parked (release_small).
  void make_room(Pool& pool, const detail::PendingFree& p) {
    if (!p.seg) return make_room(pool);
    std::size_t i = p.seg->index_of(p.ptr);
    pool.arena.reserve_bin(merged(*p.seg, i).granules);
  }
  bool try_make_room(Pool& pool, const detail::PendingFree& p) noexcept {
    try {
      make_room(pool, p);
      return true;
    } catch (...) {
      return false;
    }
  }
  // A spare node for the large set, so that caching a record that leaves
  // the parking slots cannot throw.
  void prepare_evict(Pool& pool) {
    if (pool.spare_node.empty())
      pool.spare_node = pool.large.extract(pool.large.insert(&pool.node_probe).first);
  }
  // Whether block `i` of `seg` merges with its next and previous neighbour
  // when binned (they are binned), and the merged block's granules.
  struct Merge {
    bool next, prev;
    std::uint32_t granules;
  };
  static Merge merged(const detail::SmallSegment& seg, std::size_t i) noexcept {
    using namespace detail::small_block;
    Merge m{i + 1 < seg.blocks.size() && state(seg.blocks[i + 1]) == binned,
            i > 0 && state(seg.blocks[i - 1]) == binned, granules(seg.blocks[i])};
    if (m.next) m.granules += granules(seg.blocks[i + 1]);
    if (m.prev) m.granules += granules(seg.blocks[i - 1]);
    return m;
  }

  // Under the pool lock: splits `b` (not in the free structures) to `size`
  // if the remainder is worth keeping, and marks it allocated.
  Block* carve(Pool& pool, Block* b, std::size_t size, std::size_t requested) {
    std::size_t remaining = b->size - size;
    bool split = b->segment->small
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

  // Under the pool lock: the counts of a block that is no longer in use
  // (freed, and past its pending stream uses), whether parked or binned.
  ACCELKIT_ALWAYS_INLINE void count_released(Pool& pool, char* ptr, std::size_t size, bool small) {
    count_down(pool.stats.active, small, 1);
    count_down(pool.stats.active_bytes, small, static_cast<std::int64_t>(size));
    if (trace_.on()) trace_.record(TraceEntry::Action::free_completed, ptr, size, pool.stream);
  }
  // Under the pool lock: a block that is no longer in use (freed, and past
  // its pending stream uses) is parked (Note [Recently freed blocks]),
  // evicting the oldest parked block into the bins when all slots are full,
  // or, while its pool does not park, goes into the bins. The caller has
  // called make_room() first, before changing anything.
  ACCELKIT_ALWAYS_INLINE void free_block(Pool& pool, Block* b) {
    std::size_t size = b->size;
    bool small = b->segment->small, whole = detail::whole_segment(b);
    count_released(pool, b->ptr, size, small);
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
    count_inactive(pool, size, small, whole, true);
  }
  // The same for small block `i` of `seg`, at `ptr`: parked by its size
  // (Note [Parked small blocks]) or, where that is full, binned. Nothing has
  // changed when this throws.
  ACCELKIT_ALWAYS_INLINE void release_small(Pool& pool, detail::SmallSegment& seg, std::size_t i,
                                            char* ptr) {
    using namespace detail::small_block;
    Desc d = seg.blocks[i];
    std::size_t size = bytes(d);
    if (pool.parked_small.may_park(granules(d), parking_room(pool, size))) {
      seg.blocks[i] = with_payload(with_state(d, parked), 0);
      pool.parked_small.park(granules(d), {&seg, ptr, i});
      count_inactive(pool, size, true, seg.blocks.size() == 1, true);
    } else {
      cache_small(pool, seg, i);  // may throw first
    }
    count_released(pool, ptr, size, true);
  }
  // What the parked small blocks of `pool` may hold as a block of `size`
  // bytes is freed: half its free small memory, that block's included (Note
  // [Parked small blocks]).
  static std::size_t parking_room(const Pool& pool, std::size_t size) noexcept {
    const PoolStats& s = pool.stats;
    auto allocated = static_cast<std::size_t>(s.allocated_bytes.current[0]);
    return (static_cast<std::size_t>(s.reserved_bytes.current[0]) - allocated + size) / 2;
  }

  // Note [Prefetching the next eviction]: merging an evicted block reads its
  // neighbours' records, which with many live blocks are rarely in cache
  // (three quarters of a free's time at 100,000 live blocks). The next block
  // to be evicted is known one free ahead, so its neighbours are fetched now
  // and have arrived when it goes.
  static void prefetch_neighbours(const Block* b) noexcept {
    if (!b) return;
    if (b->prev) ACCELKIT_PREFETCH(b->prev);
    if (b->next) ACCELKIT_PREFETCH(b->next);
  }

  // Under the pool lock: `b` takes over its next neighbour, which is in no
  // free structure (unlinked, or just freed).
  void absorb_next(Pool& pool, Block* b) {
    Block* nx = b->next;
    b->size += nx->size;
    b->next = nx->next;
    if (nx->next) nx->next->prev = b;
    pool.recycle(nx);
  }

  // After allocate() took record `b` and unlocked its pool: puts the block
  // into the pointer map (Note [Mapped blocks]). When the map cannot grow,
  // the block is freed again and the error thrown.
  void map_block(Pool& pool, Block* b) {
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
  void unmap_block(Block* b) noexcept {
    if (!b->mapped) return;
    live_.erase(b->ptr);
    b->mapped = false;
  }

  // Under the pool lock: puts a free block into the bins or the large set,
  // merged with free neighbours.
  void cache_block(Pool& pool, Block* b) {
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

  // Under the pool lock: puts small block `i` of `seg` (in no bin) into the
  // bins, merged with binned neighbours.
  void cache_small(Pool& pool, detail::SmallSegment& seg, std::size_t i) {
    using namespace detail::small_block;
    std::uint32_t off = offset(seg.blocks[i]);
    ACCELKIT_ASSERT((i == 0 || offset(seg.blocks[i - 1]) + granules(seg.blocks[i - 1]) == off) &&
                        (i + 1 == seg.blocks.size() ||
                         off + granules(seg.blocks[i]) == offset(seg.blocks[i + 1])),
                    "the descriptors of a small segment tile it (no gap, no overlap)");
    auto [next, prev, total] = merged(seg, i);
    pool.arena.reserve_bin(total);  // nothing below throws
    if (next) {
      count_inactive(pool, bytes(seg.blocks[i + 1]), true, false, false);
      pool.arena.unbin(seg, i + 1);
    }
    if (prev) {
      count_inactive(pool, bytes(seg.blocks[i - 1]), true, false, false);
      pool.arena.unbin(seg, i - 1);
      off = offset(seg.blocks[i - 1]);
      --i;
    }
    // The descriptors merged into block i go in one move (Note [Moving descriptors]).
    if (std::size_t gone = std::size_t{next} + std::size_t{prev}) seg.erase_blocks(i + 1, gone);
    seg.blocks[i] = make(off, total, parked, false, 0);
    ACCELKIT_ASSERT(seg.chunks_agree(), "a small segment's chunk index counts its blocks");
    pool.arena.bin(seg, i);
    bool whole = seg.blocks.size() == 1;
    count_inactive(pool, std::size_t{total} * kGranule, true, whole, true);
    if (whole) seg.free_tick = ++tick_;
  }

  // Orders the free of the block at `ptr` after its uses on other streams
  // (Note [Stream-use recording]); false when it must be quarantined.
  bool record_uses(char* ptr, const std::vector<StreamHandle>& uses,
                   std::vector<std::pair<device_index, EventHandle>>& events) {
    if (uses.empty()) return true;
    std::vector<std::pair<device_index, StreamHandle>> on_device;
    on_device.reserve(uses.size());
    for (StreamHandle s : uses) on_device.emplace_back(device_, s);
    return detail::record_stream_uses(
        backend_, on_device, [&](device_index) -> EventPool<R>& { return events_; }, events,
        [&] { return fmt::format("device memory at {}", static_cast<void*>(ptr)); });
  }

  // Under the pool lock: frees pending blocks whose events have completed
  // (all of them, waiting, when `wait`).
  void process_pending(Pool& pool, bool wait) {
    detail::drain_pending(
        pool.pending, wait,
        [&](const detail::PendingFree& p) {
          // A driver error (one of earlier queued work, say) goes to the
          // caller; the entry stays queued.
          for (auto [device, e] : p.events) {
            if (wait) backend_.event_synchronize(device, e);
            if (!backend_.event_query(device, e)) return false;
          }
          return true;
        },
        [&](detail::PendingFree& p) {
          // The free first: if it throws, nothing changed and p stays queued.
          make_room(pool, p);
          cache_freed(pool, p);
          for (auto [device, e] : p.events) events_.release(e, /*completed=*/true);
        });
  }

  // Under the pool lock, after make_room(): returns a freed block whose
  // stream uses are past to the cache (free_block or release_small).
  void cache_freed(Pool& pool, const detail::PendingFree& p) {
    if (p.seg) release_small(pool, *p.seg, p.seg->index_of(p.ptr), p.ptr);
    else free_block(pool, p.block);
  }
  // Under the pool lock, after record_uses(): caches the block now when
  // there are no events to wait for and room for it; otherwise queues it,
  // and process_pending caches it once its events complete.
  void cache_or_queue(Pool& pool, detail::PendingFree p) {
    if (p.events.empty() && try_make_room(pool, p)) {
      cache_freed(pool, p);
      return;
    }
    pool.pending.push_back(std::move(p));
  }

  // Under the pool lock: the streams a freed block was used on, leaving none
  // recorded for it.
  static std::vector<StreamHandle> take_uses(Pool& pool, const void* ptr) {
    auto it = pool.uses.find(ptr);
    std::vector<StreamHandle> uses = std::move(it->second);
    pool.uses.erase(it);
    return uses;
  }
  // Under the pool lock: records that the block at `ptr` is used on `stream`.
  static void add_use(Pool& pool, const void* ptr, StreamHandle stream) {
    std::vector<StreamHandle>& uses = pool.uses[ptr];
    if (std::find(uses.begin(), uses.end(), stream) == uses.end()) uses.push_back(stream);
  }

  // -------------------------------------------------------- driver memory

  // Note [Segment sizes]: small requests share 2 MiB segments; requests of
  // 10 MiB and more get their own, rounded to 2 MiB. CUDA serves 1-10 MiB
  // requests from fixed 20 MiB segments; a pool that holds only a few of
  // them then wastes most of its last segment (a quarter of reserved memory
  // in the benchmark's training step). Here their segment grows with the
  // pool: a 32nd of what is already reserved, rounded to 2 MiB, between the
  // request itself and large_segment_size. A pool past 640 MiB gets 20 MiB
  // segments as in CUDA; a smaller one wastes at most about 3% of its
  // reserved memory in the tail of its newest segment, for a few more driver
  // calls while it warms up.
  std::size_t segment_size(std::size_t size) const noexcept {
    using namespace memory_constants;
    auto round2 = [](std::size_t n) { return (n + kRoundLarge - 1) / kRoundLarge * kRoundLarge; };
    if (size <= kSmallSize) return kSmallBuffer;
    if (size >= kMinLargeAlloc) return round2(size);
    std::size_t grown = round2(reserved_.load(std::memory_order_relaxed) / 32);
    return std::max(size, std::min(grown, config_.large_segment_size));
  }

  // Memory from the driver within the limit, or nullptr when either says no.
  char* driver_alloc(std::size_t n) {
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

  Block* add_segment(Pool& pool, char* ptr, std::size_t size, bool small) {
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
    count_segment(pool, seg, true);
    if (trace_.on())
      trace_.record(TraceEntry::Action::segment_alloc, ptr, size, pool.stream);
    return b;
  }

  // Under the pool lock: a new small segment at `ptr`, from the driver,
  // carved for the request. On error the memory goes back to the driver.
  Allocation add_small_segment(Pool& pool, char* ptr, std::size_t size, std::size_t requested) {
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
    count_segment(pool, n, true, n >= config_.max_split_size, true);
    if (trace_.on())
      trace_.record(TraceEntry::Action::segment_alloc, ptr, n, pool.stream);
    return {nullptr, p, size};
  }

  // Under the pool lock: removes a wholly free small segment from the pool
  // and deletes its bookkeeping; its memory is the caller's to return (it
  // stays counted as reserved until then: Note [Ordered release]).
  Detached detach_small(Pool& pool, detail::SmallSegment* seg) {
    constexpr std::size_t n = memory_constants::kSmallBuffer;
    small_index_.remove(pool, *seg);
    Detached d{&pool, seg->ptr, n, true, n >= config_.max_split_size, nullptr};
    pool.arena.remove_segment(seg);
    return d;
  }

  // ------------------------------------------- finding small blocks by address
  // Note [Small block index] (memory/detail/small_index.hpp).
  using SmallRef = detail::SmallIndex::Ref;
  using SmallHold = detail::SmallIndex::Hold;
  void register_windows(Pool& pool, const detail::SmallSegment& seg) {
    if (!small_index_.add(pool, seg))
      throw RuntimeError(Backend<R>::name,
                         fmt::format("the driver of {}:{} returned memory at {} that overlaps "
                                     "memory it already gave",
                                     Backend<R>::name, device_, static_cast<void*>(seg.ptr)));
  }

  RuntimeError not_live(const void* ptr) const {
    return RuntimeError(
        Backend<R>::name,
        fmt::format("free of {} on {}:{}: not a live allocation of this allocator (double free, "
                    "or memory from elsewhere)",
                    ptr, Backend<R>::name, device_));
  }

  // deallocate() of a small block (Note [Small arena]).
  ACCELKIT_ALWAYS_INLINE void free_small(SmallHold& h, char* ptr) {
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
    if (trace_.on()) trace_.record(TraceEntry::Action::free_requested, ptr, size, pool.stream);
    if (has_uses(d)) {
      free_small_used(lock, pool, seg, i, ptr, d);
      return;
    }
    release_small(pool, seg, i, ptr);  // may throw: nothing changed
    count_free(pool, size, requested, true);
  }
  // The rest of free_small, out of line (so that the common frees do not pay
  // for its frame): a block used on other streams is pending (never
  // allocated again, nor freed twice) until events on those streams say they
  // are past this point. Called under the pool's lock, held by `lock`, with
  // the block's descriptor `d`.
  ACCELKIT_NOINLINE void free_small_used(detail::SpinGuard& lock, Pool& pool,
                                         detail::SmallSegment& seg, std::size_t i, char* ptr,
                                         detail::small_block::Desc d) {
    using namespace detail::small_block;
    std::size_t size = bytes(d), requested = static_cast<std::size_t>(payload(d));
    std::vector<StreamHandle> uses = take_uses(pool, ptr);
    seg.blocks[i] = with_uses(with_state(d, pending), false);
    lock.unlock();
    std::vector<std::pair<device_index, EventHandle>> events;
    bool safe = record_uses(ptr, uses, events);
    lock.lock();
    count_free(pool, size, requested, true);
    if (!safe) return;  // quarantined: see record_uses
    cache_or_queue(pool, {nullptr, &seg, ptr, std::move(events)});
  }

  // deallocate() of a block with a record (Note [Mapped blocks]); out of
  // line, so that freeing a small block does not pay for its frame.
  ACCELKIT_NOINLINE void free_large(void* ptr) {
    detail::LiveBlock live = live_.find(ptr);  // Note [Mapped blocks]
    if (!live.block) throw not_live(ptr);
    detail::Block* b = live.block;
    detail::Pool& pool = *live.pool;
    std::vector<StreamHandle> uses;
    {
      detail::SpinGuard lock(pool.lock);
      // A second free (the block may be parked) or a stale map read.
      if (!b->allocated || b->ptr != ptr) throw not_live(ptr);
      if (trace_.on())
        trace_.record(TraceEntry::Action::free_requested, b->ptr, b->size, pool.stream);
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
    bool safe = record_uses(b->ptr, uses, events);
    detail::SpinGuard lock(pool.lock);
    count_free(pool, b);
    if (!safe) return;  // quarantined: see record_uses
    cache_or_queue(pool, {b, nullptr, b->ptr, std::move(events)});
  }

  // Under the pool lock: removes a wholly free segment from the pool; its
  // memory is the caller's to return (Note [Ordered release]).
  Detached detach_segment(Pool& pool, Segment* seg) {
    unlink_free(pool, seg->head);
    Segment* last = pool.segments.back();
    pool.segments[seg->index] = last;
    last->index = seg->index;
    pool.segments.pop_back();
    pool.recycle(seg->head);
    return Detached{&pool, seg->ptr, seg->size, seg->small, seg->oversize, seg};
  }

  static bool wholly_free(const Segment* seg) noexcept {
    return seg->head->cached && detail::whole_segment(seg->head);
  }

  // Under release_mutex_: returns detached segments to the driver after
  // synchronizing the streams that own them and the streams in `also`
  // (Note [Ordered release]). Throws the first error, after every segment
  // is freed or in limbo_.
  void free_segments(Released& r, const std::vector<StreamHandle>& also = {}) {
    std::exception_ptr first;
    std::vector<StreamHandle> streams(also), failed;
    for (const Detached& d : r)
      if (std::find(streams.begin(), streams.end(), d.pool->stream) == streams.end())
        streams.push_back(d.pool->stream);
    for (StreamHandle s : streams) {
      try {
        backend_.stream_synchronize(device_, s);
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
    for (const Detached& d : r) {
      bool ordered = !also_failed && !did_fail(d.pool->stream);
      if (ordered) {
        try {
          backend_.raw_free(device_, d.ptr, d.size);
        } catch (...) {
          if (!first) first = std::current_exception();
          ordered = false;
        }
      }
      if (!ordered) {
        limbo_.push_back(d);
        continue;
      }
      reserved_.fetch_sub(d.size);
      {
        detail::SpinGuard lock(d.pool->lock);
        count_segment(*d.pool, d.size, d.small, d.oversize, false);
      }
      if (trace_.on())
        trace_.record(TraceEntry::Action::segment_free, d.ptr, d.size, d.pool->stream);
      delete d.record;
    }
    r.clear();
    if (first) std::rethrow_exception(first);
  }

  // Returns every wholly free segment of every stream to the driver.
  void release_all(bool wait) {
    std::lock_guard<std::mutex> serial(release_mutex_);
    Released freed;
    freed.swap(limbo_);  // tried again (Note [Ordered release])
    try {
      release_into(freed, wait);
    } catch (...) {
      free_segments(freed);  // what was detached before the failure
      throw;
    }
    free_segments(freed);
  }
  void release_into(Released& freed, bool wait) {
    for (Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      if (!pool->pending.empty()) {
        if (wait) ++pool->stats.num_sync_all_streams;
        process_pending(*pool, wait);
      }
      unpark_all(*pool);
      for (std::size_t i = pool->segments.size(); i-- > 0;) {
        Segment* s = pool->segments[i];
        if (!wholly_free(s)) continue;
        freed.push_back(detach_segment(*pool, s));
      }
      std::vector<detail::SmallSegment*> empty;
      pool->arena.for_each_segment([&](detail::SmallSegment& s) {
        if (s.wholly_free()) empty.push_back(&s);
      });
      freed.reserve(freed.size() + empty.size());
      for (detail::SmallSegment* s : empty) freed.push_back(detach_small(*pool, s));
    }
  }

  // Note [Garbage collection threshold]: before growing past the threshold,
  // return wholly free segments, least recently freed first, until the new
  // segment fits under it.
  void collect_garbage(std::size_t incoming) {
    auto threshold = static_cast<std::size_t>(config_.garbage_collection_threshold *
                                              static_cast<double>(limit_.load()));
    if (reserved_.load() + incoming <= threshold) return;
    std::lock_guard<std::mutex> serial(release_mutex_);
    struct Candidate {
      std::uint64_t tick;
      Pool* pool;
      Segment* seg;    // a record's segment, or
      SmallRef small;  // a small segment
    };
    std::vector<Candidate> candidates;
    for (Pool* pool : pools_snapshot()) {
      detail::SpinGuard lock(pool->lock);
      unpark_all(*pool);
      for (Segment* s : pool->segments)
        if (wholly_free(s)) candidates.push_back({s->free_tick, pool, s, {}});
      pool->arena.for_each_segment([&](detail::SmallSegment& s) {
        if (s.wholly_free()) candidates.push_back({s.free_tick, pool, nullptr, {pool, s.ptr, s.id}});
      });
    }
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.tick < b.tick; });
    Released freed;
    std::size_t releasing = 0;
    for (const Candidate& c : candidates) {
      if (reserved_.load() - releasing + incoming <= threshold) break;
      detail::SpinGuard lock(c.pool->lock);
      if (c.seg) {
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

  // A new segment for a request the cache could not serve; where the driver
  // has no room, the cache returned to it and tried again (`must`), or {}.
  Allocation allocate_slow(Pool& pool, std::size_t size, std::size_t requested, bool must) {
    bool small = size <= memory_constants::kSmallSize;
    std::size_t seg_size = segment_size(size);
    for (int attempt = 0;; ++attempt) {
      if (config_.garbage_collection_threshold > 0) collect_garbage(seg_size);
      if (char* p = driver_alloc(seg_size)) {
        detail::SpinGuard lock(pool.lock);
        if (small) return add_small_segment(pool, p, size, requested);
        return allocation_of(carve(pool, add_segment(pool, p, seg_size, small), size, requested));
      }
      // A 1-10 MiB request normally takes a large_segment_size segment to
      // share; when that does not fit, a segment of its own still may.
      if (!small && seg_size > size) {
        if (char* p = driver_alloc(size)) {
          detail::SpinGuard lock(pool.lock);
          return allocation_of(carve(pool, add_segment(pool, p, size, small), size, requested));
        }
      }
      if (!must) return {};
      if (attempt == 1) break;
      {
        detail::SpinGuard lock(pool.lock);
        ++pool.stats.num_alloc_retries;
      }
      release_all(true);
      detail::SpinGuard lock(pool.lock);
      if (Allocation t = take_cached(pool, size, requested); t.ptr) return t;
    }
    {
      detail::SpinGuard lock(pool.lock);
      ++pool.stats.num_ooms;
    }
    if (trace_.on())
      trace_.record(TraceEntry::Action::oom, nullptr, size, pool.stream);
    throw out_of_memory(requested, size);
  }

  // nullptr where the driver has no room and not `must`.
  Block* allocate_uncached(Pool& pool, std::size_t bytes, bool must) {
    std::size_t size = (bytes + memory_constants::kMinBlockSize - 1) /
                       memory_constants::kMinBlockSize * memory_constants::kMinBlockSize;
    char* p = driver_alloc(size);
    if (!p && !must) return nullptr;
    if (!p) {
      {
        detail::SpinGuard lock(pool.lock);
        ++pool.stats.num_ooms;
      }
      throw out_of_memory(bytes, size);
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
    count_up(s.segment, is_small(b), 1);
    count_up(s.reserved_bytes, is_small(b), static_cast<std::int64_t>(size));
    ++s.num_device_alloc;
    return b;
  }

  // Without caching every free goes to the driver, ordered after the
  // block's stream and the streams it was used on (Note [Ordered release]);
  // a failure leaves it in limbo_ (tried again by empty_cache) and is
  // reported through the diagnostics hook: a free must not throw for the
  // driver's sake (it runs in tensor deleters).
  void free_uncached(Pool& pool, Block* b, const std::vector<StreamHandle>& uses) {
    char* ptr = b->ptr;
    std::size_t size = b->size;
    Released r;
    {
      detail::SpinGuard lock(pool.lock);
      count_free(pool, b);
      auto n = static_cast<std::int64_t>(b->size);
      bool sm = is_small(b);
      count_down(pool.stats.active, sm, 1);
      count_down(pool.stats.active_bytes, sm, n);
      r.push_back(Detached{&pool, b->ptr, b->size, sm, false, b->segment});
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

  // ---------------------------------------------------------------- errors

  OutOfMemoryError too_large(std::size_t bytes) const {
    return OutOfMemoryError(
        Backend<R>::name,
        fmt::format("cannot allocate {} ({} bytes) on {}:{}: larger than the device's largest "
                    "single allocation, {} (capacity {})",
                    detail::format_bytes(bytes), bytes, Backend<R>::name, device_,
                    detail::format_bytes(max_allocation_), detail::format_bytes(total_memory_)));
  }

  OutOfMemoryError out_of_memory(std::size_t bytes, std::size_t rounded) {
    DeviceStats s = stats();
    std::uint64_t driver_free = 0;
    try {
      driver_free = backend_.memory_info(device_).free;
    } catch (...) {
    }
    std::size_t limit = limit_.load();
    std::string limit_note =
        limit < total_memory_
            ? fmt::format("; the memory fraction caps this process at {}", detail::format_bytes(limit))
            : std::string();
    return OutOfMemoryError(
        Backend<R>::name,
        fmt::format("out of memory on {}:{}: tried to allocate {} ({} bytes, {} after rounding). "
                    "The device has {} in total, {} free; this process's memory pool has {} "
                    "reserved, {} of it allocated{}. If reserved but unallocated memory is "
                    "large, set {}_ALLOC_CONF=max_split_size_mb:<n> to limit fragmentation",
                    Backend<R>::name, device_, detail::format_bytes(bytes), bytes, rounded,
                    detail::format_bytes(total_memory_), detail::format_bytes(driver_free),
                    detail::format_bytes(reserved_.load()),
                    detail::format_bytes(static_cast<std::uint64_t>(s.allocated_bytes[0].current)),
                    limit_note, detail::upper(Backend<R>::name)));
  }

  Backend<R>& backend_;
  device_index device_;
  AllocatorConfig config_;
  std::uint64_t id_;
  std::size_t total_memory_ = 0;
  std::size_t max_allocation_ = 0;
  std::atomic<std::size_t> limit_{0};
  std::atomic<double> fraction_{1.0};
  std::atomic<std::size_t> reserved_{0};
  std::atomic<std::uint64_t> tick_{0};
  std::unique_ptr<EventPool<R>> own_events_;  // when no shared pool was given
  EventPool<R>& events_;
  detail::PointerMap<detail::LiveBlock> live_;
  detail::SmallIndex small_index_;  // small blocks by address (Note [Small block index])

  std::mutex pools_mutex_;
  std::unordered_map<std::uintptr_t, std::unique_ptr<Pool>> pools_by_stream_;
  std::vector<Pool*> pools_;
  std::mutex release_mutex_;  // serializes returning segments to the driver
  Released limbo_;            // under release_mutex_ (Note [Ordered release])

  detail::TraceRing trace_;  // the allocation history
};

ACCELKIT_END_NAMESPACE
