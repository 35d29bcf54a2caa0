// accelkit: quantized tensors on the device (Note [Quantized tensors]): their
// creation, copies, integer representation, quantizer queries and views as
// native operators of the QuantizedPrivateUse1 key (register_quantized_ops),
// and quantized_fallback, which runs every other operator on them through
// PyTorch's QuantizedCPU kernels; the dense operators that make per-channel
// quantized tensors on copies (register_quantizing_ops).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/kernel_table.hpp>
#include <accelkit/torch/storage.hpp>
#include <accelkit/torch/views.hpp>

#include <ATen/quantized/QTensorImpl.h>
#include <ATen/quantized/Quantizer.h>
#include <ATen/ops/clone_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/empty_quantized_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/squeeze_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/unsqueeze_native.h>
#include <ATen/native/TensorFactories.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Quantized tensors]
// Problem: PyTorch's quantized tensors (torch.quantize_per_tensor,
// quantize_per_channel, torch.ao's eager quantized modules) dispatch to the
// Quantized<backend> key, where a backend has no kernel unless it registers
// them: not even a device tensor can be made.
// Decision: the QuantizedPrivateUse1 key is served by
// - native kernels for what must not move the data: creation
//   (_empty_affine_quantized, _empty_per_channel_affine_quantized,
//   empty_quantized, empty_like, empty, empty_strided) in device memory,
//   copies between the device and the CPU or between devices (the integer
//   representation copied, the quantizer taken from the source as the
//   CPU's copy_ does; a float source quantized by the CPU's copy_ rules),
//   int_repr, clone, resize_, set_, the quantizer's queries and the views
//   that must alias (view, _reshape_alias, as_strided, squeeze, unsqueeze,
//   unfold; the composite views reach these);
// - quantized_fallback for every other operator, quantized:: ones included
//   (quantized::add, conv2d, linear with their packed weights): the same
//   policy, block list, report and capture refusal as the dense fallback
//   (Note [CPU fallback policy], Note [Refusals during capture]); its
//   device tensors copied to the CPU (a quantized one stays quantized, in
//   its own strides when they are dense), PyTorch's QuantizedCPU kernel run,
//   tensors it wrote copied back, results copied to the device. Operators
//   with a QuantizedCPU kernel and a composite one take the fallback, as on
//   the CPU they take the kernel.
// The dense operators that make a per-channel quantized tensor run the same
// way on copies, at the CPU key (register_quantizing_ops).
// A device tensor's quantizer holds its per-channel scales and zero points
// on the CPU, where the CPU kernels read them; q_per_channel_scales and
// q_per_channel_zero_points return them on the device.
// Limits: sub-byte dtypes (quint4x2, quint2x4) and quantizers other than
// per-tensor affine, per-channel affine and per-channel affine with float
// parameters are refused (NotImplementedError naming the backend). The
// fallback always copies (no zero-copy path: the CPU's quantized kernels
// are given CPU quantized tensors), and a view operator without a kernel
// here is refused as by the dense fallback.
struct QuantizedOps {
  static bool on_device(const at::Tensor& t) {
    return t.defined() && t.device().type() == kDeviceType;
  }

  // Refuses what the device does not hold: sub-byte dtypes and other
  // quantization schemes. An UnknownQuantizer (torch.empty(...,
  // dtype=torch.quint8), whose quantizer the caller sets later) has none.
  static void check_supported(const at::QuantizerPtr& q) {
    c10::ScalarType st = q->scalar_type();
    TORCH_CHECK_NOT_IMPLEMENTED(
        st == c10::kQUInt8 || st == c10::kQInt8 || st == c10::kQInt32, backend_name(),
        ": quantized tensors of dtype ", st, " are not supported on ", backend_name(),
        " (quint8, qint8 and qint32 are)");
    if (dynamic_cast<const at::UnknownQuantizer*>(q.get())) return;
    c10::QScheme s = q->qscheme();
    TORCH_CHECK_NOT_IMPLEMENTED(
        s == c10::kPerTensorAffine || s == c10::kPerChannelAffine ||
            s == c10::kPerChannelAffineFloatQParams,
        backend_name(), ": quantized tensors with qscheme ", c10::toString(s),
        " are not supported on ", backend_name(),
        " (per_tensor_affine, per_channel_affine and per_channel_affine_float_qparams are)");
  }

