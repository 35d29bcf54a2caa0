// accelkit: the caching allocator of pinned (page-locked) host memory.
//
// Note [Pinned host allocator]
// Pinning host memory costs the driver far more than a device allocation,
// and pinned buffers are the staging area of every asynchronous host<->device
// copy, so they are cached like device memory. As PyTorch's
// CachingHostAllocator does, sizes are rounded up to a power of two and
// blocks are not split; each size class has its own lock, free list and
// statistics (Note [Sharded statistics]), so threads that allocate different
// sizes do not contend. Pinned memory is allocated in a device's context
// (Note [Pinned memory per device]): each device has its own size classes,
// and a block goes back only to the device whose host_malloc gave it; any
// device's copies may use it. A block that copies on some
// device's stream used
// (record_stream) is reused only after an event recorded on that stream at
// free time completes; the events come from per-device EventPools.
// PyTorch's pinned keys (Note [Allocator configuration]) apply as in its
// CachingHostAllocator: requests above pinned_max_round_threshold_mb or
// pinned_max_cached_size_mb get a block of their own size (a 512 B
// multiple, in the class of its power of two), freed blocks above
// pinned_max_cached_size_mb go back to the driver once their copies have
// landed, and with pinned_use_background_threads a thread of the allocator
// returns freed blocks whose copies landed to the cache every 100 us, so
// allocations do not look at them. The settings follow
// AllocatorSettings::process() while the allocator lives (Note [Run-time
// allocator settings]).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/format.hpp>
#include <accelkit/detail/pending.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/detail/pointer_map.hpp>
#include <accelkit/detail/spinlock.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/diagnostics.hpp>
#include <accelkit/error.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/stats.hpp>
#include <accelkit/memory/detail/stream_uses.hpp>
#include <accelkit/stream/event_pool.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// Statistics of the pinned host allocator (c10's HostStats, in the same Stat
// shape as the device statistics).
struct HostStats {
  Stat allocation;        // COUNT: live allocations
  Stat segment;           // COUNT: blocks held from the driver
  Stat allocated_bytes;   // SUM: bytes in live allocations (rounded)
  Stat reserved_bytes;    // SUM: bytes held from the driver
  std::int64_t num_host_alloc = 0;  // driver host_malloc calls
  std::int64_t num_host_free = 0;   // driver host_free calls

  void merge(const HostStats& o) noexcept {
    allocation.merge(o.allocation);
    segment.merge(o.segment);
    allocated_bytes.merge(o.allocated_bytes);
    reserved_bytes.merge(o.reserved_bytes);
    num_host_alloc += o.num_host_alloc;
    num_host_free += o.num_host_free;
  }
};

// torch.cuda.host_memory_stats_as_nested_dict()'s shape: "allocations" and
// "allocated_bytes" are the blocks held from the driver (live and cached),
// "active_requests" and "active_bytes" the live allocations. (CUDA's
// allocator also times its driver calls; this one does not.)
inline std::string to_json(const HostStats& s) {
  detail::JsonWriter w;
  w.begin_object();
  auto stat = [&](std::string_view name, const Stat& st) {
    std::string base(name);
    w.field(base + ".current", st.current).field(base + ".peak", st.peak);
    w.field(base + ".allocated", st.allocated).field(base + ".freed", st.freed);
  };
  stat("allocations", s.segment);
  stat("allocated_bytes", s.reserved_bytes);
  stat("active_requests", s.allocation);
  stat("active_bytes", s.allocated_bytes);
  w.field("num_host_alloc", s.num_host_alloc).field("num_host_free", s.num_host_free);
  w.end_object();
  return w.str();
}

template <class R>
class HostAllocator {
 public:
  explicit HostAllocator(Backend<R>& backend)
      : HostAllocator(backend,
                      AllocatorConfig::from_environment(Backend<R>::name, backend.environment())) {}
  HostAllocator(Backend<R>& backend, AllocatorConfig config)
      : backend_(backend), config_(config) {
    settings_ = AllocatorSettings::process().listen(
        Backend<R>::name, config_, [this](std::string_view text) -> std::function<void()> {
          AllocatorConfig next =
              AllocatorConfig::parse(Backend<R>::name, "allocator settings", text, config_);
          return [this, next] { set_config(next); };
        });
    if (config_.pinned_use_background_threads) start_worker();
  }
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;

