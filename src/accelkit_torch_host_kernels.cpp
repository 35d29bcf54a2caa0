// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is cut into units of about equal compile time, so that a build on
// two cores compiles them side by side.
//
// This unit: the host kernels (Note [Host kernels]).
#include <accelkit/torch/host_kernels.hpp>
#include <accelkit/torch/kernels.hpp>

#include "accelkit_torch_registrations.hpp"

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

void register_host_kernel_set(KernelTable& table) { register_host_kernels(table); }

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
