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
//    the pool of the stream that first needed it. Besides the streams'
//    pools there are private pools, named by a MempoolId and not keyed by a
//    stream, which serve only the allocations routed to them (a graph's
//    capture, a user's pool: Note [Private pools]).
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
//  - Blocks freed on a stream are parked (Note [Recently freed blocks])
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
// With expandable_segments, a pool's large blocks come from a segment that
// grows and shrinks in place by pages (Note [Expandable segments]).
// Blocks that were used on other streams (record_stream) are returned to the
// cache only after events recorded on those streams at free time complete;
// the events come from a pool (EventPool). Limits: a segment serves only the
// stream whose pool holds it, so memory one stream cached reaches another
// only through the driver (empty_cache, garbage collection, the retry before
// out-of-memory); a peak summed over pools bounds the device's peak from
// above (Note [Sharded statistics]). While a stream captures, the
// allocator records no event on it and never synchronizes it (Note [Frees
// during capture]).
//
// This file holds the public API and the policy: which cached block serves a
// request (take_cached), when a pool stops parking records (judge_parking),
// how large a new segment is (segment_size), and what a request does when
// the driver has no room (allocate_slow). The mechanisms are in memory/detail/, a concern a file, each included below:
//   stream_pools.hpp  the pool of each stream, each thread's cache of them
//   private_pools.hpp private pools: use counts, routes, giving memory back
//   statistics.hpp    counting, stats(), snapshot()
//   large_blocks.hpp  records: parking, the large set, split and merge, the
//                     pointer map
//   small_blocks.hpp  descriptors: parking by size, split and merge, lookup
//   stream_order.hpp  record_stream, pending frees, frees during capture
//   segments.hpp      memory from the driver, detaching free segments
//   expandable.hpp    segments that grow and shrink in place by pages
//   collection.hpp    memory back to the driver in order, garbage collection
//   errors.hpp        the messages of out-of-memory and invalid frees
// Their data structures: pool.hpp (records, a stream's pool), small_arena.hpp,
// small_parking.hpp, small_index.hpp, stream_uses.hpp, trace_ring.hpp.
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
#include <accelkit/memory/detail/small_arena.hpp>
#include <accelkit/memory/detail/small_index.hpp>
#include <accelkit/memory/detail/stream_uses.hpp>
#include <accelkit/memory/detail/trace_ring.hpp>
#include <accelkit/memory/history.hpp>
#include <accelkit/memory/snapshot.hpp>
#include <accelkit/memory/stats.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// The segment of the caching allocator that holds a pointer
// (DeviceCachingAllocator::segment_of): memory from one driver allocation,
// which inter-process sharing exports whole (Note [Sharing device memory
// between processes] in torch/ipc.hpp).
struct SegmentSpan {
  char* base = nullptr;     // the start of the driver's allocation; null: no segment holds it
  std::size_t size = 0;     // its bytes
  bool expandable = false;  // pages mapped into a reserved range (Note [Expandable segments])
};

template <class R>
class DeviceCachingAllocator {
 public:
  DeviceCachingAllocator(Backend<R>& backend, device_index device, AllocatorConfig config)
      : backend_(backend),
        device_(device),
        config_(config),
        id_(next_id()),
        cache_key_(id_),
        own_events_(std::make_unique<EventPool<R>>(backend, device)),
        events_(*own_events_) {
    const DeviceProperties& p = backend.properties(device);
    total_memory_ = p.total_memory;
    max_allocation_ = p.max_allocation;
    limit_ = fraction_limit(config.memory_fraction);
    fraction_ = config.memory_fraction;
    check_expandable(config);
  }
  // The same, taking the events that order stream uses from a shared pool
  // (the device's pool in Streams<R>, so the stream layer and the allocator
  // use one set of driver events). `events` must outlive the allocator.
  DeviceCachingAllocator(Backend<R>& backend, device_index device, AllocatorConfig config,
                         EventPool<R>& events)
      : backend_(backend),
        device_(device),
        config_(config),
        id_(next_id()),
        cache_key_(id_),
        events_(events) {
    if (events.device() != device)
      throw ValueError(Backend<R>::name,
                       fmt::format("the allocator of {}:{} was given the event pool of {}:{}",
                                   Backend<R>::name, device, Backend<R>::name, events.device()));
    const DeviceProperties& p = backend.properties(device);
    total_memory_ = p.total_memory;
    max_allocation_ = p.max_allocation;
    limit_ = fraction_limit(config.memory_fraction);
    fraction_ = config.memory_fraction;
    check_expandable(config);
  }
  DeviceCachingAllocator(const DeviceCachingAllocator&) = delete;
  DeviceCachingAllocator& operator=(const DeviceCachingAllocator&) = delete;