  // Returns every block to the driver, those still allocated and those
  // kept out of the cache included, as the device allocator does.
  ~HostAllocator() {
    settings_.reset();
    stop_worker();
    for_each_bucket([&](Bucket& bucket) {
      for (Pending& p : bucket.pending) {
        release_events(p);
        delete_block(p.block);
      }
      for (Block* b : bucket.free) delete_block(b);
      for (Block* b : bucket.quarantined) delete_block(b);
      for (Block* b : bucket.refused) delete_block(b);
    });
    live_.for_each([&](Block* b) { delete_block(b); });
  }

  // `bytes` of pinned host memory for copies of `device`; nullptr for 0
  // bytes. IndexError for a device that is not visible; OutOfMemoryError
  // when the driver has none left even after the cache was returned.
  void* allocate(device_index device, std::size_t bytes) {
    backend_.check_device(device);
    if (bytes == 0) return nullptr;
    if (bytes > kMaxBytes)
      throw OutOfMemoryError(Backend<R>::name,
                             fmt::format("cannot allocate {} ({} bytes) of pinned host memory: "
                                         "larger than the {} this allocator serves",
                                         detail::format_bytes(bytes), bytes,
                                         detail::format_bytes(kMaxBytes)));
    std::size_t cls = size_class(bytes);
    Bucket& bucket = pool(device).buckets[cls];
    Block* b = nullptr;
    if (config_.caching) {
      detail::SpinGuard lock(bucket.lock);
      if (!bucket.pending.empty() && !worker_on_.load(std::memory_order_relaxed))
        process_pending(bucket, detail::Drain::completed);
      b = take_free(bucket, bytes);
      if (b) {
        b->allocated = true;
        bucket.stats.allocation.increase(1);
        bucket.stats.allocated_bytes.increase(static_cast<std::int64_t>(b->size));
      }
    }
    if (!b) b = allocate_new(bucket, device, cls, bytes);
    live_.insert(b->ptr, b);
    return b->ptr;
  }

  // Returns pinned memory from allocate(). RuntimeError for a pointer that
  // is not a live allocation.
  void deallocate(void* ptr) {
    if (!ptr) return;
    Block* b = live_.erase(ptr);
    if (!b)
      throw RuntimeError(Backend<R>::name,
                         fmt::format("free of pinned host pointer {}: not a live allocation of "
                                     "this allocator (double free, or memory from elsewhere)",
                                     ptr));
    Bucket& bucket = bucket_of(b);
    Pending pending{b, {}};
    bool safe = record_uses(pending);
    if (!config_.caching) {
      // Freed to the driver only after its copies have landed: a block
      // whose events cannot be waited for now is queued like a cached one,
      // and empty_cache returns it once they complete.
      bool waited = safe && wait(pending);
      detail::SpinGuard lock(bucket.lock);
      count_free(bucket, b);
      if (!safe) bucket.quarantined.push_back(b);
      else if (!waited) bucket.pending.push_back(std::move(pending));
      else free_to_driver(bucket, b);
      return;
    }
    detail::SpinGuard lock(bucket.lock);
    count_free(bucket, b);
    if (!safe) {  // never reused; returned to the driver at teardown
      bucket.quarantined.push_back(b);
      return;
    }
    if (!pending.events.empty())
      bucket.pending.push_back(std::move(pending));  // cached or freed once they land
    else if (cacheable(b))
      bucket.free.push_back(b);
    else
      free_to_driver(bucket, b);  // above pinned_max_cached_size_mb
  }

  // Marks `ptr` as used by work on `stream` of `device`: once freed, it is
  // not reused before that stream has passed the point of the free.
  void record_stream(void* ptr, device_index device, StreamHandle stream) {
    backend_.check_device(device);
    Block* b = live_.find(ptr);
    if (!b)
      throw RuntimeError(Backend<R>::name,
                         fmt::format("record_stream: pinned host pointer {} is not a live "
                                     "allocation",
                                     ptr));
    detail::SpinGuard lock(bucket_of(b).lock);
    for (const auto& u : b->uses)
      if (u.first == device && u.second == stream) return;
    b->uses.emplace_back(device, stream);
  }

  // Whether `ptr` is a live allocation of this allocator.
  bool is_allocation(const void* ptr) { return live_.find(ptr) != nullptr; }

  // The device whose host_malloc gave the live allocation at `ptr`, or
  // nullopt for other memory.
  std::optional<device_index> device_of(const void* ptr) {
    if (Block* b = live_.find(ptr)) return b->device;
    return std::nullopt;
  }

