// vkdev's native kernels: GLSL compute shaders (shaders/*.comp, compiled to
// SPIR-V at build time) for the hot operators of a training step, registered
// through accelkit's vendor-kernel API (include/accelkit/torch/kernels.hpp)
// and recorded on the current stream's command buffer
// (VulkanRuntime::enqueue), asynchronously.
//
//   add.Tensor, sub.Tensor,    float32 tensors on one vkdev device, broadcast
//   mul.Tensor and their       and strided (any layout of at most 4 dims once
//   in-place forms             mergeable dims are merged), or a float32
//                              tensor and a Python number (a wrapped CPU
//                              scalar); alpha any real number; in place
//                              where the output does not partly overlap an
//                              input (SGD's update: _foreach_add_ runs add_
//                              per parameter)
//   relu, threshold_backward   float32, broadcast and strided as above
//   mm, addmm                  2-d float32 matrices of any strides (a
//                              transposed weight included); addmm's bias
//                              broadcastable to the result, beta and alpha
//                              any real numbers (beta 0 ignores the bias)
//   sum, sum.dim_IntList       float32 (dtype unset or float32), any dims,
//                              keepdim, any strides
//
// Everything else (other dtypes, a tensor on another device, more than 4
// unmergeable dims, a tensor whose span exceeds one storage-buffer binding,
// an input a kernel does not take such as an out-of-range dim) goes through
// the SDK's CPU fallback (Kernels<R>::fallback), which computes, or raises,
// as the CPU does. Outputs come from the caching pool on the current stream
// (the backend's c10 allocator, laid out as at::empty_like or at::empty
// would, without a dispatcher call); inputs are recorded on that stream;
// each launch is reported (Kernels<R>::enqueued).
//
// VKDEV_NATIVE_KERNELS=0 at the library's load leaves the kernels
// unregistered (every operator as without them: the fallback, or host
// kernels where memory is host-visible).
//
// Note [vkdev pipelines]
// Problem: a Vulkan compute pipeline is compiled by the driver from SPIR-V
// per device; creating it per launch would cost a compile each time, and
// descriptor sets would need a pool per thread.
// Decision: the pipelines of a device are created at its first launch
// there, under one mutex, and kept for the program's life (recorded command
// buffers may use them until the stream completes); their storage buffers
// are push descriptors (VK_KHR_push_descriptor) and their parameters push
// constants, so recording a launch allocates nothing and needs no lock
// beyond the stream's. A failed creation is kept: each later launch on that
// device raises the same RuntimeError. Without VK_KHR_push_descriptor the
// kernels take the fallback.
// Limits: nothing is retried; the pipelines are not destroyed at exit (the
// driver frees them with the device).
//
// Note [vkdev kernel bindings]
// Problem: a tensor is a span inside a VkBuffer (a pool block, a view at an
// offset), and a storage-buffer binding may cover at most
// maxStorageBufferRange bytes (128 MiB on lavapipe) from an offset aligned
// to minStorageBufferOffsetAlignment: a pool block larger than that cannot
// be bound whole.
// Decision: each operand binds its own buffer from its offset rounded down
// to the alignment to the end of the tensor's span (its largest element
// offset), and the shader gets the element offset of the tensor's first
// element in that range by push constant, with element strides; indices are
// 32-bit.
// Limits: a tensor whose span, with the rounding, exceeds
// maxStorageBufferRange takes the fallback.
#include <accelkit/torch/kernels.hpp>

#include "vkdev_kernels.hpp"

#include <ATen/EmptyTensor.h>
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
#include <c10/core/Allocator.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace vkdev::spv {
#include "addmm.h"
#include "elementwise.h"
#include "sum.h"
#include "sum_serial.h"
}  // namespace vkdev::spv

