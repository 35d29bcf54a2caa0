// The C++ conformance kit on simdev (ctest: conformance.cpp.simdev).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <simdev_runtime.hpp>

ACCELKIT_CONFORMANCE_SUITE(simdev::SimRuntime)
