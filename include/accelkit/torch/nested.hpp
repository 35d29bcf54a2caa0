// accelkit: nested tensors of the strided layout on the device (Note
// [Nested tensors]): nested_fallback, the NestedTensorPrivateUse1 fallback,
// the nested kernels that run on the device tensors themselves
// (register_nested_kernels) and the PrivateUse1 kernels whose results are
// nested (register_nested_creation).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/kernel_table.hpp>

#include <ATen/NestedTensorImpl.h>

#include <cstddef>
#include <optional>
#include <set>
#include <string>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Nested tensors]
// A nested tensor of the strided layout (torch.nested.nested_tensor(...,
// layout=torch.strided)) is a NestedTensorImpl: one storage holding every
// component, and on the CPU the components' sizes, strides and offsets in
// that storage. On the device its storage is device memory and its
// operators dispatch to NestedTensorPrivateUse1, for which PyTorch has no
// kernel. (The jagged layout is a Python subclass over dense tensors, whose
// operators are the dense ones: it needs nothing here.)
// Decision: PyTorch's nested kernels are of two kinds.
// - Those that only compute metadata or call other operators on the
//   storage as a dense tensor (views: unbind, select, transpose, view,
//   chunk...; empty_like, _to_copy, copy_, the metadata accessors
//   _nested_tensor_size/_strides/_storage_offsets) are the same for CPU and
//   CUDA: they run as they are on the device tensors (the NestedTensorCPU
//   kernel redispatched with the device tensors), so views alias the device
//   storage and copies go through the backend's copies.
// - Every other operator runs on the CPU as the dense fallback does (Note
//   [CPU fallback policy]: the same policy, block list and report): each
//   device storage of the operator's nested tensors is copied to one CPU
//   storage (two nested tensors over one storage stay one: the CPU kernel
//   sees the aliasing it would see on the CPU), each nested tensor becomes
//   a CPU nested tensor with its own sizes, strides and offsets over it,
//   dense device tensors become CPU copies; the CPU's kernel runs (its
//   errors surface unchanged); the storages of the arguments the operator
//   writes are copied back; a result that is a written argument is that
//   device tensor, any other result a new device tensor (a nested result
//   keeps its sizes, strides and offsets).
// The PrivateUse1 operators whose CPU kernel makes a nested tensor from
// dense ones (_nested_tensor_from_mask, _nested_from_padded...: the
// Transformer's fast path) run the same way; _nested_view_from_buffer, a
// view, runs on the device tensors.
// Limits: a dense tensor beside nested ones is copied on its own, so its
// aliasing with a nested tensor's storage is not seen by the CPU kernel; the
// written storages are copied back whole. A CPU tensor (not a zero-dim one)
// beside device tensors in an operator on nested tensors is refused as
// CUDA refuses it.

// The operators whose nested kernels run on the device tensors themselves
// (see the Note): PyTorch registers the same kernel for CPU and CUDA, and it
// touches the storage only through other operators.
inline bool nested_kernel_is_generic(const c10::OperatorHandle& op) {
  for (const c10::Argument& r : op.schema().returns())
    if (r.alias_info() && !r.alias_info()->isWrite()) return true;  // a view
  static const std::set<std::string> generic = {
      "aten::_to_copy", "aten::empty_like", "aten::copy_", "aten::_nested_tensor_size",
      "aten::_nested_tensor_strides", "aten::_nested_tensor_storage_offsets",
      "aten::_nested_view_from_buffer"};
  return generic.count(op.schema().name()) != 0;
}

namespace detail_nested {

// A nested tensor over `buffer` (1-D, its whole storage) with the given
// components, made without the prototype warning NestedTensorImpl's
// constructor gives: the images and results made here are not the user's
// constructions, and under torch.set_warn_always(True) the device would
// warn more often than the CPU. (Warning handlers are per thread.)
inline at::Tensor make_nested(const at::Tensor& buffer, const at::native::NestedTensorImpl& like) {
  struct Discard final : c10::WarningHandler {
    void process(const c10::Warning&) override {}
  };
  static Discard discard;
  c10::WarningUtils::WarningHandlerGuard quiet(&discard);
  return at::detail::make_tensor<at::native::NestedTensorImpl>(
      buffer, like.get_nested_sizes(), like.get_nested_strides(), like.get_storage_offsets());
}

}  // namespace detail_nested

// The CPU images of an operator's device tensors, and the way back (Note
// [Nested tensors]).
class NestedImage {
 public:
  explicit NestedImage(c10::Device device) : device_(device) {}

