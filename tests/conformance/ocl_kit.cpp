// The C++ conformance kit on the OpenCL backend (examples/opencl) over the
// machine's OpenCL device (ctest: conformance.cpp.ocl.svm_fine and
// .svm_coarse, one per SVM kind).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <opencl_runtime.hpp>

ACCELKIT_CONFORMANCE_SUITE(ocl::OpenCLRuntime)
