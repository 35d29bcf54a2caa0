// vkdev's native kernels: GLSL compute shaders (shaders/*.comp, SPIR-V
// headers built with the library) for the hot operators of a training step,
// registered through accelkit's vendor-kernel API (kernels.hpp) and recorded
// on the current stream's command buffer (VulkanRuntime::enqueue):
//   add, sub, mul (.Tensor, and in place where the output does not partly
//   overlap an input: SGD's _foreach_add_ runs add_ per parameter), relu,
//   threshold_backward: float32, broadcast, any strides (at most 4 dims once
//   mergeable dims are merged), or a float32 tensor and a Python number
//   mm, addmm: 2-d float32 of any strides, addmm's bias broadcast, any beta
//   and alpha (beta 0 ignores the bias)
//   sum, sum.dim_IntList: float32, any dims, keepdim, any strides.
// Everything else goes through the SDK's CPU fallback (Kernels<R>::fallback),
// which computes, or raises, as the CPU does. Outputs come from the caching
// pool on the current stream, made without the dispatcher; inputs are
// recorded on that stream. VKDEV_NATIVE_KERNELS=0 at load leaves the kernels
// unregistered.
//
// Note [vkdev pipelines]
// Problem: the driver compiles a pipeline from SPIR-V per device; a compile
// per launch is far too slow, and descriptor sets would need pools per thread.
// Decision: a device's pipelines are created at its first launch, under one
// mutex, and kept for the program's life (recorded work may use them until
// its stream completes). Buffers are push descriptors (VK_KHR_push_descriptor)
// and parameters push constants: recording a launch allocates nothing and
// takes no lock beyond the stream's. A failed creation is kept and raised
// again by each later launch on that device.
// Limits: nothing is retried; without VK_KHR_push_descriptor every operator
// takes the fallback.
//
// Note [vkdev kernel bindings]
// Problem: a tensor is a span of a VkBuffer (a pool block, a view at an
// offset), and one storage-buffer binding covers at most
// maxStorageBufferRange bytes (128 MiB on lavapipe) from an offset aligned to
// minStorageBufferOffsetAlignment, so a large pool block cannot be bound whole.
// Decision: each operand binds its buffer from its offset rounded down to the
// alignment to the end of the tensor's span; the shader gets the element
// offset of the first element in that range, and element strides, as push
// constants (32-bit indices).
// Limits: a tensor whose span exceeds maxStorageBufferRange takes the fallback.
#include <accelkit/torch/kernels.hpp>

#include "vkdev_kernels.hpp"

#include <ATen/ExpandUtils.h>
#include <ATen/core/DimVector.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/threshold_backward_ops.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>

namespace vkdev::spv {
#include "addmm.h"
#include "elementwise.h"
#include "sum.h"
#include "sum_serial.h"
}  // namespace vkdev::spv

