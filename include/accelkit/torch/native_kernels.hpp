// accelkit: what a backend's set of native kernels writes around its
// kernels whatever the driver: registration that falls back to the CPU
// where a kernel declines its arguments, an environment switch read at
// load, per-device state built once (a program, pipelines) whose failure is
// raised again, launch counters for tests and benchmarks, and the outputs
// and layouts of elementwise operators, matrix products and reductions.
//
//   // nullopt: the arguments do not fit the kernel, so the CPU fallback runs
//   std::optional<at::Tensor> relu(const at::Tensor& self);
//   ACCELKIT_KERNELS(MyRuntime, lib) {
//     if (!accelkit::kernels_enabled("MY_NATIVE_KERNELS")) return;
//     accelkit::impl_or_fallback<MyRuntime, at::_ops::relu, &relu>(lib);
//   }
#pragma once

#include <accelkit/torch/kernels.hpp>

#include <ATen/ExpandUtils.h>
#include <ATen/core/DimVector.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

namespace detail {
template <class R, class Op, auto F, class Schema = typename Op::schema>
struct OrFallback;
template <class R, class Op, auto F, class Ret, class... A>
struct OrFallback<R, Op, F, Ret(A...)> {
  static Ret call(A... a) {
    if constexpr (std::is_reference_v<Ret>) {  // in place: the kernel wrote `self`
      if (F(a...)) return std::get<0>(std::forward_as_tuple(a...));
    } else {
      if (auto out = F(a...)) return std::move(*out);
    }
    return Kernels<R>::template fallback<Op>(a...);
  }
};
}  // namespace detail

// Registers F for ATen operator Op (at::_ops::add_Tensor): F takes Op's
// arguments and returns std::optional<at::Tensor>, nullopt where it declines
// them (a dtype, a layout, a size it does not take), in which case Op runs
// through the CPU fallback (Kernels<R>::fallback), which computes or raises
// as the CPU does. For an in-place Op (returning Tensor&) any value means
// F wrote the first argument, which is returned.
template <class R, class Op, auto F>
void impl_or_fallback(KernelLibrary<R>& lib) {
  std::string name = Op::name;
  if (name.rfind("aten::", 0) == 0) name = name.substr(6);
  if (*Op::overload_name) name += std::string(".") + Op::overload_name;
  lib.impl(name.c_str(), TORCH_FN((detail::OrFallback<R, Op, F>::call)));
}

// Whether a backend's native kernels are on, from environment variable
// `var` read once at load: unset or "1" on, "0" off; another value is an
// std::invalid_argument naming the variable (ACCELKIT_KERNELS reports it).
inline bool kernels_enabled(const char* var) {
  const char* v = std::getenv(var);
  if (v == nullptr || std::strcmp(v, "1") == 0) return true;
  if (std::strcmp(v, "0") == 0) return false;
  throw std::invalid_argument(std::string(var) + "='" + v +
                              "': expected 0 or 1 (the native kernels are not registered)");
}

// How many times each named kernel ran; thread-safe.
template <std::size_t N>
class LaunchCounters {
 public:
  explicit LaunchCounters(std::array<const char*, N> names) : names_(names) {}
  void count(std::size_t kernel) { counts_[kernel].fetch_add(1, std::memory_order_relaxed); }
  // The launches of `kernel`, or of all for "" (ValueError naming the
  // backend and the kernels for an unknown name).
  std::int64_t launches(std::string_view kernel) const {
    std::int64_t total = 0;
    bool known = kernel.empty();
    std::string all;
    for (std::size_t i = 0; i < N; ++i) {
      all += (i ? ", " : "") + std::string(names_[i]);
      if (!kernel.empty() && kernel != names_[i]) continue;
      known = true;
      total += counts_[i].load(std::memory_order_relaxed);
    }
    TORCH_CHECK_VALUE(known, torch_adapter::backend_name(), ": launches: no native kernel '", std::string(kernel),
                      "' (", all, ")");
    return total;
  }

 private:
  std::array<const char*, N> names_;
  std::array<std::atomic<std::int64_t>, N> counts_{};
};

// A T per (physical) device, made by make(device) at the first get() there,
// once (other threads wait for it), and kept for the program's life. A
// failed make (it throws) is kept: each later get() on that device raises
// a RuntimeError with the same message. Lock-free after the first get for
// devices 0..63.
template <class T>
class PerDevice {
 public:
  template <class Make>
  T& get(int device, Make&& make) {
    bool fast = device >= 0 && device < static_cast<int>(ready_.size());
    if (fast)
      if (T* p = ready_[static_cast<std::size_t>(device)].load(std::memory_order_acquire)) return *p;
    std::lock_guard<std::mutex> lock(mutex_);
    Slot& slot = slots_[device];
    if (!slot.value && slot.error.empty()) {
      try {
        slot.value = make(device);
      } catch (const c10::Error& e) {
        slot.error = e.what_without_backtrace();
      } catch (const std::exception& e) {
        slot.error = e.what();
      }
    }
    TORCH_CHECK(slot.value, slot.error);
    if (fast) ready_[static_cast<std::size_t>(device)].store(slot.value.get(), std::memory_order_release);
    return *slot.value;
  }

 private:
  struct Slot {
    std::unique_ptr<T> value;
    std::string error;
  };
  std::mutex mutex_;
  std::map<int, Slot> slots_;  // never erased
  std::array<std::atomic<T*>, 64> ready_{};
};

