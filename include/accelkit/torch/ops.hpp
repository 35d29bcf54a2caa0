// accelkit: the operator set a backend registers for ATen: Ops, the
// native operators of copy.hpp, empty.hpp, views.hpp, storage.hpp and
// fill.hpp under one name, with the convolutions and the fused recurrent
// cells of recurrent.hpp (register_aten_ops); the
// copies' fallthroughs on the Conjugate and Negative keys; and the operators
// whose CPU kernel is preferred to a composite (Note [CPU kernels over
// composites]).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/convolution.hpp>
#include <accelkit/torch/copy.hpp>
#include <accelkit/torch/empty.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/fill.hpp>
#include <accelkit/torch/ipc.hpp>
#include <accelkit/torch/kernel_table.hpp>
#include <accelkit/torch/recurrent.hpp>
#include <accelkit/torch/storage.hpp>
#include <accelkit/torch/views.hpp>

#include <ATen/ops/native_dropout_backward_native.h>
#include <ATen/ops/native_dropout_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>

#include <optional>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Every native operator of the headers above, and the host access they
// use, under one name (register_aten_ops; a vendor's own kernels may call
// Ops::to_cpu and the like). The host access is named here once more:
// GCC finds a name that two groups each bring in from HostAccess
// ambiguous.
struct Ops : CopyOps, EmptyOps, ViewOps, StorageOps, FillOps {
  using HostAccess::on_device, HostAccess::dev,
      HostAccess::host_visible, HostAccess::nbytes, HostAccess::stream_of,
      HostAccess::sync, HostAccess::queued, HostAccess::host_ready,
      HostAccess::run_on_host, HostAccess::host_ptr, HostAccess::host_view,
      HostAccess::storage_to_cpu,
      HostAccess::to_cpu, HostAccess::from_cpu;
};

// The copies resolve conjugate and negative bits themselves (Note [Math
// bits in copies]): the Conjugate and Negative fallbacks let them through.
inline void register_math_bit_fallthroughs(torch::Library& m) {
  m.impl("_copy_from", torch::CppFunction::makeFallthrough());
  m.impl("_copy_from_and_resize", torch::CppFunction::makeFallthrough());
}

// Through the registration table (Note [Vendor kernel registration]).
inline void register_aten_ops(KernelTable& m) {
  using O = Ops;
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
  // Tensor.item(): as the CPU's kernel, the first element whatever the
  // numel, and an empty tensor refused by that kernel in its own words.
  m.impl("_local_scalar_dense", [](const at::Tensor& self) -> at::Scalar {
    if (self.numel() == 0)
      return at::_local_scalar_dense(at::empty({0}, self.options().device(c10::kCPU)));
    return O::local_scalar_dense(self.numel() == 1 ? self : self.as_strided({}, {}));
  });
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(O::set_storage));
  m.impl("fill_.Scalar", TORCH_FN(O::fill));
  m.impl("record_stream", TORCH_FN(O::record_stream));
  m.impl("_lazy_clone", TORCH_FN(O::lazy_clone));  // Note [Copy-on-write on the storage's device]
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
  register_recurrent_cells(m);  // Note [Fused recurrent cells]
  m.impl("convolution_overrideable", TORCH_FN(Convolution::forward));
  m.impl("convolution_backward_overrideable", TORCH_FN(Convolution::backward));
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

// Note [Composites the CPU must run]: a few composite kernels
// (CompositeExplicitAutograd, the operator's only kernel) work on the
// built-in device types only: mode's out= form refuses any device type but
// CPU, CUDA and XPU; conj_physical_ calls a per-device kernel table
// (DispatchStub) that has no entry for the backend (torch.svd with out=
// reaches it); and the structured composites of index and scatter's
// reduce forms run the operator's shape function, which warns (a uint8
// mask, a deprecated argument), before the out= form through the fallback
// runs it again, warning twice where the CPU warns once, while those of
// mse_loss and smooth_l1_loss hand their out= form a result that its shape
// function resizes, with PyTorch's resize warning, which the CPU's own
// functional kernel does not raise. They are
// routed to the fallback, where the CPU runs them as on a CPU tensor. The
// list is what the OpInfo comparison's out= direction and its warnings
// find in op_db's samples (python/accelkit/testing/_opinfo_child.py); an
// operator the backend already has a kernel for keeps it, as does one a
// vendor registers later (Note [Vendor kernel registration]).
inline void register_cpu_runs_of_device_checked_composites(KernelTable& m) {
  auto& dispatcher = c10::Dispatcher::singleton();
  for (const char* name : {"mode.values", "conj_physical_", "index.Tensor", "scatter.reduce",
                           "scatter_.reduce", "mse_loss", "smooth_l1_loss"}) {
    std::string s(name);
    std::size_t dot = s.find('.');
    std::optional<c10::OperatorHandle> op =
        dispatcher.findOp({"aten::" + s.substr(0, dot), dot == std::string::npos ? "" : s.substr(dot + 1)});
    if (op && !op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1))
      m.impl(name, torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
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
// has a kernel for the backend keeps it (a vendor's kernel registered later
// replaces these: Note [Vendor kernel registration]).
inline void register_cpu_kernels_over_composites(KernelTable& m) {
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
    m.impl(short_name.c_str(), torch::CppFunction::makeFromBoxedFunction<&fallback>());
  }
  register_cpu_runs_of_device_checked_composites(m);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
