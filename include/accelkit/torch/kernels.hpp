// accelkit: the vendor-kernel API. A vendor's own ATen kernels for its
// backend: the stream to enqueue on, the runtime and the physical device
// behind a tensor, stream-use recording for the caching pool, and the
// registration that overrides the SDK's kernel of an operator (or opts an
// operator out of its host kernel) without PyTorch's override warning and
// whatever the link order; with the driver-neutral helpers of
// kernel_helpers.hpp (outputs, broadcast strides, merged dims, numbers,
// overlap checks).
//
//   using K = accelkit::Kernels<MyRuntime>;
//   at::Tensor my_relu(const at::Tensor& self) {
//     if (!fits(self)) return K::fallback<at::_ops::relu>(self);  // the CPU, as before
//     at::Tensor out = at::empty_like(self);     // the caching pool, current stream
//     accelkit::KernelStream s = K::current_stream(self);
//     K::translated([&] {  // the runtime's errors as PyTorch's
//       K::runtime().launch_relu(s.device, s.handle, self.data_ptr(), out.data_ptr(), n);
//     });
//     K::enqueued(s);
//     return out;
//   }
//   ACCELKIT_KERNELS(MyRuntime, lib) {
//     lib.impl("relu", TORCH_FN(my_relu));
//     lib.fallback("mul.Tensor");  // the CPU fallback instead of the host kernel
//   }
//
// Note [Vendor kernel registration]: the SDK registers each of its ATen
// kernels for the backend (the SDK's library part: the native operators,
// the host kernels, the CPU kernels over composites) through a table of its
// own, one torch::Library per operator, instead of the one library of a
// TORCH_LIBRARY_IMPL block. A vendor's ACCELKIT_KERNELS block, a static
// initializer of its own translation unit, goes through the same table: an
// operator the vendor took first is skipped by the SDK; one the SDK
// registered first loses the SDK's kernel (its library is destroyed, which
// deregisters it) before the vendor's is registered. Either way the
// dispatcher never sees two kernels for one operator and key, so PyTorch
// does not warn, and the vendor's kernel wins whatever the order of static
// initialization (the link order). Of two vendor kernels for one operator
// the first stays; the second is refused with an error naming both places,
// reported through the diagnostics hook (a PyTorch warning), since a static
// initializer has no caller to throw to (an exception leaving it would end
// the process). A vendor kernel registered with PyTorch's
// own TORCH_LIBRARY_IMPL bypasses the table and is not covered.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/kernel_helpers.hpp>
#include <accelkit/torch/kernel_table.hpp>

#include <ATen/native/CPUFallback.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE

// A stream as a kernel enqueues on it (a CUDA extension's
// getCurrentCUDAStream().stream()): PyTorch's stream, and the runtime's
// physical device ordinal and handle, to pass to the runtime's own members.
struct KernelStream {
  c10::Stream stream;
  device_index device;  // physical (Note [Logical and physical indices])
  StreamHandle handle;
};

// What a vendor kernel of runtime R uses; all static, all thread-safe.
template <class R>
struct Kernels {
  // The calling thread's current stream of `t`'s device (ValueError unless
  // `t` is a tensor of this backend).
  static KernelStream current_stream(const at::Tensor& t) {
    return current_stream(device_of(t, "current_stream"));
  }
  // The calling thread's current stream of a device (-1: the current one).
  static KernelStream current_stream(c10::DeviceIndex device = -1) {
    return torch_adapter::translated([&] {
      torch_adapter::BackendInterface& b = torch_adapter::backend();
      device_index d = device == -1 ? b.current_device() : device;
      Backend<R>::instance().check_not_lost(d, "a kernel launch");  // Note [Lost devices]
      Stream s = b.current_stream(d);
      return KernelStream{torch_adapter::to_c10(s), b.physical(d), b.handle(s)};
    });
  }
  // The runtime's (physical) ordinal of `t`'s device.
  static device_index physical_device(const at::Tensor& t) {
    c10::DeviceIndex d = device_of(t, "physical_device");
    return torch_adapter::translated([&] { return Backend<R>::instance().physical(d); });
  }
  // The runtime object (initialized once a tensor of the backend exists).
  static R& runtime() { return Backend<R>::instance().runtime(); }
  // Runs f (calls of the runtime's own members), raising an error of the
  // SDK's as the PyTorch error of its kind (Note [Error kinds]): a
  // runtime's driver_error as RuntimeError, an out-of-memory as
  // torch.OutOfMemoryError, as the SDK's own kernels raise them.
  template <class F>
  static decltype(auto) translated(F&& f) {
    return torch_adapter::translated(std::forward<F>(f));
  }

