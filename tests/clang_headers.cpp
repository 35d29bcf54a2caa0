// The SDK's headers compiled by Clang (core.clang_headers, where a clang++
// is installed), whatever compiler builds the rest: the SDK is header-only,
// and a vendor's compiler may be either. Explicit instantiations, so that
// every member of the allocators is compiled.
#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

template class accelkit::DeviceCachingAllocator<simdev::SimRuntime>;
template class accelkit::CachingAllocator<simdev::SimRuntime>;
template class accelkit::HostAllocator<simdev::SimRuntime>;