// A reduction of `self` over `dims` (none or empty: all): the output's
// shape (reduced dims kept as 1 with keepdim), and the sizes and strides of
// the kept dims (the output's, in order) and of the reduced dims.
struct ReductionLayout {
  at::DimVector shape, kept_sizes, kept_strides, reduced_sizes, reduced_strides;
};
// nullopt where `dims` names a dim out of range or twice (the CPU's error).
inline std::optional<ReductionLayout> reduction_layout(const at::Tensor& self,
                                                       at::OptionalIntArrayRef dims, bool keepdim) {
  std::int64_t nd = self.dim(), wrap = std::max<std::int64_t>(nd, 1);
  c10::SmallVector<bool, 8> reduced(static_cast<std::size_t>(nd), !dims || dims->empty());
  for (std::int64_t d : dims.value_or(c10::IntArrayRef())) {
    std::int64_t w = d < 0 ? d + wrap : d;
    if (w < 0 || w >= wrap || (nd > 0 && reduced[static_cast<std::size_t>(w)])) return std::nullopt;
    if (nd > 0) reduced[static_cast<std::size_t>(w)] = true;
  }
  ReductionLayout l;
  for (std::int64_t d = 0; d < nd; ++d) {
    bool r = reduced[static_cast<std::size_t>(d)];
    if (!r || keepdim) l.shape.push_back(r ? 1 : self.size(d));
    (r ? l.reduced_sizes : l.kept_sizes).push_back(self.size(d));
    (r ? l.reduced_strides : l.kept_strides).push_back(self.stride(d));
  }
  return l;
}

// Whether `t` is a plain (not conjugate or negative view) tensor of dtype
// `dtype` on the device of `like`, a tensor of this backend.
inline bool dtype_on(const at::Tensor& t, at::ScalarType dtype, const at::Tensor& like) {
  return t.defined() && t.device().type() == torch_adapter::kDeviceType &&
         t.device() == like.device() && t.scalar_type() == dtype && !t.is_conj() && !t.is_neg();
}

// The output of an elementwise kernel out = f(a, b) (b null: f(a)) with
// broadcasting, and its layout for the kernel's parameters: `into` (an
// in-place output; it must have the broadcast shape, distinct elements, and
// share with each input all or none of its bytes) or a new tensor laid out
// as at::empty_like lays out the input of that shape (empty_output), and
// the dims merged where the output and both inputs allow (merge_dims:
// strides[0] the output's, [1] a's, [2] b's, 0 where broadcast; b's are a's
// without b). nullopt where `into` does not fit or more than M dims remain;
// an empty output is returned with the layout unspecified.
template <class T, std::size_t M>
std::optional<at::Tensor> elementwise_output(const at::Tensor& a, const at::Tensor* b,
                                             const at::Tensor* into, T (&size)[M],
                                             const std::array<T*, 3>& strides, T& ndim) {
  at::DimVector shape = b ? at::infer_size_dimvector(a.sizes(), b->sizes()) : at::DimVector(a.sizes());
  c10::IntArrayRef sh(shape);
  if (into && (into->sizes() != sh || !distinct_elements(*into) || !same_or_disjoint(*into, a) ||
               (b && !same_or_disjoint(*into, *b))))
    return std::nullopt;
  const at::Tensor* like = a.sizes() == sh ? &a : b && b->sizes() == sh ? b : nullptr;
  at::Tensor out = into ? *into : empty_output(a, sh, like);
  if (out.numel() == 0) return out;
  at::DimVector sa(shape.size()), sb(shape.size());
  broadcast_strides(a, sh, sa.data());
  broadcast_strides(b ? *b : a, sh, sb.data());
  if (!merge_dims<3>(sh, {out.strides().data(), sa.data(), sb.data()}, size, strides, ndim))
    return std::nullopt;
  return out;
}

// The arguments of beta * bias + alpha * (a @ b) (addmm; mm with an
// undefined bias) for a kernel of `dtype` matrices: the sizes, whether the
// bias is read (defined, beta not 0) and its strides broadcast to (m, n),
// alpha and beta as T. nullopt where a and b are not 2-d matrices of dtype
// on one device of the backend that multiply, the bias is not a tensor of
// dtype there of at most 2 dims broadcastable to (m, n), or a number is
// complex.
template <class T>
struct MatmulArgs {
  std::int64_t m, n, k;
  bool has_bias;
  std::array<std::int64_t, 2> bias_strides;
  T alpha, beta;
};
template <class T>
std::optional<MatmulArgs<T>> matmul_args(const at::Tensor& bias, const at::Tensor& a,
                                         const at::Tensor& b, const at::Scalar& beta,
                                         const at::Scalar& alpha, at::ScalarType dtype) {
  auto fa = real_number<T>(alpha), fb = real_number<T>(beta);
  if (!dtype_on(a, dtype, a) || !dtype_on(b, dtype, a) || a.dim() != 2 || b.dim() != 2 ||
      a.size(1) != b.size(0) || !fa || !fb)
    return std::nullopt;
  MatmulArgs<T> r{a.size(0), b.size(1), a.size(1), bias.defined() && *fb != T(0), {0, 0}, *fa, *fb};
  std::array<std::int64_t, 2> mn = {r.m, r.n};
  if (bias.defined() && (!dtype_on(bias, dtype, a) || bias.dim() > 2 || !at::is_expandable_to(bias.sizes(), mn)))
    return std::nullopt;
  if (r.has_bias) broadcast_strides(bias, mn, r.bias_strides.data());
  return r;
}

ACCELKIT_END_NAMESPACE
