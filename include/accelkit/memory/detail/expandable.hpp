// accelkit: the caching allocator's expandable segments.
//
// Note [Expandable segments]
// Problem: a pool that grows by whole segments fragments. Eight 16 MiB
// blocks freed leave eight 16 MiB segments; four 32 MiB requests then fit
// in none of them and need 128 MiB more, though 128 MiB lies free: peak
// reserved is twice peak requested. Variable-length work (serving, packed
// batches) meets this on every new longest request.
// Decision (CUDA's expandable_segments, on the runtime's virtual-memory
// members, Note [Virtual memory] in device/backend.hpp): with
// AllocatorConfig::expandable_segments, each pool (a stream's or a private
// pool's) serves its requests above kSmallSize from one expandable segment:
// a range of addresses about the device's total memory (rounded to the
// granularity) reserved with vm_reserve, of which only a prefix is mapped,
// one vm_create'd page of the granularity per vm_map, so any whole page can
// go back alone. The segment's size is that prefix, tiled by blocks as any
// segment's; blocks split at 512 B (remainders of any size, as CUDA splits
// inside its expandable segments) and merge as in other segments. A request
// the cached blocks cannot serve maps just the pages it lacks beyond the
// free block at the mapped end (allocate_expandable), under release_mutex_
// so that no release changes that end meanwhile; the segment then grows by
// those pages and the request is carved from its last block. A request of a
// page or more starts at the free end's first page boundary when that maps
// no more pages than starting at the free end itself (aligned_skip): the
// bytes below the boundary stay free for smaller requests, and the
// request's pages, once freed, are whole pages that can move; otherwise a
// block a page long that started mid-page would straddle two pages and
// leave neither whole when freed. Before new pages are made, whole free
// pages inside the pool's expandable segments move to the end
// (move_free_pages): they become holes (Block::hole: never allocated, never
// merged) under the pool lock, then, if the pool's stream
// is idle (stream_query; never while a capture is underway), so that no
// queued work can use them, they are unmapped and their physical memory is
// mapped at the end; with work queued they become free blocks again and
// new pages are made. So reserved memory follows what is allocated rather
// than the highest address ever used. A range whose
// next pages are taken (full, or pages still waiting in limbo) gives way to
// a new range and segment (Pool::growing). The release paths (empty_cache,
// the out-of-memory retry, garbage collection, a released private pool)
// take back whole free pages at the mapped end (shrink_tail): under the
// pool lock the free last block is cut at its first page boundary and the
// pages beyond leave the segment, so nothing can allocate from them; then,
// as for any segment (Note [Ordered release]), the pool's stream is
// synchronized (blocks used on other streams reached the cache only after
// their events completed) before each page is unmapped and destroyed, and
// a segment wholly free goes whole, its range released once no page holds
// memory. Reserved bytes count mapped pages: in when mapped, out when
// destroyed. A growth the driver refuses undoes itself: vm_create's null
// handle (no room) unmaps and destroys the pages this request made and is
// treated as a full device (the cache goes back to the driver, one retry,
// then OutOfMemoryError); a throwing vm_create or vm_map does the same
// undoing and its DriverError reaches the caller.
// Limits: small requests keep their 2 MiB segments (Note [Small arena]);
// the release paths give back only the pages at the mapped end, and pages
// move only while their stream is idle, so a segment whose last block is
// allocated may keep free interior pages mapped; a hole's addresses are
// not used again until its segment goes (the range has the device's size
// in addresses, and a new range follows a full one);
// growing and shrinking walk the segment's block list (the free end has no
// index), linear in its blocks; growth maps a page a call, so a 1 GiB
// request is 512 driver calls on a 2 MiB granularity; a runtime without the
// seven members refuses the setting (check_expandable); with caching off
// the setting has no effect. Evidence: bench/memory_bench.cpp, fragmentation.
//
// Part of DeviceCachingAllocator: the class, its public API and its policy are
// in memory/caching_allocator.hpp, which includes this file at its end (this
// file includes it first, so that it compiles alone).
#pragma once

