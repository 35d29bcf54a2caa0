// accelkit: finding a small block by its address (Note [Small arena]): the
// map from 2 MiB address windows to the small segments that overlap them,
// each thread's cache of the windows it looked up last, and holding the
// segment that contains a pointer under its pool's lock. The device pool
// (memory/caching_allocator.hpp) registers a small segment's windows when it
// makes the segment and unregisters them before it returns it.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/pointer_map.hpp>
#include <accelkit/detail/spinlock.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/detail/pool.hpp>
#include <accelkit/memory/detail/small_arena.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// A thread's memory of one window it looked up (SmallIndex).
struct SmallWindowCacheEntry {
  std::uint64_t owner = 0;  // the index's id
  const void* key = nullptr;
  std::uint64_t epoch = 0;  // the index's epoch before its map was read
  SmallWindow window;
};

// Note [Small block index]: a pointer's 2 MiB window names the (at most two)
// small segments that overlap it. The map is read without the pool's lock,
// so what it names is checked under that lock (hold). Each thread keeps the
// windows it looked up last: two threads freeing in one window (adjacent
// segments of two streams) would otherwise take turns at one shard's lock,
// which halved the two-thread throughput. A remembered window may be out of
// date; whatever it names is checked under the pool's lock, and the map is
// asked when the check fails. That it names no segment for a pointer is
// trusted while no segment has been added since (epoch_): a large block's
// free then makes no map lookup.
class SmallIndex {
 public:
  // A small segment as the index names it: its pool, base and id.
  struct Ref {
    Pool* pool = nullptr;
    char* base = nullptr;
    std::uint64_t id = 0;
  };
  // A small segment, held under its pool's lock, and the index of the block
  // that starts at the address asked for (seg->blocks.size() if none).
  struct Hold {
    Pool* pool = nullptr;
    SmallSegment* seg = nullptr;
    std::size_t i = 0;
    SpinGuard lock;
    bool allocated() const noexcept {
      return i < seg->blocks.size() && small_block::state(seg->blocks[i]) == small_block::allocated;
    }
  };

  SmallIndex() : id_(next_id()) {}
  SmallIndex(const SmallIndex&) = delete;
  SmallIndex& operator=(const SmallIndex&) = delete;

  // The small segment that contains `p`, locked; seg null when none does.
  // The block's index is looked for at `hint` first (SmallSegment::index_of).
  ACCELKIT_ALWAYS_INLINE Hold hold(const void* p, std::size_t hint = ~std::size_t{0}) {
    const void* key = window_key(p);
    CacheEntry& cached = tls_entry(key);
    for (int attempt = 0; attempt < 2; ++attempt) {
      Ref r;
      if (attempt == 0) {
        if (cached.owner != id_ || cached.key != key) continue;
        r = in_window(cached.window, p);
        if (!r.pool) {
          if (cached.epoch == epoch_.load(std::memory_order_acquire)) return {};
          continue;  // a segment may have come since
        }
      } else {
        r = in_window(refresh(cached, key), p);
        if (!r.pool) return {};
      }
      SpinGuard lock(r.pool->lock);
      if (SmallSegment* seg = segment_of(r))
        return {r.pool, seg, seg->index_of(p, hint), std::move(lock)};
      // Released since the window was read: ask the map (again).
    }
    return {};
  }

  // Reads the window at `key` from the map into the thread's cache entry.
  // Out of line: a free that finds its window in the cache (most do) then
  // does not compute the map's hash.
  ACCELKIT_NOINLINE const SmallWindow& refresh(SmallWindowCacheEntry& cached, const void* key) {
    std::uint64_t epoch = epoch_.load(std::memory_order_acquire);
    cached = {id_, key, epoch, windows_.find(key)};
    return cached.window;
  }

  // Under r.pool's lock: the segment with r's id if it starts at r's base
  // (the one r named, or one at that address now); nullptr once released.
  static SmallSegment* segment_of(const Ref& r) noexcept {
    SmallSegment* seg = r.pool->arena.segment(r.id);
    return seg && seg->ptr == r.base ? seg : nullptr;
  }

