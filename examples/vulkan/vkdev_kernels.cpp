// vkdev's native kernels: GLSL compute shaders (shaders/*.comp, SPIR-V
// headers built with the library) for a training step's hot operators,
// registered through native_kernels.hpp and recorded on the current stream
// (VulkanRuntime::enqueue), all float32 of any strides:
//   add, sub, mul (.Tensor; in place where the output does not partly
//   overlap an input), relu, threshold_backward: broadcast, at most 4 dims
//   once merged, or a tensor and a Python number;
//   mm, addmm: 2-d, addmm's bias broadcast, any beta and alpha;
//   sum, sum.dim_IntList: any dims, keepdim.
// Everything else goes through the CPU fallback (impl_or_fallback), which
// computes, or raises, as the CPU does. VKDEV_NATIVE_KERNELS=0 at load
// leaves the kernels unregistered.
//
// Note [vkdev pipelines]
// Problem: the driver compiles a pipeline from SPIR-V per device; a compile
// per launch is far too slow, and descriptor sets would need pools per thread.
// Decision: a device's pipelines are created at its first launch, once
// (accelkit::PerDevice), and kept for the program's life (recorded work may
// use them until its stream completes). Buffers are push descriptors
// (VK_KHR_push_descriptor) and parameters push constants: recording a launch
// allocates nothing and takes no lock beyond the stream's. A failed creation
// is kept and raised again by each later launch on that device.
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
#include <accelkit/torch/native_kernels.hpp>

#include "vkdev_kernels.hpp"

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
#include <limits>
#include <optional>

namespace vkdev::spv {
#include "addmm.h"
#include "elementwise.h"
#include "sum.h"
}  // namespace vkdev::spv

