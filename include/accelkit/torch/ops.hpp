// accelkit: the minimal native operators PyTorch requires of a backend, and
// the fallback that runs every other operator through the CPU.
#pragma once

#include <accelkit/torch/adapter.hpp>

#include <ATen/MemoryOverlap.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/native_dropout_backward_native.h>
#include <ATen/ops/native_dropout_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>
#include <unordered_map>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
namespace torch_adapter {

// Tensors of two devices in one operator, refused in PyTorch's own words
// (a RuntimeError naming both devices and the operator).
inline void check_same_device(const c10::Device& first, const c10::Device& other,
                              const std::string& op) {
  TORCH_CHECK(first == other,
              "Expected all tensors to be on the same device, but found at least two devices, ",
              first, " and ", other, "! (in ", op, ")");
}

template <class R>
struct Ops {
  static State<R>& st() { return State<R>::get(); }
  static bool on_device(const at::Tensor& t) { return t.device().type() == kDeviceType; }
  static device_index dev(const at::Tensor& t) { return t.device().index(); }
  static bool host_visible(device_index d) {
    return st().backend().properties(d).host_visible_memory;
  }
  static std::size_t nbytes(const at::Tensor& t) {
    return static_cast<std::size_t>(t.numel()) * t.element_size();
  }
  static StreamHandle stream_of(device_index d) { return st().current_handle(d); }
  static void sync(device_index d) { st().backend().stream_synchronize(d, stream_of(d)); }
  // After queueing work on d's current stream (Note [Device work inside host kernels]).
  static void queued(device_index d) {
    if (host_kernel_depth > 0) sync(d);
  }
  // Whether the host may work on d's memory now: it is host-visible, and
  // d's current stream has been waited for (so the work lands in order).
  static bool host_ready(device_index d) {
    if (!host_visible(d)) return false;
    sync(d);
    return true;
  }
  // Whether device work on d is better done right here, on the host
  // (Note [Device work inside host kernels]). Waits for d's stream if so.
  static bool run_on_host(device_index d) { return host_kernel_depth > 0 && host_ready(d); }

  // A CPU tensor viewing the device memory of `t` (host-visible devices only).
  static at::Tensor host_view(const at::Tensor& t) {
    return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                         at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
  }

  // The whole storage of a device tensor, copied to a CPU byte buffer, and
  // `t`'s view of it.
  static std::pair<at::Tensor, at::Tensor> storage_to_cpu(const at::Tensor& t) {
    device_index d = dev(t);
    const c10::Storage& s = t.storage();
    at::Tensor bytes = at::empty({static_cast<int64_t>(s.nbytes())}, at::TensorOptions().dtype(at::kByte));
    st().backend().memcpy_async(d, bytes.data_ptr(), s.data(), s.nbytes(), CopyKind::device_to_host,
                                stream_of(d));
    sync(d);
    at::Tensor view = at::from_blob(static_cast<char*>(bytes.data_ptr()) +
                                        t.storage_offset() * t.element_size(),
                                    t.sizes(), t.strides(),
                                    at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
    return {bytes, view};
  }

  // A contiguous CPU copy of a device tensor.
  static at::Tensor to_cpu(const at::Tensor& t) {
    device_index d = dev(t);
    if (t.is_contiguous()) {
      at::Tensor out = at::empty(t.sizes(), t.options().device(at::kCPU));
      st().backend().memcpy_async(d, out.data_ptr(), t.data_ptr(), nbytes(t),
                                  CopyKind::device_to_host, stream_of(d));
      sync(d);
      return out;
    }
    if (host_ready(d)) return host_view(t).clone(at::MemoryFormat::Contiguous);
    return storage_to_cpu(t).second.clone(at::MemoryFormat::Contiguous);
  }

  // Writes a CPU tensor (broadcast and converted to dst's shape and dtype)
  // into a device tensor.
  static void from_cpu(const at::Tensor& dst, const at::Tensor& src) {
    device_index d = dev(dst);
    at::Tensor tmp = at::empty(dst.sizes(), dst.options().device(at::kCPU));
    tmp.copy_(src);
    if (dst.is_contiguous()) {
      st().backend().memcpy_async(d, dst.data_ptr(), tmp.data_ptr(), nbytes(dst),
                                  CopyKind::host_to_device, stream_of(d));
      sync(d);
      return;
    }
    if (host_ready(d)) {
      host_view(dst).copy_(tmp);
      return;
    }
    auto [bytes, view] = storage_to_cpu(dst);  // read, modify, write back
    view.copy_(tmp);
    const c10::Storage& s = dst.storage();
    st().backend().memcpy_async(d, s.mutable_data(), bytes.data_ptr(), s.nbytes(),
                                CopyKind::host_to_device, stream_of(d));
    sync(d);
  }

  static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() && a.is_contiguous() &&
           b.is_contiguous();
  }

