// accelkit: PyTorch's own CPU kernels as native kernels of a backend whose
// memory the host can address.
//
// Note [Host kernels]
// The boxed CPU fallback serves every operator, but each call pays for
// boxing the arguments into a stack, a CPU tensor aliasing each device
// tensor, and a second trip through the dispatcher, as much as a small
// kernel itself (bench/simdev_bench.py). When the host can reach the device's memory
// (capability schema), the hottest operators do without all of that: their
// PrivateUse1 kernel orders itself after the current stream, then runs
// PyTorch's CPU kernel of the same operator directly on the device tensors,
// either by an unboxed redispatch to the CPU key (out= forms) or, for the
// functional forms of elementwise operators, through the structured CPU
// kernel class with outputs allocated on the device (what PyTorch generates
// for the CPU, with this backend's allocator). PyTorch's CPU kernels need
// nothing of a CPU tensor but its memory; where one calls a TensorIterator
// kernel stub with the iterator's device type, the stub gets a PrivateUse1
// entry that forwards to its CPU kernel (installed once some device reported
// memory the host can reach). On a direct device the CPU kernel gets the
// device tensors themselves, so PyTorch's overlap checks
// (ATen/MemoryOverlap.h) compare their real storages and addresses, and
// refuse or allow an out= over an input as the CPU does (the fallback: Note
// [One host storage per device storage]).
//
// They remain CPU execution: each is counted in the fallback report under
// its operator's name, and the fallback policy and block list apply to them
// as to any fallback. Arguments they do not take (tensors of two devices or
// of another device type, mixed dtypes that a TensorIterator would have to
// convert, a device whose memory the host cannot reach: host_access none)
// go to the fallback unchanged. On a device whose host_access is mapped, a
// host kernel maps its tensors, and what it allocates, for its length (Note
// [Map scopes]), and gives the CPU kernel CPU tensors at the host's
// addresses instead of the device tensors (Note [Host kernels on mapped
// memory]). The arithmetic operators (add, sub, mul, div) also take one
// CPU scalar operand (`x * 0.5`, a zero-dim CPU tensor) beside a device
// tensor, as TensorIterator allows on any device, when it does not change
// the result's dtype: it is converted to that dtype first, as the CPU's
// TensorIterator does, except for Half and BFloat16, whose CPU kernels
// compute with the scalar's original precision. Device work issued inside a
// host kernel (zeroing an output) is done in order, on the host (Note
// [Device work inside host kernels]). A runtime's own kernels
// (ACCELKIT_KERNELS, torch/kernels.hpp) replace these operator by operator,
// as does its per-operator opt-out (KernelLibrary::fallback); a runtime
// declares `static constexpr bool host_kernels = false;` to turn them all off.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/compat.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/kernel_table.hpp>

#include <ATen/native/Activation.h>
#include <ATen/native/BinaryOps.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Lerp.h>
#include <ATen/native/PointwiseOps.h>
#include <ATen/native/ReduceOps.h>
#include <ATen/native/TensorCompare.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/add_native.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/clamp_min_native.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/div_native.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/mm_ops.h>
#include <ATen/ops/mul_native.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/result_type_native.h>
#include <ATen/ops/sub_native.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/threshold_backward_native.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/exp_native.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/log_native.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/sqrt_native.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/rsqrt_native.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/tanh_native.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/sigmoid_native.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/neg_native.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/reciprocal_native.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/lerp_native.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/addcmul_native.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addcdiv_native.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/tanh_backward_native.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/sigmoid_backward_native.h>
#include <ATen/ops/sigmoid_backward_ops.h>

#include <array>
#include <deque>
#include <mutex>
#include <set>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

