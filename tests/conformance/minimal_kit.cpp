// The C++ conformance kit on minimal (ctest: conformance.cpp.minimal).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <minimal_runtime.hpp>

ACCELKIT_CONFORMANCE_SUITE(minimal::MinimalRuntime)