#include <accelkit/memory/caching_allocator.hpp>

#include <algorithm>
#include <cstddef>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
inline void DeviceCachingAllocator<R>::check_expandable(const AllocatorConfig& config) const {
  if (!config.expandable_segments || Backend<R>::has_virtual_memory()) return;
  throw NotSupportedError(
      Backend<R>::name,
      fmt::format("expandable_segments:True is not supported on {}:{}: its runtime lacks the "
                  "virtual-memory members vm_granularity, vm_reserve, vm_release, vm_create, "
                  "vm_destroy, vm_map and vm_unmap",
                  Backend<R>::name, device_));
}

// Under the pool lock: the last block of `seg` (Note [Expandable segments]).
template <class R>
inline auto DeviceCachingAllocator<R>::last_block(const Segment* seg) noexcept -> Block* {
  Block* b = seg->head;
  while (b->next) b = b->next;
  return b;
}

// Under release_mutex_: unmaps and destroys pages [first, first + count) of
// `range` that hold memory, from the last down, adding the bytes destroyed
// to `freed` and lowering `lowest` to the lowest page destroyed; stops at
// the first error (thrown), leaving the pages below as they are.
template <class R>
inline void DeviceCachingAllocator<R>::unmap_pages(detail::VmRange& range, std::size_t first,
                                                   std::size_t count, std::size_t& freed,
                                                   std::size_t& lowest) {
  for (std::size_t k = first + count; k-- > first;) {
    detail::VmRange::Page& pg = range.pages[k];
    if (pg.mapped) {
      backend_.vm_unmap(device_, range.base + k * range.page, range.page);
      pg.mapped = false;
    }
    if (pg.memory) {
      backend_.vm_destroy(device_, pg.memory);
      pg.memory = PhysicalHandle{};
      --range.held;
      freed += range.page;
      lowest = k;
    }
  }
}

// A page of physical memory; null where the device has no room.
template <class R>
inline PhysicalHandle DeviceCachingAllocator<R>::create_page(std::size_t page) {
  try {
    return backend_.vm_create(device_, page);
  } catch (const OutOfMemoryError&) {
    return PhysicalHandle{};
  }
}

// Under release_mutex_: releases `range` once its segment is gone and no
// page holds memory.
template <class R>
inline void DeviceCachingAllocator<R>::release_range(detail::VmRange& range) {
  if (!range.orphaned || range.held != 0 || range.released) return;
  backend_.vm_release(device_, range.base, range.bytes);
  range.released = true;
}

// Under release_mutex_, after the streams that order `d` are synchronized
// (free_segments): gives the pages of detached expandable memory back;
// false (the error in `first`) when the driver refused, `d` then waiting
// in limbo for the rest. Reserved bytes drop page by page as each is
// destroyed.
template <class R>
inline bool DeviceCachingAllocator<R>::free_expandable(Detached& d, std::exception_ptr& first) {
  detail::VmRange& range = *d.range;
  std::size_t freed = 0, lowest = 0;
  bool done = true;
  try {
    unmap_pages(range, d.first_page, d.page_count, freed, lowest);
  } catch (...) {
    if (!first) first = std::current_exception();
    done = false;
  }
  if (freed) {
    reserved_.fetch_sub(freed);
    {
      detail::SpinGuard lock(d.pool->lock);
      count_down(d.pool->stats.reserved_bytes, BlockKind::large, static_cast<std::int64_t>(freed));
      ++d.pool->stats.num_device_free;
    }
    if (trace_.on())
      record_trace(*d.pool, TraceEntry::Action::segment_unmap, range.base + lowest * range.page,
                   freed);
  }
  if (!done) return false;
  if (d.record) {  // the whole segment: its range goes once no page holds memory
    {
      detail::SpinGuard lock(d.pool->lock);
      count_down(d.pool->stats.segment, BlockKind::large, 1);
    }
    delete d.record;
    d.record = nullptr;
    range.orphaned = true;
  }
  try {
    release_range(range);
  } catch (...) {
    if (!first) first = std::current_exception();
    return false;
  }
  return true;
}