namespace host {

// A stub's PrivateUse1 entry: the same call on the CPU entry.
template <auto& Stub, class Fn>
struct StubForward;
template <auto& Stub, class Ret, class... A>
struct StubForward<Stub, Ret (*)(A...)> {
  static Ret call(A... a) { return Stub(c10::DeviceType::CPU, std::forward<A>(a)...); }
};
template <auto& Stub>
void forward_stub() {
  using FnPtr = typename std::remove_reference_t<decltype(Stub)>::FnPtr;
  Stub.set_privateuse1_dispatch_ptr(&StubForward<Stub, FnPtr>::call);
}

inline void install_stubs() {
#ifdef ACCELKIT_TORCH_CPU_STUBS
  using namespace at::native;
  forward_stub<add_stub>();
  forward_stub<mul_stub>();
  forward_stub<div_true_stub>();
  forward_stub<clamp_min_scalar_stub>();
  forward_stub<threshold_stub>();
  forward_stub<sum_stub>();
  forward_stub<exp_stub>();
  forward_stub<log_stub>();
  forward_stub<sqrt_stub>();
  forward_stub<rsqrt_stub>();
  forward_stub<tanh_stub>();
  forward_stub<sigmoid_stub>();
  forward_stub<neg_stub>();
  forward_stub<reciprocal_stub>();
  forward_stub<lerp_kernel_scalar_weight>();
  forward_stub<addcmul_stub>();
  forward_stub<addcdiv_stub>();
  forward_stub<tanh_backward_stub>();
  forward_stub<sigmoid_backward_stub>();
#endif
}

// f(tensor, written): each tensor argument, and whether the operator writes
// it (out= and in-place arguments are the non-const ones).
template <class F>
void visit_tensors(const at::Tensor& t, const F& f) {
  f(t, false);
}
template <class F>
void visit_tensors(at::Tensor& t, const F& f) {
  f(t, true);
}
template <class F>
void visit_tensors(const std::optional<at::Tensor>& t, const F& f) {
  if (t) f(*t, false);
}
template <class T, class F>
void visit_tensors(const T&, const F&) {}

// Whether host kernels may run on d (host_access mapped or direct), waiting
// for d's current stream when `wait`; the first yes installs the stubs'
// PrivateUse1 entries.
template <bool wait = true>
bool host_ready(c10::DeviceIndex d) {
  using H = HostAccess;
  if (!translated([&] { return wait ? H::host_reachable_ready(d) : H::host_reachable(d); }))
    return false;
  static std::once_flag once;
  std::call_once(once, install_stubs);
  return true;
}

// A zero-dim CPU tensor: TensorIterator takes it beside tensors of any device.
inline bool cpu_scalar(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.dim() == 0;
}

// Where a host kernel may run for some arguments, and the dtype its CPU
// scalars are converted to.
struct HostPlace {
  c10::Device device;
  at::ScalarType dtype;
};

// The device that a host kernel may run on for these arguments: the one
// device of this backend that every tensor argument is on, if its memory is
// host-visible; then ordered after its current stream. With `uniform`, the
// tensors must also share one dtype: a TensorIterator on a device other than
// the CPU leaves type conversion to the kernel, which PyTorch's CPU kernels
// do not do. With `scalar`, one input may instead be a CPU scalar whose
// conversion to that dtype is what the CPU would do (Note [Host kernels]).
// Otherwise nullopt, and the call goes to the fallback (which copies through
// the CPU, converts, or reports two devices).
// With `wait` false the stream is not waited for: the caller does, after
// allocating what the kernel writes (Note [Host work on recycled blocks]).
template <bool uniform, bool scalar = false, bool wait = true, class... Args>
std::optional<HostPlace> host_device(Args&&... args) {  // forwarding: sees which are written
  std::optional<c10::Device> device;
  std::optional<at::ScalarType> dtype;
  const at::Tensor* first = nullptr;  // the first device tensor
  const at::Tensor* cpu = nullptr;    // the CPU scalar
  bool ok = true;
  auto look = [&](const at::Tensor& t, bool written) {
    if (!t.defined()) return;
    if (scalar && !written && cpu_scalar(t)) {
      if (cpu) ok = false;  // TensorIterator takes one CPU scalar at most
      cpu = &t;
      return;
    }
    if (t.device().type() != kDeviceType) {
      ok = false;
      return;
    }
    if (!device) {
      first = &t;
      device = t.device();
      dtype = t.scalar_type();
    } else if (*device != t.device() || (uniform && *dtype != t.scalar_type())) {
      ok = false;
    }
  };
  (visit_tensors(args, look), ...);
  if (!device || !ok) return std::nullopt;
  if (cpu) {
    at::ScalarType d = *dtype;
    bool exact = at::isComplexType(d) || at::isIntegralType(d, /*includeBool=*/false) ||
                 (at::isFloatingType(d) && d != at::kHalf && d != at::kBFloat16);
    // The native function, not the operator: no trip through the dispatcher
    // (nor an event of its own under the profiler) for a dtype query.
    if (!exact || at::native::result_type(*first, *cpu) != d) return std::nullopt;
  }
  if (!host_ready<wait>(device->index())) return std::nullopt;
  return HostPlace{*device, *dtype};
}

// Maps every tensor argument on a device whose memory the host reaches
// only mapped (Note [Map scopes]); nothing otherwise.
template <class... Args>
void map_arguments(MapScope& maps, const Args&... args) {
  std::vector<at::Tensor> ts;
  (visit_tensors(args, [&](const at::Tensor& t, bool) { ts.push_back(t); }), ...);
  translated([&] { maps.add_all(ts); });  // largest first (Note [Map scopes])
}

// The arguments as the CPU kernel gets them: the CPU scalar (host_device
// allows one) converted to the kernel's dtype and held here for the call,
// everything else as it is.
struct Converted {
  at::Tensor held;
};
template <class T>
const T& cpu_arg(const T& a, Converted&, at::ScalarType) {
  return a;
}
inline at::Tensor& cpu_arg(at::Tensor& a, Converted&, at::ScalarType) { return a; }
inline const at::Tensor& cpu_arg(const at::Tensor& a, Converted& c, at::ScalarType d) {
  if (!cpu_scalar(a) || a.scalar_type() == d) return a;
  TORCH_INTERNAL_ASSERT(!c.held.defined(), "host kernels take one CPU scalar");
  c.held = a.to(d);
  if (a.unsafeGetTensorImpl()->is_wrapped_number())
    c.held.unsafeGetTensorImpl()->set_wrapped_number(true);
  return c.held;
}

// Note [Host kernels on mapped memory]
// Problem: a device whose host_access is mapped is reached by the host at
// the addresses host_map returns, which the driver may choose (Vulkan's
// vkMapMemory maps where it likes); a CPU kernel given the device tensors
// themselves would touch the device pointers.
// Decision: on such a device a host kernel, once the device's streams are
// waited for and every storage its tensors use is mapped (Note [Map
// scopes]), gives the CPU kernel a CPU tensor for each device tensor: over
// one CPU storage per device storage at the host's address of it, with the
// tensor's own offset, sizes and strides (HostImage and HostAliases, as the
// zero-copy fallback: Note [One host storage per device storage]), so the
// CPU kernel's overlap checks see the device tensors' aliasing. A result
// that is one of those tensors is its device tensor; a structured kernel's
// output is allocated on the device as on a direct device, waited for,
// mapped and given to the kernel as its CPU tensor; what the kernel did to a
// written argument (resized past its storage) reaches the device tensor as
// in the fallback. A direct device's host kernels take the device tensors.
// Limits: a result the CPU kernel allocates itself (relu's) is CPU memory,
// copied to the device; the device tensors are not given to the CPU kernel,
// so device work it would issue on them (none in these operators) is the
// CPU's.
class MappedArgs {
 public:
  explicit MappedArgs(c10::Device device) : device_(device), image_(true), aliases_(image_) {}