  // The quantizer of a device tensor: per-channel parameters copied into
  // CPU memory of their own. A CPU quantizer may hold a view of device
  // memory (the dense fallback's zero-copy path gives the CPU kernel such
  // views, and quantize_per_channel keeps int64 zero points as given),
  // valid only during that kernel.
  static at::QuantizerPtr host_params(const at::QuantizerPtr& q) {
    auto* pc = dynamic_cast<at::PerChannelAffineQuantizer*>(q.get());  // float qparams too
    if (!pc) return q;
    auto own = [](const at::Tensor& t) {
      return t.to(c10::TensorOptions(c10::kCPU), /*non_blocking=*/false, /*copy=*/true);
    };
    return at::make_per_channel_affine_quantizer(own(pc->scales()), own(pc->zero_points()),
                                                 pc->axis(), q->scalar_type());
  }

  // A new quantized tensor on `device` (this backend's or the CPU) with
  // quantizer q: in `strides`, or contiguous in `format`.
  static at::Tensor make(c10::IntArrayRef sizes, std::optional<c10::IntArrayRef> strides,
                         c10::MemoryFormat format, c10::Device device, at::QuantizerPtr q) {
    at::native::check_size_nonnegative(sizes);
    bool host = device.is_cpu();
    if (!host) {
      check_supported(q);
      q = host_params(q);
    }
    std::optional<c10::DeviceGuard> guard;
    if (!host && device.has_index()) guard.emplace(device);
    caffe2::TypeMeta dtype = c10::scalarTypeToTypeMeta(q->scalar_type());
    std::size_t item = dtype.itemsize();
    std::size_t nbytes = strides ? at::detail::computeStorageNbytes(sizes, *strides, item)
                                 : at::detail::computeStorageNbytesContiguous(sizes, item);
    c10::Allocator* allocator = host ? c10::GetCPUAllocator() : &device_allocator();
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes, allocator, /*resizable=*/true);
    at::Tensor t = at::detail::make_tensor<at::QTensorImpl>(
        std::move(storage),
        c10::DispatchKeySet(host ? c10::DispatchKey::QuantizedCPU
                                 : c10::DispatchKey::QuantizedPrivateUse1),
        dtype, std::move(q));
    if (strides) {
      t.unsafeGetTensorImpl()->set_sizes_and_strides(sizes, *strides);
    } else {
      at::get_qtensorimpl(t)->set_sizes_contiguous(sizes);
      at::get_qtensorimpl(t)->empty_tensor_restride(format);
    }
    return t;
  }

  static c10::Device device_of(std::optional<c10::Device> device) {
    return device.value_or(c10::Device(kDeviceType));
  }
  static c10::MemoryFormat format_of(std::optional<c10::MemoryFormat> format) {
    return format.value_or(c10::MemoryFormat::Contiguous);
  }

  // The quantized integers of q as a dense tensor over the same memory.
  static at::Tensor int_view(const at::Tensor& q) {
    at::Tensor v = at::detail::make_tensor<c10::TensorImpl>(
        c10::Storage(q.storage()),
        c10::DispatchKeySet(q.device().is_cpu() ? c10::DispatchKey::CPU
                                                : c10::DispatchKey::PrivateUse1),
        c10::scalarTypeToTypeMeta(c10::toUnderlying(q.scalar_type())));
    v.unsafeGetTensorImpl()->set_sizes_and_strides(q.sizes(), q.strides(), q.storage_offset());
    return v;
  }

  // A copy of quantized tensor q on `device`, in q's strides when they are
  // dense (contiguous otherwise), with q's quantizer.
  static at::Tensor copy_to(const at::Tensor& q, c10::Device device, bool non_blocking = false) {
    at::Tensor out =
        q.is_non_overlapping_and_dense()
            ? make(q.sizes(), q.strides(), c10::MemoryFormat::Contiguous, device, q.quantizer())
            : make(q.sizes(), std::nullopt, c10::MemoryFormat::Contiguous, device, q.quantizer());
    int_view(out).copy_(int_view(q), non_blocking);
    return out;
  }

  // --- creation ---------------------------------------------------------

  static at::Tensor empty_affine(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                                 std::optional<c10::Layout>, std::optional<c10::Device> device,
                                 std::optional<bool>, double scale, int64_t zero_point,
                                 std::optional<c10::MemoryFormat> format) {
    TORCH_CHECK(dtype.has_value(), "Must provide data type for Tensor creation functions.");
    return make(C10_AS_INTARRAYREF_SLOW(size), std::nullopt, format_of(format), device_of(device),
                at::make_per_tensor_affine_quantizer(scale, zero_point, *dtype));
  }

  static at::Tensor empty_per_channel(c10::SymIntArrayRef size, const at::Tensor& scales,
                                      const at::Tensor& zero_points, int64_t axis,
                                      std::optional<c10::ScalarType> dtype,
                                      std::optional<c10::Layout>, std::optional<c10::Device> device,
                                      std::optional<bool>,
                                      std::optional<c10::MemoryFormat> format) {
    TORCH_CHECK(dtype.has_value(), "Must provide data type for Tensor creation functions.");
    return make(C10_AS_INTARRAYREF_SLOW(size), std::nullopt, format_of(format), device_of(device),
                at::make_per_channel_affine_quantizer(scales.cpu(), zero_points.cpu(), axis,
                                                      *dtype));
  }

  // torch.empty(..., dtype=torch.quint8): a quantizer the caller sets later.
  static at::Tensor empty_unknown(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                                  std::optional<c10::Layout>, std::optional<c10::Device> device,
                                  std::optional<bool>, std::optional<c10::MemoryFormat> format) {
    TORCH_CHECK(dtype.has_value(), "Must provide data type for Tensor creation functions.");
    return make(C10_AS_INTARRAYREF_SLOW(size), std::nullopt, format_of(format), device_of(device),
                at::make_unknown_quantizer(*dtype));
  }

  static at::Tensor empty_strided_unknown(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                                          std::optional<c10::ScalarType> dtype,
                                          std::optional<c10::Layout>,
                                          std::optional<c10::Device> device, std::optional<bool>) {
    TORCH_CHECK(dtype.has_value(), "Must provide data type for Tensor creation functions.");
    return make(C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
                c10::MemoryFormat::Contiguous, device_of(device),
                at::make_unknown_quantizer(*dtype));
  }

  // --- copies -----------------------------------------------------------

  static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
    if (dst.is_quantized() && !self.is_quantized()) {
      // Quantized on the CPU with dst's quantizer, under the CPU's rules
      // (a float source, contiguous tensors of one shape).
      at::Tensor host = make(dst.sizes(), dst.strides(), c10::MemoryFormat::Contiguous,
                             c10::Device(c10::kCPU), dst.quantizer());
      host.copy_(self.device().is_cpu() ? self : self.to(c10::kCPU));
      int_view(dst).copy_(int_view(host), non_blocking);
      return dst;
    }
    TORCH_CHECK(dst.is_quantized(),
                "Copying from quantized Tensor to non-quantized Tensor is not allowed, please use "
                "dequantize to get a float Tensor from a quantized Tensor");
    TORCH_CHECK(self.qscheme() == dst.qscheme(), "Quantized Copy only works with same qscheme");
    TORCH_CHECK(self.scalar_type() == dst.scalar_type());
    at::QuantizerPtr q = self.quantizer();
    if (on_device(dst)) {
      check_supported(q);
      q = host_params(q);
    }
    at::set_quantizer_(dst, q);
    int_view(dst).copy_(int_view(self), non_blocking);
    return dst;
  }

  static const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                                  std::optional<c10::MemoryFormat> format) {
    TORCH_CHECK(!format.has_value(), "Unsupported memory format for quantized tensor resize ",
                format.value());
    TORCH_CHECK(self.qscheme() == c10::kPerTensorAffine,
                "Can only resize quantized tensors with per-tensor schemes!");
    return translated([&]() -> const at::Tensor& {
      c10::TensorImpl* impl = self.unsafeGetTensorImpl();
      at::native::resize_impl_cpu_(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt,
                                   /*resize_storage=*/false);
      if (impl->numel() > 0)
        StorageOps::grow_storage(impl->storage(),
                                 at::detail::computeStorageNbytesContiguous(
                                     impl->sizes(), self.element_size(), impl->storage_offset()));
      return self;
    });
  }

  static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
    if (dst.is_quantized()) {
      if (dst.sizes() != self.sizes()) {
        if (self.is_quantized() && dst.qscheme() != self.qscheme())
          at::set_quantizer_(dst, host_params(self.quantizer()));
        resize(dst, self.sym_sizes(), std::nullopt);
      }
    } else {
      dst.resize_(self.sizes());
    }
    return copy_from(self, dst, false);
  }

  // --- the integers and the quantizer -----------------------------------

  static at::Tensor int_repr(const at::Tensor& self) {
    at::Tensor out = at::empty(self.sizes(),
                               self.options().dtype(c10::toUnderlying(self.scalar_type())),
                               self.suggest_memory_format());
    out.copy_(int_view(self));
    return out;
  }

  static at::Tensor q_per_channel_scales(const at::Tensor& self) {
    return at::native::q_per_channel_scales(self).to(self.device());
  }
  static at::Tensor q_per_channel_zero_points(const at::Tensor& self) {
    return at::native::q_per_channel_zero_points(self).to(self.device());
  }

  // --- views ------------------------------------------------------------

  static at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size,
                               c10::SymIntArrayRef stride, std::optional<c10::SymInt> offset) {
    return at::native::as_strided_qtensorimpl(
        self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
        offset ? std::optional<int64_t>(offset->expect_int()) : std::nullopt);
  }

  static at::Tensor& set_storage(at::Tensor& self, at::Storage source, c10::SymInt offset,
                                 c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
    return at::native::set_storage_quantized_(self, std::move(source), offset.expect_int(),
                                              C10_AS_INTARRAYREF_SLOW(size),
                                              C10_AS_INTARRAYREF_SLOW(stride));
  }
};

