// The C++ conformance kit on examples/cudart (ctest: conformance.cpp.cudart).
// Without a GPU every check but discovery's is skipped, "no device: " and
// CUDA's error (tests/cudart/check_cudart_kit.py checks that).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <cudart_runtime.hpp>

ACCELKIT_CONFORMANCE_SUITE(cudart::CudaRuntime)