  // Records a tensor argument of the kernel (written: an out= or in-place
  // one); load() then makes the CPU storages of those recorded since.
  void record(const at::Tensor& t, bool written) {
    if (!t.defined() || t.device().type() != kDeviceType) return;
    image_.add(t);
    if (written) written_.insert(t.unsafeGetTensorImpl());
  }
  template <class... Args>
  void record_all(Args&&... args) {  // forwarding: sees which are written
    (visit_tensors(args, [&](const at::Tensor& t, bool w) { record(t, w); }), ...);
    translated([&] { image_.load(device_.index()); });
  }

  // The argument as the CPU kernel gets it: each device tensor as its CPU
  // tensor, a CPU scalar converted as cpu_arg does, anything else as it is.
  template <class T>
  const T& arg(const T& a, Converted&, at::ScalarType) {
    return a;
  }
  const at::Tensor& arg(const at::Tensor& a, Converted& c, at::ScalarType d) {
    if (a.defined() && a.device().type() == kDeviceType) return aliases_.alias(a);
    return cpu_arg(a, c, d);
  }
  at::Tensor& arg(at::Tensor& a, Converted&, at::ScalarType) {
    outs_.push_back({aliases_.alias(a), &a});
    return outs_.back().first;
  }
  const std::optional<at::Tensor>& arg(const std::optional<at::Tensor>& a, Converted&,
                                       at::ScalarType) {
    optionals_.push_back(a ? std::optional<at::Tensor>(aliases_.alias(*a)) : std::nullopt);
    return optionals_.back();
  }