// Runs `op` through the CPU's kernel at `cpu_key` on copies of its device
// tensors (Note [Quantized tensors]), under the fallback's policy.
inline void run_on_cpu_copies(const c10::OperatorHandle& op, torch::jit::Stack* stack,
                              c10::DispatchKey cpu_key) {
  using Q = QuantizedOps;
  const c10::OperatorName& n = op.schema().operator_name();
  const std::string name = n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
  auto count = Fallback::get().run_named(name);  // policy, block list, report
  const auto& arguments = op.schema().arguments();
  const std::size_t first = stack->size() - arguments.size();

  // Tensors of one device of this backend; a CPU tensor beside them only as
  // a zero-dim scalar (or an index), as on CUDA. A Device argument says
  // where the results go.
  std::optional<c10::Device> device, target;
  bool cpu_tensor = false;
  auto check = [&](const at::Tensor& t, bool index) {
    if (!t.defined()) return;
    if (Q::on_device(t)) {
      if (!device) device = t.device();
      check_same_device(*device, t.device(), name);
    } else if (!index && t.device().is_cpu() && t.dim() > 0) {
      cpu_tensor = true;
    }
  };
  for (std::size_t i = first; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      check(v.toTensor(), false);
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) check(t, false);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
        if (t) check(*t, true);
    } else if (v.isDevice()) {
      target = v.toDevice();
    }
  }
  if (device && cpu_tensor) check_same_device(*device, c10::Device(c10::kCPU), name);
  Fallback::refuse_during_capture(op, *stack, target, name);
  if (!target) target = device;

  // Each device tensor's CPU copy (one tensor passed twice: one copy).
  std::unordered_map<const c10::TensorImpl*, at::Tensor> host;
  std::vector<std::pair<at::Tensor, at::Tensor>> written;  // device tensor, its CPU copy
  auto to_host = [&](const at::Tensor& t, bool write) -> at::Tensor {
    if (!Q::on_device(t)) return t;
    at::Tensor& h = host[t.unsafeGetTensorImpl()];
    if (!h.defined())
      h = t.is_quantized() ? Q::copy_to(t, c10::Device(c10::kCPU)) : t.to(c10::kCPU);
    if (write) written.emplace_back(t, h);
    return h;
  };
  for (std::size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    const c10::AliasInfo* info = arguments[i - first].alias_info();
    bool write = info && info->isWrite();
    if (v.isTensor()) {
      v = to_host(v.toTensor(), write);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(to_host(t, write));
      v = c10::IValue(list);
    } else if (v.isOptionalTensorList()) {
      c10::List<std::optional<at::Tensor>> list;
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
        list.push_back(t ? std::optional<at::Tensor>(to_host(*t, write)) : std::nullopt);
      v = c10::IValue(list);
    } else if (v.isDevice() && v.toDevice().type() == kDeviceType) {
      v = c10::IValue(c10::Device(c10::kCPU));
    }
  }
  op.redispatchBoxed(c10::DispatchKeySet(cpu_key), stack);

  // What the kernel wrote goes back to the device tensors.
  for (auto& [dev, h] : written) {
    if (dev.is_quantized()) Q::copy_from_and_resize(h, dev);
    else at::_copy_from_and_resize(h, dev);
  }

  const auto& returns = op.schema().returns();
  const std::size_t results = stack->size() - returns.size();
  auto back = [&](const at::Tensor& t) -> at::Tensor {
    if (!t.defined() || !t.device().is_cpu() || !target || target->type() != kDeviceType) return t;
    for (auto& [dev, h] : written)
      if (h.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return dev;
    return t.is_quantized() ? Q::copy_to(t, *target) : cpu_result_to(t, *target);
  };
  for (std::size_t i = 0; i < returns.size(); ++i) {
    const c10::AliasInfo* info = returns[i].alias_info();
    TORCH_CHECK(!info || info->isWrite(), "The operator ", name,
                " appears to be a view operator, but it has no implementation for the backend \"",
                target ? *target : c10::Device(kDeviceType),
                "\". View operators don't support since the tensor's storage cannot be shared "
                "across devices.");
    c10::IValue& v = (*stack)[results + i];
    if (v.isTensor()) {
      v = back(v.toTensor());
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(back(t));
      v = c10::IValue(list);
    }
  }
}

