// The C++ conformance kit on the Vulkan backend (examples/vulkan) over the
// machine's Vulkan device (ctest: conformance.cpp.vkdev.<mode>, one per
// VKDEV_HOST_ACCESS mode).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <vkdev_runtime.hpp>

ACCELKIT_CONFORMANCE_SUITE(vkdev::VulkanRuntime)