  // Returns every cached block to the driver, after waiting for pending
  // uses, and tries again those the driver refused before.
  void empty_cache() {
    for_each_bucket([&](Bucket& bucket) {
      std::vector<Block*> freed;
      {
        detail::SpinGuard lock(bucket.lock);
        if (!bucket.pending.empty()) process_pending(bucket, detail::Drain::wait_for_all);
        freed.swap(bucket.free);
        freed.insert(freed.end(), bucket.refused.begin(), bucket.refused.end());
        bucket.refused.clear();
      }
      for (Block* b : freed) {
        detail::SpinGuard lock(bucket.lock);
        free_to_driver(bucket, b);
      }
    });
  }

  // Over every device's pinned memory (torch.cuda's host_memory_stats).
  HostStats stats() {
    HostStats out;
    for_each_bucket([&](Bucket& bucket) {
      detail::SpinGuard lock(bucket.lock);
      out.merge(bucket.stats);
    });
    return out;
  }
  void reset_peak_stats() {
    for_each_bucket([&](Bucket& bucket) {
      detail::SpinGuard lock(bucket.lock);
      for (Stat* s : {&bucket.stats.allocation, &bucket.stats.segment,
                      &bucket.stats.allocated_bytes, &bucket.stats.reserved_bytes})
        s->reset_peak();
    });
  }
  void reset_accumulated_stats() {
    for_each_bucket([&](Bucket& bucket) {
      detail::SpinGuard lock(bucket.lock);
      for (Stat* s : {&bucket.stats.allocation, &bucket.stats.segment,
                      &bucket.stats.allocated_bytes, &bucket.stats.reserved_bytes})
        s->reset_accumulated();
      bucket.stats.num_host_alloc = bucket.stats.num_host_free = 0;
    });
  }

  // The settings (Note [Allocator configuration]); set_config applies the
  // pinned keys of `config` from now on (cached blocks keep their sizes).
  // ValueError where `config` turns caching on or off.
  const AllocatorConfig& config() const noexcept { return config_; }
  void set_config(const AllocatorConfig& config) {
    std::lock_guard<std::mutex> lock(worker_mutex_);
    if (config.caching != config_.caching)
      throw ValueError(Backend<R>::name,
                       fmt::format("the pinned host allocator cannot turn caching {} while it "
                                   "lives",
                                   config.caching ? "on" : "off"));
    config_ = config;
    if (config.pinned_use_background_threads) start_worker_locked();
    else stop_worker_locked();
  }

  // Freed blocks whose stream uses were not yet seen complete.
  std::size_t pending_frees() {
    std::size_t n = 0;
    for_each_bucket([&](Bucket& bucket) {
      detail::SpinGuard lock(bucket.lock);
      n += bucket.pending.size();
    });
    return n;
  }

 private:
  static constexpr std::size_t kMinClass = 9;   // 512 B
  static constexpr std::size_t kClasses = 48;   // up to 2^47 B
  static constexpr std::size_t kMaxBytes = std::size_t{1} << (kClasses - 1);

  struct Block {
    void* ptr = nullptr;
    std::size_t size = 0;
    device_index device = 0;  // whose host_malloc gave it
    std::size_t cls = 0;
    bool allocated = false;
    std::vector<std::pair<device_index, StreamHandle>> uses;
  };
  struct Pending {
    Block* block;
    std::vector<std::pair<device_index, EventHandle>> events;
  };
  struct alignas(64) Bucket {
    detail::SpinLock lock;
    std::vector<Block*> free;
    std::vector<Pending> pending;
    std::vector<Block*> quarantined;  // freed, but never to be reused (record_uses)
    std::vector<Block*> refused;      // the driver refused to free them (free_to_driver)
    HostStats stats;
  };
  // One device's size classes, made at its first pinned allocation.
  struct DevicePool {
    std::array<Bucket, kClasses> buckets;
  };

  DevicePool& pool(device_index device) {
    return pools_.get(device, backend_.device_count(),
                      [] { return std::make_unique<DevicePool>(); });
  }
  Bucket& bucket_of(const Block* b) { return pool(b->device).buckets[b->cls]; }
  // f(bucket) for every bucket of every device's pool made so far.
  template <class F>
  void for_each_bucket(F&& f) {
    pools_.for_each([&](device_index, DevicePool& p) {
      for (Bucket& bucket : p.buckets) f(bucket);
    });
  }