  // The CPU tensor of `t`: a nested or dense device tensor's image, any
  // other tensor as it is.
  at::Tensor to_cpu(const at::Tensor& t) {
    if (!t.defined() || t.device().type() != kDeviceType) return t;
    for (const Image& i : images_)
      if (i.device.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) return i.host;
    at::Tensor host;
    if (t.is_nested()) {
      const at::native::NestedTensorImpl* nt = at::native::get_nested_tensor_impl(t);
      host = detail_nested::make_nested(host_storage(nt->get_unsafe_storage_as_tensor()), *nt);
    } else {
      host = t.cpu();
    }
    images_.push_back({t, host});
    return host;
  }

  // After the kernel: the device tensors the operator wrote take what it
  // wrote on their images.
  void store(const std::set<const c10::TensorImpl*>& written) {
    std::set<const c10::StorageImpl*> done;
    for (const Image& i : images_) {
      if (!written.count(i.device.unsafeGetTensorImpl())) continue;
      if (!i.device.is_nested()) {
        i.device.copy_(i.host);
        continue;
      }
      const c10::StorageImpl* s = i.device.storage().unsafeGetStorageImpl();
      if (!done.insert(s).second) continue;
      for (const Storage& st : storages_)
        if (st.device.storage().unsafeGetStorageImpl() == s) st.device.copy_(st.host);
    }
  }

  // The device tensor of a CPU result: the device tensor whose image it is,
  // or a new device tensor.
  at::Tensor to_device(const at::Tensor& r) {
    if (!r.defined() || !r.device().is_cpu()) return r;
    for (const Image& i : images_)
      if (i.host.unsafeGetTensorImpl() == r.unsafeGetTensorImpl()) return i.device;
    if (!r.is_nested()) return cpu_result_to(r, device_);
    const at::native::NestedTensorImpl* nt = at::native::get_nested_tensor_impl(r);
    at::Tensor buffer;
    for (const Storage& st : storages_)  // a new nested tensor over an argument's storage
      if (st.host.storage().unsafeGetStorageImpl() == r.storage().unsafeGetStorageImpl())
        buffer = st.device;
    if (!buffer.defined()) buffer = nt->get_unsafe_storage_as_tensor().to(device_);
    return detail_nested::make_nested(buffer, *nt);
  }

 private:
  struct Image {
    at::Tensor device, host;
  };
  struct Storage {
    at::Tensor device, host;  // 1-D, the whole storage
  };
  // One CPU storage per device storage.
  at::Tensor host_storage(const at::Tensor& device) {
    for (const Storage& st : storages_)
      if (st.device.storage().unsafeGetStorageImpl() == device.storage().unsafeGetStorageImpl())
        return st.host;
    storages_.push_back({device, device.cpu()});
    return storages_.back().host;
  }

  c10::Device device_;
  std::vector<Image> images_;
  std::vector<Storage> storages_;
};

namespace detail_nested {

// f(tensor) for each tensor argument of the operator on `stack`, in lists
// too.
template <class F>
void each_tensor_argument(const c10::OperatorHandle& op, const torch::jit::Stack& stack, F&& f) {
  std::size_t n = op.schema().arguments().size();
  for (std::size_t i = stack.size() - n; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      f(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorVector()) f(t);
    } else if (v.isOptionalTensorList()) {
      for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
        if (t) f(*t);
    }
  }
}

// `v` with each tensor replaced by f(tensor), in lists too.
template <class F>
c10::IValue map_tensors(const c10::IValue& v, F&& f) {
  if (v.isTensor()) return f(v.toTensor());
  if (v.isTensorList()) {
    std::vector<at::Tensor> list;
    for (const at::Tensor& t : v.toTensorVector()) list.push_back(f(t));
    return c10::IValue(list);
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> list;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorVector())
      list.push_back(t ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    return c10::IValue(list);
  }
  return v;
}

// The operator's name as the fallback report writes it ("aten::add.Tensor").
inline std::string operator_name(const c10::OperatorHandle& op) {
  const c10::OperatorName& n = op.schema().operator_name();
  return n.overload_name.empty() ? n.name : n.name + "." + n.overload_name;
}

}  // namespace detail_nested

