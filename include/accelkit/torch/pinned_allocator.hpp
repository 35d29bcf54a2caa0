// accelkit: pinned host memory as PyTorch's host allocator for the device
// type (pin_memory(), torch.accelerator.empty_host_cache(), host statistics).
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/errors.hpp>

#include <ATen/core/CachingHostAllocator.h>

#include <cstring>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Host allocator]
// Problem: PyTorch reaches a device type's pinned memory through two doors:
// the hooks' getPinnedMemoryAllocator (pin_memory(), pin_memory=True) and
// at::getHostAllocator(device type) (torch.accelerator.empty_host_cache(),
// the host statistics, record_event), which dereferences whatever was
// registered, nothing included: a process with a device tensor died in
// empty_host_cache.
// Decision: one object is both, an at::HostAllocator over the SDK's pinned
// pool (HostAllocator<R>), registered with at::setHostAllocator for
// PrivateUse1 as the module loads and returned by the hooks. A DataPtr's
// context is its pointer (the pool finds its block by pointer). Its
// statistics are the pool's (HostStats), in c10's shape; the Python device
// module's host_memory_stats read them through PyTorch's registry, so they
// are the same figures PyTorch sees. Before the backend is initialized
// empty_cache and the resets do nothing and the statistics are zero, as on
// CUDA; they never initialize it.
// Limits: the pool has no private pools: begin_allocate_to_pool and its
// kin keep PyTorch's NotImplementedError. record_event on a stream that is
// capturing records nothing (no event can be recorded there); the torch
// layer's own copies captured into a graph keep their pinned storage alive
// until the graph is reset instead (Note [Captured pinned copies] in
// torch/capture.hpp). The driver's host_malloc and host_free are not timed
// (host_alloc_time and host_free_time stay zero).
struct PinnedAllocator final : at::HostAllocator {
  template <class From, class To>
  static void copy_stat(const From& from, To& to) {
    to.current = from.current;
    to.peak = from.peak;
    to.allocated = from.allocated;
    to.freed = from.freed;
  }
  static void deleter(void* ptr) {
    if (!ptr || backend().in_bad_fork()) return;
    reporting_failures([&] { backend().host_deallocate(ptr); });
  }
  // Pinning for the calling thread's current device (Note [Pinned memory
  // per device]: pin_memory() names no device).
  c10::DataPtr allocate(std::size_t n) override {
    return translated([&] {
      void* p = backend().host_allocate(backend().current_device(), n);
      return c10::DataPtr(p, p, &deleter, c10::Device(c10::DeviceType::CPU));
    });
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  // The block of `ctx` (its base pointer) is not reused before `stream` has
  // passed the work queued on it so far; false for memory of another
  // allocator.
  bool record_event(void* ptr, void* ctx, c10::Stream stream) override {
    return translated([&] {
      BackendInterface& b = backend();
      if (!b.is_initialized()) return false;
      void* base = ctx && b.host_is_allocation(ctx) ? ctx : ptr;
      if (!base || !b.host_is_allocation(base)) return false;
      Stream s = from_c10(stream);
      StreamHandle h = b.handle(s);
      if (b.stream_is_capturing(s.device, h)) return true;  // Note [Host allocator]
      b.host_record_stream(base, s.device, h);
      return true;
    });
  }
  void empty_cache() override {
    translated([&] {
      if (backend().is_initialized()) backend().host_empty_cache();
    });
  }
  at::HostStats get_stats() override {
    return translated([&] {
      at::HostStats out;
      if (!backend().is_initialized()) return out;
      HostStats s = backend().host_stats();
      copy_stat(s.allocation, out.active_requests);
      copy_stat(s.allocated_bytes, out.active_bytes);
      copy_stat(s.segment, out.allocations);
      copy_stat(s.reserved_bytes, out.allocated_bytes);
      out.num_host_alloc = s.num_host_alloc;
      out.num_host_free = s.num_host_free;
      return out;
    });
  }
  // c10's host statistics in the SDK's shape (for to_json), the inverse of
  // get_stats.
  static HostStats from_c10_stats(const at::HostStats& s) {
    HostStats out;
    copy_stat(s.active_requests, out.allocation);
    copy_stat(s.active_bytes, out.allocated_bytes);
    copy_stat(s.allocations, out.segment);
    copy_stat(s.allocated_bytes, out.reserved_bytes);
    out.num_host_alloc = s.num_host_alloc;
    out.num_host_free = s.num_host_free;
    return out;
  }
  void reset_accumulated_stats() override {
    translated([&] {
      if (backend().is_initialized()) backend().host_reset_accumulated_stats();
    });
  }
  void reset_peak_stats() override {
    translated([&] {
      if (backend().is_initialized()) backend().host_reset_peak_stats();
    });
  }
};

inline PinnedAllocator& pinned_allocator() {
  static PinnedAllocator a;
  return a;
}

// The host allocator PyTorch holds for the device type (the one above,
// once the module has registered it).
inline at::HostAllocator& registered_host_allocator() {
  at::HostAllocator* a = at::getHostAllocator(kDeviceType);
  TORCH_CHECK(a, backend_name(), ": no host allocator is registered for the device type");
  return *a;
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
