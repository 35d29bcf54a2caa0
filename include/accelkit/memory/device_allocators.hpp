// accelkit: CachingAllocator<R>, the caching device allocators of every
// device of a backend (one DeviceCachingAllocator per device, made on first
// use), with the settings of Note [Allocator configuration]: the
// environment's, and those applied at run time (Note [Run-time allocator
// settings]). The allocation policy is in memory/caching_allocator.hpp.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/error.hpp>
#include <accelkit/memory/caching_allocator.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

// The caching allocators of every device of a backend, created on first use
// with the current settings (Note [Allocator configuration]); it listens to
// AllocatorSettings::process() while it lives.
template <class R>
class CachingAllocator {
 public:
  explicit CachingAllocator(Backend<R>& backend)
      : CachingAllocator(backend,
                         AllocatorConfig::from_environment(Backend<R>::name, backend.environment())) {}
  CachingAllocator(Backend<R>& backend, AllocatorConfig config)
      : backend_(backend), config_(config) {
    listen();
  }
  // With the event pools of the stream layer, so that one set of driver
  // events serves both:
  //   CachingAllocator<R> pool(backend, config,
  //       [&](device_index d) { return &streams.events(d, EventFlags::none); });
  CachingAllocator(Backend<R>& backend, AllocatorConfig config,
                   std::function<EventPool<R>*(device_index)> event_pools)
      : backend_(backend), config_(config), event_pools_(std::move(event_pools)) {
    listen();
  }
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // The settings of every device's allocator, and of those made later.
  const AllocatorConfig& config() const noexcept { return config_; }

  // Applies `config` to every device's allocator (DeviceCachingAllocator::
  // set_config) and to those made later; `fraction`: also sets each one's
  // memory fraction to config.memory_fraction (set_memory_fraction), as
  // where a settings string names per_process_memory_fraction.
  // NotSupportedError for expandable_segments on a runtime without the
  // virtual-memory members; nothing changes then.
  void set_config(const AllocatorConfig& config, bool fraction = false) {
    check(config);
    std::lock_guard<std::mutex> lock(settings_mutex_);
    devices_.for_each([&](device_index, DeviceCachingAllocator<R>& a) {
      a.set_config(config);
      if (fraction) a.set_memory_fraction(config.memory_fraction);
    });
    config_ = config;
  }

  DeviceCachingAllocator<R>& device(device_index d) {
    if (auto* a = devices_.find(d)) return *a;  // made: no checks needed
    backend_.check_device(d);
    // Made under the settings' lock: set_config reaches it or it starts from them.
    std::lock_guard<std::mutex> lock(settings_mutex_);
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
  std::vector<MempoolId> pool_ids(device_index d) { return device(d).pool_ids(); }
  void begin_allocate_to_pool(device_index d, MempoolId id,
                              std::function<bool(StreamHandle)> filter) {
    device(d).begin_allocate_to_pool(id, std::move(filter));
  }
  void end_allocate_to_pool(device_index d, MempoolId id) { device(d).end_allocate_to_pool(id); }

 private:
  void check(const AllocatorConfig& c) const {
    if (c.expandable_segments && !Backend<R>::has_virtual_memory())
      throw NotSupportedError(
          Backend<R>::name,
          fmt::format("expandable_segments:True needs the runtime's virtual-memory members "
                      "(vm_granularity, vm_reserve, vm_release, vm_create, vm_destroy, vm_map, "
                      "vm_unmap), which {} lacks",
                      Backend<R>::name));
  }
  // Starts from the settings applied at run time so far and hears later ones.
  void listen() {
    settings_ = AllocatorSettings::process().listen(
        Backend<R>::name, config_, [this](std::string_view text) -> std::function<void()> {
          AllocatorConfig next =
              AllocatorConfig::parse(Backend<R>::name, "allocator settings", text, config_);
          check(next);
          bool fraction = AllocatorConfig::names(text, "per_process_memory_fraction");
          return [this, next, fraction] { set_config(next, fraction); };
        });
    check(config_);
  }

  Backend<R>& backend_;
  AllocatorConfig config_;
  std::function<EventPool<R>*(device_index)> event_pools_;
  std::mutex settings_mutex_;  // set_config, and making a device's allocator
  detail::PerDevice<DeviceCachingAllocator<R>> devices_;
  AllocatorSettings::Subscription settings_;  // last: stops listening first
};

ACCELKIT_END_NAMESPACE
