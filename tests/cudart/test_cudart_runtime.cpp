// examples/cudart's runtime against the real libcudart (ctest: cudart.*).
// On a machine without a GPU or a driver (this CI: the toolkit only),
// discovery must answer 0 devices at once, throw nothing through the SDK,
// and keep CUDA's own error as the reason; with a GPU, the device's
// properties must be sound.
#include "../catch.hpp"

#include <cudart_runtime.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

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

TEST_CASE("cudart: graphs are CUDA's stream capture, the mode mapped to CUDA's") {
  STATIC_REQUIRE(accelkit::Backend<Rt>::has_graphs);
  CHECK(Rt::capture_mode(accelkit::CaptureMode::global) == cudaStreamCaptureModeGlobal);
  CHECK(Rt::capture_mode(accelkit::CaptureMode::per_thread) == cudaStreamCaptureModeThreadLocal);
  CHECK(Rt::capture_mode(accelkit::CaptureMode::relaxed) == cudaStreamCaptureModeRelaxed);
  // The DriverError's message from CUDA, or "" when `f` did not throw one.
  auto refusal = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const accelkit::DriverError& e) {
      return e.driver_message();
    }
    return "";
  };
  auto starts = [](const std::string& s, const std::string& prefix) {
    return s.compare(0, prefix.size(), prefix) == 0;
  };
  Rt rt;
  int count = 0;
  cudaError_t direct = cudaGetDeviceCount(&count);
  if (direct != cudaSuccess || count == 0) {
    // No GPU: each member reports CUDA's own error, naming its CUDA call.
    accelkit::StreamHandle legacy{};
    CHECK(starts(refusal([&] { rt.stream_begin_capture(0, legacy, accelkit::CaptureMode::global); }),
                 "cudaStreamBeginCapture failed: cudaError"));
    CHECK(starts(refusal([&] { rt.stream_end_capture(0, legacy); }),
                 "cudaStreamEndCapture failed: cudaError"));
    CHECK(starts(refusal([&] { rt.stream_is_capturing(0, legacy); }),
                 "cudaStreamIsCapturing failed: cudaError"));
    CHECK(refusal([&] { rt.graph_instantiate(0, accelkit::GraphHandle{}); }).find(
              " failed: cudaError") != std::string::npos);
    return;
  }
  // A GPU: a memset and a copy captured, not run; each launch runs them,
  // reading the source when it runs.
  rt.set_device(0);
  accelkit::StreamHandle s = rt.stream_create(0, 0);
  constexpr std::size_t n = 1 << 16;
  void* a = rt.malloc(0, n);
  void* b = rt.malloc(0, n);
  REQUIRE((a && b));
  rt.memset_async(0, b, 0, n, s);
  rt.stream_synchronize(0, s);
  rt.stream_begin_capture(0, s, accelkit::CaptureMode::global);
  CHECK(rt.stream_is_capturing(0, s));
  rt.memset_async(0, static_cast<char*>(a) + n / 2, 7, n / 2, s);
  rt.memcpy_async(0, b, a, n, accelkit::CopyKind::device_to_device, s, false);
  accelkit::GraphHandle g = rt.stream_end_capture(0, s);
  CHECK_FALSE(rt.stream_is_capturing(0, s));
  std::vector<unsigned char> host(n, 1);
  rt.memcpy(0, host.data(), b, n, accelkit::CopyKind::device_to_host);
  CHECK(host == std::vector<unsigned char>(n, 0));
  accelkit::GraphExecHandle x = rt.graph_instantiate(0, g);
  rt.graph_destroy(0, g);  // the exec is independent of it
  for (unsigned char round : {3, 5}) {
    std::vector<unsigned char> src(n, round);
    rt.memcpy(0, a, src.data(), n, accelkit::CopyKind::host_to_device);
    rt.graph_launch(0, x, s);
    rt.stream_synchronize(0, s);
    rt.memcpy(0, host.data(), b, n, accelkit::CopyKind::device_to_host);
    std::vector<unsigned char> want(n, round);
    std::fill(want.begin() + n / 2, want.end(), static_cast<unsigned char>(7));
    CHECK(host == want);
  }
  // Synchronizing a capturing stream: CUDA refuses and invalidates the
  // capture; its end reports that, and the stream is not capturing after.
  rt.stream_begin_capture(0, s, accelkit::CaptureMode::global);
  rt.memset_async(0, a, 1, n, s);
  CHECK(starts(refusal([&] { rt.stream_synchronize(0, s); }),
               "cudaStreamSynchronize failed: cudaErrorStreamCapture"));
  CHECK(starts(refusal([&] { rt.stream_end_capture(0, s); }),
               "cudaStreamEndCapture failed: cudaErrorStreamCaptureInvalidated"));
  CHECK_FALSE(rt.stream_is_capturing(0, s));
  accelkit::StreamHandle other = rt.stream_create(0, 0);
  rt.graph_launch(0, x, other);  // any stream of the device
  rt.stream_synchronize(0, other);
  rt.graph_exec_destroy(0, x);
  rt.free(0, a);
  rt.free(0, b);
  rt.stream_destroy(0, s);
  rt.stream_destroy(0, other);
}

