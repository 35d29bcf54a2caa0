// skel's runtime: accelkit's Runtime contract over your driver, the one
// class you write. Out of the box each member is wired to host memory (one
// device, every operation done before the call returns), so that the
// project builds, passes accelkit's conformance kit and runs as a PyTorch
// device before any driver is involved. Replace each body with the driver
// call named in its comment ("Driver:", in CUDA's names). What each member
// must do is accelkit's docs/contract.md (the same table opens
// <accelkit/runtime.hpp>); docs/porting.md goes member by member through
// the driver calls and the rules the kit checks.
#pragma once

#include <accelkit/accelkit.hpp>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace skel {

class SkelRuntime : public accelkit::Runtime<SkelRuntime> {
 public:
  // Here: device="skel", torch.skel, and the SDK's variables
  // SKEL_VISIBLE_DEVICES, SKEL_ALLOC_CONF, SKEL_FALLBACK. Settings of the
  // runtime's own: SKEL_* variables (SKEL_DEVICE_COUNT...).
  static constexpr std::string_view name = "skel";

  using device_index = accelkit::device_index;
  using CopyKind = accelkit::CopyKind;
  using StreamHandle = accelkit::StreamHandle;
  using EventHandle = accelkit::EventHandle;
  using EventFlags = accelkit::EventFlags;

  // Driver: cuDeviceGetCount. A driver that starts threads at its first
  // query also declares
  //   static constexpr bool fork_safe_discovery = false;
  int device_count() { return 1; }

  // Driver: cuDeviceGetName, cuDeviceGetAttribute, cuDeviceTotalMem... Leave
  // uuid empty when the driver has none (the SDK derives a stable one);
  // memory_alignment is what malloc guarantees.
  accelkit::DeviceProperties properties(device_index) {
    accelkit::DeviceProperties p;
    p.name = "skel host device";
    p.vendor = "skel";
    p.uuid = "00000000-0000-4000-8000-736b656c0000";
    p.driver_version = {1, 0, 0};
    p.runtime_version = {1, 0, 0};
    p.total_memory = capacity;
    p.max_allocation = capacity;
    p.memory_alignment = alignment;
    p.compute_units = 1;
    p.subgroup_size = 1;
    p.clock_rate_khz = 1000000;
    p.dtypes = accelkit::DTypeSet::all();
    // The host may touch device pointers at any time: PyTorch's CPU kernels
    // then run in place. `mapped` for memory the host reaches only between
    // host_map (which returns the host address) and host_unmap, `none` for
    // memory behind a bus (the SDK copies instead), as for memory the
    // driver names by handle (docs/porting.md's recipe).
    p.unified_memory = true;
    p.host_access = accelkit::HostAccessLevel::direct;
    p.stream_priorities = accelkit::StreamPriorityRange::from_levels(1);
    p.event_timing = true;  // event_elapsed_time below
    return p;
  }

  // Driver: cuCtxGetDevice / cuCtxSetCurrent (per calling thread).
  device_index get_device() { return current_; }
  void set_device(device_index device) { current_ = device; }

  // Driver: cuMemAlloc / cuMemFree.
  void* malloc(device_index, std::size_t bytes) {
    std::size_t size = round_up(bytes);
    if (used_.fetch_add(size) + size > capacity) {
      used_.fetch_sub(size);
      return nullptr;
    }
    void* p = std::aligned_alloc(alignment, size);
    if (!p) {
      used_.fetch_sub(size);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    sizes_[p] = size;
    return p;
  }
  void free(device_index, void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = sizes_.find(ptr);
      if (it == sizes_.end()) driver_error(1, "free", "not a pointer from malloc");
      used_.fetch_sub(it->second);
      sizes_.erase(it);
    }
    std::free(ptr);
  }
  // Driver: cuMemHostAlloc (CU_MEMHOSTALLOC_PORTABLE) / cuMemFreeHost.
  void* host_malloc(device_index, std::size_t bytes) {
    return std::aligned_alloc(alignment, round_up(bytes));
  }
  void host_free(device_index, void* ptr) { std::free(ptr); }

  // Driver: cuMemcpy.
  void memcpy(device_index, void* dst, const void* src, std::size_t bytes, CopyKind) {
    std::memmove(dst, src, bytes);
  }
  // Driver: cuMemcpyAsync. Here the copy is done before returning, which
  // is right whatever host_pinned says.
  void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                    CopyKind kind, StreamHandle, bool /*host_pinned*/) {
    memcpy(device, dst, src, bytes, kind);
  }
  // Driver: cuMemsetD8Async.
  void memset_async(device_index, void* ptr, int value, std::size_t bytes, StreamHandle) {
    std::memset(ptr, value, bytes);
  }

  // Driver: cuStreamCreateWithPriority / cuStreamDestroy / cuStreamQuery /
  // cuStreamSynchronize / cuStreamWaitEvent. Here work is done when queued:
  // every stream is idle.
  StreamHandle stream_create(device_index, int) { return StreamHandle{++handles_}; }
  void stream_destroy(device_index, StreamHandle) {}
  bool stream_query(device_index, StreamHandle) { return true; }
  void stream_synchronize(device_index, StreamHandle) {}
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}

  // Driver: cuEventCreate / cuEventDestroy / cuEventRecord / cuEventQuery /
  // cuEventSynchronize. Here a record completes at once, so it keeps only
  // its time, for event_elapsed_time.
  EventHandle event_create(device_index, EventFlags) {
    EventHandle e{++handles_};
    std::lock_guard<std::mutex> lock(mutex_);
    recorded_[e.value] = {};
    return e;
  }
  void event_destroy(device_index, EventHandle event) {
    std::lock_guard<std::mutex> lock(mutex_);
    recorded_.erase(event.value);
  }
  void event_record(device_index, EventHandle event, StreamHandle) {
    std::lock_guard<std::mutex> lock(mutex_);
    recorded_[event.value] = std::chrono::steady_clock::now();
  }
  bool event_query(device_index, EventHandle) { return true; }
  void event_synchronize(device_index, EventHandle) {}
  // Optional. Driver: cuEventElapsedTime.
  float event_elapsed_time(device_index, EventHandle start, EventHandle end) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto a = recorded_.find(start.value), b = recorded_.find(end.value);
    if (a == recorded_.end() || b == recorded_.end() || a->second == Time{} ||
        b->second == Time{})
      driver_error(2, "event_elapsed_time", "both events must be recorded");
    return std::chrono::duration<float, std::milli>(b->second - a->second).count();
  }

  // Driver: cuCtxSynchronize.
  void device_synchronize(device_index) {}

 private:
  using Time = std::chrono::steady_clock::time_point;
  static constexpr std::size_t capacity = std::size_t{256} << 20;  // bytes
  static constexpr std::size_t alignment = 256;
  static std::size_t round_up(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }

  static inline thread_local device_index current_ = 0;
  std::atomic<std::size_t> used_{0};
  std::atomic<std::uintptr_t> handles_{0};
  std::mutex mutex_;
  std::unordered_map<void*, std::size_t> sizes_;
  std::unordered_map<std::uintptr_t, Time> recorded_;
};

}  // namespace skel