  // Note [Math bits in copies]: a tensor may carry a lazy conjugate or
  // negative bit (x.conj(), a view that conjugates on read). PyTorch's
  // copy_ hands tensors of other backends to _copy_from before it resolves
  // those bits, and the Conjugate/Negative fallbacks, which would resolve
  // them by cloning, clone through copy_ again: an endless recursion. So
  // _copy_from and _copy_from_and_resize fall through those keys (see
  // register_aten_ops) and resolve the bits here: the source's raw values are
  // read without its bits, the bits applied on the CPU, and a destination
  // with bits of its own gets the values that read back as the source's.
  static bool math_bits(const at::Tensor& t) { return t.is_conj() || t.is_neg(); }
  // The same memory without the lazy bits (the raw values).
  static at::Tensor raw(const at::Tensor& t) {
    at::Tensor a = at::alias(t);
    a._set_conj(false);
    a._set_neg(false);
    return a;
  }
  static at::Tensor copy_with_math_bits(const at::Tensor& self, const at::Tensor& dst) {
    at::Tensor values = on_device(self) ? to_cpu(raw(self)) : raw(self).clone();
    values._set_conj(self.is_conj());
    values._set_neg(self.is_neg());
    values = values.resolve_conj().resolve_neg();
    if (!on_device(dst)) {
      dst.copy_(values);  // the CPU's copy_ resolves dst's bits
      return dst;
    }
    // Stored so that reading through dst's bits gives `values`.
    if (dst.is_neg()) values = values.neg();
    if (dst.is_conj()) values = values.conj().resolve_conj();
    from_cpu(raw(dst), values);
    return dst;
  }

  static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
    return translated([&] {
      if (self.numel() == 0) return dst;
      if (math_bits(self) || math_bits(dst)) return copy_with_math_bits(self, dst);
      bool src_dev = on_device(self), dst_dev = on_device(dst);
      Backend<R>& b = st().backend();
      if (src_dev && dst_dev) {
        if (same_layout(self, dst)) {
          if (dev(self) == dev(dst)) {
            if (run_on_host(dev(dst))) {
              std::memmove(dst.data_ptr(), self.data_ptr(), nbytes(dst));
              return dst;
            }
            b.memcpy_async(dev(dst), dst.data_ptr(), self.data_ptr(), nbytes(dst),
                           CopyKind::device_to_device, stream_of(dev(dst)));
            queued(dev(dst));
          } else {
            sync(dev(dst));  // earlier work on dst finishes before it is overwritten
            b.memcpy_peer_async(dst.data_ptr(), dev(dst), self.data_ptr(), dev(self),
                                nbytes(dst), stream_of(dev(self)));
            sync(dev(self));
          }
          return dst;
        }
        if (dev(self) == dev(dst) && dst.sizes() == self.sizes() && host_ready(dev(self))) {
          host_view(dst).copy_(host_view(self));
          return dst;
        }
        from_cpu(dst, to_cpu(self));
        return dst;
      }
      // Between device d and host memory that is pinned or not: left in
      // flight on d's stream only when asked to and the host side is pinned.
      // A copy left in flight keeps its pinned block from reuse until the
      // stream has passed it, should the tensor be freed first (as
      // CUDA's pinned allocator records an event for it).
      auto transfer = [&](device_index d, CopyKind kind, bool pinned) {
        const at::Tensor& host = kind == CopyKind::host_to_device ? self : dst;
        bool in_flight = non_blocking && pinned;
        if (in_flight) st().host_memory().record_stream(host.storage().mutable_data(), d, stream_of(d));
        b.memcpy_async(d, dst.data_ptr(), self.data_ptr(), nbytes(dst), kind, stream_of(d));
        if (in_flight) queued(d);
        else sync(d);
        return dst;
      };
      if (src_dev) {  // device -> host
        if (same_layout(self, dst))
          return transfer(dev(self), CopyKind::device_to_host, dst.is_pinned());
        dst.copy_(to_cpu(self));
        return dst;
      }
      // host -> device
      if (same_layout(self, dst))
        return transfer(dev(dst), CopyKind::host_to_device, self.is_pinned());
      from_cpu(dst, self);
      return dst;
    });
  }