// The QuantizedPrivateUse1 fallback: PyTorch's QuantizedCPU kernels.
inline void quantized_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu_copies(op, stack, c10::DispatchKey::QuantizedCPU);
}
inline void quantizing_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  run_on_cpu_copies(op, stack, c10::DispatchKey::CPU);
}

// Dense operators that make a per-channel quantized tensor
// (quantize_per_channel, _make_per_channel_quantized_tensor): the CPU's
// kernel keeps its scales and zero points arguments in the result's
// quantizer when their dtypes are already double and int64. On the dense
// fallback's zero-copy path those would be views of device memory, read
// after the kernel's maps are closed (Note [Map scopes]); on copies they
// are the CPU's own.
inline void register_quantizing_ops(KernelTable& m) {
  for (const char* name : {"quantize_per_channel", "_make_per_channel_quantized_tensor"})
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&quantizing_fallback>());
}

// The native operators of the QuantizedPrivateUse1 key, then the fallback
// for every ATen operator with a QuantizedCPU kernel and none here (Note
// [Quantized tensors]).
inline void register_quantized_ops(torch::Library& m) {
  using Q = QuantizedOps;
  m.impl("_empty_affine_quantized", TORCH_FN(Q::empty_affine));
  m.impl("_empty_per_channel_affine_quantized", TORCH_FN(Q::empty_per_channel));
  m.impl("empty.memory_format", TORCH_FN(Q::empty_unknown));
  m.impl("empty_strided", TORCH_FN(Q::empty_strided_unknown));
  m.impl("empty_quantized", TORCH_FN(at::native::empty_quantized));
  m.impl("empty_like", TORCH_FN(at::native::empty_like_quantized));
  m.impl("clone", TORCH_FN(at::native::quantized_clone));
  m.impl("_copy_from", TORCH_FN(Q::copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(Q::copy_from_and_resize));
  m.impl("resize_", TORCH_FN(Q::resize));
  m.impl("int_repr", TORCH_FN(Q::int_repr));
  m.impl("q_scale", TORCH_FN(at::native::q_scale_quant));
  m.impl("q_zero_point", TORCH_FN(at::native::q_zero_point_quant));
  m.impl("q_per_channel_axis", TORCH_FN(at::native::q_per_channel_axis));
  m.impl("q_per_channel_scales", TORCH_FN(Q::q_per_channel_scales));
  m.impl("q_per_channel_zero_points", TORCH_FN(Q::q_per_channel_zero_points));
  m.impl("qscheme", TORCH_FN(at::native::qscheme_quant));
  m.impl("as_strided", TORCH_FN(Q::as_strided));
  m.impl("view", TORCH_FN(ViewOps::view));
  m.impl("_reshape_alias", TORCH_FN(ViewOps::reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("squeeze", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&)>(
                        &at::native::squeeze_quantized)));
  m.impl("squeeze.dim", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, int64_t)>(
                            &at::native::squeeze_quantized)));
  m.impl("squeeze.dims", TORCH_FN(static_cast<at::Tensor (*)(const at::Tensor&, c10::IntArrayRef)>(
                             &at::native::squeeze_quantized)));
  m.impl("unsqueeze", TORCH_FN(at::native::unsqueeze_quantized));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(Q::set_storage));
  m.impl("record_stream", TORCH_FN(StorageOps::record_stream));

  auto& dispatcher = c10::Dispatcher::singleton();
  const std::string prefix = "aten::";
  for (const c10::OperatorName& name : dispatcher.getAllOpNames()) {
    if (name.name.compare(0, prefix.size(), prefix) != 0) continue;
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedCPU) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::QuantizedPrivateUse1))
      continue;
    std::string short_name = name.name.substr(prefix.size());
    if (!name.overload_name.empty()) short_name += "." + name.overload_name;
    m.impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&quantized_fallback>());
  }
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
