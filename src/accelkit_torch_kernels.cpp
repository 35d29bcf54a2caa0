// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is two units, compiled side by side with the registration unit:
// more units would each parse PyTorch's headers again, which on two cores
// costs more than it saves (bench/compile_bench.py times the units).
//
// This unit: the native operators and the host kernels (Note [Host
// kernels]), the math-bit fallthroughs, autocast and the sparse layouts'
// refusal; the order of the ATen kernels' registration.
#include <accelkit/torch/autocast.hpp>
#include <accelkit/torch/host_kernels.hpp>
#include <accelkit/torch/kernels.hpp>
#include <accelkit/torch/ops.hpp>
#include <accelkit/torch/sparse.hpp>

namespace {
namespace ta = ::accelkit::torch_adapter;
}

// The SDK's ATen kernels, through the table that vendor kernels share (Note
// [Vendor kernel registration]).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  (void)m;
  ta::KernelTable& table = ta::KernelTable::get();
  ta::register_aten_ops(table);
  ta::register_host_kernels(table);
  ta::register_cpu_kernels_over_composites(table);
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { ta::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { ta::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::sparse_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::sparse_fallback>());
}
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) { ta::register_autocast(m); }
