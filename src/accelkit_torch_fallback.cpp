// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is cut into units of about equal compile time, so that a build on
// two cores compiles them side by side.
//
// This unit: the CPU fallback of every operator without a kernel (Note
// [CPU fallback policy] in accelkit/torch/fallback.hpp).
#include <accelkit/torch/fallback.hpp>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Fallback::get().run(op, stack);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::accelkit::torch_adapter::fallback>());
}