  static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
    dst.resize_(self.sizes());
    return copy_from(self, dst, false);
  }

  static at::Tensor empty_memory_format(c10::SymIntArrayRef size,
                                        std::optional<c10::ScalarType> dtype,
                                        std::optional<c10::Layout>, std::optional<c10::Device> device,
                                        std::optional<bool>,
                                        std::optional<c10::MemoryFormat> memory_format) {
    std::optional<c10::DeviceGuard> guard;  // only for an explicit index: else current
    if (device && device->has_index()) guard.emplace(*device);
    return at::detail::empty_generic(C10_AS_INTARRAYREF_SLOW(size), &device_allocator<R>(),
                                     c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                     dtype.value_or(at::get_default_dtype_as_scalartype()),
                                     memory_format);
  }

  static at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                  std::optional<c10::ScalarType> dtype, std::optional<c10::Layout>,
                                  std::optional<c10::Device> device, std::optional<bool>) {
    std::optional<c10::DeviceGuard> guard;
    if (device && device->has_index()) guard.emplace(*device);
    return at::detail::empty_strided_generic(
        C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), &device_allocator<R>(),
        c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
        dtype.value_or(at::get_default_dtype_as_scalartype()));
  }

  static at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset) {
    return at::native::as_strided_tensorimpl(
        self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
        offset ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
  }

  static at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
    return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
  }

  static at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                                  c10::SymIntArrayRef stride) {
    return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                      C10_AS_INTARRAYREF_SLOW(stride));
  }

  // Grows a storage to `n` bytes, keeping its contents (device to device).
  // Moves a storage to new memory of exactly `n` bytes, keeping the common
  // prefix (device to device, on the current stream), as the CPU does.
  static void reallocate_storage(const c10::Storage& storage, std::size_t n) {
    device_index d = storage.device().index();
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = device_allocator<R>().allocate(n);
    std::size_t keep = std::min(n, storage.nbytes());
    if (keep > 0) {
      st().backend().memcpy_async(d, fresh.get(), storage.data(), keep,
                                  CopyKind::device_to_device, stream_of(d));
      queued(d);
    }
    const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
    const_cast<c10::Storage&>(storage).set_nbytes(n);
  }
  // Grows a storage to `n` bytes (never shrinks: Tensor.resize_ keeps memory).
  static void grow_storage(const c10::Storage& storage, std::size_t n) {
    if (n > storage.nbytes()) reallocate_storage(storage, n);
  }

  static const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                                  std::optional<c10::MemoryFormat> memory_format) {
    return translated([&]() -> const at::Tensor& {
      auto* impl = self.unsafeGetTensorImpl();
      at::native::resize_impl_cpu_(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt,
                                   /*resize_storage=*/false);
      if (impl->numel() > 0) {
        std::size_t needed = at::detail::computeStorageNbytesContiguous(
            impl->sizes(), self.element_size(), impl->storage_offset());
        grow_storage(impl->storage(), needed);
      }
      if (memory_format) impl->empty_tensor_restride(*memory_format);
      return self;
    });
  }

  static at::Scalar local_scalar_dense(const at::Tensor& self) {
    return translated([&] { return to_cpu(self).item(); });
  }

  static at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                 c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
    return at::native::set_storage_cpu_(self, source, offset.expect_int(),
                                        C10_AS_INTARRAYREF_SLOW(size),
                                        C10_AS_INTARRAYREF_SLOW(stride));
  }

  // Tensor.record_stream: the storage's memory is not reused before `s` has
  // passed the point of its free (the caching pool's record_stream).
  // The stream must be one of the tensor's device (the pool of that device
  // records it): RuntimeError naming both otherwise.
  static void record_stream(at::Tensor& self, c10::Stream s) {
    TORCH_CHECK(s.device() == self.device(), R::name, ": record_stream: the stream is on ",
                s.device(), " but the tensor is on ", self.device());
    device_allocator<R>().recordStream(self.storage().data_ptr(), s);
  }

  static at::Tensor& fill(at::Tensor& self, const at::Scalar& value) {
    return translated([&]() -> at::Tensor& {
      if (self.numel() == 0) return self;
      if (host_ready(dev(self))) {
        host_view(self).fill_(value);
      } else {
        from_cpu(self, at::scalar_tensor(value, self.options().device(at::kCPU)));
      }
      return self;
    });
  }

  static at::Tensor& zero(at::Tensor& self) {
    return translated([&]() -> at::Tensor& {
      if (self.numel() == 0) return self;
      if (self.is_contiguous()) {
        if (run_on_host(dev(self))) {
          std::memset(self.data_ptr(), 0, nbytes(self));
          return self;
        }
        st().backend().memset_async(dev(self), self.data_ptr(), 0, nbytes(self),
                                    stream_of(dev(self)));
        queued(dev(self));
        return self;
      }
      return fill(self, 0);
    });
  }
};

template <class R>
class Fallback;

// Convolutions reach a backend as convolution_overrideable, whose default
// kernel raises instead of falling back; these run them through the CPU like
// the fallback does (and count in its report).
template <class R>
struct Convolution {
  // The CPU tensors a CPU convolution reads (its tensors all on one device,
  // see one_device): views of the device memory when it is host-visible
  // (after its stream is waited for), copies otherwise.
  struct Inputs {
    bool view = false;
    at::Tensor operator()(const at::Tensor& t) const {
      if (!t.defined()) return t;
      return view ? Ops<R>::host_view(t) : t.cpu();
    }
  };
  // Every tensor of a convolution on the first one's device, as a CUDA
  // convolution requires.
  template <class... T>
  static void one_device(const std::string& op, const at::Tensor& first, const T&... rest) {
    ((rest.defined() ? check_same_device(first.device(), rest.device(), op) : void()), ...);
  }
  static Inputs inputs(const at::Tensor& any) {
    device_index d = any.device().index();
    return {translated([&] { return Ops<R>::host_ready(d); })};
  }
  static at::Tensor forward(const at::Tensor& input, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                            c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
                            bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups) {
    static const std::string op = "aten::convolution_overrideable";
    at::Tensor no_bias;
    const at::Tensor& bias_t = bias && bias->defined() ? *bias : no_bias;
    one_device(op, input, weight, bias_t);
    auto timer = Fallback<R>::get().run_named(op);
    Inputs cpu = inputs(input);
    std::optional<at::Tensor> b =
        bias_t.defined() ? std::optional<at::Tensor>(cpu(bias_t)) : std::nullopt;
    at::Tensor out = at::convolution_symint(cpu(input), cpu(weight), b, stride, padding, dilation,
                                            transposed, output_padding, std::move(groups));
    return out.to(input.device());
  }
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(
      const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
      c10::SymIntArrayRef stride, c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation,
      bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
      std::array<bool, 3> output_mask) {
    static const std::string op = "aten::convolution_backward_overrideable";
    one_device(op, input, grad_output, weight);
    auto timer = Fallback<R>::get().run_named(op);
    std::vector<c10::SymInt> bias_sizes{weight.sym_size(transposed ? 1 : 0) * groups};
    Inputs cpu = inputs(input);
    auto [gi, gw, gb] = at::convolution_backward_symint(
        cpu(grad_output), cpu(input), cpu(weight), c10::SymIntArrayRef(bias_sizes), stride,
        padding, dilation, transposed, output_padding, std::move(groups), output_mask);
    auto back = [&](const at::Tensor& t) { return t.defined() ? t.to(input.device()) : t; };
    return {back(gi), back(gw), back(gb)};
  }
};