// Under the pool lock and release_mutex_: detaches the whole free pages at
// the mapped end of expandable segment `seg` (not wholly free) into `freed`.
template <class R>
inline void DeviceCachingAllocator<R>::shrink_tail(Pool& pool, Segment* seg, Released& freed) {
  Block* last = last_block(seg);
  if (!last->cached || last == seg->head) return;
  std::size_t page = seg->range->page;
  auto at = reinterpret_cast<std::uintptr_t>(last->ptr);
  char* cut = last->ptr + ((page - at % page) % page);
  char* end = seg->ptr + seg->size;
  if (cut >= end) return;
  freed.reserve(freed.size() + 1);
  prepare_evict(pool);  // so that putting back what stays cannot fail
  unlink_free(pool, last);
  if (cut > last->ptr) {
    last->size = static_cast<std::size_t>(cut - last->ptr);
    insert_free(pool, last);
  } else {
    last->prev->next = nullptr;
    pool.recycle(last);
  }
  auto bytes = static_cast<std::size_t>(end - cut);
  seg->size -= bytes;
  Detached d{&pool, cut, bytes, BlockKind::large, false, nullptr};
  d.range = seg->range;
  d.first_page = static_cast<std::size_t>(cut - seg->ptr) / page;
  d.page_count = bytes / page;
  freed.push_back(std::move(d));
}

// Under the pool lock and release_mutex_: turns the whole pages inside free
// blocks of `pool`'s expandable segments (none at a segment's end, which
// shrink_tail takes) into holes, until `pages` pages are found or none is
// left; the rest of each block stays free on either side. Returns the
// holes (Note [Expandable segments]).
template <class R>
inline auto DeviceCachingAllocator<R>::make_holes(Pool& pool, std::size_t pages)
    -> std::vector<Block*> {
  std::vector<Block*> holes;
  std::size_t found = 0;
  for (Segment* seg : pool.segments) {
    if (!seg->expandable) continue;
    std::size_t page = seg->range->page;
    for (Block* b = seg->head; b && found < pages; b = b->next) {
      if (!b->cached || !b->next) continue;
      auto lo = reinterpret_cast<std::uintptr_t>(b->ptr);
      std::uintptr_t a = (lo + page - 1) / page * page, z = (lo + b->size) / page * page;
      if (z <= a) continue;
      z = std::min<std::uintptr_t>(z, a + (pages - found) * page);
      Block* before = nullptr;
      Block* after = nullptr;
      try {  // room first: out of memory here ends the search, nothing changed
        holes.reserve(holes.size() + 1);
        prepare_evict(pool);
        if (a > lo) before = pool.new_block();
        if (z < lo + b->size) after = pool.new_block();
      } catch (...) {
        if (before) pool.recycle(before);
        return holes;
      }
      unlink_free(pool, b);
      char* end = b->ptr + b->size;
      if (before) {  // the free part below the hole
        before->ptr = b->ptr;
        before->size = a - lo;
        before->segment = seg;
        before->prev = b->prev;
        before->next = b;
        if (b->prev) b->prev->next = before;
        else seg->head = before;
        b->prev = before;
      }
      b->ptr = reinterpret_cast<char*>(a);
      b->size = z - a;
      b->hole = true;
      if (after) {  // the free part above it
        after->ptr = reinterpret_cast<char*>(z);
        after->size = static_cast<std::size_t>(end - after->ptr);
        after->segment = seg;
        after->prev = b;
        after->next = b->next;
        b->next->prev = after;
        b->next = after;
      }
      // The spare node serves the first insert; should the second not find
      // room, that part stays a hole too.
      if (before) insert_free(pool, before);
      if (after) {
        try {
          insert_free(pool, after);
        } catch (...) {
          b->size += after->size;
          b->next = after->next;
          after->next->prev = b;
          pool.recycle(after);
        }
      }
      holes.push_back(b);
      found += b->size / page;
    }
    if (found >= pages) break;
  }
  return holes;
}