namespace vkdev::kernels {
namespace {

using K = accelkit::Kernels<VulkanRuntime>;
using Opt = std::optional<at::Tensor>;
using accelkit::broadcast_strides, accelkit::distinct_elements, accelkit::empty_output,
    accelkit::merge_dims, accelkit::real_number, accelkit::same_or_disjoint, accelkit::span_bytes;

struct MatmulParams {  // addmm.comp's push constants
  std::uint32_t off_o, off_a, off_b, off_c, m, n, k, has_bias, sa0, sa1, sb0, sb1, sc0, sc1;
  float alpha, beta;
};
struct Red {  // sum.comp's and sum_serial.comp's
  std::uint32_t off_o, off_a, nout, nred, nk, nr, pad0, pad1;
  std::uint32_t ksize[kMaxDims], kstride[kMaxDims], rsize[kMaxDims], rstride[kMaxDims];
};
static_assert(sizeof(MatmulParams) == 64 && sizeof(Red) == 96);
constexpr std::uint32_t kGroup = 64;         // local_size_x of elementwise, addmm, sum_serial
constexpr std::uint32_t kBlock = 4;          // addmm.comp's output block edge
constexpr std::uint32_t kMaxGroups = 65535;  // maxComputeWorkGroupCount's guaranteed minimum
constexpr std::int64_t kMax32 = std::numeric_limits<std::uint32_t>::max();

constexpr std::array<const char*, 7> kNames = {"add", "mul", "relu", "threshold_backward",
                                               "mm", "addmm", "sum"};
enum Counter { c_add, c_mul, c_relu, c_threshold_backward, c_mm, c_addmm, c_sum };
std::array<std::atomic<std::int64_t>, kNames.size()> counters{};

std::mutex create_mutex;  // Note [vkdev pipelines]
std::map<int, std::unique_ptr<Pipelines>> created;  // by physical device, never erased
std::map<int, std::string> failed;                  // a failed creation's message
std::array<std::atomic<const Pipelines*>, 64> ready{};  // devices 0..63 once created

// Creates `pl` from SPIR-V; the Vulkan call that failed, or nullptr.
const char* create(VkDevice dev, Pipeline& pl, const std::uint32_t* code, std::size_t bytes,
                   std::uint32_t bindings, std::uint32_t push_bytes, VkResult& r) {
  pl.bindings = bindings;
  pl.push_bytes = push_bytes;
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, nullptr, 0, bytes, code};
  if ((r = vkCreateShaderModule(dev, &mi, nullptr, &pl.module)) != VK_SUCCESS)
    return "vkCreateShaderModule";
  std::array<VkDescriptorSetLayoutBinding, 4> b{};
  for (std::uint32_t i = 0; i < bindings; ++i)
    b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, nullptr,
                                     VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
                                     bindings, b.data()};
  if ((r = vkCreateDescriptorSetLayout(dev, &li, nullptr, &pl.set_layout)) != VK_SUCCESS)
    return "vkCreateDescriptorSetLayout";
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, nullptr, 0, 1,
                                &pl.set_layout, 1, &range};
  if ((r = vkCreatePipelineLayout(dev, &pi, nullptr, &pl.layout)) != VK_SUCCESS)
    return "vkCreatePipelineLayout";
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0,
              VK_SHADER_STAGE_COMPUTE_BIT, pl.module, "main", nullptr};
  ci.layout = pl.layout;
  r = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &pl.pipeline);
  if (r != VK_SUCCESS) return "vkCreateComputePipelines";
  return nullptr;
}

// A float32 tensor of vkdev's device `like` (the kernels' one dtype).
bool f32(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1 &&
         t.device() == like.device() && t.scalar_type() == at::kFloat && !t.is_conj() &&
         !t.is_neg();
}
bool f32(const at::Tensor& t) { return f32(t, t); }
// The current stream of `like`'s device and its pipelines; nullopt where the
// device has none (no push descriptors).
std::optional<std::pair<accelkit::KernelStream, const Pipelines*>> target(const at::Tensor& like) {
  accelkit::KernelStream st = K::current_stream(like);
  const Pipelines* p = K::translated([&] { return pipelines(st.device); });
  if (!p->push_descriptors) return std::nullopt;
  return std::make_pair(st, p);
}

// Binds the operands `ts` (the output first; false where one does not fit a
// binding), writes their element offsets at the start of `push`, records the
// inputs on `st` and `pl`'s dispatch on the stream, counts and reports it.
template <std::size_t N, class Push>
bool launch(const accelkit::KernelStream& st, const Pipelines& p, const Pipeline& pl,
            const std::array<const at::Tensor*, N>& ts, Push& push, std::uint32_t x,
            std::uint32_t y, Counter counter) {
  std::array<Binding, 4> bs{};
  auto* offsets = reinterpret_cast<std::uint32_t*>(&push);
  for (std::size_t i = 0; i < pl.bindings; ++i) {
    if (i >= N) bs[i] = bs[1];  // an operand the shader does not read
    else if (!bind(p, st.device, ts[i]->const_data_ptr(), span_bytes(*ts[i]), bs[i])) return false;
    offsets[i] = bs[i].element;
  }
  for (std::size_t i = 1; i < N; ++i) K::record_stream(*ts[i], st);  // an input of another stream
  K::translated([&] {
    K::runtime().enqueue(st.device, st.handle, "vkCmdDispatch", [&](VkCommandBuffer cb) {
      record_dispatch(cb, p, pl, bs.data(), &push, x, y);
    });
  });
  counters[counter].fetch_add(1, std::memory_order_relaxed);
  K::enqueued(st);
  return true;
}