  static std::size_t size_class(std::size_t bytes) noexcept {
    if (bytes <= (std::size_t{1} << kMinClass)) return kMinClass;
    return static_cast<std::size_t>(64 - __builtin_clzll(bytes - 1));
  }

  // Whether a request of `bytes` is rounded up to its power of two (PyTorch's
  // pinned_max_round_threshold_mb and pinned_max_cached_size_mb).
  bool rounded(std::size_t bytes) const noexcept {
    return config_.caching && bytes <= config_.pinned_max_round_threshold &&
           bytes <= config_.pinned_max_cached_size;
  }
  // Whether a freed block returns to the cache rather than to the driver.
  bool cacheable(const Block* b) const noexcept {
    return config_.caching && b->size <= config_.pinned_max_cached_size;
  }

  // Under the bucket lock: the free block freed last that holds `bytes`
  // (blocks of a class differ in size only where requests were not rounded).
  static Block* take_free(Bucket& bucket, std::size_t bytes) noexcept {
    for (std::size_t i = bucket.free.size(); i-- > 0;) {
      Block* b = bucket.free[i];
      if (b->size < bytes) continue;
      bucket.free.erase(bucket.free.begin() + static_cast<std::ptrdiff_t>(i));
      return b;
    }
    return nullptr;
  }

  Block* allocate_new(Bucket& bucket, device_index device, std::size_t cls, std::size_t bytes) {
    std::size_t size = rounded(bytes) ? std::size_t{1} << cls : (bytes + 511) / 512 * 512;
    void* p = nullptr;
    for (int attempt = 0; attempt < 2 && !p; ++attempt) {
      try {
        p = backend_.raw_host_malloc(device, size);
      } catch (const OutOfMemoryError&) {
        if (attempt == 1 || !config_.caching)
          throw OutOfMemoryError(
              Backend<R>::name,
              fmt::format("out of pinned host memory: tried to allocate {} ({} bytes); the "
                          "cache held {} in {} blocks and was returned to the driver first",
                          detail::format_bytes(size), size,
                          detail::format_bytes(static_cast<std::uint64_t>(
                              stats().reserved_bytes.current)),
                          stats().segment.current));
        empty_cache();
      }
    }
    auto* b = new Block();
    b->ptr = p;
    b->size = size;
    b->device = device;
    b->cls = cls;
    b->allocated = true;
    detail::SpinGuard lock(bucket.lock);
    bucket.stats.segment.increase(1);
    bucket.stats.reserved_bytes.increase(static_cast<std::int64_t>(size));
    ++bucket.stats.num_host_alloc;
    bucket.stats.allocation.increase(1);
    bucket.stats.allocated_bytes.increase(static_cast<std::int64_t>(size));
    return b;
  }

  void count_free(Bucket& bucket, Block* b) {
    b->allocated = false;
    bucket.stats.allocation.decrease(1);
    bucket.stats.allocated_bytes.decrease(static_cast<std::int64_t>(b->size));
  }

  // Under the bucket lock. A block the driver refuses stays counted as
  // reserved, in `refused`, and the next empty_cache tries again; the
  // failure is reported (Note [Diagnostics]), not thrown: frees run in
  // deleters.
  void free_to_driver(Bucket& bucket, Block* b) {
    try {
      backend_.raw_host_free(b->device, b->ptr);
    } catch (const std::exception& e) {
      bool lost = backend_.is_lost(b->device);  // never to be tried again (Note [Lost devices])
      report(Severity::warning, Backend<R>::name,
             fmt::format("pinned host memory at {} ({} bytes) could not be returned to the "
                         "driver and is {}: {}",
                         b->ptr, b->size,
                         lost ? "left to it (its device is lost)"
                              : "kept for a later empty_cache",
                         e.what()));
      if (!lost) {
        bucket.refused.push_back(b);
        return;
      }
    }
    bucket.stats.segment.decrease(1);
    bucket.stats.reserved_bytes.decrease(static_cast<std::int64_t>(b->size));
    ++bucket.stats.num_host_free;
    delete b;
  }

  void delete_block(Block* b) {
    try {
      backend_.raw_host_free(b->device, b->ptr);
    } catch (...) {
      // The driver refused; nothing more can be done with the memory.
    }
    delete b;
  }

