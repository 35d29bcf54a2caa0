// accelkit: CachingAllocator<R>, the caching device allocators of every
// device of a backend (one DeviceCachingAllocator per device, made on first
// use), with the configuration read from <NAME>_ALLOC_CONF. The allocation
// policy is in memory/caching_allocator.hpp.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/memory/caching_allocator.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <functional>
#include <memory>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

// The caching allocators of every device of a backend, created on first use
// with the configuration from <NAME>_ALLOC_CONF (Note [Allocator
// configuration]).
template <class R>
class CachingAllocator {
 public:
  explicit CachingAllocator(Backend<R>& backend)
      : CachingAllocator(backend,
                         AllocatorConfig::from_environment(Backend<R>::name, backend.environment())) {}
  CachingAllocator(Backend<R>& backend, AllocatorConfig config)
      : backend_(backend), config_(config) {}
  // With the event pools of the stream layer, so that one set of driver
  // events serves both:
  //   CachingAllocator<R> pool(backend, config,
  //       [&](device_index d) { return &streams.events(d, EventFlags::none); });
  CachingAllocator(Backend<R>& backend, AllocatorConfig config,
                   std::function<EventPool<R>*(device_index)> event_pools)
      : backend_(backend), config_(config), event_pools_(std::move(event_pools)) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  const AllocatorConfig& config() const noexcept { return config_; }

  DeviceCachingAllocator<R>& device(device_index d) {
    if (auto* a = devices_.find(d)) return *a;  // made: no checks needed
    backend_.check_device(d);
    return devices_.get(d, backend_.device_count(), [&] {
      return event_pools_
                 ? std::make_unique<DeviceCachingAllocator<R>>(backend_, d, config_, *event_pools_(d))
                 : std::make_unique<DeviceCachingAllocator<R>>(backend_, d, config_);
    });
  }

  void* allocate(device_index d, std::size_t bytes, StreamHandle stream) {
    return device(d).allocate(bytes, stream);
  }
  void* try_allocate(device_index d, std::size_t bytes, StreamHandle stream) {
    return device(d).try_allocate(bytes, stream);
  }
  void deallocate(device_index d, void* ptr) { device(d).deallocate(ptr); }
  void record_stream(device_index d, void* ptr, StreamHandle stream) {
    device(d).record_stream(ptr, stream);
  }
  // Returns the unused cache of every device that has an allocator.
  void empty_cache() {
    devices_.for_each([](device_index, DeviceCachingAllocator<R>& a) { a.empty_cache(); });
  }
  // The same for private pool `id` on every device that has an allocator
  // (Note [Private pools]); {0, 0}: empty_cache().
  void empty_cache(MempoolId id) {
    devices_.for_each([&](device_index, DeviceCachingAllocator<R>& a) { a.empty_cache(id); });
  }

  // Private pools of device `d` (Note [Private pools]).
  void create_pool(device_index d, MempoolId id) { device(d).create_pool(id); }
  void release_pool(device_index d, MempoolId id) { device(d).release_pool(id); }
  int pool_use_count(device_index d, MempoolId id) { return device(d).pool_use_count(id); }
  void begin_allocate_to_pool(device_index d, MempoolId id,
                              std::function<bool(StreamHandle)> filter) {
    device(d).begin_allocate_to_pool(id, std::move(filter));
  }
  void end_allocate_to_pool(device_index d, MempoolId id) { device(d).end_allocate_to_pool(id); }

 private:
  Backend<R>& backend_;
  AllocatorConfig config_;
  std::function<EventPool<R>*(device_index)> event_pools_;
  detail::PerDevice<DeviceCachingAllocator<R>> devices_;
};

ACCELKIT_END_NAMESPACE