// The operator through the CPU's kernel on CPU images of its device tensors
// (Note [Nested tensors]), counted in the fallback report.
inline void nested_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  std::string name = detail_nested::operator_name(op);
  Fallback::Count count = Fallback::get().run_named(name);
  std::optional<c10::Device> device;
  bool cpu_tensor = false;
  detail_nested::each_tensor_argument(op, *stack, [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (t.device().type() != kDeviceType) {
      cpu_tensor = cpu_tensor || (t.device().is_cpu() && (t.is_nested() || t.dim() > 0));
      return;
    }
    if (!device) device = t.device();
    check_same_device(*device, t.device(), name);
  });
  TORCH_CHECK(device, backend_name(), ": ", name,
              " reached the nested tensors' fallback without a ", backend_name(),
              " tensor among its arguments");
  // A CPU tensor beside device tensors in a nested operator, refused as
  // CUDA refuses it (the dense operators that make nested tensors take CPU
  // metadata tensors, which their kernels check).
  if (cpu_tensor && op.schema().name().rfind("aten::_nested_", 0) != 0)
    check_same_device(*device, c10::Device(c10::kCPU), name);
  Fallback::refuse_during_capture(op, *stack, device, name);  // Note [Refusals during capture]

  const auto& arguments = op.schema().arguments();
  std::size_t first = stack->size() - arguments.size();
  std::set<const c10::TensorImpl*> written;
  for (std::size_t i = first; i < stack->size(); ++i) {
    const c10::AliasInfo* info = arguments[i - first].alias_info();
    if (!info || !info->isWrite()) continue;
    const c10::IValue& v = (*stack)[i];
    if (v.isTensor()) written.insert(v.toTensor().unsafeGetTensorImpl());
    if (v.isTensorList())
      for (const at::Tensor& t : v.toTensorVector()) written.insert(t.unsafeGetTensorImpl());
  }
  NestedImage image(*device);
  bool any_nested = false;
  for (std::size_t i = first; i < stack->size(); ++i)
    (*stack)[i] = detail_nested::map_tensors((*stack)[i], [&](const at::Tensor& t) {
      at::Tensor h = image.to_cpu(t);
      any_nested = any_nested || (h.defined() && h.is_nested());
      return h;
    });
  op.redispatchBoxed(c10::DispatchKeySet(any_nested ? c10::DispatchKey::NestedTensorCPU
                                                    : c10::DispatchKey::CPU),
                     stack);
  image.store(written);
  std::size_t results = op.schema().returns().size();
  for (std::size_t i = stack->size() - results; i < stack->size(); ++i)
    (*stack)[i] = detail_nested::map_tensors(
        (*stack)[i], [&](const at::Tensor& r) { return image.to_device(r); });
}

// A nested kernel of PyTorch's that runs on the device tensors themselves
// (nested_kernel_is_generic), the NestedTensorCPU one, which CUDA shares.
inline void nested_generic(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  bool nested = false;
  detail_nested::each_tensor_argument(op, *stack, [&](const at::Tensor& t) {
    nested = nested || (t.defined() && t.is_nested());
  });
  op.redispatchBoxed(
      c10::DispatchKeySet(nested ? c10::DispatchKey::NestedTensorCPU : c10::DispatchKey::CPU),
      stack);
}

// The NestedTensorPrivateUse1 fallback (Note [Nested tensors]).
inline void nested_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (nested_kernel_is_generic(op))
    nested_generic(op, stack);
  else
    nested_on_cpu(op, stack);
}

// The NestedTensorPrivateUse1 kernels (Note [Nested tensors]):
// - _to_copy, copy_ and empty_like, which the dispatcher sends there with
//   no device nested tensor among the arguments (_to_copy's BackendSelect
//   kernel follows the device argument: a CPU nested tensor's .to(device));
// - the operators with both a NestedTensorCPU kernel and a
//   CompositeImplicitAutograd one (matmul, linear, chunk, narrow...): the
//   composite one would otherwise serve the device's nested tensors, and it
//   fails on them ("NestedTensorImpl doesn't support sizes") where the CPU
//   runs its nested kernel. Found in the dispatcher, so that a PyTorch
//   version's list is its own.
inline void register_nested_kernels(torch::Library& m) {
  std::set<std::string> names = {"_to_copy", "copy_", "empty_like"};
  c10::Dispatcher& dispatcher = c10::Dispatcher::singleton();
  for (const c10::OperatorName& n :
       dispatcher.getRegistrationsForDispatchKey(c10::DispatchKey::NestedTensorCPU)) {
    std::optional<c10::OperatorHandle> op = dispatcher.findOp(n);
    if (!op || n.name.rfind("aten::", 0) != 0 || n.name.find("_test_") != std::string::npos ||
        !op->hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd))
      continue;
    names.insert(n.name.substr(6) + (n.overload_name.empty() ? "" : "." + n.overload_name));
  }
  for (const std::string& name : names)
    m.impl(name.c_str(), torch::CppFunction::makeFromBoxedFunction<&nested_fallback>());
}

// The PrivateUse1 operators whose CPU kernels make nested tensors from dense
// ones (Note [Nested tensors]).
inline void register_nested_creation(KernelTable& table) {
  for (const char* name : {"_nested_tensor_from_mask", "_nested_from_padded"})
    table.impl(name, torch::CppFunction::makeFromBoxedFunction<&nested_on_cpu>());
  table.impl("_nested_view_from_buffer",
             torch::CppFunction::makeFromBoxedFunction<&nested_generic>());
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