namespace vkdev::kernels {
namespace {

using K = accelkit::Kernels<VulkanRuntime>;

// The push constants of addmm.comp and sum.comp (std430).
struct MatmulParams {
  std::uint32_t m, n, k, has_bias;
  std::uint32_t sa0, sa1, sb0, sb1, sc0, sc1;
  std::uint32_t off_o, off_a, off_b, off_c;
  float alpha, beta;
};
static_assert(sizeof(MatmulParams) == 64);
struct Red {
  std::uint32_t nout, nred, nk, nr;
  std::uint32_t off_o, off_a, pad0, pad1;
  std::uint32_t ksize[kMaxDims], kstride[kMaxDims], rsize[kMaxDims], rstride[kMaxDims];
};
static_assert(sizeof(Red) == 96);

constexpr std::uint32_t kGroup = 64;        // local_size_x of elementwise, addmm, sum_serial
constexpr std::uint32_t kBlock = 4;         // addmm.comp's output block edge
constexpr std::uint32_t kMaxGroups = 65535;      // maxComputeWorkGroupCount's guaranteed minimum

// ------------------------------------------------------------- counters

constexpr std::array<const char*, 7> kNames = {"add", "mul", "relu", "threshold_backward",
                                               "mm", "addmm", "sum"};
enum Counter { c_add, c_mul, c_relu, c_threshold_backward, c_mm, c_addmm, c_sum };
std::array<std::atomic<std::int64_t>, kNames.size()> counters{};

// ------------------------------------------------------------ pipelines

struct Created {
  std::unique_ptr<Pipelines> pipelines;  // null: a failure, or no push descriptors
  std::string error;                     // a failed creation's RuntimeError message
  bool done = false;
};
std::mutex create_mutex;
std::map<int, Created> created;  // by physical device; entries never erased
constexpr int kFast = 64;
// The pipelines of devices 0..kFast-1 once created, read without the mutex.
std::array<std::atomic<const Pipelines*>, kFast> ready{};
std::array<std::atomic<bool>, kFast> unsupported{};

const char* result_name(VkResult r) {
  switch (r) {
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_INVALID_SHADER_NV: return "VK_ERROR_INVALID_SHADER_NV";
    default: return "VkResult";
  }
}

// Creates `pl` from SPIR-V `code`; the error message of a failure.
std::optional<std::string> create(VkDevice dev, int device, Pipeline& pl, const char* name,
                                  const std::uint32_t* code, std::size_t code_bytes,
                                  std::uint32_t bindings, std::uint32_t push_bytes) {
  auto failure = [&](const char* call, VkResult r) {
    return std::string("vkdev: creating the native kernel '") + name + "' for device " +
           std::to_string(device) + " failed: " + call + ": " + result_name(r) + " (" +
           std::to_string(static_cast<int>(r)) + ")";
  };
  pl.bindings = bindings;
  pl.push_bytes = push_bytes;
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO};
  mi.codeSize = code_bytes;
  mi.pCode = code;
  if (VkResult r = vkCreateShaderModule(dev, &mi, nullptr, &pl.module); r != VK_SUCCESS)
    return failure("vkCreateShaderModule", r);
  std::array<VkDescriptorSetLayoutBinding, 4> b{};
  for (std::uint32_t i = 0; i < bindings; ++i)
    b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO};
  li.flags = VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR;
  li.bindingCount = bindings;
  li.pBindings = b.data();
  if (VkResult r = vkCreateDescriptorSetLayout(dev, &li, nullptr, &pl.set_layout); r != VK_SUCCESS)
    return failure("vkCreateDescriptorSetLayout", r);
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO};
  pi.setLayoutCount = 1;
  pi.pSetLayouts = &pl.set_layout;
  pi.pushConstantRangeCount = 1;
  pi.pPushConstantRanges = &range;
  if (VkResult r = vkCreatePipelineLayout(dev, &pi, nullptr, &pl.layout); r != VK_SUCCESS)
    return failure("vkCreatePipelineLayout", r);
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO};
  ci.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
  ci.stage.module = pl.module;
  ci.stage.pName = "main";
  ci.layout = pl.layout;
  if (VkResult r = vkCreateComputePipelines(dev, VK_NULL_HANDLE, 1, &ci, nullptr, &pl.pipeline);
      r != VK_SUCCESS)
    return failure("vkCreateComputePipelines", r);
  return std::nullopt;
}

// ------------------------------------------------------------- layouts

