// accelkit: the PyTorch side of a backend that vendor code may use beside
// its kernels: the device guard, the allocators, the hooks, error
// translation and the per-thread work counts, one header each. Vendor
// kernels include <accelkit/torch/kernels.hpp>.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/device_allocator.hpp>
#include <accelkit/torch/device_work.hpp>
#include <accelkit/torch/errors.hpp>
#include <accelkit/torch/guard.hpp>
#include <accelkit/torch/hooks.hpp>
#include <accelkit/torch/pinned_allocator.hpp>