  EventPool<R>& events(device_index device) {
    return event_pools_.get(device, backend_.device_count(),
                            [&] { return std::make_unique<EventPool<R>>(backend_, device); });
  }

  // Orders the free of p's block after its uses on streams (Note
  // [Stream-use recording]); false when it must be quarantined.
  bool record_uses(Pending& p) {
    bool safe = detail::record_stream_uses(
        backend_, p.block->uses, [&](device_index d) -> EventPool<R>& { return events(d); },
        p.events, [&] { return fmt::format("pinned host memory at {}", p.block->ptr); });
    p.block->uses.clear();
    return safe;
  }

  // `completed`: the caller saw every event's record complete.
  void release_events(Pending& p, bool completed = false) {
    for (auto [device, e] : p.events) events(device).release(e, completed);
    p.events.clear();
  }

  // Waits for a freed block's events; false, keeping them, if the driver
  // could not wait for one.
  bool wait(Pending& p) {
    for (auto [device, e] : p.events) {
      try {
        backend_.event_synchronize(device, e);
      } catch (const std::exception& err) {
        report(Severity::warning, Backend<R>::name,
               fmt::format("the free of pinned host memory at {} waits for a later "
                           "empty_cache: {}",
                           p.block->ptr, err.what()));
        return false;
      }
    }
    release_events(p, /*completed=*/true);
    return true;
  }

  // Under the bucket lock (Note [Pinned host allocator]).
  void process_pending(Bucket& bucket, detail::Drain drain) {
    bool block = drain == detail::Drain::wait_for_all;
    detail::drain_pending(
        bucket.pending, block,
        [&](const Pending& p) {
          // A driver error goes to the caller; the entry stays queued.
          for (auto [device, e] : p.events) {
            if (block) backend_.event_synchronize(device, e);
            if (!backend_.event_query(device, e)) return false;
          }
          return true;
        },
        [&](Pending& p) {
          release_events(p, /*completed=*/true);
          if (cacheable(p.block)) bucket.free.push_back(p.block);
          else free_to_driver(bucket, p.block);
        });
  }

  // Note [Pinned background thread]: with pinned_use_background_threads,
  // as PyTorch's CachingHostAllocator, a thread returns the freed blocks
  // whose copies have landed to the cache every 100 us, and allocations leave
  // them to it. It runs while the key is True; a driver error it meets is
  // reported once (Note [Diagnostics]) and the entry stays queued.
  void start_worker() {
    std::lock_guard<std::mutex> lock(worker_mutex_);
    start_worker_locked();
  }
  void stop_worker() {
    std::lock_guard<std::mutex> lock(worker_mutex_);
    stop_worker_locked();
  }
  void start_worker_locked() {
    if (worker_.joinable()) return;
    worker_on_.store(true);
    worker_ = std::thread([this] {
      bool reported = false;
      std::unique_lock<std::mutex> lock(worker_wait_mutex_);
      while (worker_on_.load()) {
        lock.unlock();
        try {
          for_each_bucket([&](Bucket& bucket) {
            detail::SpinGuard guard(bucket.lock);
            if (!bucket.pending.empty()) process_pending(bucket, detail::Drain::completed);
          });
        } catch (const std::exception& e) {
          if (!reported)
            report(Severity::warning, Backend<R>::name,
                   fmt::format("the pinned memory's background thread could not query a freed "
                               "block's events; it keeps trying: {}",
                               e.what()));
          reported = true;
        }
        lock.lock();
        worker_wake_.wait_for(lock, std::chrono::microseconds(100),
                              [this] { return !worker_on_.load(); });
      }
    });
  }
  void stop_worker_locked() {
    if (!worker_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(worker_wait_mutex_);
      worker_on_.store(false);
    }
    worker_wake_.notify_all();
    worker_.join();
  }

  Backend<R>& backend_;
  AllocatorConfig config_;
  detail::PerDevice<DevicePool> pools_;
  detail::PointerMap<Block*> live_;
  detail::PerDevice<EventPool<R>> event_pools_;
  std::mutex worker_mutex_;  // starts and stops the worker; serializes set_config
  std::thread worker_;       // Note [Pinned background thread]
  std::atomic<bool> worker_on_{false};
  std::mutex worker_wait_mutex_;
  std::condition_variable worker_wake_;
  AllocatorSettings::Subscription settings_;  // last: stops listening first
};

ACCELKIT_END_NAMESPACE