// out = op(a, b, s), broadcast, into `into` (in place) or a new tensor.
Opt elementwise(Op op, Counter counter, const at::Tensor& a, const at::Tensor* b, float s,
                const at::Tensor* into = nullptr) {
  at::DimVector shape =
      b ? at::infer_size_dimvector(a.sizes(), b->sizes()) : at::DimVector(a.sizes());
  c10::IntArrayRef sh(shape);
  if (into && (into->sizes() != sh || !distinct_elements(*into) ||
               !same_or_disjoint(*into, a) || (b && !same_or_disjoint(*into, *b))))
    return std::nullopt;
  auto t = target(a);
  if (!t) return std::nullopt;
  const at::Tensor* like = a.sizes() == sh ? &a : b && b->sizes() == sh ? b : nullptr;
  at::Tensor out = into ? *into : empty_output(a, sh, like);
  if (out.numel() == 0) return out;
  if (out.numel() > kMax32) return std::nullopt;
  at::DimVector sa(shape.size()), sb(shape.size());
  broadcast_strides(a, sh, sa.data());
  if (b) broadcast_strides(*b, sh, sb.data());
  Geom g{0, 0, 0, static_cast<std::uint32_t>(out.numel()), 0, static_cast<std::uint32_t>(op), s};
  if (!merge_dims<3>(sh, {out.strides().data(), sa.data(), sb.data()}, g.size,
                     {g.so, g.sa, g.sb}, g.ndim))
    return std::nullopt;
  auto groups =
      static_cast<std::uint32_t>(std::min<std::int64_t>((g.n + kGroup - 1) / kGroup, kMaxGroups));
  const Pipelines& p = *t->second;
  bool ok = b ? launch<3>(t->first, p, p.elementwise, {&out, &a, b}, g, groups, 1, counter)
              : launch<2>(t->first, p, p.elementwise, {&out, &a}, g, groups, 1, counter);
  return ok ? Opt(out) : std::nullopt;
}

// a op b where b is a tensor of a's device or a Python number (s: add's alpha).
Opt binary(Op op, Counter counter, const at::Tensor& a, const at::Tensor& b, std::optional<float> s,
           const at::Tensor* into = nullptr) {
  if (!f32(a) || !s) return std::nullopt;
  if (f32(b, a)) return elementwise(op, counter, a, &b, *s, into);
  auto v = accelkit::wrapped_number<float>(b);
  if (!v) return std::nullopt;
  return op == Op::add ? elementwise(Op::add_scalar, counter, a, nullptr, *s * *v, into)
                       : elementwise(Op::mul_scalar, counter, a, nullptr, *v, into);
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto out = binary(Op::add, c_add, self, other, real_number<float>(alpha))) return *out;
  return K::fallback<at::_ops::add_Tensor>(self, other, alpha);
}
at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (binary(Op::add, c_add, self, other, real_number<float>(alpha), &self)) return self;
  return K::fallback<at::_ops::add__Tensor>(self, other, alpha);
}
std::optional<float> negated(const at::Scalar& alpha) {
  auto s = real_number<float>(alpha);
  return s ? std::optional<float>(-*s) : std::nullopt;
}
at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto out = binary(Op::add, c_add, self, other, negated(alpha))) return *out;
  return K::fallback<at::_ops::sub_Tensor>(self, other, alpha);
}
at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (binary(Op::add, c_add, self, other, negated(alpha), &self)) return self;
  return K::fallback<at::_ops::sub__Tensor>(self, other, alpha);
}
at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  if (auto out = binary(Op::mul, c_mul, self, other, 1.0f)) return *out;
  return K::fallback<at::_ops::mul_Tensor>(self, other);
}
at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  if (binary(Op::mul, c_mul, self, other, 1.0f, &self)) return self;
  return K::fallback<at::_ops::mul__Tensor>(self, other);
}
at::Tensor relu(const at::Tensor& self) {
  if (f32(self))
    if (auto out = elementwise(Op::relu, c_relu, self, nullptr, 0.0f)) return *out;
  return K::fallback<at::_ops::relu>(self);
}
at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                              const at::Scalar& threshold) {
  auto t = real_number<float>(threshold);
  if (t && f32(grad) && f32(self, grad))
    if (auto out = elementwise(Op::threshold_backward, c_threshold_backward, grad, &self, *t))
      return *out;
  return K::fallback<at::_ops::threshold_backward>(grad, self, threshold);
}