  // Returns every segment to the driver. Blocks still allocated are lost.
  ~DeviceCachingAllocator();

  device_index device() const noexcept { return device_; }
  const AllocatorConfig& config() const noexcept { return config_; }

  // `bytes` of device memory usable in order on `stream`. nullptr for 0
  // bytes. OutOfMemoryError when the device (or the memory fraction) has no
  // room even after the cache was returned to the driver; DriverError when
  // the driver fails otherwise. On error nothing changes.
  void* allocate(std::size_t bytes, StreamHandle stream) {
    return allocate_or(bytes, stream, NoRoom::release_then_throw);
  }
  // As allocate, but nullptr where the device has no room without returning
  // the cache to the driver: nothing is released, retried or counted as out
  // of memory (for memory that may as well live elsewhere: Note [CPU results
  // in device memory] in torch/host_results.hpp). DriverError as allocate.
  void* try_allocate(std::size_t bytes, StreamHandle stream) {
    return allocate_or(bytes, stream, NoRoom::return_null);
  }

 private:
  // What an allocation does where the device has no room: allocate returns
  // the cache to the driver, tries again, then throws; try_allocate returns
  // nullptr.
  enum class NoRoom : bool { return_null, release_then_throw };

  // While history is recorded, allocate_recorded: gathers the context
  // before any lock (Note [History contexts]).
  ACCELKIT_ALWAYS_INLINE void* allocate_or(std::size_t bytes, StreamHandle stream,
                                           NoRoom no_room) {
    backend_.check_not_lost(device_, "malloc");  // cached memory too (Note [Lost devices])
    if (trace_.on()) return allocate_recorded(bytes, stream, no_room);
    return allocate_core<false>(bytes, stream, no_room);
  }
  ACCELKIT_NOINLINE void* allocate_recorded(std::size_t bytes, StreamHandle stream,
                                            NoRoom no_room) {
    if (bytes == 0) return nullptr;
    std::shared_ptr<HistoryContext> context = trace_.gather(HistoryContexts::state);
    detail::HistoryScope scope(context);
    return allocate_core<true>(bytes, stream, no_room);
  }
  template <bool kRecord>
  ACCELKIT_ALWAYS_INLINE void* allocate_core(std::size_t bytes, StreamHandle stream,
                                             NoRoom no_room) {
    if (bytes == 0) return nullptr;
    if (bytes > max_allocation_) {
      if (no_room == NoRoom::return_null) return nullptr;
      throw too_large(bytes);
    }
    // A stream's pool, or the private pool a route sends it to (Note
    // [Private pools]).
    detail::Pool& pool = pool_for(stream);
    Allocation t;
    if (!config_.caching) {
      detail::Block* b = allocate_uncached(pool, bytes, no_room);
      if (!b) return nullptr;
      detail::SpinGuard lock(pool.lock);  // allocation_of marks it
      t = allocation_of(b);
    } else {
      std::size_t size = config_.round_size(bytes);
      {
        detail::SpinGuard lock(pool.lock);
        if (!pool.pending.empty()) process_pending(pool, detail::Drain::completed);
        t = take_cached(pool, size, bytes);
      }
      if (!t.ptr) {
        t = allocate_slow(pool, size, bytes, no_room);
        if (!t.ptr) return nullptr;  // only where NoRoom::return_null
      }
    }
    // Small blocks are found through their segment (Note [Small arena]).
    if (t.unmapped) map_block(pool, t.block);
    if (!t.block) tls_last_small_ = {t.ptr, t.index};
    if constexpr (kRecord) record_trace(pool, TraceEntry::Action::alloc, t.ptr, bytes);
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
    if (trace_.on()) {
      deallocate_recorded(ptr);
      return;
    }
    deallocate_core(ptr);
  }

