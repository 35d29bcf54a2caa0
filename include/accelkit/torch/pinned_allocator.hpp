// accelkit: pinned host memory as PyTorch's allocator for pin_memory().
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/errors.hpp>

#include <cstring>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Pinned host memory for pin_memory(): a CPU allocator over HostAllocator,
// pinning for the calling thread's current device (Note [Pinned memory per
// device]: pin_memory() names no device).
struct PinnedAllocator final : c10::Allocator {
  static void deleter(void* ptr) {
    if (!ptr || backend().in_bad_fork()) return;
    reporting_failures([&] { backend().host_deallocate(ptr); });
  }
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
};

inline PinnedAllocator& pinned_allocator() {
  static PinnedAllocator a;
  return a;
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