  // Tensor.record_stream: `t`'s memory is used by work on `s`, so the
  // caching pool does not hand it out again, once `t` is freed, before the
  // work queued on `s` so far has completed. Not needed for the stream `t`
  // was allocated on (outputs of at::empty on the current stream).
  static void record_stream(const at::Tensor& t, const KernelStream& s) {
    c10::DeviceIndex d = device_of(t, "record_stream");
    TORCH_CHECK_VALUE(s.stream.device_index() == d, R::name, ": record_stream: a tensor of ",
                      R::name, ":", static_cast<int>(d), " recorded on a stream of ", R::name, ":",
                      static_cast<int>(s.stream.device_index()));
    if (!t.storage().data()) return;
    torch_adapter::translated([&] {
      torch_adapter::backend().device_record_stream(d, t.storage().data_ptr().get(), s.handle);
    });
  }

  // Reports work just enqueued on `s`. Call it after every launch: the
  // profiler then gives the operator a device activity (Note [Device work
  // of an operator]), and where the SDK runs the kernel as part of host
  // work (inside a host kernel or the CPU fallback, Note [Device work
  // inside host kernels]) it waits for the work here, so the host code
  // after it sees the result.
  static void enqueued(const KernelStream& s) {
    torch_adapter::note_device_work();
    if (torch_adapter::host_kernel_depth > 0)
      torch_adapter::translated(
          [&] { Backend<R>::instance().stream_synchronize(s.stream.device_index(), s.handle); });
  }

  // Runs operator Op through the SDK's CPU fallback (the arguments a vendor
  // kernel does not take): fallback<at::_ops::add_Tensor>(self, other, alpha).
  template <class Op, class... A>
  static decltype(auto) fallback(A&&... a) {
    return at::native::call_fallback_fn_symint<&torch_adapter::fallback,
                                               Op>::call(
        std::forward<A>(a)...);
  }

 private:
  static c10::DeviceIndex device_of(const at::Tensor& t, const char* what) {
    TORCH_CHECK_VALUE(t.defined() && t.device().type() == torch_adapter::kDeviceType, R::name,
                      ": ", what, ": expected a tensor of ", R::name, ", got ",
                      t.defined() ? t.device().str() : std::string("an undefined tensor"));
    return t.device().index();
  }
};

// The registration handle of an ACCELKIT_KERNELS block.
template <class R>
class KernelLibrary {
 public:
  KernelLibrary(const char* file, unsigned line) : file_(file), line_(line) {}
  // The vendor's kernel of ATen operator `name` ("relu", "add.Tensor"), as
  // torch::Library::impl takes it (TORCH_FN(f), a lambda, a boxed function).
  template <class F>
  KernelLibrary& impl(const char* name, F&& f) {
    torch_adapter::KernelTable::get().vendor_impl(
        name, std::forward<F>(f), file_, line_);
    return *this;
  }
  // Operator `name` runs through the CPU fallback, not the SDK's host
  // kernel (Note [Host kernels]): a per-operator opt-out.
  KernelLibrary& fallback(const char* name) {
    return impl(name, torch::CppFunction::makeFromBoxedFunction<
                          &torch_adapter::fallback>());
  }

 private:
  const char* file_;
  unsigned line_;
};

ACCELKIT_END_NAMESPACE

#define ACCELKIT_KERNELS_CAT2_(a, b) a##b
#define ACCELKIT_KERNELS_CAT_(a, b) ACCELKIT_KERNELS_CAT2_(a, b)
// ACCELKIT_KERNELS(R, lib) { lib.impl(...); ... }: a vendor's kernels for
// runtime R's backend, registered when its translation unit is initialized
// (Note [Vendor kernel registration]). At namespace scope, in any .cpp of
// the backend's library; several blocks may exist.
#define ACCELKIT_KERNELS(R, lib)                                                              \
  static void ACCELKIT_KERNELS_CAT_(accelkit_kernels_, __LINE__)(::accelkit::KernelLibrary<R>&); \
  static const bool ACCELKIT_KERNELS_CAT_(accelkit_kernels_registered_, __LINE__) = [] {      \
    try {                                                                                      \
      ::accelkit::KernelLibrary<R> l(__FILE__, __LINE__);                                      \
      ACCELKIT_KERNELS_CAT_(accelkit_kernels_, __LINE__)(l);                                  \
      return true;                                                                             \
    } catch (const std::exception& e) { /* Note [Vendor kernel registration] */               \
      ::accelkit::report(::accelkit::Severity::error, R::name, e.what());                      \
      return false;                                                                            \
    }                                                                                          \
  }();                                                                                         \
  static void ACCELKIT_KERNELS_CAT_(accelkit_kernels_, __LINE__)(::accelkit::KernelLibrary<R>& lib)
