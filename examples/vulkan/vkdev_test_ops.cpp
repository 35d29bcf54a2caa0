// Operators for vkdev's tests and benchmarks (torch.ops.vkdev_kernels),
// beside the native kernels of vkdev_kernels.cpp:
// - launches(kernel='') counts the native kernels' launches ("add", ...,
//   "" for all), so a test can tell a kernel ran, not the fallback;
//   enabled() says whether they were registered (VKDEV_NATIVE_KERNELS);
// - add_directly(a, b, out, iters, per_submit=False) runs the native `add`
//   shader's pipeline `iters` times with raw Vulkan calls on a command
//   buffer of its own: recorded as the backend records it (a barrier, the
//   pipeline, push descriptors and constants, vkCmdDispatch), ended,
//   vkQueueSubmit with a fence and vkWaitForFences; all `iters` dispatches
//   in one submission, or (per_submit) one submission and wait per
//   dispatch;
// - copy_directly(src, dst, bytes, iters) copies the first `bytes` bytes of
//   src to dst `iters` times with vkCmdCopyBuffer, one submission and fence
//   wait per copy, as the backend's device-to-device copy followed by a
//   synchronize does.
// These bypass the streams: synchronize the device (torch.vkdev.synchronize)
// before them where the stream may still write their operands. They are the
// baselines of bench/vkdev_bench.py.
#include <accelkit/torch/kernels.hpp>

#include "vkdev_kernels.hpp"

#include <array>
#include <map>
#include <mutex>
#include <string>

namespace {
using K = accelkit::Kernels<vkdev::VulkanRuntime>;

void check(VkResult r, const char* call) {
  TORCH_CHECK(r == VK_SUCCESS, "vkdev: ", call, " failed: VkResult ", static_cast<int>(r));
}

// A command pool, one command buffer and a fence of a device's queue family,
// created at the first direct call there and kept; calls on one device take
// turns (its mutex).
struct Direct {
  VkDevice dev = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  VkCommandBuffer cb = VK_NULL_HANDLE;
  VkFence fence = VK_NULL_HANDLE;
  std::mutex mutex;
};
std::mutex directs_mutex;
std::map<int, Direct> directs;

Direct& direct(int device) {
  std::lock_guard<std::mutex> lock(directs_mutex);
  Direct& d = directs[device];
  if (d.fence) return d;
  vkdev::VulkanRuntime& rt = K::runtime();
  d.dev = K::translated([&] { return rt.logical(device).device; });
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO};
  pi.flags = VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT;
  pi.queueFamilyIndex = K::translated([&] { return rt.physical(device).family; });
  if (!d.pool) check(vkCreateCommandPool(d.dev, &pi, nullptr, &d.pool), "vkCreateCommandPool");
  if (!d.cb) {
    VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO};
    ai.commandPool = d.pool;
    ai.level = VK_COMMAND_BUFFER_LEVEL_PRIMARY;
    ai.commandBufferCount = 1;
    check(vkAllocateCommandBuffers(d.dev, &ai, &d.cb), "vkAllocateCommandBuffers");
  }
  VkFenceCreateInfo fi{VK_STRUCTURE_TYPE_FENCE_CREATE_INFO};
  check(vkCreateFence(d.dev, &fi, nullptr, &d.fence), "vkCreateFence");
  return d;
}

// Records f(cb) on d's command buffer, submits it with d's fence and waits.
template <class F>
void submit_and_wait(int device, Direct& d, F&& record) {
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO};
  bi.flags = VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT;
  check(vkBeginCommandBuffer(d.cb, &bi), "vkBeginCommandBuffer");
  record(d.cb);
  check(vkEndCommandBuffer(d.cb), "vkEndCommandBuffer");
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO};
  si.commandBufferCount = 1;
  si.pCommandBuffers = &d.cb;
  VkResult r = K::translated([&] {
    return K::runtime().with_queue(device, [&](VkQueue q) { return vkQueueSubmit(q, 1, &si, d.fence); });
  });
  check(r, "vkQueueSubmit");
  check(vkWaitForFences(d.dev, 1, &d.fence, VK_TRUE, UINT64_MAX), "vkWaitForFences");
  check(vkResetFences(d.dev, 1, &d.fence), "vkResetFences");
}

void expect_tensor(const at::Tensor& t, const at::Tensor& like, const char* what) {
  TORCH_CHECK_VALUE(t.device().type() == c10::DeviceType::PrivateUse1 && t.device() == like.device(),
                    "vkdev: ", what, ": expected tensors of one vkdev device, got ",
                    t.device().str());
}

