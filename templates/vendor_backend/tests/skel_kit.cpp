// accelkit's conformance kit (C++) on skel's runtime: every rule of the
// contract, each check a Catch2 test case "conformance/<group>/<check>";
// the JSON report goes to $ACCELKIT_CONFORMANCE_REPORT.
#if !__has_include(<catch2/catch_test_macros.hpp>)
#define CATCH_CONFIG_MAIN  // Catch2 v2 brings its main this way
#endif
#include <accelkit/testing/conformance.hpp>

#include "skel_runtime.hpp"

ACCELKIT_CONFORMANCE_SUITE(skel::SkelRuntime)