  // The CPU tensor of device tensor `t`, recorded and loaded first.
  at::Tensor alias(const at::Tensor& t) {
    record(t, false);
    translated([&] { image_.load(device_.index()); });
    return aliases_.alias(t);
  }

  // After the kernel, its maps closed: the device tensors take what it did
  // (HostAliases::store), and its result is given back in device tensors.
  void store() { translated([&] { aliases_.store(written_); }); }
  template <class Ret>
  Ret back(Ret r) {
    if constexpr (std::is_same_v<Ret, at::Tensor&>) {
      return original(r);
    } else if constexpr (std::is_same_v<Ret, at::Tensor>) {
      const at::Tensor* t = aliases_.device_tensor(r);
      return t ? *t : cpu_result_to(r, device_);
    } else {  // a tuple of out= arguments
      return std::apply([&](auto&... e) { return Ret(original(e)...); }, r);
    }
  }

 private:
  // The out= argument whose CPU tensor the kernel returned.
  at::Tensor& original(at::Tensor& r) {
    for (auto& [slot, orig] : outs_)
      if (&slot == &r) return *orig;
    for (auto& [slot, orig] : outs_)
      if (slot.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return *orig;
    TORCH_INTERNAL_ASSERT(false, "a host kernel returned a tensor that is not an argument");
  }

  c10::Device device_;
  HostImage image_;
  HostAliases aliases_;
  std::set<const c10::TensorImpl*> written_;
  std::deque<std::pair<at::Tensor, at::Tensor*>> outs_;  // CPU tensor, its argument
  std::deque<std::optional<at::Tensor>> optionals_;
};

// Whether host kernels on d take CPU tensors at the host's addresses (Note
// [Host kernels on mapped memory]).
inline bool mapped(c10::DeviceIndex d) {
  return translated([&] { return HostAccess::host_access(d) == HostAccessLevel::mapped; });
}

// Refuses host kernel Op when the current stream of a device its tensors
// are on is capturing (Note [Refusals during capture]), before it is known
// whether the host kernel or the fallback would take the arguments: either
// runs PyTorch's CPU kernel on the host.
template <class Op, class... Args>
void refuse_during_capture(const Args&... args) {
  auto check = [](const at::Tensor& t, bool) {
    if (!t.defined() || t.device().type() != kDeviceType) return;
    refuse_if_capturing(t.device().index(), [] {
      return fmt::format("{} (PyTorch's CPU kernel run by the host, as a host kernel or through "
                         "the CPU fallback)",
                         operator_name(Op::name, Op::overload_name));
    });
  };
  (visit_tensors(args, check), ...);
}

// The dispatcher's handle of operator Op (for the fallback report).
template <class Op>
const c10::OperatorHandle& handle() {
  static const c10::OperatorHandle h =
      c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name);
  return h;
}

// An out= (or otherwise allocation-free) operator: its CPU kernel, called
// directly on the device tensors.
template <class Op, bool uniform, bool scalar = false, class Sig = typename Op::schema>
struct Kernel;
template <class Op, bool uniform, bool scalar, class Ret, class... Args>
struct Kernel<Op, uniform, scalar, Ret(Args...)> {
  static Ret call(Args... args) {
    refuse_during_capture<Op>(args...);
    std::optional<HostPlace> place = host_device<uniform, scalar>(args...);
    if (!place) return at::native::call_fallback_fn_symint<&fallback, Op>::call(args...);
    if (mapped(place->device.index())) return on_mapped(*place, args...);
    return Fallback::get().host(handle<Op>(), [&]() -> Ret {
      MapScope maps(place->device.index());
      map_arguments(maps, args...);
      HostKernelScope scope;
      Converted c;
      if constexpr (std::is_void_v<Ret>) {
        Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), cpu_arg(args, c, place->dtype)...);
        maps.close();  // a failed unmap fails the operator (Note [Map scopes])
      } else {
        Ret r = Op::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU),
                               cpu_arg(args, c, place->dtype)...);
        maps.close();  // a failed unmap fails the operator (Note [Map scopes])
        return r;
      }
    });
  }
  // On a mapped device (Note [Host kernels on mapped memory]).
  static Ret on_mapped(const HostPlace& place, Args... args) {
    return Fallback::get().host(handle<Op>(), [&]() -> Ret {
      MapScope maps(place.device.index());
      map_arguments(maps, args...);
      MappedArgs m(place.device);
      m.record_all(args...);
      Converted c;
      constexpr c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
      if constexpr (std::is_void_v<Ret>) {
        {
          HostKernelScope scope;
          Op::redispatch(cpu, m.arg(args, c, place.dtype)...);
        }
        maps.close();  // a failed unmap fails the operator (Note [Map scopes])
        m.store();
      } else {
        Ret r = [&]() -> Ret {
          HostKernelScope scope;
          return Op::redispatch(cpu, m.arg(args, c, place.dtype)...);
        }();
        maps.close();  // a failed unmap fails the operator (Note [Map scopes])
        m.store();
        return m.back<Ret>(r);
      }
    });
  }
};

