// vkdev's native kernels (vkdev_kernels.cpp): what the test and benchmark
// operators (vkdev_test_ops.cpp) reach of them.
#pragma once

#include "vkdev_runtime.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace vkdev::kernels {

// Dims of a kernel's layout once mergeable dims are merged (more: the
// fallback).
inline constexpr int kMaxDims = 4;

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

// One compute pipeline: its shader's storage buffers are push descriptors
// (set 0, bindings 0..bindings-1), its parameters push constants.
struct Pipeline {
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  std::uint32_t bindings = 0;
  std::uint32_t push_bytes = 0;
};

// The pipelines of one (physical) device, created at its first launch and
// kept for the program's life (Note [vkdev pipelines]).
struct Pipelines {
  Pipeline elementwise, addmm, sum, sum_serial;
  PFN_vkCmdPushDescriptorSetKHR push_descriptors = nullptr;
  VkDeviceSize offset_alignment = 256;  // minStorageBufferOffsetAlignment
  VkDeviceSize max_range = 1u << 27;    // maxStorageBufferRange
};

// The pipelines of a physical device (thread-safe; created once); without
// VK_KHR_push_descriptor, none (push_descriptors null: the kernels take the
// fallback). A failed creation is a RuntimeError naming the backend, the
// device and the Vulkan call, raised again at each later call.
const Pipelines* pipelines(int device);

// A storage-buffer binding of `bytes` at device pointer `p` (Note [vkdev
// kernel bindings]): the descriptor's buffer range and the element offset
// of `p` in it; false where the span does not fit one binding.
struct Binding {
  VkDescriptorBufferInfo info;
  std::uint32_t element;
};
bool bind(const Pipelines& p, int device, const void* ptr, std::size_t bytes, Binding& out);

// Records a compute barrier (earlier compute and transfer writes visible to
// the dispatch), the pipeline, its push descriptors and push constants and
// vkCmdDispatch(x, y, 1) on `cb`.
void record_dispatch(VkCommandBuffer cb, const Pipelines& p, const Pipeline& pl,
                     const Binding* bindings, const void* push, std::uint32_t x, std::uint32_t y);

// How many times each native kernel ran since the library was loaded:
// "add" (add, sub and their in-place forms), "mul", "relu",
// "threshold_backward", "mm", "addmm", "sum", or "" for all (ValueError
// for another name).
std::int64_t launches(std::string_view kernel);

// Whether the kernels were registered (VKDEV_NATIVE_KERNELS, read at load).
bool enabled();

}  // namespace vkdev::kernels