// Drops the size-1 dims of `size` and merges each dim into the next where
// every stride list allows, writing the dims left to out_size and, for each
// stride list o, out[o]; false when more than kMaxDims remain or a value
// does not fit 32 bits.
template <std::size_t N>
bool collapse(c10::IntArrayRef size, const std::array<const std::int64_t*, N>& strides,
              std::uint32_t* out_size, const std::array<std::uint32_t*, N>& out,
              std::uint32_t& ndim) {
  std::array<std::int64_t, kMaxDims> sz{};
  std::array<std::array<std::int64_t, kMaxDims>, N> st{};
  int n = 0;
  for (std::size_t d = 0; d < size.size(); ++d) {
    if (size[d] == 1) continue;
    bool mergeable = n > 0;
    for (std::size_t o = 0; o < N && mergeable; ++o)
      mergeable = st[o][n - 1] == strides[o][d] * size[d];
    if (mergeable) {
      sz[n - 1] *= size[d];
      for (std::size_t o = 0; o < N; ++o) st[o][n - 1] = strides[o][d];
      continue;
    }
    if (n == kMaxDims) return false;  // merging never lowers the count again
    sz[n] = size[d];
    for (std::size_t o = 0; o < N; ++o) st[o][n] = strides[o][d];
    ++n;
  }
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  for (int d = 0; d < n; ++d) {
    if (sz[d] > kMax) return false;
    out_size[d] = static_cast<std::uint32_t>(sz[d]);
    for (std::size_t o = 0; o < N; ++o) {
      if (st[o][d] < 0 || st[o][d] > kMax) return false;
      out[o][d] = static_cast<std::uint32_t>(st[o][d]);
    }
  }
  ndim = static_cast<std::uint32_t>(n);
  return true;
}

// The strides of `t` expanded to `shape` (0 where a dim is broadcast),
// without making the view.
void broadcast_strides(const at::Tensor& t, c10::IntArrayRef shape, std::int64_t* out) {
  c10::IntArrayRef ts = t.sizes(), st = t.strides();
  std::size_t lead = shape.size() - ts.size();
  for (std::size_t d = 0; d < shape.size(); ++d)
    out[d] = d < lead || ts[d - lead] != shape[d] ? 0 : st[d - lead];
}

// The bytes from t's first element to the end of its last (float32).
std::size_t span_bytes(const at::Tensor& t) {
  std::int64_t last = 0;
  for (std::int64_t d = 0; d < t.dim(); ++d) last += (t.size(d) - 1) * t.stride(d);
  return static_cast<std::size_t>(last + 1) * sizeof(float);
}

// An uninitialized float32 output on `device`'s device, from the caching
// pool on the current stream, made without the dispatcher: laid out as
// at::empty_like(*like) lays it out, or contiguous with `shape` where
// `like` is null.
at::Tensor empty_out(const at::Tensor& device, c10::IntArrayRef shape, const at::Tensor* like) {
  c10::DeviceGuard guard(device.device());  // the allocator takes the current device
  constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
  c10::Allocator* alloc = c10::GetAllocator(c10::DeviceType::PrivateUse1);
  if (!like) return at::detail::empty_generic(shape, alloc, keys, at::kFloat, std::nullopt);
  if (like->is_non_overlapping_and_dense())
    return at::detail::empty_strided_generic(like->sizes(), like->strides(), alloc, keys,
                                             at::kFloat);
  return at::detail::empty_strided_generic(
      like->sizes(), at::infer_dense_strides(like->sizes(), like->strides()), alloc, keys,
      at::kFloat);
}

// Whether no two elements of `t` share memory: its dims of more than one
// element, by stride, each step past the extent of the smaller ones (a
// sufficient test, which views of one tensor pass).
bool distinct_elements(const at::Tensor& t) {
  c10::SmallVector<std::pair<std::int64_t, std::int64_t>, 8> dims;  // (stride, size)
  for (std::int64_t d = 0; d < t.dim(); ++d)
    if (t.size(d) > 1) dims.emplace_back(t.stride(d), t.size(d));
  std::sort(dims.begin(), dims.end());
  std::int64_t extent = 0;  // the largest offset reached by the smaller dims
  for (auto [stride, size] : dims) {
    if (stride <= extent) return false;
    extent += (size - 1) * stride;
  }
  return true;
}

