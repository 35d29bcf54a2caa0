// examples/cudart's runtime against the real libcudart (ctest: cudart.*).
// On a machine without a GPU or a driver (this CI: the toolkit only),
// discovery must answer 0 devices at once, throw nothing through the SDK,
// and keep CUDA's own error as the reason; with a GPU, the device's
// properties must be sound.
#include "../catch.hpp"

#include <cudart_runtime.hpp>

#include <chrono>
#include <string>

namespace {
using Rt = cudart::CudaRuntime;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

TEST_CASE("cudart: device_count reports CUDA's error as a DriverError, or the devices") {
  Rt rt;
  int n = -1;
  int count = 0;
  cudaError_t direct = cudaGetDeviceCount(&count);
  try {
    n = rt.device_count();
  } catch (const accelkit::DriverError& e) {
    // The error CUDA gave the test itself, by its name, code and string.
    REQUIRE(direct != cudaSuccess);
    CHECK(e.code() == static_cast<std::int64_t>(direct));
    CHECK(e.call() == "device_count");
    std::string what = e.what();
    CHECK(what.find("cudart") != std::string::npos);
    CHECK(what.find(cudaGetErrorName(direct)) != std::string::npos);
    CHECK(what.find(cudaGetErrorString(direct)) != std::string::npos);
    return;
  }
  REQUIRE(direct == cudaSuccess);
  CHECK(n == count);
}

TEST_CASE("cudart: through the SDK, no GPU is 0 devices, nothing thrown, the reason kept") {
  auto t0 = std::chrono::steady_clock::now();
  accelkit::Backend<Rt> b(accelkit::Environment::fixed({}));
  int n = b.device_count();  // noexcept
  int direct = 0;
  cudaError_t e = cudaGetDeviceCount(&direct);
  if (e == cudaSuccess && direct > 0) {
    // A GPU: every device's properties pass the SDK's validation.
    REQUIRE(n == direct);
    CHECK(b.init_error().empty());
    for (int d = 0; d < n; ++d) {
      auto problems = accelkit::property_problems(b.runtime().properties(d), "cudart");
      CHECK(problems.empty());
    }
    return;
  }
  CHECK(n == 0);
  CHECK(b.visible_devices().empty());
  std::string why = b.init_error();
  INFO(why);
  if (e != cudaSuccess) {
    CHECK(why.find(std::string(cudaGetErrorName(e)) + " (" + std::to_string(e) + "): " +
                   cudaGetErrorString(e)) != std::string::npos);
    CHECK(why.find("cudaGetDeviceCount") != std::string::npos);
  }
  // Device use raises an error that names it; nothing hangs.
  try {
    b.lazy_init();
    FAIL("lazy_init() succeeded without a device");
  } catch (const accelkit::Error& err) {
    std::string what = err.what();
    INFO(what);
    CHECK(what.find("cudart") != std::string::npos);
    if (e != cudaSuccess) CHECK(what.find(cudaGetErrorName(e)) != std::string::npos);
  }
  CHECK(b.device_count() == 0);  // asked again: the same answer
  CHECK(seconds_since(t0) < 10.0);
}

TEST_CASE("cudart: a failed CUDA call is a DriverError with CUDA's code, name and string") {
  try {
    Rt::check(cudaErrorMemoryAllocation, "malloc", "cudaMalloc");
    FAIL("check() did not throw");
  } catch (const accelkit::DriverError& e) {
    CHECK(e.code() == static_cast<std::int64_t>(cudaErrorMemoryAllocation));
    CHECK(e.call() == "malloc");
    CHECK(e.driver_message() == std::string("cudaMalloc failed: cudaErrorMemoryAllocation (2): ") +
                                    cudaGetErrorString(cudaErrorMemoryAllocation));
  }
  CHECK_NOTHROW(Rt::check(cudaSuccess, "malloc", "cudaMalloc"));
}

TEST_CASE("cudart: host signals are the runtime's own flags, checked without a device") {
  STATIC_REQUIRE(accelkit::Backend<Rt>::has_stream_signals);
  Rt rt;
  auto code = [](auto&& f) -> std::int64_t {
    try {
      f();
    } catch (const accelkit::DriverError& e) {
      return e.code();
    }
    return 0;
  };
  accelkit::SignalHandle g = rt.signal_create(0);
  CHECK(code([&] { rt.signal_complete(1, g, 0); }) == cudaErrorInvalidValue);
  rt.signal_complete(0, g, 0);
  CHECK(code([&] { rt.signal_complete(0, g, 0); }) == cudaErrorInvalidValue);
  rt.signal_destroy(0, g);
  CHECK(code([&] { rt.signal_destroy(0, g); }) == cudaErrorInvalidResourceHandle);
  CHECK(code([&] { rt.signal_complete(0, g, 0); }) == cudaErrorInvalidResourceHandle);
}