// Note [Math bits in copies]: the copies resolve conjugate and negative bits
// themselves, so the Conjugate and Negative fallbacks must not intercept them.
inline void register_math_bit_fallthroughs(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

template <class R>
void register_aten_ops(torch::Library& m) {
  using O = Ops<R>;
  m.impl("empty.memory_format", TORCH_FN(O::empty_memory_format));
  m.impl("empty_strided", TORCH_FN(O::empty_strided));
  m.impl("as_strided", TORCH_FN(O::as_strided));
  m.impl("view", TORCH_FN(O::view));
  // View operators whose only kernels are per device (PyTorch's are device
  // agnostic): a view cannot go through the CPU fallback. Every other view
  // operator has a composite kernel; tests/python enumerates them all.
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("_reshape_alias", TORCH_FN(O::reshape_alias));
  m.impl("resize_", TORCH_FN(O::resize));
  m.impl("_copy_from", TORCH_FN(O::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(O::copy_from_and_resize));
  m.impl("_local_scalar_dense", TORCH_FN(O::local_scalar_dense));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(O::set_storage));
  m.impl("fill_.Scalar", TORCH_FN(O::fill));
  m.impl("record_stream", TORCH_FN(O::record_stream));
  // Dropout as the CPU composes it (bernoulli_, mul) from dispatched
  // operators, so that its mask draws from the device's generator (Note
  // [Device generators]): the CPU kernel would take the CPU's.
  m.impl("native_dropout", TORCH_FN(at::native::native_dropout_cpu));
  m.impl("native_dropout_backward", TORCH_FN(at::native::native_dropout_backward));
  m.impl("zero_", TORCH_FN(O::zero));
  // Lets a CPU parameter take device data in place (variable.set_data, which
  // libtorch's Module::to uses); PyTorch's own check knows only its built-in
  // device types. Both are plain strided TensorImpls.
  m.impl("_has_compatible_shallow_copy_type",
         [](const at::Tensor& self, const at::Tensor& from) -> bool {
           auto plain = [](const at::Tensor& t) {
             return t.layout() == c10::kStrided && !t.is_sparse() && !t.is_quantized() &&
                    (t.device().type() == kDeviceType || t.device().is_cpu());
           };
           return plain(self) && plain(from);
         });
  m.impl("convolution_overrideable", TORCH_FN(Convolution<R>::forward));
  m.impl("convolution_backward_overrideable", TORCH_FN(Convolution<R>::backward));
  // set_.source_Storage and set_.source_Tensor re-dispatch to the above.
  m.impl("set_.source_Storage",
         [](at::Tensor& self, at::Storage source) -> at::Tensor& {
           return at::native::set_(self, source);
         });
  m.impl("set_.source_Tensor",
         [](at::Tensor& self, const at::Tensor& source) -> at::Tensor& {
           return at::native::set_tensor_(self, source);
         });
}

// Note [Sparse layouts]: sparse layouts (COO, CSR and the other compressed
// ones) have no kernels on a generated backend, and PyTorch's sparse kernels
// are per device. Every operator on them (the SparsePrivateUse1 and
// SparseCsrPrivateUse1 fallbacks), and every fallen-back operator whose
// result would be one on the device (x.to_sparse_csr()), raises
// NotImplementedError naming the backend and the operator, instead of
// PyTorch's generic "could not run ... Sparse<name>" or a sparse tensor on
// which composite operators fail obscurely.
template <class R>
void refuse_sparse(const c10::OperatorHandle& op) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, R::name, ": sparse tensors are not supported on ", R::name,
                              " (operator ", op.schema().operator_name(),
                              "); use a strided tensor, or a sparse tensor on the CPU");
}

// Note [CPU fallback policy]: every operator without a native kernel runs on
// the CPU (inputs copied there, outputs copied back). <NAME>_FALLBACK
// chooses what happens: "allow" (default), "warn" (a warning the first time
// each operator falls back) or "error"; <NAME>_FALLBACK_BLOCKLIST names
// operators (comma list) that must not fall back. The report lists each
// operator that fell back, how often and for how long.
template <class R>
class Fallback {
  struct Entry;

 public:
  enum class Policy { allow, warn, error };
  static Fallback& get() {
    static Fallback* const f = new Fallback();
    return *f;
  }