 private:
  // deallocate() while history is recorded: the free's context first,
  // before any lock (Note [History contexts]).
  ACCELKIT_NOINLINE void deallocate_recorded(void* ptr) {
    std::shared_ptr<HistoryContext> context = trace_.gather(HistoryContexts::all);
    detail::HistoryScope scope(context);
    deallocate_core(ptr);
  }
  ACCELKIT_ALWAYS_INLINE void deallocate_core(void* ptr) {
    std::size_t hint = ptr == tls_last_small_.ptr ? tls_last_small_.index : kNoHint;
    if (SmallHold h = small_index_.hold(ptr, hint); h.seg) {
      free_small(h, static_cast<char*>(ptr));
      return;
    }
    free_large(ptr);
  }

 public:
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
  bool contains(const void* ptr);
  // The segment whose memory holds `ptr` (a live allocation's start or any
  // byte inside it), {} where none does. Walks every segment, as contains().
  SegmentSpan segment_of(const void* ptr);

  // Marks `ptr` as used on `stream` too: when freed it is not reused before
  // `stream` has passed the point of the free.
  void record_stream(void* ptr, StreamHandle stream);

  // Returns every unused cached segment to the driver, after waiting for
  // pending stream uses. Reserved memory drops to what allocations need,
  // but for private pools in use (Note [Private pools]) and, while a stream
  // captures, that stream's pool (Note [Frees during capture]).
  void empty_cache() {
    std::shared_ptr<HistoryContext> context;
    if (trace_.on()) context = trace_.gather(HistoryContexts::all);
    detail::HistoryScope scope(context);
    release_all(detail::Drain::wait_for_all);
    forget_idle_pools();
  }

  // Private pools (Note [Private pools]), named by MempoolId; {0, 0} names
  // the streams' pools and is refused where a private pool is meant.
  // Adds a use of pool `id`, creating it if new. ValueError for {0, 0}.
  void create_pool(MempoolId id);
  // Drops a use of pool `id`; at 0 its wholly free segments go back to the
  // driver at once, the others as their blocks are freed. ValueError naming
  // the id if it has no use.
  void release_pool(MempoolId id);
  // The uses of pool `id`; 0 if unknown.
  int pool_use_count(MempoolId id);
  // The ids of the private pools this allocator knows: in use, or holding
  // memory until their blocks are freed.
  std::vector<MempoolId> pool_ids();
  // From now until end_allocate_to_pool(id), an allocation on a stream for
  // which `filter` returns true comes from pool `id` (the route begun last
  // is asked first). Adds a use, as create_pool. `filter` is called under
  // the allocator's lock, from any thread that allocates: it must be cheap
  // and must not call the allocator.
  void begin_allocate_to_pool(MempoolId id, std::function<bool(StreamHandle)> filter);
  // Ends the route begun last for pool `id` (its use stays: release_pool
  // drops it). ValueError if none is active.
  void end_allocate_to_pool(MempoolId id);
  // Pool `id`'s wholly free segments back to the driver, if its use count
  // is 0 (memory of a pool in use stays reserved). {0, 0}: empty_cache().
  void empty_cache(MempoolId id);
  // Pool `id`'s figures alone; {0, 0}: the streams' pools'; zeros for an
  // unknown id.
  DeviceStats stats(MempoolId id);

  // Statistics summed over every pool (Note [Sharded statistics]).
  DeviceStats stats();
  void reset_peak_stats();
  void reset_accumulated_stats();

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