// A structured CPU kernel class (meta + impl, TensorIterator based) whose
// outputs are allocated on the device: what PyTorch generates for CPU, with
// the device allocator.
template <class Impl, std::size_t N>
struct DeviceOutputs final : compat::MetaOutputs<Impl, DeviceOutputs<Impl, N>> {
  std::array<at::Tensor, N> outputs;  // what the kernel writes
  // On a mapped device (Note [Host kernels on mapped memory]): the map
  // scope and CPU tensors of the kernel, the outputs being CPU tensors of
  // device_outputs.
  MapScope* maps = nullptr;
  MappedArgs* mapped_args = nullptr;
  std::array<at::Tensor, N> device_outputs;
  const at::Tensor& maybe_get_output(int64_t i) override { return outputs[static_cast<std::size_t>(i)]; }

  // The output hooks (compat::MetaOutputs: their signature differs between
  // PyTorch versions, Note [PyTorch versions]).
  void make(int64_t i, at::IntArrayRef sizes, at::IntArrayRef strides, at::TensorOptions options) {
    constexpr c10::DispatchKeySet keys(c10::DispatchKey::PrivateUse1);
    at::ScalarType dtype = options.dtype().toScalarType();
    // No strides: contiguous in the requested memory format.
    at::Tensor t = strides.empty() ? at::detail::empty_generic(sizes, &device_allocator(), keys,
                                                               dtype, options.memory_format_opt())
                                   : at::detail::empty_strided_generic(
                                         sizes, strides, &device_allocator(), keys, dtype);
    if (mapped_args) {
      // Waited for past every use of its block (Note [Host work on recycled
      // blocks]), then mapped.
      translated([&] {
        HostAccess::host_wait(t.device().index());
        maps->add(t);
      });
      device_outputs[static_cast<std::size_t>(i)] = t;
      t = mapped_args->alias(t);
    }
    outputs[static_cast<std::size_t>(i)] = std::move(t);
    this->raw_strided(i, sizes, strides, options);
  }
};