// beta * bias + alpha * (a @ b); bias undefined for mm.
Opt matmul(Counter counter, const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
           const at::Scalar& beta, const at::Scalar& alpha) {
  auto fa = real_number<float>(alpha), fb = real_number<float>(beta);
  if (!f32(a) || !f32(b, a) || a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0) || !fa || !fb)
    return std::nullopt;
  std::int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  std::array<std::int64_t, 2> mn = {m, n}, sc = {0, 0};
  bool has_bias = bias.defined() && *fb != 0.0f;
  std::int64_t blocks = ((m + kBlock - 1) / kBlock) * ((n + kBlock - 1) / kBlock);
  bool bias_fits = !bias.defined() || (f32(bias, a) && bias.dim() <= 2 &&
                                        at::is_expandable_to(bias.sizes(), mn));
  if (!bias_fits || (blocks + kGroup - 1) / kGroup > kMaxGroups || (k == 0 && m * n != 0))
    return std::nullopt;
  if (has_bias) broadcast_strides(bias, mn, sc.data());
  for (std::int64_t v : {k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), sc[0], sc[1]})
    if (v < 0 || v > kMax32) return std::nullopt;
  auto t = target(a);
  if (!t) return std::nullopt;
  at::Tensor out = empty_output(a, mn, nullptr);
  if (out.numel() == 0) return out;
  auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  MatmulParams q{0, 0, 0, 0, u(m), u(n), u(k), has_bias, u(a.stride(0)), u(a.stride(1)),
                 u(b.stride(0)), u(b.stride(1)), u(sc[0]), u(sc[1]), *fa, *fb};
  const Pipelines& p = *t->second;
  auto x = u((blocks + kGroup - 1) / kGroup);
  bool ok = has_bias ? launch<4>(t->first, p, p.addmm, {&out, &a, &b, &bias}, q, x, 1, counter)
                     : launch<3>(t->first, p, p.addmm, {&out, &a, &b}, q, x, 1, counter);
  return ok ? Opt(out) : std::nullopt;
}

at::Tensor mm(const at::Tensor& self, const at::Tensor& mat2) {
  if (auto out = matmul(c_mm, at::Tensor(), self, mat2, 0, 1)) return *out;
  return K::fallback<at::_ops::mm>(self, mat2);
}
at::Tensor addmm(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2,
                 const at::Scalar& beta, const at::Scalar& alpha) {
  if (auto out = matmul(c_addmm, self, mat1, mat2, beta, alpha)) return *out;
  return K::fallback<at::_ops::addmm>(self, mat1, mat2, beta, alpha);
}