TEST_CASE("cudart: inter-process memory and events are CUDA's IPC, each failure CUDA's") {
  STATIC_REQUIRE(accelkit::Backend<Rt>::has_ipc_memory);
  STATIC_REQUIRE(accelkit::Backend<Rt>::has_ipc_events);
  // The member's DriverError ("" when it did not throw one): its call, and
  // CUDA's error in the message.
  auto refusal = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const accelkit::DriverError& e) {
      return std::string(e.call()) + ": " + e.driver_message();
    }
    return "";
  };
  auto names = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  Rt rt;
  int count = 0;
  cudaError_t direct = cudaGetDeviceCount(&count);
  if (direct != cudaSuccess || count == 0) {
    // No GPU: each member fails with CUDA's error, never crashes.
    int x = 0;
    CHECK(names(refusal([&] { rt.ipc_mem_export(0, &x); }), "ipc_mem_export: "));
    CHECK(names(refusal([&] { rt.ipc_mem_open(0, accelkit::IpcMemHandle{}); }), "ipc_mem_open: "));
    CHECK(names(refusal([&] { rt.ipc_mem_close(0, &x); }), "ipc_mem_close: "));
    CHECK(names(refusal([&] { rt.ipc_event_export(0, accelkit::EventHandle{}); }),
                "ipc_event_export: "));
    CHECK(names(refusal([&] { rt.ipc_event_open(0, accelkit::IpcEventHandle{}); }),
                "ipc_event_open: "));
    CHECK(names(refusal([&] { rt.ipc_mem_open(0, accelkit::IpcMemHandle{}); }), " failed: cudaError"));
    return;
  }
  // A GPU: a handle names the allocation; CUDA refuses to open it in the
  // process that exported it (the conformance kit's interprocess group runs
  // the rest in two processes).
  rt.set_device(0);
  void* p = rt.malloc(0, 1 << 20);
  REQUIRE(p != nullptr);
  accelkit::IpcMemHandle h = rt.ipc_mem_export(0, p);
  CHECK(h != accelkit::IpcMemHandle{});
  CHECK(names(refusal([&] { rt.ipc_mem_open(0, h); }), "ipc_mem_open: cudaIpcOpenMemHandle failed"));
  // An interprocess event has no timing (cudaEventInterprocess needs
  // cudaEventDisableTiming) and exports.
  accelkit::EventHandle e = rt.event_create(0, accelkit::EventFlags::interprocess);
  accelkit::StreamHandle s = rt.stream_create(0, 0);
  rt.event_record(0, e, s);
  rt.stream_synchronize(0, s);
  CHECK(rt.ipc_event_export(0, e) != accelkit::IpcEventHandle{});
  CHECK(names(refusal([&] { rt.event_elapsed_time(0, e, e); }), "cudaEventElapsedTime failed"));
  rt.event_destroy(0, e);
  rt.stream_destroy(0, s);
  rt.free(0, p);
}
