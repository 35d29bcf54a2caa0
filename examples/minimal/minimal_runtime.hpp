// minimal: the smallest runtime that passes accelkit's conformance kit. One
// device whose memory is host memory, and every operation synchronous: work
// "queued" on a stream is done before the call returns, so every stream is
// always idle and every event always complete. A real driver's runtime is
// longer (examples/simdev, templates/vendor_backend); this one shows what
// the contract asks for and nothing more.
#pragma once

#include <accelkit/accelkit.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace minimal {

class MinimalRuntime : public accelkit::Runtime<MinimalRuntime> {
 public:
  static constexpr std::string_view name = "minimal";
  static constexpr std::size_t capacity = std::size_t{256} << 20;
  static constexpr std::size_t alignment = 256;
  using device_index = accelkit::device_index;
  using StreamHandle = accelkit::StreamHandle;
  using EventHandle = accelkit::EventHandle;

  int device_count() { return 1; }
  accelkit::DeviceProperties properties(device_index) {
    accelkit::DeviceProperties p;
    p.name = "minimal host device";
    p.vendor = "accelkit";
    p.uuid = "00000000-0000-4000-8000-6d696e696d61";
    p.driver_version = p.runtime_version = {1, 0, 0};
    p.total_memory = p.max_allocation = capacity;
    p.memory_alignment = alignment;
    p.compute_units = p.subgroup_size = 1;
    p.clock_rate_khz = 1000000;
    p.dtypes = accelkit::DTypeSet::all();
    p.unified_memory = true;
    p.host_access = accelkit::HostAccessLevel::direct;
    return p;
  }
  device_index get_device() { return 0; }
  void set_device(device_index) {}

  // Device memory: host memory counted against the capacity, its size kept
  // in a header of one alignment unit before the block.
  void* malloc(device_index, std::size_t bytes) {
    std::size_t size = round_up(bytes);
    if (used_.fetch_add(size) + size > capacity) {
      used_.fetch_sub(size);
      return nullptr;
    }
    auto* block = static_cast<char*>(std::aligned_alloc(alignment, size + alignment));
    if (!block) {
      used_.fetch_sub(size);
      return nullptr;
    }
    std::memcpy(block, &size, sizeof size);
    return block + alignment;
  }
  void free(device_index, void* ptr) {
    char* block = static_cast<char*>(ptr) - alignment;
    std::size_t size;
    std::memcpy(&size, block, sizeof size);
    used_.fetch_sub(size);
    std::free(block);
  }
  void* host_malloc(device_index, std::size_t bytes) {
    return std::aligned_alloc(alignment, round_up(bytes));
  }
  void host_free(device_index, void* ptr) { std::free(ptr); }

  void memcpy(device_index, void* dst, const void* src, std::size_t bytes, accelkit::CopyKind) {
    std::memmove(dst, src, bytes);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, StreamHandle, bool) {
    memcpy(d, dst, src, bytes, kind);
  }
  void memset_async(device_index, void* ptr, int value, std::size_t bytes, StreamHandle) {
    std::memset(ptr, value, bytes);
  }

  // Streams and events: handles only (nothing is ever pending).
  StreamHandle stream_create(device_index, int) { return StreamHandle{++handles_}; }
  void stream_destroy(device_index, StreamHandle) {}
  bool stream_query(device_index, StreamHandle) { return true; }
  void stream_synchronize(device_index, StreamHandle) {}
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}
  EventHandle event_create(device_index, accelkit::EventFlags) { return EventHandle{++handles_}; }
  void event_destroy(device_index, EventHandle) {}
  void event_record(device_index, EventHandle, StreamHandle) {}
  bool event_query(device_index, EventHandle) { return true; }
  void event_synchronize(device_index, EventHandle) {}
  void device_synchronize(device_index) {}

 private:
  static std::size_t round_up(std::size_t bytes) {
    return (bytes + alignment - 1) / alignment * alignment;
  }
  std::atomic<std::size_t> used_{0};
  std::atomic<std::uintptr_t> handles_{0};
};

}  // namespace minimal