  void run(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
    Entry& e = admit(op);
    std::optional<c10::Device> to_device = check_one_device(op, *stack, e.name);
    use_device_generator(op, *stack);
    auto t0 = std::chrono::steady_clock::now();
    if (!on_cpu(op, *stack)) {
      at::native::cpu_fallback(op, stack, /*error_on_views=*/true);
      if (to_device) results_to(op, *stack, *to_device);
    }
    std::size_t results = op.schema().returns().size();
    for (std::size_t i = stack->size() - results; i < stack->size(); ++i) {
      const c10::IValue& v = (*stack)[i];
      if (v.isTensor() && v.toTensor().defined() && v.toTensor().layout() != c10::kStrided &&
          v.toTensor().device().type() == kDeviceType)
        refuse_sparse<R>(op);  // Note [Sparse layouts]
    }
    e.add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
              .count());
  }

  // Counts one run of an operator through the CPU in the report, timed
  // until it is destroyed.
  class Count {
   public:
    explicit Count(Entry& e) : e_(e) {}
    ~Count() {
      e_.add(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
                 .count());
    }
    Count(const Count&) = delete;
    Count& operator=(const Count&) = delete;

   private:
    Entry& e_;
    std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  };
  // A run through the CPU of operator `op` (by name) that does not come
  // through the dispatcher's fallback, under the same policy and block list.
  Count run_named(const std::string& op) { return Count(admit(entry_named(op))); }

  // Runs body() as operator `op` through the CPU under the policy, counted
  // in the report: the host kernels' way in (Note [Host kernels]).
  template <class F>
  decltype(auto) host(const c10::OperatorHandle& op, F&& body) {
    Count count(admit(op));
    return body();
  }

  // "op count total_ms" lines, most time first.
  std::string report() {
    std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> v;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (auto& [name, e] : stats_)
        if (auto c = e->count.load()) v.emplace_back(e->ns.load(), c, name);
    }
    std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return std::get<0>(a) > std::get<0>(b); });
    std::ostringstream out;
    for (auto& [ns, count, name] : v) out << name << ' ' << count << ' ' << (ns / 1e6) << '\n';
    return out.str();
  }
  // Zeroes the counts (entries stay: threads cache them).
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [name, e] : stats_) {
      e->count = 0;
      e->ns = 0;
    }
  }

 private:
  struct Entry {
    std::string name;  // "aten::add.out"
    bool blocked = false;
    std::atomic<std::int64_t> count{0};
    std::atomic<std::int64_t> ns{0};
    std::atomic<bool> warned{false};
    void add(std::int64_t elapsed) {
      count.fetch_add(1, std::memory_order_relaxed);
      ns.fetch_add(elapsed, std::memory_order_relaxed);
    }
  };

  Entry& entry_named(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::unique_ptr<Entry>& slot = stats_[name];
    if (!slot) {
      slot = std::make_unique<Entry>();
      slot->name = name;
      std::string base = name.substr(0, name.find('.'));
      slot->blocked = blocked_.count(name) != 0 || blocked_.count(base) != 0;
    }
    return *slot;
  }

  // The entry of an operator, cached per thread (the dispatcher's schema
  // objects live as long as the process).
  Entry& entry_for(const c10::OperatorHandle& op) {
    static thread_local const void* last_schema = nullptr;
    static thread_local Entry* last = nullptr;
    const void* schema = &op.schema();
    if (schema == last_schema) return *last;
    Entry* e;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = by_schema_.find(schema);
      e = it == by_schema_.end() ? nullptr : it->second;
    }
    if (!e) {
      const c10::OperatorName& n = op.schema().operator_name();
      e = &entry_named(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
      std::lock_guard<std::mutex> lock(mutex_);
      by_schema_.emplace(schema, e);
    }
    last_schema = schema;
    last = e;
    return *e;
  }

  static std::string upper() { return detail::upper(R::name); }

  // The entry of `op`, once the policy and the block list let it through
  // the CPU (warning once per operator under the warn policy).
  Entry& admit(const c10::OperatorHandle& op) { return admit(entry_for(op)); }
  Entry& admit(Entry& e) {
    TORCH_CHECK_NOT_IMPLEMENTED(
        policy_ != Policy::error && !e.blocked, "The operator '", e.name,
        "' is not implemented for ", R::name, " and its CPU fallback is ",
        policy_ == Policy::error ? "disabled (" : "blocked (", upper(), "_FALLBACK",
        policy_ == Policy::error ? "=error)" : "_BLOCKLIST)");
    if (policy_ == Policy::warn && !e.warned.exchange(true, std::memory_order_relaxed))
      TORCH_WARN("The operator '", e.name, "' is not implemented for ", R::name,
                 " and falls back to the CPU; this may be slow.");
    return e;
  }

  // Note [Zero-copy fallback]: when the device's memory is host-visible
  // (capability schema), the CPU kernel runs directly on device memory: the
  // current stream is synchronized (the kernel then runs, in effect, at its
  // place on that stream), every device tensor argument is replaced by a CPU
  // tensor viewing the same memory, and results that are those views are
  // mapped back to the device tensors. A new result (a functional operator's
  // output) is copied to the device in the layout the kernel gave it.
  //
  // Note [Layout-keeping fallback]: without host-visible memory the same
  // path runs on copies: each device tensor argument's memory, from its
  // first element to its last, is copied to the CPU and viewed there with
  // the tensor's own strides, offset and math bits; the arguments the
  // operator writes are copied back afterwards. The CPU kernel thus sees
  // exactly the layouts it would see on the CPU (a conjugate view stays
  // one, a transposed slice stays one), and computes bit for bit as there;
  // a copy that resolved them would let BLAS round differently. Arguments
  // that view less than a quarter of a range above 1 MiB take the
  // compacting copy of at::native::cpu_fallback instead, as do
  // operators with no device tensor, or with tensors of other devices or
  // device types.
  bool on_cpu(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    // A result that aliases an input (a view) cannot be mapped back; such
    // operators take at::native::cpu_fallback, which refuses them clearly.
    for (const c10::Argument& r : op.schema().returns())
      if (r.alias_info() && !r.alias_info()->isWrite()) return false;
    const auto& arguments = op.schema().arguments();
    std::size_t first = stack.size() - arguments.size();
    std::optional<c10::Device> device;
    auto each_tensor = [&](auto&& f) {
      for (std::size_t i = first; i < stack.size(); ++i) {
        const c10::IValue& v = stack[i];
        if (v.isTensor()) {
          if (!f(v.toTensor())) return false;
        } else if (v.isTensorList()) {
          for (const at::Tensor& t : v.toTensorVector())
            if (!f(t)) return false;
        } else if (v.isList() || v.isDevice()) {
          return false;  // optional-tensor lists and device arguments: copying path
        }
      }
      return true;
    };
    if (!each_tensor([&](const at::Tensor& t) {
          if (!t.defined() || t.device().type() != kDeviceType) return true;
          if (!device) device = t.device();
          return t.layout() == c10::kStrided && *device == t.device();
        }) ||
        !device)
      return false;
    device_index d = device->index();
    bool visible = translated([&] { return Ops<R>::host_ready(d); });
    // The bytes from a tensor's first element to its last.
    auto extent = [](const at::Tensor& t) {
      return at::detail::computeStorageNbytes(t.sizes(), t.strides(), t.element_size());
    };
    if (!visible && !each_tensor([&](const at::Tensor& t) {
          return !t.defined() || t.device().type() != kDeviceType || t.numel() == 0 ||
                 extent(t) <= std::max<std::size_t>(4 * t.nbytes(), std::size_t{1} << 20);
        }))
      return false;

    struct Alias {
      at::Tensor device_tensor;
      at::Tensor host_view;
      void* ptr;
      at::Tensor device_range;  // without host-visible memory: the range copied, if written
      at::Tensor host_range;    // and its copy
    };
    std::vector<Alias> aliases;
    // A CPU tensor over the same memory (or a copy of it), whose storage the
    // CPU kernel may still resize (onto new CPU memory, copied back
    // afterwards).
    // The tensors the operator writes (out= and in-place arguments).
    std::set<const c10::TensorImpl*> written;
    for (std::size_t i = first; i < stack.size(); ++i) {
      const c10::AliasInfo* info = arguments[i - first].alias_info();
      if (!info || !info->isWrite()) continue;
      if (stack[i].isTensor()) written.insert(stack[i].toTensor().unsafeGetTensorImpl());
      if (stack[i].isTensorList())
        for (const at::Tensor& t : stack[i].toTensorVector()) written.insert(t.unsafeGetTensorImpl());
    }
    auto alias_of = [&](const at::Tensor& t) -> at::Tensor {
      if (!t.defined() || t.device().type() != kDeviceType) return t;
      for (const Alias& a : aliases)  // one tensor passed twice (x.mul_(x)): one view
        if (a.device_tensor.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return a.host_view;
      at::Tensor view, device_range, host_range;
      if (t.numel() == 0) {
        view = at::empty(t.sizes(), t.options().device(at::kCPU));
      } else if (visible) {
        c10::Storage storage(c10::Storage::use_byte_size_t(), extent(t),
                             c10::DataPtr(t.data_ptr(), c10::Device(c10::kCPU)),
                             c10::GetCPUAllocator(), /*resizable=*/true);
        view = at::detail::make_tensor<c10::TensorImpl>(
            std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
        view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides());
      } else {
        // The range as plain values (no math bits), one contiguous copy.
        at::Tensor raw = at::alias(t);
        raw._set_conj(false);
        raw._set_neg(false);
        device_range = raw.as_strided({static_cast<int64_t>(extent(t) / t.element_size())}, {1});
        host_range = device_range.to(at::kCPU);
        view = host_range.as_strided(t.sizes(), t.strides());
        if (!written.count(t.unsafeGetTensorImpl())) device_range = host_range = at::Tensor();
      }
      // Operators that take lazily conjugated or negated inputs as they are
      // (dot, vdot, ...: the Conjugate key falls through for them) read the
      // same bits on the CPU alias (Note [Math bits in copies]).
      view._set_conj(t.is_conj());
      view._set_neg(t.is_neg());
      aliases.push_back({t, view, view.data_ptr(), device_range, host_range});
      return view;
    };
    for (std::size_t i = first; i < stack.size(); ++i) {
      c10::IValue& v = stack[i];
      if (v.isTensor()) {
        v = alias_of(v.toTensor());
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> list;
        for (const at::Tensor& t : v.toTensorVector()) list.push_back(alias_of(t));
        v = c10::IValue(list);
      }
    }
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), &stack);

    std::size_t results = op.schema().returns().size();
    for (std::size_t i = stack.size() - results; i < stack.size(); ++i) {
      c10::IValue& v = stack[i];
      if (!v.isTensor()) continue;
      const at::Tensor& out = v.toTensor();
      auto same = std::find_if(aliases.begin(), aliases.end(), [&](const Alias& a) {
        return a.host_view.unsafeGetTensorImpl() == out.unsafeGetTensorImpl();
      });
      v = same != aliases.end() ? c10::IValue(same->device_tensor)
                                : c10::IValue(to_device(out, *device));
    }
    // What the kernel did to an argument, the device tensor must take too:
    // - resized onto new CPU memory: new device memory in the same layout;
    // - without host-visible memory, values written: the range copied back;
    // - another shape without elements (a (0,) out= tensor resized to
    //   (1, 0, 3));
    // - restrided in place over the same memory (transpose_, as_strided_);
    // - a conjugate or negative bit set in place (linalg_lu_solve with
    //   left=False conjugates its output by setting the bit).
    for (Alias& a : aliases) {
      const at::Tensor& host = a.host_view;
      at::Tensor& dev = a.device_tensor;
      if (host.numel() > 0 && host.data_ptr() != a.ptr) {
        dev.set_(to_device(host, dev.device()));  // in the kernel's layout
        continue;
      }
      if (a.device_range.defined()) a.device_range.copy_(a.host_range);
      if (host.numel() == 0) {
        if (host.sizes() != dev.sizes()) dev.resize_(host.sizes());
      } else if (host.sizes() != dev.sizes() || host.strides() != dev.strides() ||
                 host.storage_offset() != 0) {
        dev.as_strided_(host.sizes(), host.strides(), dev.storage_offset() + host.storage_offset());
      }
      if (dev.is_conj() != host.is_conj()) dev._set_conj(host.is_conj());
      if (dev.is_neg() != host.is_neg()) dev._set_neg(host.is_neg());
    }
    return true;
  }

  // Like PyTorch's native kernels, refuse tensors of two devices of this
  // backend in one operator (the CPU fallback would silently mix them), or
  // a device tensor with a CPU tensor that is not a zero-dim scalar.
  // Raises unless the tensor arguments are on at most one device of this
  // backend. Returns that device when at::native::cpu_fallback would put the
  // results elsewhere: it follows the first tensor argument, which may be a
  // CPU scalar (a zero-dim CPU tensor: `2.0 - x` is sub(scalar, x)), while
  // on a device (as with CUDA) the results of such an operator belong on the
  // device. A first argument that is a CPU tensor of any other shape keeps
  // PyTorch's rule (`cpu_x[device_mask]` is a CPU tensor).
  // Note [Device generators]: a random operator that falls back and is not
  // given a generator draws from its device's default generator (the
  // hooks' getDefaultGenerator, which torch.<name>.manual_seed seeds and
  // torch.manual_seed seeds too), as on CUDA, and not from the CPU's: the
  // CPU kernel is handed that generator (a CPU generator, so it takes it).
  // Unlike CUDA, an explicit generator of the CPU is accepted too: the
  // device's generators are CPU generators.
  static void use_device_generator(const c10::OperatorHandle& op, torch::jit::Stack& stack) {
    const auto& args = op.schema().arguments();
    std::size_t first = stack.size() - args.size();
    std::optional<std::size_t> slot;
    std::optional<c10::Device> device;
    for (std::size_t i = 0; i < args.size(); ++i) {
      const c10::IValue& v = stack[first + i];
      if (v.isTensor() && !device && v.toTensor().defined() &&
          v.toTensor().device().type() == kDeviceType)
        device = v.toTensor().device();
      if (!slot && v.isNone()) {
        c10::TypePtr t = args[i].real_type();
        if (auto o = t->cast<c10::OptionalType>()) t = o->getElementType();
        if (t->kind() == c10::TypeKind::GeneratorType) slot = i;
      }
    }
    if (slot && device)
      stack[first + *slot] = c10::IValue(at::globalContext().defaultGenerator(*device));
  }

  static std::optional<c10::Device> check_one_device(const c10::OperatorHandle& op,
                                                     const torch::jit::Stack& stack,
                                                     const std::string& full) {
    std::size_t n = op.schema().arguments().size();
    std::optional<c10::Device> seen;
    bool cpu_tensor = false;  // a CPU tensor that is not a scalar
    bool cpu_first = false, any = false, device_arg = false;
    // `indices`: an optional-tensor list (index, index_put_), whose CPU
    // index tensors CUDA accepts too.
    auto check = [&](const at::Tensor& t, bool indices) {
      if (!t.defined()) return;
      if (!any) cpu_first = t.device().is_cpu() && t.dim() == 0;
      any = true;
      if (t.device().type() != kDeviceType) {
        if (!indices && t.device().is_cpu() && t.dim() > 0) cpu_tensor = true;
        return;
      }
      if (!seen) seen = t.device();
      check_same_device(*seen, t.device(), full);
    };
    for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
      const c10::IValue& v = stack[i];
      if (v.isTensor()) {
        check(v.toTensor(), false);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) check(t, false);
      } else if (v.isList()) {
        for (const c10::IValue& e : v.toListRef())
          if (e.isTensor()) check(e.toTensor(), true);
      } else if (v.isDevice()) {
        device_arg = true;  // the operator says where its results go
      }
    }
    // A CPU tensor beside device tensors is refused as on CUDA, unless it
    // is a zero-dim scalar (which TensorIterator takes on any device).
    if (seen && cpu_tensor) check_same_device(*seen, c10::Device(c10::kCPU), full);
    if (seen && cpu_first && !device_arg) return seen;
    return std::nullopt;
  }

  // Moves the new (non-aliasing) tensor results on the CPU to `device`.
  // A new CPU result on the device, in the CPU kernel's layout. .to() would
  // compact a result that is not dense (linalg_lstsq returns its solution
  // as a slice of a bigger buffer), and a later kernel on another layout may
  // round differently (BLAS); such a result keeps its strides.
  static at::Tensor to_device(const at::Tensor& t, c10::Device device) {
    if (!t.defined()) return t;
    if (t.layout() != c10::kStrided || t.is_non_overlapping_and_dense() ||
        at::has_internal_overlap(t) == at::MemOverlap::Yes)
      return t.to(device);
    at::Tensor out = at::empty_strided(t.sizes(), t.strides(), t.options().device(device));
    out.copy_(t);
    return out;
  }

  static void results_to(const c10::OperatorHandle& op, torch::jit::Stack& stack,
                         c10::Device device) {
    const auto& returns = op.schema().returns();
    std::size_t first = stack.size() - returns.size();
    for (std::size_t i = 0; i < returns.size(); ++i) {
      c10::IValue& v = stack[first + i];
      if (returns[i].alias_info() || !v.isTensor()) continue;
      const at::Tensor& t = v.toTensor();
      if (t.defined() && t.device().is_cpu()) v = to_device(t, device);
    }
  }

  Fallback() {
    const Environment& env = Backend<R>::instance().environment();
    if (auto v = env.get(upper() + "_FALLBACK")) {
      std::string_view s = detail::trim(*v);
      if (s == "allow" || s.empty()) policy_ = Policy::allow;
      else if (s == "warn") policy_ = Policy::warn;
      else if (s == "error") policy_ = Policy::error;
      else
        TORCH_CHECK_VALUE(false, R::name, ": ", upper(), "_FALLBACK='", *v,
                          "': expected allow, warn or error");
    }
    if (auto v = env.get(upper() + "_FALLBACK_BLOCKLIST")) {
      for (std::string_view item : detail::split_list(*v)) {
        if (item.empty()) continue;
        std::string op(item);
        if (op.rfind("aten::", 0) != 0) op = "aten::" + op;
        blocked_.insert(op);
      }
    }
  }

  Policy policy_ = Policy::allow;
  std::set<std::string> blocked_;
  std::mutex mutex_;
  std::map<std::string, std::unique_ptr<Entry>> stats_;
  std::unordered_map<const void*, Entry*> by_schema_;
};