// Whether an in-place output `out` and an input `in` are the same elements
// (the same tensor layout: each element read before it is written, by the
// same invocation) or share no bytes.
bool apart_or_same(const at::Tensor& out, const at::Tensor& in) {
  if (&out == &in || out.numel() == 0 || in.numel() == 0) return true;
  if (!out.storage().is_alias_of(in.storage())) return true;
  auto begin = [](const at::Tensor& t) { return static_cast<const char*>(t.const_data_ptr()); };
  if (begin(out) == begin(in) && out.sizes() == in.sizes() && out.strides() == in.strides())
    return true;
  return begin(out) + span_bytes(out) <= begin(in) || begin(in) + span_bytes(in) <= begin(out);
}

bool on_vkdev(const at::Tensor& t) {
  return t.defined() && t.device().type() == c10::DeviceType::PrivateUse1;
}
// A float32 tensor of vkdev's device `like` (the kernels' one dtype).
bool f32(const at::Tensor& t, const at::Tensor& like) {
  return on_vkdev(t) && t.device() == like.device() && t.scalar_type() == at::kFloat &&
         !t.is_conj() && !t.is_neg();
}
bool f32(const at::Tensor& t) { return f32(t, t); }
// A Python number as the second operand, read from its wrapped CPU tensor.
std::optional<float> number(const at::Tensor& t) {
  if (!t.defined() || !t.unsafeGetTensorImpl()->is_wrapped_number() || !t.device().is_cpu())
    return std::nullopt;
  switch (t.scalar_type()) {
    case at::kDouble: return static_cast<float>(*t.const_data_ptr<double>());
    case at::kLong: return static_cast<float>(*t.const_data_ptr<std::int64_t>());
    case at::kBool: return *t.const_data_ptr<bool>() ? 1.0f : 0.0f;
    default: return std::nullopt;
  }
}
std::optional<float> real(const at::Scalar& s) {
  if (s.isComplex()) return std::nullopt;
  return static_cast<float>(s.toDouble());
}

// The pipelines of `t`'s device, or nullptr where the device has none (no
// push descriptors: the fallback).
const Pipelines* pipelines_of(const at::Tensor& t) {
  int device = static_cast<int>(K::physical_device(t));
  return K::translated([&] { return pipelines(device); });
}

// Up to four operands' bindings; false where one does not fit.
template <std::size_t N>
bool bind_all(const Pipelines& p, int device, const std::array<const at::Tensor*, N>& ts,
              std::array<Binding, 4>& out) {
  for (std::size_t i = 0; i < N; ++i)
    if (!bind(p, device, ts[i]->const_data_ptr(), span_bytes(*ts[i]), out[i])) return false;
  return true;
}

// Records `pl` with `push` on `st`'s stream, then counts and reports it.
void launch(const accelkit::KernelStream& st, const Pipelines& p, const Pipeline& pl,
            const std::array<Binding, 4>& bindings, const void* push, std::uint32_t x,
            std::uint32_t y, Counter counter) {
  K::translated([&] {
    K::runtime().enqueue(st.device, st.handle, "vkCmdDispatch", [&](VkCommandBuffer cb) {
      record_dispatch(cb, p, pl, bindings.data(), push, x, y);
    });
  });
  counters[counter].fetch_add(1, std::memory_order_relaxed);
  K::enqueued(st);
}