  // Applies `config` to the live allocator: later requests, splits, segments
  // and collections follow it; blocks already cached keep their sizes. Safe
  // while other threads allocate and free: every field is read and written
  // atomically (Note [Allocator configuration]), so a request running
  // meanwhile sees each field either old or new, and the hot path takes no
  // lock for it. A per_process_memory_fraction that differs from the current
  // configuration's is applied as set_memory_fraction. ValueError where
  // `config` turns caching on or off (fixed at construction) or its fraction
  // is outside (0, 1]; nothing changes then.
  void set_config(const AllocatorConfig& config) {
    static std::mutex serial;  // one set_config at a time
    std::lock_guard<std::mutex> guard(serial);
    if (config.caching != config_.caching)
      throw ValueError(Backend<R>::name,
                       fmt::format("the allocator of {}:{} cannot turn caching {} while it lives",
                                   Backend<R>::name, device_, config.caching ? "on" : "off"));
    check_expandable(config);
    double fraction = config.memory_fraction;
    bool fraction_changed = fraction != config_.memory_fraction;
    if (fraction_changed && !(fraction > 0.0 && fraction <= 1.0))
      throw ValueError(Backend<R>::name,
                       fmt::format("memory fraction {} for {}:{} is outside (0, 1]", fraction,
                                   Backend<R>::name, device_));
    config_ = config;
    if (fraction_changed) set_memory_fraction(fraction);
  }

  // Records the allocation history as `options` say (memory/history.hpp,
  // Note [History contexts]); HistoryRecord::off stops and drops it.
  // Thread-safe; the gatherer is called only outside the allocator's locks.
  void record_history(const HistoryOptions& options) { trace_.configure(options); }

  // Adds an observer of out-of-memory errors (OomObserver).
  void attach_oom_observer(OomObserver observer) {
    std::lock_guard<std::mutex> lock(oom_mutex_);
    oom_observers_.push_back(std::move(observer));
  }

  // Adds a reclaimer: where the device has no room, before the cache goes
  // back to the driver and the request is tried again, each reclaimer frees
  // what it can (memory that other processes have stopped using: Note
  // [Sharing device memory between processes] in torch/ipc.hpp). Called
  // with no lock of the allocator held; it may free memory of this
  // allocator, and what it throws is dropped.
  void attach_reclaimer(std::function<void()> reclaimer) {
    std::lock_guard<std::mutex> lock(oom_mutex_);
    reclaimers_.push_back(std::move(reclaimer));
  }

  // Segments with their blocks, and the history recorded (whose newest
  // entry, while it is recorded, is this snapshot's).
  MemorySnapshot snapshot();

 private:
  using Block = detail::Block;
  using Pool = detail::Pool;
  using Segment = detail::Segment;

  // The named arguments of the statistics' counting (memory/detail/statistics.hpp).
  // Which figures a block or segment counts in (Note [Statistics by pool kind]).
  enum class BlockKind : bool { large, small };
  // Whether a free block spans its whole segment: only one that does not
  // counts as inactive split.
  enum class Span : bool { part_of_segment, whole_segment };
  // A block or segment counted in (it enters what a figure counts) or out.
  enum class Count : bool { out, in };

  // A segment detached from its pool, on its way back to the driver (Note
  // [Ordered release]).
  struct Detached {
    Pool* pool;
    char* ptr;
    std::size_t size;
    BlockKind kind;
    bool oversize;
    Segment* record;  // a large segment's record, deleted once freed
    // Expandable memory (Note [Expandable segments]): pages [first_page,
    // first_page + page_count) of `range`, unmapped once ordered.
    std::shared_ptr<detail::VmRange> range = nullptr;
    std::size_t first_page = 0;
    std::size_t page_count = 0;
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

  struct PoolCacheEntry {
    std::uint64_t owner = 0;
    std::uintptr_t stream = 0;
    Pool* pool = nullptr;
  };
  static inline thread_local std::array<PoolCacheEntry, 4> tls_pools_{};
  static inline thread_local unsigned tls_next_ = 0;

  // The small block this thread was handed last (Note [The last block taken]).
  struct LastSmall {
    const void* ptr = nullptr;
    std::size_t index = 0;
  };
  static constexpr std::size_t kNoHint = ~std::size_t{0};
  static inline thread_local LastSmall tls_last_small_{};