// A functional operator with one result, run by the structured CPU kernel
// class Impl (meta(args...), then impl(args..., out)) on the device.
template <class Op, class Impl, bool scalar = false, class Sig = typename Op::schema>
struct Functional;
template <class Op, class Impl, bool scalar, class... Args>
struct Functional<Op, Impl, scalar, at::Tensor(Args...)> {
  static at::Tensor call(Args... args) {
    refuse_during_capture<Op>(args...);
    std::optional<HostPlace> place = host_device<true, scalar, /*wait=*/false>(args...);
    if (!place) return at::native::call_fallback_fn_symint<&fallback, Op>::call(args...);
    if (mapped(place->device.index())) return on_mapped(*place, args...);
    c10::DeviceGuard guard(place->device);  // the allocator serves the current device
    Converted c;
    auto cpu_args = std::forward_as_tuple(cpu_arg(args, c, place->dtype)...);
    DeviceOutputs<Impl, 1> op;
    std::apply([&](const auto&... a) { op.meta(a...); }, cpu_args);  // allocates the output
    for (int i = 1; i < op.ntensors(); ++i)
      if (op.dtype(i) != op.dtype(0))  // a promoting result (int / int): see host_device
        return at::native::call_fallback_fn_symint<&fallback, Op>::call(args...);
    // The stream is waited for after the output was allocated, so past every
    // use queued before its block was freed (Note [Host work on recycled
    // blocks]).
    translated([&] { HostAccess::host_wait(place->device.index()); });
    return Fallback::get().host(handle<Op>(), [&] {
      MapScope maps(place->device.index());
      map_arguments(maps, args..., op.outputs[0]);
      HostKernelScope scope;
      std::apply([&](const auto&... a) { op.impl(a..., op.outputs[0]); }, cpu_args);
      maps.close();  // a failed unmap fails the operator (Note [Map scopes])
      return std::move(op.outputs[0]);
    });
  }
  // On a mapped device (Note [Host kernels on mapped memory]): the inputs
  // waited for, mapped and given as CPU tensors; the output allocated,
  // waited for and mapped by DeviceOutputs::make.
  static at::Tensor on_mapped(const HostPlace& place, Args... args) {
    c10::DeviceGuard guard(place.device);  // the allocator serves the current device
    translated([&] { HostAccess::host_wait(place.device.index()); });
    MapScope maps(place.device.index());
    map_arguments(maps, args...);
    MappedArgs m(place.device);
    m.record_all(args...);
    Converted c;
    auto cpu_args = std::forward_as_tuple(m.arg(args, c, place.dtype)...);
    DeviceOutputs<Impl, 1> op;
    op.maps = &maps;
    op.mapped_args = &m;
    std::apply([&](const auto&... a) { op.meta(a...); }, cpu_args);  // allocates the output
    for (int i = 1; i < op.ntensors(); ++i)
      if (op.dtype(i) != op.dtype(0)) {  // a promoting result (int / int): see host_device
        maps.close();
        return at::native::call_fallback_fn_symint<&fallback, Op>::call(args...);
      }
    return Fallback::get().host(handle<Op>(), [&] {
      {
        HostKernelScope scope;
        std::apply([&](const auto&... a) { op.impl(a..., op.outputs[0]); }, cpu_args);
      }
      maps.close();  // a failed unmap fails the operator (Note [Map scopes])
      return std::move(op.device_outputs[0]);
    });
  }
};

// mean.out as the CPU computes it: a sum, then a division by the number of
// elements reduced. PyTorch's mean.out takes that path for CPU tensors only;
// for any other device it calls a mean kernel stub, which rounds
// differently. Half and BFloat16 (which the CPU sums in float), and dtypes
// that mean rejects, go to the fallback.
struct Mean {
  using Op = at::_ops::mean_out;
  static at::Tensor& call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                          std::optional<at::ScalarType> dtype, at::Tensor& out) {
    refuse_during_capture<Op>(self, out);
    auto plain = [](at::ScalarType t) {
      return (at::isFloatingType(t) && t != at::kHalf && t != at::kBFloat16) ||
             (at::isComplexType(t) && t != at::kComplexHalf);
    };
    at::ScalarType d = out.scalar_type();
    if (!plain(self.scalar_type()) || !plain(d) || (dtype && *dtype != d) ||
        !host_device<false>(self, out))
      return at::native::call_fallback_fn_symint<&fallback, Op>::call(self, dim, keepdim,
                                                                         dtype, out);
    return Fallback::get().host(handle<Op>(), [&]() -> at::Tensor& {
      MapScope maps(out.device().index());
      map_arguments(maps, self, out);
      if (mapped(out.device().index())) {  // Note [Host kernels on mapped memory]
        MappedArgs m(out.device());
        m.record_all(self, out);
        Converted c;
        const at::Tensor& cpu_self = m.arg(self, c, d);
        at::Tensor& cpu_out = m.arg(out, c, d);
        {
          HostKernelScope scope;
          compute(cpu_self, dim, keepdim, d, cpu_out);
        }
        maps.close();  // a failed unmap fails the operator (Note [Map scopes])
        m.store();
        return out;
      }
      HostKernelScope scope;
      at::Tensor& r = compute(self, dim, keepdim, d, out);
      maps.close();  // a failed unmap fails the operator (Note [Map scopes])
      return r;
    });
  }
  // The sum, then the division, by the CPU's kernels.
  static at::Tensor& compute(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                             at::ScalarType d, at::Tensor& out) {
    int64_t n = 1;
    if (!dim || dim->empty() || self.dim() == 0) {
      n = self.numel();
    } else {
      for (int64_t i : *dim) n *= self.size(i);
    }
    constexpr c10::DispatchKeySet cpu(c10::DispatchKey::CPU);
    at::_ops::sum_IntList_out::redispatch(cpu, self, dim, keepdim, d, out);
    // out.div_(n) on the CPU: n as a wrapped number, converted to out's dtype.
    at::Tensor divisor = at::scalar_tensor(n, at::TensorOptions().dtype(d));
    divisor.unsafeGetTensorImpl()->set_wrapped_number(true);
    return at::_ops::div__Tensor::redispatch(cpu, out, divisor);
  }
};