// Under release_mutex_: up to `pages` whole free pages of `pool`'s
// expandable segments unmapped, their physical memory returned to be mapped
// at the growing end, if the pool's stream is idle once they are holes (no
// queued work can use them, Note [Expandable segments]); none otherwise.
template <class R>
inline std::vector<PhysicalHandle> DeviceCachingAllocator<R>::move_free_pages(Pool& pool,
                                                                              std::size_t pages) {
  std::vector<PhysicalHandle> moved;
  auto idle = [&] {
    if (backend_.capture_underway(device_)) return false;
    try {
      return backend_.stream_query(device_, pool.stream);
    } catch (...) {
      return false;  // an error of earlier work: the next synchronization reports it
    }
  };
  if (!idle()) return moved;
  std::vector<Block*> holes;
  {
    detail::SpinGuard lock(pool.lock);
    holes = make_holes(pool, pages);
  }
  if (holes.empty()) return moved;
  std::size_t total = 0;
  for (const Block* h : holes) total += h->size / h->segment->range->page;
  bool ok = idle();
  if (ok) {
    try {
      moved.reserve(total);
    } catch (...) {
      ok = false;
    }
  }
  if (!ok) {  // work queued meanwhile may use them: free blocks again
    detail::SpinGuard lock(pool.lock);
    for (Block* h : holes) {
      try {
        prepare_evict(pool);
      } catch (...) {
        continue;  // stays a hole, its pages mapped: given back with its segment
      }
      h->hole = false;
      cache_block(pool, h);
    }
    return moved;
  }
  for (const Block* h : holes) {
    detail::VmRange& range = *h->segment->range;
    std::size_t first = static_cast<std::size_t>(h->ptr - range.base) / range.page;
    std::size_t n = h->size / range.page, done = 0;
    for (; done < n; ++done) {
      detail::VmRange::Page& pg = range.pages[first + done];
      try {
        backend_.vm_unmap(device_, range.base + (first + done) * range.page, range.page);
      } catch (const std::exception& e) {
        // The rest stay mapped inside the hole, given back with the segment.
        report(Severity::warning, Backend<R>::name,
               fmt::format("device {}: free pages could not move to the end of an expandable "
                           "segment: {}",
                           device_, e.what()));
        break;
      }
      pg.mapped = false;
      moved.push_back(pg.memory);
      pg.memory = PhysicalHandle{};
      --range.held;
    }
    if (done && trace_.on())
      record_trace(pool, TraceEntry::Action::segment_unmap, h->ptr, done * range.page);
    if (done < n) break;
  }
  return moved;
}

// Under the pool lock: where a request of `size` grows an expandable
// segment whose last block is `last`, the bytes of a free `last` below its
// first page boundary, which stay free, so that the request starts on a
// page boundary; 0 where that would map more pages than starting at `last`,
// for a request under a page, and for an allocated `last` (Note
// [Expandable segments]).
template <class R>
inline std::size_t DeviceCachingAllocator<R>::aligned_skip(const Block* last, std::size_t size,
                                                           std::size_t page) noexcept {
  if (!last->cached || size < page || last->size >= size) return 0;
  std::size_t skip = (page - reinterpret_cast<std::uintptr_t>(last->ptr) % page) % page;
  auto pages = [&](std::size_t tail) { return (size - tail + page - 1) / page; };
  return pages(last->size - skip) == pages(last->size) ? skip : 0;
}