template <class R>
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Fallback<R>::get().run(op, stack);
}

// Note [CPU kernels over composites]: an operator that has both a CPU
// kernel and a composite one (CompositeExplicitAutograd or
// CompositeImplicitAutograd) runs the composite on a backend without a
// kernel of its own, not the fallback. For native_layer_norm and
// native_group_norm the composite is a decomposition through batch_norm,
// which rounds differently from the CPU's fused kernel in reduced precision
// (bfloat16 layer_norm was 0.125 off). These operators are routed to the
// fallback, so that the backend computes with the CPU's kernel as it does
// for every other operator it lacks, and autograd treats them as on the
// CPU. The set is read from the dispatcher at registration (it differs
// between PyTorch versions: 14 operators in 2.13); an operator that already
// has a kernel for the backend keeps it, so register the vendor's kernels
// before ACCELKIT_REGISTER_BACKEND or they override these with PyTorch's
// warning.
template <class R>
void register_cpu_kernels_over_composites(torch::Library& m) {
  using c10::DispatchKey;
  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string prefix = "aten::";
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.compare(0, prefix.size(), prefix) != 0) continue;
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(DispatchKey::CPU) ||
        op->hasKernelForDispatchKey(DispatchKey::PrivateUse1) ||
        !(op->hasKernelForDispatchKey(DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(DispatchKey::CompositeImplicitAutograd)))
      continue;
    std::string short_name = name.name.substr(prefix.size());
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    m.impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback<R>>());
  }
}

template <class R>
void sparse_fallback(const c10::OperatorHandle& op, torch::jit::Stack*) {
  refuse_sparse<R>(op);
}

// storage.resize_(n): new memory of exactly n bytes, keeping the prefix.
template <class R>
void Hooks<R>::resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const {
  translated([&] {
    if (newsize != storage.nbytes()) Ops<R>::reallocate_storage(storage, newsize);
  });
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