  // Registers a new segment of `pool`. False, with nothing changed, when a
  // window would name three segments: the driver returned memory that
  // overlaps memory it already gave. Throws only bad_alloc.
  bool add(Pool& pool, const SmallSegment& seg) {
    const void* first = window_key(seg.ptr);
    const void* last = window_key(seg.ptr + memory_constants::kSmallBuffer - 1);
    if (!add_window(first, pool, seg)) return false;
    if (last != first) {
      bool added = false;
      try {
        added = add_window(last, pool, seg);
      } catch (...) {
        remove_window(first, pool, seg);
        throw;
      }
      if (!added) {
        remove_window(first, pool, seg);
        return false;
      }
    }
    epoch_.fetch_add(1, std::memory_order_release);  // after: see hold
    return true;
  }
  // Unregisters a segment of `pool` (before its memory goes back).
  void remove(Pool& pool, const SmallSegment& seg) noexcept {
    const void* first = window_key(seg.ptr);
    const void* last = window_key(seg.ptr + memory_constants::kSmallBuffer - 1);
    remove_window(first, pool, seg);
    if (last != first) remove_window(last, pool, seg);
  }

 private:
  using CacheEntry = SmallWindowCacheEntry;
  // By window address, 32 windows (64 MiB of small segments, 2.3 KiB a
  // thread): bench/memory_bench.cpp's random allocations at N = 1e3 hold 18
  // segments (36 MiB), which 16 entries would miss on two frees in three.
  static inline thread_local std::array<CacheEntry, 32> tls_cache_{};
  static CacheEntry& tls_entry(const void* key) noexcept {
    return tls_cache_[(reinterpret_cast<std::uintptr_t>(key) >> 21) % tls_cache_.size()];
  }
  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }
  static const void* window_key(const void* p) noexcept {
    constexpr std::uintptr_t n = memory_constants::kSmallBuffer;
    return reinterpret_cast<const void*>((reinterpret_cast<std::uintptr_t>(p) & ~(n - 1)) + n);
  }
  static Ref in_window(const SmallWindow& w, const void* p) noexcept {
    // Which of the two holds `p` is chosen by a select, not a loop that
    // stops at the first (when a window holds two, a free is as likely in
    // either: the loop's exit mispredicted a third of the time).
    auto at = reinterpret_cast<std::uintptr_t>(p);
    auto inside = [&](int k) {
      auto base = reinterpret_cast<std::uintptr_t>(w.base[k]);
      return w.pool[k] && at - base < memory_constants::kSmallBuffer;
    };
    int k = inside(1) ? 1 : 0;
    if (!inside(k)) return {};
    return {w.pool[k], w.base[k], w.id[k]};
  }
  bool add_window(const void* key, Pool& pool, const SmallSegment& seg) {
    bool added = false;
    windows_.modify(key, [&](SmallWindow& w) {
      if (w.pool[1]) return true;  // three 2 MiB segments cannot overlap one 2 MiB window
      int k = w.pool[0] ? 1 : 0;
      w.pool[k] = &pool;
      w.base[k] = seg.ptr;
      w.id[k] = seg.id;
      added = true;
      return true;
    });
    return added;
  }
  void remove_window(const void* key, Pool& pool, const SmallSegment& seg) noexcept {
    windows_.modify_existing(key, [&](SmallWindow& w) {
      for (int k = 0; k < 2; ++k)
        if (w.pool[k] == &pool && w.base[k] == seg.ptr) w = SmallWindow::without(w, k);
      return w.pool[0] != nullptr;
    });
  }

  std::uint64_t id_;
  // Few shards: threads mostly find windows in their own cache, and 1024
  // shards' tables would spread 3,000 windows over 1 MiB.
  PointerMap<SmallWindow, 4> windows_;
  std::atomic<std::uint64_t> epoch_{0};  // small segments added so far
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