// allocate_slow's expandable path: a request above kSmallSize the cache
// could not serve, from the pool's expandable segment grown by the pages
// it lacks (Note [Expandable segments]); {} where the device (or the memory
// fraction) has no room; DriverError where the driver fails, the pages this
// call mapped given back first.
template <class R>
inline auto DeviceCachingAllocator<R>::allocate_expandable(Pool& pool, std::size_t size,
                                                           std::size_t requested) -> Allocation {
  std::lock_guard<std::mutex> serial(release_mutex_);
  const std::size_t page = backend_.vm_granularity(device_);
  for (;;) {
    std::shared_ptr<detail::VmRange> range;
    std::size_t first = 0, count = 0;
    {
      detail::SpinGuard lock(pool.lock);
      // Freed since the cache was asked (a thread freeing on this pool).
      if (Allocation t = take_cached(pool, size, requested); t.ptr) return t;
      if (Segment* seg = pool.growing) {
        Block* last = last_block(seg);
        std::size_t tail = last->cached ? last->size : 0;
        if (tail >= size) {  // refused by max_split_size's rule, but the end grows
          unlink_free(pool, last);
          return allocation_of(carve(pool, last, size, requested));
        }
        first = seg->size / page;
        count = (size - (tail - aligned_skip(last, size, page)) + page - 1) / page;
        range = seg->range;
        bool room = first + count <= range->pages.size();
        for (std::size_t k = first; room && k < first + count; ++k)
          room = !range->pages[k].memory;
        if (!room) range = nullptr;  // full, or pages in limbo: a new range
      }
    }
    bool fresh = !range;
    // Whole free pages inside the pool's segments move to the end instead
    // of new ones, when no queued work can use them: holes are made first
    // (nothing allocates from them since), then the stream must be idle.
    std::vector<PhysicalHandle> moved;
    if (!fresh) moved = move_free_pages(pool, count);
    if (fresh) {
      first = 0;
      count = (size + page - 1) / page;
      std::size_t bytes = (std::max<std::size_t>(total_memory_, count * page) + page - 1) / page * page;
      void* base = backend_.vm_reserve(device_, bytes);
      if (!base) return {};
      range = std::make_shared<detail::VmRange>();
      range->base = static_cast<char*>(base);
      range->bytes = bytes;
      range->page = page;
      range->orphaned = true;  // until a segment takes it
      try {
        range->pages.resize(bytes / page);
      } catch (...) {
        backend_.vm_release(device_, base, bytes);
        throw;
      }
    }
    // Undoes this call's pages (moved ones destroyed too: they leave the
    // pool's reserved memory) and, if fresh, its range; never throws.
    std::size_t made = 0;
    auto undo = [&]() noexcept {
      try {
        std::size_t ignored = 0, lowest = 0;
        unmap_pages(*range, first, made, ignored, lowest);
        for (std::size_t k = made; k < moved.size(); ++k) backend_.vm_destroy(device_, moved[k]);
        if (fresh) release_range(*range);
      } catch (...) {
        // Pages no work ever used; a driver refusing them is gone or broken.
      }
      if (!moved.empty()) {
        auto n = moved.size() * page;
        reserved_.fetch_sub(n);
        detail::SpinGuard lock(pool.lock);
        count_down(pool.stats.reserved_bytes, BlockKind::large, static_cast<std::int64_t>(n));
        moved.clear();
      }
    };
    // Moved pages are reserved already; new ones count in.
    std::size_t grow_bytes = (count - moved.size()) * page;
    std::size_t cur = reserved_.load();
    do {
      if (cur + grow_bytes > limit_.load()) {
        undo();
        return {};
      }
    } while (!reserved_.compare_exchange_weak(cur, cur + grow_bytes));
    try {
      for (; made < count; ++made) {
        PhysicalHandle memory = made < moved.size() ? moved[made] : create_page(page);
        if (!memory) break;  // no room
        detail::VmRange::Page& pg = range->pages[first + made];
        pg.memory = memory;
        ++range->held;
        backend_.vm_map(device_, range->base + (first + made) * page, page, memory);
        pg.mapped = true;
      }
    } catch (...) {
      ++made;  // the page whose vm_map threw holds memory: undone too
      undo();
      reserved_.fetch_sub(grow_bytes);
      throw;
    }
    if (made < count) {
      undo();
      reserved_.fetch_sub(grow_bytes);
      return {};
    }
    char* at = range->base + first * page;
    std::size_t mapped_bytes = count * page;
    detail::SpinGuard lock(pool.lock);
    Block* fresh_block = nullptr;
    Segment* seg = nullptr;
    try {
      prepare_evict(pool);
      fresh_block = pool.new_block();
      if (fresh) {
        seg = new Segment();
        pool.segments.reserve(pool.segments.size() + 1);
      }
    } catch (...) {
      if (fresh_block) pool.recycle(fresh_block);
      delete seg;
      lock.unlock();
      undo();
      reserved_.fetch_sub(grow_bytes);
      throw;
    }
    PoolStats& s = pool.stats;
    count_up(s.reserved_bytes, BlockKind::large, static_cast<std::int64_t>(grow_bytes));
    ++s.num_device_alloc;
    Block* tail;
    if (fresh) {
      range->orphaned = false;
      seg->pool = &pool;
      seg->ptr = range->base;
      seg->size = mapped_bytes;
      seg->expandable = true;
      seg->range = range;
      seg->index = pool.segments.size();
      fresh_block->ptr = seg->ptr;
      fresh_block->size = mapped_bytes;
      fresh_block->segment = seg;
      seg->head = fresh_block;
      pool.segments.push_back(seg);
      count_up(s.segment, BlockKind::large, 1);
      pool.growing = seg;
      tail = fresh_block;
    } else {
      seg = pool.growing;
      Block* last = last_block(seg);
      seg->size += mapped_bytes;
      if (std::size_t skip = aligned_skip(last, size, page)) {
        // The free end's part below its first page boundary stays free, the
        // rest (with the new pages) serves the request. The free end's own
        // set node goes back in with it: nothing to allocate.
        auto node = pool.large.extract(last);
        count_inactive(pool, last, Count::out);
        fresh_block->ptr = last->ptr + skip;
        fresh_block->size = last->size - skip + mapped_bytes;
        fresh_block->segment = seg;
        fresh_block->prev = last;
        last->next = fresh_block;
        last->size = skip;
        node.value() = last;
        pool.large.insert(std::move(node));
        count_inactive(pool, last, Count::in);
        tail = fresh_block;
      } else if (last->cached) {
        pool.recycle(fresh_block);
        unlink_free(pool, last);
        last->size += mapped_bytes;
        tail = last;
      } else {
        fresh_block->ptr = at;
        fresh_block->size = mapped_bytes;
        fresh_block->segment = seg;
        fresh_block->prev = last;
        last->next = fresh_block;
        tail = fresh_block;
      }
    }
    if (trace_.on())
      record_trace(pool, TraceEntry::Action::segment_map, at, mapped_bytes);
    if (tail->size >= size) return allocation_of(carve(pool, tail, size, requested));
    // Its free end was taken meanwhile: cache what was mapped, and grow again.
    insert_free(pool, tail);
  }
}