// out = op(a, b, s), broadcast, into `into` (in place: a's own tensor) or a
// new tensor; nullopt where the layout does not fit.
std::optional<at::Tensor> elementwise(Op op, Counter counter, const at::Tensor& a,
                                      const at::Tensor* b, float s,
                                      const at::Tensor* into = nullptr) {
  const Pipelines* p = pipelines_of(a);
  if (!p) return std::nullopt;
  at::DimVector shape = b ? at::infer_size_dimvector(a.sizes(), b->sizes()) : at::DimVector(a.sizes());
  c10::IntArrayRef sh(shape);
  if (into) {
    // In place: the result's shape is the output's own, the output has no
    // internal overlap, and no input partly overlaps it.
    if (into->sizes() != sh || !distinct_elements(*into)) return std::nullopt;
    for (const at::Tensor* t : {&a, b})
      if (t && !apart_or_same(*into, *t)) return std::nullopt;
  }
  at::Tensor out = into ? *into
                        : empty_out(a, sh, a.sizes() == sh ? &a : b && b->sizes() == sh ? b : nullptr);
  if (out.numel() == 0) return out;
  at::DimVector sa(shape.size()), sb(shape.size());
  broadcast_strides(a, sh, sa.data());
  if (b) broadcast_strides(*b, sh, sb.data());
  else sb = sa;
  Geom g{};
  if (out.numel() > std::numeric_limits<std::uint32_t>::max()) return std::nullopt;
  g.n = static_cast<std::uint32_t>(out.numel());
  g.op = static_cast<std::uint32_t>(op);
  g.s = s;
  if (!collapse<3>(sh, {out.strides().data(), sa.data(), sb.data()}, g.size, {g.so, g.sa, g.sb},
                   g.ndim))
    return std::nullopt;
  accelkit::KernelStream st = K::current_stream(a);
  std::array<Binding, 4> bs{};
  if (!bind_all<3>(*p, st.device, {&out, &a, b ? b : &a}, bs)) return std::nullopt;
  g.off_o = bs[0].element;
  g.off_a = bs[1].element;
  g.off_b = bs[2].element;
  K::record_stream(a, st);  // the inputs may come from another stream
  if (b) K::record_stream(*b, st);
  if (into) K::record_stream(out, st);
  std::uint32_t groups =
      static_cast<std::uint32_t>(std::min<std::uint64_t>((g.n + kGroup - 1) / kGroup, kMaxGroups));
  launch(st, *p, p->elementwise, bs, &g, groups, 1, counter);
  return out;
}

// a op b where b is a tensor of a's device or a Python number.
std::optional<at::Tensor> binary(Op op, Op scalar_op, Counter counter, const at::Tensor& a,
                                 const at::Tensor& b, float s, const at::Tensor* into = nullptr) {
  if (!f32(a)) return std::nullopt;
  if (f32(b, a)) return elementwise(op, counter, a, &b, s, into);
  if (auto v = number(b))
    return elementwise(scalar_op, counter, a, nullptr,
                       scalar_op == Op::add_scalar ? s * *v : *v, into);
  return std::nullopt;
}

at::Tensor add(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto s = real(alpha))
    if (auto out = binary(Op::add, Op::add_scalar, c_add, self, other, *s)) return *out;
  return K::fallback<at::_ops::add_Tensor>(self, other, alpha);
}

at::Tensor& add_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto s = real(alpha))
    if (binary(Op::add, Op::add_scalar, c_add, self, other, *s, &self)) return self;
  return K::fallback<at::_ops::add__Tensor>(self, other, alpha);
}

at::Tensor sub(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto s = real(alpha))
    if (auto out = binary(Op::add, Op::add_scalar, c_add, self, other, -*s)) return *out;
  return K::fallback<at::_ops::sub_Tensor>(self, other, alpha);
}

at::Tensor& sub_(at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha) {
  if (auto s = real(alpha))
    if (binary(Op::add, Op::add_scalar, c_add, self, other, -*s, &self)) return self;
  return K::fallback<at::_ops::sub__Tensor>(self, other, alpha);
}

at::Tensor mul(const at::Tensor& self, const at::Tensor& other) {
  if (auto out = binary(Op::mul, Op::mul_scalar, c_mul, self, other, 1.0f)) return *out;
  return K::fallback<at::_ops::mul_Tensor>(self, other);
}

at::Tensor& mul_(at::Tensor& self, const at::Tensor& other) {
  if (binary(Op::mul, Op::mul_scalar, c_mul, self, other, 1.0f, &self)) return self;
  return K::fallback<at::_ops::mul__Tensor>(self, other);
}

at::Tensor relu(const at::Tensor& self) {
  if (f32(self))
    if (auto out = elementwise(Op::relu, c_relu, self, nullptr, 0.0f)) return *out;
  return K::fallback<at::_ops::relu>(self);
}