// The sum of `self` over `dims` (none or empty: all).
Opt reduce_sum(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
               std::optional<at::ScalarType> dtype) {
  if (!f32(self) || (dtype && *dtype != at::kFloat)) return std::nullopt;
  std::int64_t nd = self.dim(), wrap = std::max<std::int64_t>(nd, 1);
  c10::SmallVector<bool, 8> reduced(static_cast<std::size_t>(nd), !dims || dims->empty());
  for (std::int64_t d : dims.value_or(c10::IntArrayRef())) {
    std::int64_t w = d < 0 ? d + wrap : d;
    if (w < 0 || w >= wrap || (nd > 0 && reduced[w])) return std::nullopt;  // the CPU's error
    if (nd > 0) reduced[w] = true;
  }
  at::DimVector shape, ksize, kstride, rsize, rstride;
  for (std::int64_t d = 0; d < nd; ++d) {
    if (reduced[d] && keepdim) shape.push_back(1);
    if (!reduced[d]) shape.push_back(self.size(d));
    (reduced[d] ? rsize : ksize).push_back(self.size(d));
    (reduced[d] ? rstride : kstride).push_back(self.stride(d));
  }
  Red g{};
  if (!merge_dims<1>(ksize, {kstride.data()}, g.ksize, {g.kstride}, g.nk) ||
      !merge_dims<1>(rsize, {rstride.data()}, g.rsize, {g.rstride}, g.nr))
    return std::nullopt;
  auto t = target(self);
  if (!t) return std::nullopt;
  at::Tensor out = empty_output(self, shape, nullptr);
  if (out.numel() == 0) return out;
  std::int64_t nred = self.numel() / out.numel();  // 0: sums of nothing, zeros
  if (out.numel() > kMax32 || nred > kMax32) return std::nullopt;
  g.nout = static_cast<std::uint32_t>(out.numel());
  g.nred = static_cast<std::uint32_t>(nred);
  // Many sums: an invocation each (sum_serial.comp); few: a work-group each
  // (sum.comp), whose barriers cost more on lavapipe than a long serial sum.
  bool serial = g.nout >= kGroup;
  std::uint32_t units = serial ? (g.nout + kGroup - 1) / kGroup : g.nout;
  std::uint32_t x = std::min(units, kMaxGroups), y = (units + x - 1) / x;
  const Pipelines& p = *t->second;
  bool ok = launch<2>(t->first, p, serial ? p.sum_serial : p.sum, {&out, nred ? &self : &out}, g,
                      x, y, c_sum);
  return ok ? Opt(out) : std::nullopt;
}

at::Tensor sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                   std::optional<at::ScalarType> dtype) {
  if (auto out = reduce_sum(self, dim, keepdim, dtype)) return *out;
  return K::fallback<at::_ops::sum_dim_IntList>(self, dim, keepdim, dtype);
}
at::Tensor sum(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  if (auto out = reduce_sum(self, std::nullopt, false, dtype)) return *out;
  return K::fallback<at::_ops::sum>(self, dtype);
}

std::atomic<bool> registered{false};

}  // namespace

const Pipelines* pipelines(int device) {
  bool fast = device >= 0 && device < static_cast<int>(ready.size());
  if (fast)
    if (const Pipelines* p = ready[device].load(std::memory_order_acquire)) return p;
  std::lock_guard<std::mutex> lock(create_mutex);  // Note [vkdev pipelines]
  auto known = failed.find(device);
  TORCH_CHECK(known == failed.end(), known->second);
  std::unique_ptr<Pipelines>& slot = created[device];
  if (!slot) {
    VulkanRuntime& rt = K::runtime();
    auto p = std::make_unique<Pipelines>();
    if (rt.has_push_descriptors(device)) {
      VkDevice dev = rt.vk_device(device);
      VkPhysicalDeviceProperties props{};
      vkGetPhysicalDeviceProperties(rt.vk_physical_device(device), &props);
      p->offset_alignment = std::max<VkDeviceSize>(props.limits.minStorageBufferOffsetAlignment, 4);
      p->max_range = props.limits.maxStorageBufferRange;
      struct Spec {
        Pipeline* pl;
        const char* name;
        const std::uint32_t* code;
        std::size_t bytes;
        std::uint32_t bindings, push;
      };
      for (const Spec& s :
           {Spec{&p->elementwise, "elementwise", spv::elementwise, sizeof spv::elementwise, 3,
                 sizeof(Geom)},
            Spec{&p->addmm, "addmm", spv::addmm, sizeof spv::addmm, 4, sizeof(MatmulParams)},
            Spec{&p->sum, "sum", spv::sum, sizeof spv::sum, 2, sizeof(Red)},
            Spec{&p->sum_serial, "sum_serial", spv::sum_serial, sizeof spv::sum_serial, 2,
                 sizeof(Red)}}) {
        VkResult r = VK_SUCCESS;
        if (const char* call = create(dev, *s.pl, s.code, s.bytes, s.bindings, s.push, r)) {
          failed[device] = std::string("vkdev: creating the native kernel '") + s.name +
                           "' for device " + std::to_string(device) + " failed: " + call +
                           ": VkResult " + std::to_string(r);
          TORCH_CHECK(false, failed[device]);
        }
      }
      p->push_descriptors = rt.push_descriptor_fn(device);
    }
    slot = std::move(p);
  }
  if (fast) ready[device].store(slot.get(), std::memory_order_release);
  return slot.get();
}