namespace vkdev::kernels {
namespace {

using K = accelkit::Kernels<VulkanRuntime>;
using Opt = std::optional<at::Tensor>;
using accelkit::empty_output, accelkit::merge_dims, accelkit::real_number, accelkit::span_bytes;

struct MatmulParams {  // addmm.comp's push constants
  std::uint32_t off_o, off_a, off_b, off_c, m, n, k, has_bias, sa0, sa1, sb0, sb1, sc0, sc1;
  float alpha, beta;
};
struct Red {  // sum.comp's
  std::uint32_t off_o, off_a, nout, nred, nk, nr, pad0, pad1;
  std::uint32_t ksize[kMaxDims], kstride[kMaxDims], rsize[kMaxDims], rstride[kMaxDims];
};
static_assert(sizeof(MatmulParams) == 64 && sizeof(Red) == 96);
constexpr std::uint32_t kGroup = 64;         // local_size_x of every shader
constexpr std::uint32_t kBlock = 4;          // addmm.comp's output block edge
constexpr std::uint32_t kMaxGroups = 65535;  // maxComputeWorkGroupCount's guaranteed minimum
constexpr std::int64_t kMax32 = std::numeric_limits<std::uint32_t>::max();

enum Counter { c_add, c_mul, c_relu, c_threshold_backward, c_mm, c_addmm, c_sum };
accelkit::LaunchCounters<7> counters{{"add", "mul", "relu", "threshold_backward", "mm", "addmm", "sum"}};
accelkit::PerDevice<Pipelines> per_device;  // Note [vkdev pipelines]

bool f32(const at::Tensor& t, const at::Tensor& like) { return accelkit::dtype_on(t, at::kFloat, like); }
bool f32(const at::Tensor& t) { return f32(t, t); }
std::uint32_t groups(std::int64_t n) {
  return static_cast<std::uint32_t>(std::min<std::int64_t>((n + kGroup - 1) / kGroup, kMaxGroups));
}

// Launches `pl` on the current stream of ts[0]'s device over the operands
// `ts` (the output first; those the shader has beyond them bind the first
// input), their element offsets written at the start of `push`; counts and
// reports it. False where the device has no pipelines or an operand does not
// fit a binding.
template <std::size_t N, class Push>
bool launch(vulkan::ComputePipeline Pipelines::*which, const std::array<const at::Tensor*, N>& ts,
            Push& push, std::uint32_t x, std::uint32_t y, Counter counter) {
  accelkit::KernelStream st = K::current_stream(*ts[0]);
  const Pipelines& p = *K::translated([&] { return &pipelines(st.device); });
  const vulkan::ComputePipeline& pl = p.*which;
  if (!p.push_descriptors) return false;
  std::array<VkDescriptorBufferInfo, 4> infos{};
  auto* offsets = reinterpret_cast<std::uint32_t*>(&push);
  for (std::size_t i = 0; i < pl.bindings; ++i) {
    const at::Tensor& t = *ts[std::min(i, N - 1)];
    auto at = bind(p, st.device, t.const_data_ptr(), span_bytes(t), infos[i]);
    if (!at) return false;
    offsets[i] = *at;
  }
  for (std::size_t i = 1; i < N; ++i) K::record_stream(*ts[i], st);  // an input of another stream
  K::translated([&] {
    K::runtime().enqueue(st.device, st.handle, "vkCmdDispatch", [&](VkCommandBuffer cb) {
      vulkan::dispatch(cb, p.push_descriptors, pl, infos.data(), &push, x, y);
    });
  });
  counters.count(counter);
  K::enqueued(st);
  return true;
}

// out = op(a, b, s), broadcast, into `into` (in place) or a new tensor.
Opt elementwise(Op op, Counter counter, const at::Tensor& a, const at::Tensor* b, float s,
                const at::Tensor* into = nullptr) {
  Geom g{0, 0, 0, 0, 0, static_cast<std::uint32_t>(op), s};
  auto out = accelkit::elementwise_output(a, b, into, g.size, {g.so, g.sa, g.sb}, g.ndim);
  if (!out || out->numel() == 0) return out;
  if (out->numel() > kMax32) return std::nullopt;
  g.n = static_cast<std::uint32_t>(out->numel());
  bool ok = b ? launch<3>(&Pipelines::elementwise, {&*out, &a, b}, g, groups(g.n), 1, counter)
              : launch<2>(&Pipelines::elementwise, {&*out, &a}, g, groups(g.n), 1, counter);
  return ok ? out : std::nullopt;
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
std::optional<float> negated(const at::Scalar& alpha) {
  auto s = real_number<float>(alpha);
  return s ? std::optional<float>(-*s) : std::nullopt;
}

Opt add(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return binary(Op::add, c_add, a, b, real_number<float>(alpha));
}
Opt add_(at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return binary(Op::add, c_add, a, b, real_number<float>(alpha), &a);
}
Opt sub(const at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return binary(Op::add, c_add, a, b, negated(alpha));
}
Opt sub_(at::Tensor& a, const at::Tensor& b, const at::Scalar& alpha) {
  return binary(Op::add, c_add, a, b, negated(alpha), &a);
}
Opt mul(const at::Tensor& a, const at::Tensor& b) { return binary(Op::mul, c_mul, a, b, 1.0f); }
Opt mul_(at::Tensor& a, const at::Tensor& b) { return binary(Op::mul, c_mul, a, b, 1.0f, &a); }
Opt relu(const at::Tensor& a) { return f32(a) ? elementwise(Op::relu, c_relu, a, nullptr, 0) : std::nullopt; }
Opt threshold_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& threshold) {
  auto t = real_number<float>(threshold);
  if (!t || !f32(grad) || !f32(self, grad)) return std::nullopt;
  return elementwise(Op::threshold_backward, c_threshold_backward, grad, &self, *t);
}

// beta * bias + alpha * (a @ b); bias undefined for mm.
Opt matmul(Counter counter, const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b,
           const at::Scalar& beta, const at::Scalar& alpha) {
  auto r = accelkit::matmul_args<float>(bias, a, b, beta, alpha, at::kFloat);
  if (!r) return std::nullopt;
  std::int64_t blocks = ((r->m + kBlock - 1) / kBlock) * ((r->n + kBlock - 1) / kBlock);
  if ((blocks + kGroup - 1) / kGroup > kMaxGroups || (r->k == 0 && r->m * r->n != 0)) return std::nullopt;
  auto [sc0, sc1] = r->bias_strides;
  for (std::int64_t v : {r->k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), sc0, sc1})
    if (v < 0 || v > kMax32) return std::nullopt;
  at::Tensor out = empty_output(a, {r->m, r->n}, nullptr);
  if (out.numel() == 0) return out;
  auto u = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  MatmulParams q{0, 0, 0, 0, u(r->m), u(r->n), u(r->k), r->has_bias, u(a.stride(0)), u(a.stride(1)),
                 u(b.stride(0)), u(b.stride(1)), u(sc0), u(sc1), r->alpha, r->beta};
  bool ok = r->has_bias ? launch<4>(&Pipelines::addmm, {&out, &a, &b, &bias}, q, groups(blocks), 1, counter)
                        : launch<3>(&Pipelines::addmm, {&out, &a, &b}, q, groups(blocks), 1, counter);
  return ok ? Opt(out) : std::nullopt;
}
Opt mm(const at::Tensor& a, const at::Tensor& b) { return matmul(c_mm, at::Tensor(), a, b, 0, 1); }
Opt addmm(const at::Tensor& bias, const at::Tensor& a, const at::Tensor& b, const at::Scalar& beta,
          const at::Scalar& alpha) {
  return matmul(c_addmm, bias, a, b, beta, alpha);
}

// The sum of `self` over `dims` (none or empty: all).
Opt sum_dim(const at::Tensor& self, at::OptionalIntArrayRef dims, bool keepdim,
            std::optional<at::ScalarType> dtype) {
  if (!f32(self) || (dtype && *dtype != at::kFloat)) return std::nullopt;
  auto l = accelkit::reduction_layout(self, dims, keepdim);
  Red g{};
  if (!l || !merge_dims<1>(l->kept_sizes, {l->kept_strides.data()}, g.ksize, {g.kstride}, g.nk) ||
      !merge_dims<1>(l->reduced_sizes, {l->reduced_strides.data()}, g.rsize, {g.rstride}, g.nr))
    return std::nullopt;
  at::Tensor out = empty_output(self, l->shape, nullptr);
  if (out.numel() == 0) return out;
  std::int64_t nred = self.numel() / out.numel();  // 0: sums of nothing, zeros
  if (out.numel() > kMax32 || nred > kMax32) return std::nullopt;
  g.nout = static_cast<std::uint32_t>(out.numel());
  g.nred = static_cast<std::uint32_t>(nred);
  // Many sums: an invocation each (sum_serial); few: a work-group each
  // (sum), whose barriers cost more on lavapipe than a long serial sum.
  bool serial = g.nout >= kGroup;
  std::uint32_t units = serial ? (g.nout + kGroup - 1) / kGroup : g.nout;
  std::uint32_t x = std::min(units, kMaxGroups), y = (units + x - 1) / x;
  bool ok = launch<2>(serial ? &Pipelines::sum_serial : &Pipelines::sum, {&out, nred ? &self : &out},
                      g, x, y, c_sum);
  return ok ? Opt(out) : std::nullopt;
}
Opt sum(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  return sum_dim(self, std::nullopt, false, dtype);
}

bool registered = false;

}  // namespace