at::Tensor threshold_backward(const at::Tensor& grad, const at::Tensor& self,
                              const at::Scalar& threshold) {
  auto t = real(threshold);
  if (t && f32(grad) && f32(self, grad))
    if (auto out = elementwise(Op::threshold_backward, c_threshold_backward, grad, &self, *t))
      return *out;
  return K::fallback<at::_ops::threshold_backward>(grad, self, threshold);
}

// beta * bias + alpha * (a @ b); bias undefined for mm.
std::optional<at::Tensor> matmul(Counter counter, const at::Tensor& bias, const at::Tensor& a,
                                 const at::Tensor& b, const at::Scalar& beta,
                                 const at::Scalar& alpha) {
  if (!f32(a) || !f32(b, a) || a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(0))
    return std::nullopt;
  auto fa = real(alpha), fb = real(beta);
  if (!fa || !fb) return std::nullopt;
  std::int64_t m = a.size(0), n = b.size(1), k = a.size(1);
  bool has_bias = bias.defined() && *fb != 0.0f;
  std::array<std::int64_t, 2> mn = {m, n};
  if (bias.defined() && (!f32(bias, a) || bias.dim() > 2 || !at::is_expandable_to(bias.sizes(), mn)))
    return std::nullopt;
  constexpr std::int64_t kMax = std::numeric_limits<std::uint32_t>::max();
  std::int64_t blocks = ((m + kBlock - 1) / kBlock) * ((n + kBlock - 1) / kBlock);
  if ((blocks + kGroup - 1) / kGroup > kMaxGroups || k > kMax) return std::nullopt;
  if (k == 0 && m * n != 0) return std::nullopt;  // no products: beta * bias, the CPU's rule
  const Pipelines* p = pipelines_of(a);
  if (!p) return std::nullopt;
  at::Tensor out = empty_out(a, mn, nullptr);
  if (out.numel() == 0) return out;
  accelkit::KernelStream st = K::current_stream(a);
  std::array<Binding, 4> bs{};
  if (!bind_all<3>(*p, st.device, {&out, &a, &b}, bs)) return std::nullopt;
  // The bias's own data and its strides as broadcast to (m, n), without an
  // expand view.
  std::array<std::int64_t, 2> sc = {0, 0};
  if (has_bias) {
    broadcast_strides(bias, mn, sc.data());
    if (!bind(*p, st.device, bias.const_data_ptr(), span_bytes(bias), bs[3])) return std::nullopt;
  } else {
    bs[3] = bs[1];  // never read
  }
  for (std::int64_t v : {a.stride(0), a.stride(1), b.stride(0), b.stride(1), sc[0], sc[1]})
    if (v < 0 || v > kMax) return std::nullopt;
  MatmulParams q{};
  q.m = static_cast<std::uint32_t>(m);
  q.n = static_cast<std::uint32_t>(n);
  q.k = static_cast<std::uint32_t>(k);
  q.has_bias = has_bias ? 1 : 0;
  q.sa0 = static_cast<std::uint32_t>(a.stride(0));
  q.sa1 = static_cast<std::uint32_t>(a.stride(1));
  q.sb0 = static_cast<std::uint32_t>(b.stride(0));
  q.sb1 = static_cast<std::uint32_t>(b.stride(1));
  q.sc0 = static_cast<std::uint32_t>(sc[0]);
  q.sc1 = static_cast<std::uint32_t>(sc[1]);
  q.off_o = bs[0].element;
  q.off_a = bs[1].element;
  q.off_b = bs[2].element;
  q.off_c = bs[3].element;
  q.alpha = *fa;
  q.beta = *fb;
  K::record_stream(a, st);
  K::record_stream(b, st);
  if (has_bias) K::record_stream(bias, st);
  launch(st, *p, p->addmm, bs, &q, static_cast<std::uint32_t>((blocks + kGroup - 1) / kGroup), 1,
         counter);
  return out;
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

// The sum of `self` over `dims` (none: all).
std::optional<at::Tensor> reduce_sum(const at::Tensor& self, at::OptionalIntArrayRef dims,
                                     bool keepdim, std::optional<at::ScalarType> dtype) {
  if (!f32(self) || (dtype && *dtype != at::kFloat)) return std::nullopt;
  std::int64_t nd = self.dim();
  c10::SmallVector<bool, 8> reduced(static_cast<std::size_t>(nd), !dims || dims->empty());
  if (dims && !dims->empty()) {
    for (std::int64_t d : *dims) {
      std::int64_t w = d < 0 ? d + std::max<std::int64_t>(nd, 1) : d;
      if (w < 0 || w >= std::max<std::int64_t>(nd, 1)) return std::nullopt;  // the CPU's error
      if (nd == 0) continue;
      if (reduced[static_cast<std::size_t>(w)]) return std::nullopt;  // a dim twice: the CPU's error
      reduced[static_cast<std::size_t>(w)] = true;
    }
  }
  const Pipelines* p = pipelines_of(self);
  if (!p) return std::nullopt;
  at::DimVector shape, ksize, kstride, rsize, rstride;
  for (std::int64_t d = 0; d < nd; ++d) {
    if (reduced[static_cast<std::size_t>(d)]) {
      if (keepdim) shape.push_back(1);
      rsize.push_back(self.size(d));
      rstride.push_back(self.stride(d));
    } else {
      shape.push_back(self.size(d));
      ksize.push_back(self.size(d));
      kstride.push_back(self.stride(d));
    }
  }
  Red g{};
  if (!collapse<1>(ksize, {kstride.data()}, g.ksize, {g.kstride}, g.nk) ||
      !collapse<1>(rsize, {rstride.data()}, g.rsize, {g.rstride}, g.nr))
    return std::nullopt;
  at::Tensor out = empty_out(self, shape, nullptr);
  if (out.numel() == 0) return out;
  std::int64_t nred = self.numel() / out.numel();  // 0: sums of nothing, zeros
  if (out.numel() > std::numeric_limits<std::uint32_t>::max() ||
      nred > std::numeric_limits<std::uint32_t>::max())
    return std::nullopt;
  g.nout = static_cast<std::uint32_t>(out.numel());
  g.nred = static_cast<std::uint32_t>(nred);
  accelkit::KernelStream st = K::current_stream(self);
  std::array<Binding, 4> bs{};
  // An empty input is never read: the output stands in for its binding.
  if (!bind_all<2>(*p, st.device, {&out, nred == 0 ? &out : &self}, bs)) return std::nullopt;
  g.off_o = bs[0].element;
  g.off_a = bs[1].element;
  K::record_stream(self, st);
  // Many sums: one invocation each (sum_serial.comp); few: a work-group each
  // (sum.comp), whose barriers cost more on lavapipe than a long serial sum.
  bool serial = g.nout >= kGroup;
  std::uint32_t units = serial ? (g.nout + kGroup - 1) / kGroup : g.nout;
  std::uint32_t x = std::min(units, kMaxGroups), y = (units + x - 1) / x;
  launch(st, *p, serial ? p->sum_serial : p->sum, bs, &g, x, y, c_sum);
  return out;
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

// VKDEV_NATIVE_KERNELS at load: unset or 1 on, 0 off.
bool read_enabled() {
  const char* v = std::getenv("VKDEV_NATIVE_KERNELS");
  if (v == nullptr || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  throw std::invalid_argument(std::string("VKDEV_NATIVE_KERNELS='") + v +
                              "': expected 0 or 1 (the native kernels are not registered)");
}
std::atomic<bool> registered{false};

}  // namespace

const Pipelines* pipelines(int device) {
  bool fast = device >= 0 && device < kFast;
  if (fast) {
    auto i = static_cast<std::size_t>(device);
    if (const Pipelines* p = ready[i].load(std::memory_order_acquire)) return p;
    if (unsupported[i].load(std::memory_order_acquire)) return nullptr;
  }
  std::lock_guard<std::mutex> lock(create_mutex);  // Note [vkdev pipelines]
  Created& c = created[device];
  if (!c.done) {
    VulkanRuntime& rt = K::runtime();
    if (rt.has_push_descriptors(device)) {
      auto p = std::make_unique<Pipelines>();
      VkDevice dev = rt.vk_device(device);
      VkPhysicalDeviceProperties props{};
      vkGetPhysicalDeviceProperties(rt.vk_physical_device(device), &props);
      p->offset_alignment = std::max<VkDeviceSize>(props.limits.minStorageBufferOffsetAlignment, 4);
      p->max_range = props.limits.maxStorageBufferRange;
      p->push_descriptors = rt.push_descriptor_fn(device);
      std::optional<std::string> error;
      if (!p->push_descriptors) error = "vkdev: vkCmdPushDescriptorSetKHR was not loaded";
      if (!error)
        error = create(dev, device, p->elementwise, "elementwise", spv::elementwise,
                       sizeof spv::elementwise, 3, sizeof(Geom));
      if (!error)
        error = create(dev, device, p->addmm, "addmm", spv::addmm, sizeof spv::addmm, 4,
                       sizeof(MatmulParams));
      if (!error)
        error = create(dev, device, p->sum, "sum", spv::sum, sizeof spv::sum, 2, sizeof(Red));
      if (!error)
        error = create(dev, device, p->sum_serial, "sum_serial", spv::sum_serial,
                       sizeof spv::sum_serial, 2, sizeof(Red));
      if (error) c.error = *error;
      else c.pipelines = std::move(p);
    }
    c.done = true;
  }
  TORCH_CHECK(c.error.empty(), c.error);
  if (fast) {
    auto i = static_cast<std::size_t>(device);
    if (c.pipelines) ready[i].store(c.pipelines.get(), std::memory_order_release);
    else unsupported[i].store(true, std::memory_order_release);
  }
  return c.pipelines.get();
}

bool bind(const Pipelines& p, int device, const void* ptr, std::size_t bytes, Binding& out) {
  BufferRef r = K::translated([&] { return K::runtime().locate(device, ptr, bytes, "vkCmdDispatch"); });
  if (r.offset % sizeof(float) != 0) return false;
  VkDeviceSize start = r.offset / p.offset_alignment * p.offset_alignment;
  VkDeviceSize range = r.offset - start + bytes;
  if (range > p.max_range) return false;
  out.info = {r.buffer, start, range};
  out.element = static_cast<std::uint32_t>((r.offset - start) / sizeof(float));
  return true;
}

void record_dispatch(VkCommandBuffer cb, const Pipelines& p, const Pipeline& pl,
                     const Binding* bindings, const void* push, std::uint32_t x, std::uint32_t y) {
  // Earlier compute and transfer writes (a copy into an input) before this
  // dispatch's reads and writes.
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER};
  barrier.srcAccessMask = VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  barrier.dstAccessMask = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT;
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &barrier, 0, nullptr, 0,
                       nullptr);
  std::array<VkWriteDescriptorSet, 4> writes{};
  for (std::uint32_t i = 0; i < pl.bindings; ++i) {
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET};
    writes[i].dstBinding = i;
    writes[i].descriptorCount = 1;
    writes[i].descriptorType = VK_DESCRIPTOR_TYPE_STORAGE_BUFFER;
    writes[i].pBufferInfo = &bindings[i].info;
  }
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.pipeline);
  p.push_descriptors(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.layout, 0, pl.bindings, writes.data());
  vkCmdPushConstants(cb, pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pl.push_bytes, push);
  vkCmdDispatch(cb, x, y, 1);
}

std::int64_t launches(std::string_view kernel) {
  std::int64_t total = 0;
  bool known = kernel.empty();
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (!kernel.empty() && kernel != kNames[i]) continue;
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
  if (!k::read_enabled()) return;
  lib.impl("add.Tensor", TORCH_FN(k::add));
  lib.impl("add_.Tensor", TORCH_FN(k::add_));
  lib.impl("sub.Tensor", TORCH_FN(k::sub));
  lib.impl("sub_.Tensor", TORCH_FN(k::sub_));
  lib.impl("mul.Tensor", TORCH_FN(k::mul));
  lib.impl("mul_.Tensor", TORCH_FN(k::mul_));
  lib.impl("relu", TORCH_FN(k::relu));
  lib.impl("threshold_backward", TORCH_FN(k::threshold_backward));
  lib.impl("mm", TORCH_FN(k::mm));
  lib.impl("addmm", TORCH_FN(k::addmm));
  lib.impl("sum.dim_IntList", TORCH_FN(k::sum_dim));
  lib.impl("sum", TORCH_FN(k::sum));
  k::registered = true;
}