// The destructor's part: every page unmapped and destroyed, every range
// released; the driver's refusals ignored (as the destructor's raw_free's).
template <class R>
inline void DeviceCachingAllocator<R>::release_ranges_at_exit() noexcept {
  std::vector<std::shared_ptr<detail::VmRange>> ranges;
  for (const Detached& d : limbo_)
    if (d.range) ranges.push_back(d.range);
  for (Pool* pool : pools_)
    for (Segment* s : pool->segments)
      if (s->expandable) ranges.push_back(s->range);
  std::sort(ranges.begin(), ranges.end());
  ranges.erase(std::unique(ranges.begin(), ranges.end()), ranges.end());
  for (const auto& range : ranges) {
    for (std::size_t k = range->pages.size(); k-- > 0;) {
      detail::VmRange::Page& pg = range->pages[k];
      try {
        if (pg.mapped) backend_.vm_unmap(device_, range->base + k * range->page, range->page);
        pg.mapped = false;
        if (pg.memory) backend_.vm_destroy(device_, pg.memory);
      } catch (...) {
        // The driver refused at teardown (as in the destructor).
      }
    }
    try {
      if (!range->released) backend_.vm_release(device_, range->base, range->bytes);
    } catch (...) {
    }
  }
}

ACCELKIT_END_NAMESPACE
