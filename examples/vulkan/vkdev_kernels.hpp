// vkdev's native kernels (vkdev_kernels.cpp): what the test and benchmark
// operators (vkdev_test_ops.cpp) reach of them.
#pragma once

#include "vkdev_runtime.hpp"

#include <cstdint>
#include <string_view>

namespace vkdev::kernels {

inline constexpr int kMaxDims = 4;  // of a kernel's layout once dims are merged

// The push constants of elementwise.comp (std430: 96 bytes). Every shader's
// push constants start with the element offsets of its bindings, in order.
struct Geom {
  std::uint32_t off_o, off_a, off_b, n, ndim, op;
  float s;
  std::uint32_t pad;
  std::uint32_t size[kMaxDims], so[kMaxDims], sa[kMaxDims], sb[kMaxDims];
};
static_assert(sizeof(Geom) == 96);

// What elementwise.comp computes: out = f(a, b, s).
enum class Op : std::uint32_t {
  add = 0,                 // a + s * b
  mul = 1,                 // a * b
  relu = 2,                // a > 0 or NaN ? a : 0
  threshold_backward = 3,  // b <= s ? 0 : a
  add_scalar = 4,          // a + s
  mul_scalar = 5,          // a * s
};

// The pipelines of one (physical) device (Note [vkdev pipelines]).
struct Pipelines {
  vulkan::ComputePipeline elementwise, addmm, sum, sum_serial;
  PFN_vkCmdPushDescriptorSetKHR push_descriptors = nullptr;  // null: none made
  VkPhysicalDeviceLimits limits{};  // the storage-buffer bindings'
};

// A device's pipelines, made at the first call there (thread-safe); a failed
// creation is a RuntimeError naming the device and the Vulkan call, raised
// again at each later call. Without VK_KHR_push_descriptor, none.
const Pipelines& pipelines(int device);

// The storage-buffer binding of `bytes` at device pointer `ptr` (Note [vkdev
// kernel bindings]) and the element offset of `ptr` in it; nullopt where the
// span does not fit one binding.
std::optional<std::uint32_t> bind(const Pipelines& p, int device, const void* ptr,
                                  std::size_t bytes, VkDescriptorBufferInfo& info);

// Launches of "add" (add, sub and their in-place forms), "mul", "relu",
// "threshold_backward", "mm", "addmm", "sum", or "" for all.
std::int64_t launches(std::string_view kernel);
bool enabled();  // registered (VKDEV_NATIVE_KERNELS, read at load)

}  // namespace vkdev::kernels