// sum.IntList_out. The CPU's sum of Half and BFloat16 over two or more
// reduced dimensions accumulates through a float buffer only when its
// iterator's device is the CPU (should_use_acc_buffer), so on device tensors
// it would round differently; those dtypes take the fallback, whose CPU
// aliases take the CPU's path.
struct Sum {
  using Op = at::_ops::sum_IntList_out;
  static at::Tensor& call(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                          std::optional<at::ScalarType> dtype, at::Tensor& out) {
    if (at::isReducedFloatingType(self.scalar_type()) ||
        at::isReducedFloatingType(out.scalar_type()))
      return at::native::call_fallback_fn_symint<&fallback, Op>::call(self, dim, keepdim,
                                                                         dtype, out);
    return Kernel<Op, true>::call(self, dim, keepdim, dtype, out);
  }
};

}  // namespace host

// The operators with host kernels: those of a training step (linear layers,
// ReLU, tanh, sigmoid, cross-entropy, SGD, Adam) and the common elementwise
// arithmetic and functions. Those
// whose CPU kernel calls a TensorIterator stub need the stub entries, which
// are known for x86-64 builds of PyTorch only (Note [CPU kernel stubs]).
inline void register_host_kernels(KernelTable& m) {
  // A runtime opts out with `static constexpr bool host_kernels = false;`
  // (an optional constant of the contract, default true).
  if (backend_host_kernels()) {
    // uniform: TensorIterator kernels (see host_device).
#define ACCELKIT_HOST_KERNEL(name, op, uniform) \
  m.impl(name, TORCH_FN((host::Kernel<at::_ops::op, uniform>::call)))
#define ACCELKIT_HOST_FUNCTIONAL(name, op, cls) \
  m.impl(name, TORCH_FN((host::Functional<at::_ops::op, at::native::cls>::call)))
    // Arithmetic: one CPU scalar operand allowed (see host_device).
#define ACCELKIT_HOST_ARITHMETIC(name, op) \
  m.impl(name, TORCH_FN((host::Kernel<at::_ops::op, true, true>::call)))
#define ACCELKIT_HOST_ARITHMETIC_FUNCTIONAL(name, op, cls) \
  m.impl(name, TORCH_FN((host::Functional<at::_ops::op, at::native::cls, true>::call)))
    ACCELKIT_HOST_KERNEL("relu", relu, false);
    ACCELKIT_HOST_KERNEL("relu_", relu_, false);
    ACCELKIT_HOST_KERNEL("mm.out", mm_out, false);
    ACCELKIT_HOST_KERNEL("addmm.out", addmm_out, false);
    ACCELKIT_HOST_KERNEL("_log_softmax.out", _log_softmax_out, false);
    ACCELKIT_HOST_KERNEL("_log_softmax_backward_data.out", _log_softmax_backward_data_out, false);
    ACCELKIT_HOST_KERNEL("nll_loss_forward.output", nll_loss_forward_output, false);
    ACCELKIT_HOST_KERNEL("nll_loss_backward.grad_input", nll_loss_backward_grad_input, false);
#ifdef ACCELKIT_TORCH_CPU_STUBS
    // add, sub, mul, div: out=, in place and functional.
#define ACCELKIT_HOST_ARITHMETIC_OPS(op, cls)            \
  ACCELKIT_HOST_ARITHMETIC(#op ".out", op##_out);         \
  ACCELKIT_HOST_ARITHMETIC(#op "_.Tensor", op##__Tensor); \
  ACCELKIT_HOST_ARITHMETIC_FUNCTIONAL(#op ".Tensor", op##_Tensor, cls)
    ACCELKIT_HOST_ARITHMETIC_OPS(add, structured_ufunc_add_CPU);
    ACCELKIT_HOST_ARITHMETIC_OPS(sub, structured_sub_out);
    ACCELKIT_HOST_ARITHMETIC_OPS(mul, structured_mul_out);
    ACCELKIT_HOST_ARITHMETIC_OPS(div, structured_div_out);
#undef ACCELKIT_HOST_ARITHMETIC_OPS
    ACCELKIT_HOST_KERNEL("clamp_min.out", clamp_min_out, true);
    ACCELKIT_HOST_KERNEL("threshold_backward.grad_input", threshold_backward_grad_input, true);
    m.impl("sum.IntList_out", TORCH_FN(host::Sum::call));
    ACCELKIT_HOST_FUNCTIONAL("clamp_min", clamp_min, structured_clamp_min_out);
    ACCELKIT_HOST_FUNCTIONAL("threshold_backward", threshold_backward,
                             structured_threshold_backward_out);
    // Pointwise operators (activations, optimizer steps): functional, in
    // place and out=.
#define ACCELKIT_HOST_POINTWISE(op)                                 \
  ACCELKIT_HOST_FUNCTIONAL(#op, op, structured_##op##_out);          \
  ACCELKIT_HOST_KERNEL(#op "_", op##_, true);                        \
  ACCELKIT_HOST_KERNEL(#op ".out", op##_out, true)
    ACCELKIT_HOST_POINTWISE(exp);
    ACCELKIT_HOST_POINTWISE(log);
    ACCELKIT_HOST_POINTWISE(sqrt);
    ACCELKIT_HOST_POINTWISE(rsqrt);
    ACCELKIT_HOST_POINTWISE(tanh);
    ACCELKIT_HOST_POINTWISE(sigmoid);
    ACCELKIT_HOST_POINTWISE(neg);
    ACCELKIT_HOST_POINTWISE(reciprocal);
    ACCELKIT_HOST_POINTWISE(addcmul);
    ACCELKIT_HOST_POINTWISE(addcdiv);
#undef ACCELKIT_HOST_POINTWISE
    ACCELKIT_HOST_FUNCTIONAL("lerp.Scalar", lerp_Scalar, structured_lerp_Scalar);
    ACCELKIT_HOST_KERNEL("lerp_.Scalar", lerp__Scalar, true);
    ACCELKIT_HOST_KERNEL("lerp.Scalar_out", lerp_Scalar_out, true);
    ACCELKIT_HOST_FUNCTIONAL("tanh_backward", tanh_backward, structured_tanh_backward_out);
    ACCELKIT_HOST_KERNEL("tanh_backward.grad_input", tanh_backward_grad_input, true);
    m.impl("mean.out", TORCH_FN(host::Mean::call));
    ACCELKIT_HOST_FUNCTIONAL("sigmoid_backward", sigmoid_backward,
                             structured_sigmoid_backward_out);
    ACCELKIT_HOST_KERNEL("sigmoid_backward.grad_input", sigmoid_backward_grad_input, true);
#endif
#undef ACCELKIT_HOST_ARITHMETIC_FUNCTIONAL
#undef ACCELKIT_HOST_ARITHMETIC
#undef ACCELKIT_HOST_FUNCTIONAL
#undef ACCELKIT_HOST_KERNEL
  }
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