const Pipelines& pipelines(int device) {
  return per_device.get(device, [](int device) {
    VulkanRuntime& rt = K::runtime();
    auto p = std::make_unique<Pipelines>();
    if (!rt.physical(device).push_descriptor) return p;
    p->limits = rt.physical(device).properties.limits;
    auto make = [&, dev = rt.logical(device).device](vulkan::ComputePipeline& pl, const char* name,
                                                const auto& code, std::uint32_t bindings,
                                                std::uint32_t push, std::optional<std::uint32_t> serial) {
      vulkan::create_pipeline(dev, pl, code, sizeof code, bindings, push, serial, [&](VkResult r, const char* fn) {
        TORCH_CHECK(false, "vkdev: creating the native kernel '", name, "' for device ", device,
                    " failed: ", fn, ": ", vulkan::result_name(r), " (", static_cast<int>(r), ")");
      });
    };
    make(p->elementwise, "elementwise", spv::elementwise, 3, sizeof(Geom), std::nullopt);
    make(p->addmm, "addmm", spv::addmm, 4, sizeof(MatmulParams), std::nullopt);
    make(p->sum, "sum", spv::sum, 2, sizeof(Red), 0);
    make(p->sum_serial, "sum_serial", spv::sum, 2, sizeof(Red), 1);
    p->push_descriptors = rt.logical(device).push_descriptor_fn;
    return p;
  });
}

std::optional<std::uint32_t> bind(const Pipelines& p, int device, const void* ptr,
                                  std::size_t bytes, VkDescriptorBufferInfo& info) {
  BufferRef r = K::translated([&] { return K::runtime().locate(device, ptr, bytes, "vkCmdDispatch"); });
  return vulkan::bind(r, p.limits, sizeof(float), info);
}

std::int64_t launches(std::string_view kernel) { return counters.launches(kernel); }
bool enabled() { return registered; }

}  // namespace vkdev::kernels

ACCELKIT_KERNELS(vkdev::VulkanRuntime, lib) {
  namespace k = vkdev::kernels;
  using namespace at::_ops;
  using R = vkdev::VulkanRuntime;
  if (!accelkit::kernels_enabled("VKDEV_NATIVE_KERNELS")) return;
  accelkit::impl_or_fallback<R, add_Tensor, &k::add>(lib);
  accelkit::impl_or_fallback<R, add__Tensor, &k::add_>(lib);
  accelkit::impl_or_fallback<R, sub_Tensor, &k::sub>(lib);
  accelkit::impl_or_fallback<R, sub__Tensor, &k::sub_>(lib);
  accelkit::impl_or_fallback<R, mul_Tensor, &k::mul>(lib);
  accelkit::impl_or_fallback<R, mul__Tensor, &k::mul_>(lib);
  accelkit::impl_or_fallback<R, relu, &k::relu>(lib);
  accelkit::impl_or_fallback<R, threshold_backward, &k::threshold_backward>(lib);
  accelkit::impl_or_fallback<R, mm, &k::mm>(lib);
  accelkit::impl_or_fallback<R, addmm, &k::addmm>(lib);
  accelkit::impl_or_fallback<R, sum_dim_IntList, &k::sum_dim>(lib);
  accelkit::impl_or_fallback<R, sum, &k::sum>(lib);
  k::registered = true;
}