  // The pool of each stream (memory/detail/stream_pools.hpp).
  ACCELKIT_ALWAYS_INLINE Pool& pool_for(StreamHandle stream);
  ACCELKIT_NOINLINE Pool& pool_from_map(StreamHandle stream);
  std::vector<Pool*> pools_snapshot();

  // Private pools (memory/detail/private_pools.hpp).
  struct PrivateEntry {
    MempoolId id;
    int use_count;
    std::vector<Pool*> pools;  // one a stream it served, made on its first request
  };
  struct Route {
    MempoolId id;
    std::function<bool(StreamHandle)> filter;
  };
  Pool* routed_pool(StreamHandle stream);
  PrivateEntry* find_private(MempoolId id);
  PrivateEntry* entry_of(const Pool& pool);
  void incref_pool(MempoolId id);
  std::vector<Pool*> pools_of(MempoolId id);
  void release_pool_memory(Pool& pool, detail::Drain drain);
  void mark_released(Pool& pool);
  ACCELKIT_NOINLINE void give_back(Pool& pool) noexcept;
  void forget_if_idle(MempoolId id);
  void forget_idle_pools();
  bool capturing(const Pool& pool);
  bool kept_from_release(const Pool& pool);
  void detach_free(Pool& pool, Released& freed, detail::Drain drain);
  ValueError not_private(std::string_view call, MempoolId id) const;

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
  // parked blocks, split. Inlined into allocate(): out of line, its call
  // saves and restores six registers and returns the Allocation through
  // memory. carve_small and cache_small stay out of line: inlined as well,
  // they make allocate() spill more than the calls cost.
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
      Span span = span_of(*e.seg);
      count_inactive(pool, parked * kGranule, BlockKind::small, span, Count::out);
      try {
        return {nullptr, carve_small(pool, *e.seg, j, size, requested), size, false, j};
      } catch (...) {
        pool.parked_small.park(parked, e);  // back where it was
        count_inactive(pool, parked * kGranule, BlockKind::small, span, Count::in);
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
      Span span = span_of(*seg);
      count_inactive(pool, block, BlockKind::small, span, Count::out);
      try {
        return {nullptr, carve_small(pool, *seg, i, size, requested), size, false, i};
      } catch (...) {
        pool.arena.bin(*seg, i);  // cannot throw: its bin entry was just freed
        count_inactive(pool, block, BlockKind::small, span, Count::in);
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
  // for the parking slots on top. So each pool counts its frees of records
  // and the requests that took a parked record of their size. Once
  // kParkingTrial frees have gone by with parking on, it stays on if at least
  // a quarter of them were taken back so; otherwise the parked records go
  // into the large set and frees go there directly, until kParkingPause frees
  // later parking is tried again. The decision is taken on the allocation
  // path, where merging the parked blocks may throw. Limits: a pool whose
  // sizes change pattern pays for up to kParkingPause frees before parking
  // comes back. (Small blocks park by size instead, Note [Parked small
  // blocks].) Evidence: bench/memory_bench.cpp, random sizes up to 64 KiB.
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

  // Whether a free block of `block` bytes may serve a request of `size`
  // under max_split_size (always, when it is unlimited).
  bool fits(std::size_t size, std::size_t block) const noexcept {
    if (config_.max_split_size == std::numeric_limits<std::size_t>::max()) return true;
    if (size < config_.max_split_size) return block < config_.max_split_size;
    return block < size + config_.max_non_split_rounding;
  }

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
    return std::max(size, std::min<std::size_t>(grown, config_.large_segment_size));
  }

  // A new segment for a request the cache could not serve; where the driver
  // has no room, the cache returned to it and tried again, or {} (NoRoom).
  Allocation allocate_slow(Pool& pool, std::size_t size, std::size_t requested, NoRoom no_room) {
    bool small = size <= memory_constants::kSmallSize;
    // Large requests grow the pool's expandable segment (Note [Expandable
    // segments]).
    bool expandable = !small && config_.expandable_segments;
    std::size_t seg_size = expandable ? size : segment_size(size);
    for (int attempt = 0;; ++attempt) {
      if (config_.garbage_collection_threshold > 0) collect_garbage(seg_size);
      if (expandable) {
        if (Allocation t = allocate_expandable(pool, size, requested); t.ptr) return t;
      } else if (char* p = driver_alloc(seg_size)) {
        detail::SpinGuard lock(pool.lock);
        if (small) return add_small_segment(pool, p, size, requested);
        return allocation_of(carve(pool, add_segment(pool, p, seg_size, small), size, requested));
      }
      // A 1-10 MiB request normally takes a large_segment_size segment to
      // share; when that does not fit, a segment of its own still may.
      if (!small && !expandable && seg_size > size) {
        if (char* p = driver_alloc(size)) {
          detail::SpinGuard lock(pool.lock);
          return allocation_of(carve(pool, add_segment(pool, p, size, small), size, requested));
        }
      }
      if (no_room == NoRoom::return_null) return {};
      if (attempt == 1) break;
      {
        detail::SpinGuard lock(pool.lock);
        ++pool.stats.num_alloc_retries;
      }
      reclaim();
      release_all(detail::Drain::wait_for_all);
      detail::SpinGuard lock(pool.lock);
      if (Allocation t = take_cached(pool, size, requested); t.ptr) return t;
    }
    {
      detail::SpinGuard lock(pool.lock);
      ++pool.stats.num_ooms;
    }
    throw out_of_memory(pool, requested, size);
  }

  // Runs the reclaimers (attach_reclaimer), no lock held.
  void reclaim() noexcept {
    try {
      std::vector<std::function<void()>> all;
      {
        std::lock_guard<std::mutex> lock(oom_mutex_);
        if (reclaimers_.empty()) return;
        all = reclaimers_;
      }
      for (auto& r : all) {
        try {
          r();
        } catch (...) {
        }
      }
    } catch (...) {  // the copy's allocation: nothing reclaimed
    }
  }

  // The mechanisms, each in its file.

  // Statistics (memory/detail/statistics.hpp).
  ACCELKIT_ALWAYS_INLINE static void count_up(KindStat& a, BlockKind kind, std::int64_t n) noexcept;
  ACCELKIT_ALWAYS_INLINE static void count_down(KindStat& a, BlockKind kind,
                                                std::int64_t n) noexcept;
  static BlockKind kind_of(const Block* b) noexcept;
  static BlockKind kind_of(const Segment* seg) noexcept;
  static Span span_of(const Block* b) noexcept;
  static Span span_of(const detail::SmallSegment& seg) noexcept;
  ACCELKIT_ALWAYS_INLINE void count_alloc(Pool& pool, const Block* b);
  ACCELKIT_ALWAYS_INLINE void count_alloc(Pool& pool, std::size_t size, std::size_t requested,
                                          BlockKind kind);
  ACCELKIT_ALWAYS_INLINE void count_free(Pool& pool, const Block* b);
  ACCELKIT_ALWAYS_INLINE void count_free(Pool& pool, std::size_t size, std::size_t requested,
                                         BlockKind kind);
  void count_segment(Pool& pool, const Segment* seg, Count count);
  void count_segment(Pool& pool, std::size_t size, BlockKind kind, bool oversize, Count count);
  ACCELKIT_ALWAYS_INLINE void count_inactive(Pool& pool, const Block* b, Count count);
  ACCELKIT_ALWAYS_INLINE void count_inactive(Pool& pool, std::size_t size, BlockKind kind,
                                             Span span, Count count);
  ACCELKIT_ALWAYS_INLINE void count_released(Pool& pool, char* ptr, std::size_t size,
                                             std::size_t requested, BlockKind kind);
  // History (memory/detail/statistics.hpp): an entry for `pool` with the
  // calling thread's context (Note [History contexts]). Under the pool's
  // lock or not; never throws.
  void record_trace(const Pool& pool, TraceEntry::Action action, const void* ptr,
                    std::size_t size, std::size_t device_free = 0) noexcept;

  // Large blocks: records in the large set and the parking slots
  // (memory/detail/large_blocks.hpp).
  void insert_free(Pool& pool, Block* b);
  void unlink_free(Pool& pool, Block* b);
  Block* find_large(Pool& pool, std::size_t size);
  Block* carve(Pool& pool, Block* b, std::size_t size, std::size_t requested);
  void absorb_next(Pool& pool, Block* b);
  void cache_block(Pool& pool, Block* b);
  ACCELKIT_ALWAYS_INLINE void leave_parking(Pool& pool, const Block* b);
  void evict(Pool& pool, Block* b);
  void unpark_records(Pool& pool);
  void make_room(Pool& pool);
  void prepare_evict(Pool& pool);
  static void prefetch_neighbours(const Block* b) noexcept;
  void map_block(Pool& pool, Block* b);
  void unmap_block(Block* b) noexcept;
  ACCELKIT_ALWAYS_INLINE void free_block(Pool& pool, Block* b);
  ACCELKIT_NOINLINE void free_large(void* ptr);

  // Small blocks: descriptors in small segments (memory/detail/small_blocks.hpp).
  using SmallRef = detail::SmallIndex::Ref;    // Note [Small block index]
  using SmallHold = detail::SmallIndex::Hold;
  // Whether block `i` of `seg` merges with its next and previous neighbour
  // when binned (they are binned), and the merged block's granules.
  struct Merge {
    bool next, prev;
    std::uint32_t granules;
  };
  ACCELKIT_ALWAYS_INLINE Allocation take_parked(Pool& pool, std::size_t gran,
                                                std::size_t requested);
  ACCELKIT_ALWAYS_INLINE static std::size_t parked_index(const detail::SmallParking::Entry& e,
                                                         std::size_t gran) noexcept;
  char* carve_small(Pool& pool, detail::SmallSegment& seg, std::size_t i, std::size_t size,
                    std::size_t requested);
  static Merge merged(const detail::SmallSegment& seg, std::size_t i) noexcept;
  void cache_small(Pool& pool, detail::SmallSegment& seg, std::size_t i);
  void unpark_all(Pool& pool);
  ACCELKIT_ALWAYS_INLINE void release_small(Pool& pool, detail::SmallSegment& seg, std::size_t i,
                                            char* ptr);
  static std::size_t parking_room(const Pool& pool, std::size_t size) noexcept;
  void register_windows(Pool& pool, const detail::SmallSegment& seg);
  ACCELKIT_ALWAYS_INLINE void free_small(SmallHold& h, char* ptr);
  ACCELKIT_NOINLINE void free_small_used(detail::SpinGuard& lock, Pool& pool,
                                         detail::SmallSegment& seg, std::size_t i, char* ptr,
                                         detail::small_block::Desc d);

  // Stream order: stream uses and pending frees (memory/detail/stream_order.hpp).
  bool record_uses(char* ptr, const std::vector<StreamHandle>& uses,
                   std::vector<std::pair<device_index, EventHandle>>& events);
  void process_pending(Pool& pool, detail::Drain drain);
  bool used_while_capturing(const std::vector<StreamHandle>& uses);
  void cache_freed(Pool& pool, const detail::PendingFree& p);
  void cache_or_queue(Pool& pool, detail::PendingFree p);
  void make_room(Pool& pool, const detail::PendingFree& p);
  bool try_make_room(Pool& pool, const detail::PendingFree& p) noexcept;
  static std::vector<StreamHandle> take_uses(Pool& pool, const void* ptr);
  static void add_use(Pool& pool, const void* ptr, StreamHandle stream);

  // Segments: memory from the driver (memory/detail/segments.hpp).
  char* driver_alloc(std::size_t n);
  Block* add_segment(Pool& pool, char* ptr, std::size_t size, bool small);
  Allocation add_small_segment(Pool& pool, char* ptr, std::size_t size, std::size_t requested);
  Block* allocate_uncached(Pool& pool, std::size_t bytes, NoRoom no_room);
  Detached detach_segment(Pool& pool, Segment* seg);
  Detached detach_small(Pool& pool, detail::SmallSegment* seg);
  static bool wholly_free(const Segment* seg) noexcept;

  // Expandable segments (memory/detail/expandable.hpp).
  void check_expandable(const AllocatorConfig& config) const;
  static Block* last_block(const Segment* seg) noexcept;
  static std::size_t aligned_skip(const Block* last, std::size_t size, std::size_t page) noexcept;
  Allocation allocate_expandable(Pool& pool, std::size_t size, std::size_t requested);
  void shrink_tail(Pool& pool, Segment* seg, Released& freed);
  std::vector<Block*> make_holes(Pool& pool, std::size_t pages);
  std::vector<PhysicalHandle> move_free_pages(Pool& pool, std::size_t pages);
  void unmap_pages(detail::VmRange& range, std::size_t first, std::size_t count,
                   std::size_t& freed, std::size_t& lowest);
  void release_range(detail::VmRange& range);
  PhysicalHandle create_page(std::size_t page);
  bool free_expandable(Detached& d, std::exception_ptr& first);
  void release_ranges_at_exit() noexcept;

  // Collection: memory back to the driver, in order (memory/detail/collection.hpp).
  void free_segments(Released& r, const std::vector<StreamHandle>& also = {});
  void release_all(detail::Drain drain);
  void release_into(Released& freed, detail::Drain drain);
  void collect_garbage(std::size_t incoming);
  void free_uncached(Pool& pool, Block* b, const std::vector<StreamHandle>& uses);

  // Error messages (memory/detail/errors.hpp).
  OutOfMemoryError too_large(std::size_t bytes) const;
  // Records the oom entry and calls the observers (no lock held).
  OutOfMemoryError out_of_memory(const Pool& pool, std::size_t bytes, std::size_t rounded);
  std::size_t largest_free_block();
  RuntimeError not_live(const void* ptr) const;

  Backend<R>& backend_;
  device_index device_;
  AllocatorConfig config_;
  std::uint64_t id_;
  std::size_t total_memory_ = 0;
  std::size_t max_allocation_ = 0;
  // What a thread's cache of stream pools is keyed by (tls_pools_): id_, or
  // kRouting while a route is active, which no entry holds, so that every
  // allocation then asks pool_from_map, which asks the routes (Note
  // [Private pools]). One relaxed load on the hot path, as reading id_ was.
  static constexpr std::uint64_t kRouting = ~std::uint64_t{0};
  std::atomic<std::uint64_t> cache_key_;
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
  std::vector<std::unique_ptr<Pool>> private_owned_;  // every private pool made
  std::vector<Pool*> pools_;                          // both kinds

  // Private pools (Note [Private pools]); private_mutex_ is taken before
  // pools_mutex_ and a pool's lock, never while release_mutex_ is held.
  std::mutex private_mutex_;
  std::vector<PrivateEntry> private_pools_;  // under private_mutex_
  std::vector<Route> routes_;                // under private_mutex_, oldest first
  std::vector<Pool*> idle_pools_;  // under private_mutex_: private pools of no id, reused
  DeviceStats retired_stats_;      // under private_mutex_: figures of pools made idle
  std::mutex release_mutex_;  // serializes returning segments to the driver
  Released limbo_;            // under release_mutex_ (Note [Ordered release])

  detail::TraceRing trace_;  // the allocation history
  std::mutex oom_mutex_;
  std::vector<OomObserver> oom_observers_;  // under oom_mutex_
  std::vector<std::function<void()>> reclaimers_;  // under oom_mutex_
};

ACCELKIT_END_NAMESPACE

// The definitions of the mechanisms declared above.
#include <accelkit/memory/detail/stream_pools.hpp>
#include <accelkit/memory/detail/statistics.hpp>
#include <accelkit/memory/detail/large_blocks.hpp>
#include <accelkit/memory/detail/small_blocks.hpp>
#include <accelkit/memory/detail/stream_order.hpp>
#include <accelkit/memory/detail/segments.hpp>
#include <accelkit/memory/detail/collection.hpp>
#include <accelkit/memory/detail/expandable.hpp>
#include <accelkit/memory/detail/private_pools.hpp>
#include <accelkit/memory/detail/errors.hpp>