bool bind(const Pipelines& p, int device, const void* ptr, std::size_t bytes, Binding& out) {
  BufferRef r =
      K::translated([&] { return K::runtime().locate(device, ptr, bytes, "vkCmdDispatch"); });
  VkDeviceSize start = r.offset / p.offset_alignment * p.offset_alignment;
  if (r.offset % sizeof(float) != 0 || r.offset - start + bytes > p.max_range) return false;
  out = {{r.buffer, start, r.offset - start + bytes},
         static_cast<std::uint32_t>((r.offset - start) / sizeof(float))};
  return true;
}

void record_dispatch(VkCommandBuffer cb, const Pipelines& p, const Pipeline& pl,
                     const Binding* bindings, const void* push, std::uint32_t x, std::uint32_t y) {
  // Earlier compute and transfer writes (a copy into an input) before this dispatch.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr,
                          VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &barrier, 0, nullptr, 0,
                       nullptr);
  std::array<VkWriteDescriptorSet, 4> writes{};
  for (std::uint32_t i = 0; i < pl.bindings; ++i)
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, nullptr, VK_NULL_HANDLE, i, 0, 1,
                 VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nullptr, &bindings[i].info, nullptr};
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.pipeline);
  p.push_descriptors(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.layout, 0, pl.bindings, writes.data());
  vkCmdPushConstants(cb, pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pl.push_bytes, push);
  vkCmdDispatch(cb, x, y, 1);
}

std::int64_t launches(std::string_view kernel) {
  std::int64_t total = 0;
  bool known = kernel.empty();
  for (std::size_t i = 0; i < kNames.size(); ++i)
    if (kernel.empty() || kernel == kNames[i]) {
      known = true;
      total += counters[i].load(std::memory_order_relaxed);
    }
  TORCH_CHECK_VALUE(known, "vkdev: launches: no native kernel '", std::string(kernel),
                    "' (add, mul, relu, threshold_backward, mm, addmm, sum)");
  return total;
}

bool enabled() { return registered.load(); }

}  // namespace vkdev::kernels

ACCELKIT_KERNELS(vkdev::VulkanRuntime, lib) {
  namespace k = vkdev::kernels;
  const char* v = std::getenv("VKDEV_NATIVE_KERNELS");  // at load: unset or 1 on, 0 off
  if (v != nullptr && std::strcmp(v, "1") != 0) {
    if (std::strcmp(v, "0") == 0) return;
    throw std::invalid_argument(std::string("VKDEV_NATIVE_KERNELS='") + v +
                                "': expected 0 or 1 (the native kernels are not registered)");
  }
  lib.impl("add.Tensor", TORCH_FN(k::add)).impl("add_.Tensor", TORCH_FN(k::add_));
  lib.impl("sub.Tensor", TORCH_FN(k::sub)).impl("sub_.Tensor", TORCH_FN(k::sub_));
  lib.impl("mul.Tensor", TORCH_FN(k::mul)).impl("mul_.Tensor", TORCH_FN(k::mul_));
  lib.impl("relu", TORCH_FN(k::relu)).impl("threshold_backward", TORCH_FN(k::threshold_backward));
  lib.impl("mm", TORCH_FN(k::mm)).impl("addmm", TORCH_FN(k::addmm));
  lib.impl("sum.dim_IntList", TORCH_FN(k::sum_dim)).impl("sum", TORCH_FN(k::sum));
  k::registered = true;
}
