// The SDK's library part of every backend: the torch adapters compiled once,
// for ErasedRuntime (Note [Erased backend] in accelkit/torch/erased.hpp),
// and their registrations with PyTorch, made when the module loads. Compiled
// by accelkit_add_torch_backend into the object library
// accelkit_torch_adapters, whose objects each backend's module links; the
// module's ACCELKIT_REGISTER_BACKEND(R) line defines the backend they use.
// The same file and compile command in every build tree (Note [One
// registration source for every build tree]).
#include <accelkit/torch/registration.hpp>

namespace {
using E = ::accelkit::torch_adapter::ErasedRuntime;
}

C10_REGISTER_GUARD_IMPL(PrivateUse1, ::accelkit::torch_adapter::GuardImpl<E>);
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  (void)m;
  ::accelkit::torch_adapter::register_kernels<E>();
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { ::accelkit::torch_adapter::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { ::accelkit::torch_adapter::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::accelkit::torch_adapter::sparse_fallback<E>>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::accelkit::torch_adapter::sparse_fallback<E>>());
}
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) { ::accelkit::torch_adapter::register_autocast(m); }
TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::accelkit::torch_adapter::fallback<E>>());
}
static const bool accelkit_backend_registered_ = ::accelkit::torch_adapter::register_backend<E>();