void add_directly(const at::Tensor& a, const at::Tensor& b, const at::Tensor& out,
                  std::int64_t iters, bool per_submit) {
  for (const at::Tensor* t : {&a, &b, &out}) {
    expect_tensor(*t, a, "add_directly");
    TORCH_CHECK_VALUE(t->scalar_type() == at::kFloat && t->is_contiguous() &&
                          t->numel() == a.numel(),
                      "vkdev: add_directly: expected contiguous float32 tensors of one size");
  }
  TORCH_CHECK_VALUE(iters >= 0, "vkdev: add_directly: iters=", iters, ": expected >= 0");
  TORCH_CHECK_VALUE(a.numel() > 0 && a.numel() <= (1 << 24),
                    "vkdev: add_directly: ", a.numel(), " elements: expected 1 to 2^24");
  int device = static_cast<int>(K::physical_device(a));
  const vkdev::kernels::Pipelines* p = K::translated([&] { return &vkdev::kernels::pipelines(device); });
  TORCH_CHECK(p->push_descriptors, "vkdev: add_directly: device ", device, " has no VK_KHR_push_descriptor");
  std::array<VkDescriptorBufferInfo, 3> bs{};
  std::array<std::uint32_t, 3> offs{};
  const at::Tensor* ts[3] = {&out, &a, &b};
  for (int i = 0; i < 3; ++i) {
    auto element = vkdev::kernels::bind(*p, device, ts[i]->const_data_ptr(),
                                        static_cast<std::size_t>(a.numel()) * sizeof(float), bs[i]);
    TORCH_CHECK(element, "vkdev: add_directly: a tensor's span exceeds one storage-buffer binding");
    offs[i] = *element;
  }
  vkdev::kernels::Geom g{};
  g.n = static_cast<std::uint32_t>(a.numel());
  g.ndim = 1;
  g.op = static_cast<std::uint32_t>(vkdev::kernels::Op::add);
  g.s = 1.0f;
  g.off_o = offs[0];
  g.off_a = offs[1];
  g.off_b = offs[2];
  g.size[0] = g.n;
  g.so[0] = g.sa[0] = g.sb[0] = 1;
  auto groups = static_cast<std::uint32_t>(std::min<std::uint64_t>((g.n + 63) / 64, 65535));
  Direct& d = direct(device);
  std::lock_guard<std::mutex> lock(d.mutex);
  auto record = [&](VkCommandBuffer cb) {
    vkdev::vulkan::dispatch(cb, p->push_descriptors, p->elementwise, bs.data(), &g, groups, 1);
  };
  if (per_submit) {
    for (std::int64_t i = 0; i < iters; ++i) submit_and_wait(device, d, record);
  } else if (iters > 0) {
    submit_and_wait(device, d, [&](VkCommandBuffer cb) {
      for (std::int64_t i = 0; i < iters; ++i) record(cb);
    });
  }
}

void copy_directly(const at::Tensor& src, const at::Tensor& dst, std::int64_t bytes,
                   std::int64_t iters) {
  expect_tensor(src, src, "copy_directly");
  expect_tensor(dst, src, "copy_directly");
  auto have = [](const at::Tensor& t) { return static_cast<std::int64_t>(t.storage().nbytes()); };
  TORCH_CHECK_VALUE(bytes > 0 && bytes <= have(src) - static_cast<std::int64_t>(src.storage_offset() * src.element_size()) &&
                        bytes <= have(dst) - static_cast<std::int64_t>(dst.storage_offset() * dst.element_size()),
                    "vkdev: copy_directly: bytes=", bytes, ": expected 1 to the tensors' bytes");
  TORCH_CHECK_VALUE(iters >= 0, "vkdev: copy_directly: iters=", iters, ": expected >= 0");
  int device = static_cast<int>(K::physical_device(src));
  auto n = static_cast<std::size_t>(bytes);
  vkdev::BufferRef s = K::translated([&] { return K::runtime().locate(device, src.const_data_ptr(), n, "vkCmdCopyBuffer"); });
  vkdev::BufferRef t = K::translated([&] { return K::runtime().locate(device, dst.const_data_ptr(), n, "vkCmdCopyBuffer"); });
  VkBufferCopy region{s.offset, t.offset, n};
  Direct& d = direct(device);
  std::lock_guard<std::mutex> lock(d.mutex);
  for (std::int64_t i = 0; i < iters; ++i)
    submit_and_wait(device, d, [&](VkCommandBuffer cb) { vkCmdCopyBuffer(cb, s.buffer, t.buffer, 1, &region); });
}
}  // namespace

TORCH_LIBRARY(vkdev_kernels, m) {
  m.def("launches(str kernel='') -> int", [](c10::string_view k) {
    return vkdev::kernels::launches(std::string_view(k.data(), k.size()));
  });
  m.def("enabled() -> bool", [] { return vkdev::kernels::enabled(); });
  m.def("add_directly(Tensor a, Tensor b, Tensor(a!) out, int iters, bool per_submit=False) -> ()",
        &add_directly);
  m.def("copy_directly(Tensor src, Tensor(a!) dst, int bytes, int iters) -> ()", &copy_directly);
}
