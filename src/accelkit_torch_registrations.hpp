// The registrations that one unit of the SDK's library part makes and
// another orders (accelkit_torch_*.cpp).
#pragma once

#include <accelkit/torch/kernels.hpp>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// The host kernels (accelkit_torch_host_kernels.cpp), registered after the
// native operators and before the CPU kernels over composites, which skip
// any operator that has a kernel by then (accelkit_torch_aten.cpp).
void register_host_kernel_set(KernelTable& table);

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
