// The ocl runtime's graphs (examples/opencl, Note [ocl graphs]) on the
// machine's OpenCL device, in both SVM kinds: through cl_khr_command_buffer
// where the device has it (PoCL 3.1's CPU device does), the refusal naming
// the extension where it does not (OCL_COMMAND_BUFFER=0 stands in for such
// a device on any machine).
#include "catch.hpp"

#include <accelkit/accelkit.hpp>

#include "opencl_runtime.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using accelkit::CaptureMode;
using accelkit::CopyKind;

namespace {

ocl::Config with(ocl::Svm svm, bool command_buffer = true) {
  ocl::Config c;
  c.svm = svm;
  c.command_buffer = command_buffer;
  return c;
}

bool records_graphs(ocl::OpenCLRuntime& rt) {
  auto v = rt.properties(0).extra<std::string>("ocl.command_buffer");
  return v && v->rfind("none", 0) != 0;
}

std::vector<unsigned char> read(ocl::OpenCLRuntime& rt, const void* p, std::size_t n) {
  std::vector<unsigned char> out(n);
  rt.memcpy(0, out.data(), p, n, CopyKind::device_to_host);
  return out;
}

std::vector<float> read_floats(ocl::OpenCLRuntime& rt, const void* p, std::size_t n) {
  std::vector<float> out(n);
  rt.memcpy(0, out.data(), p, n * sizeof(float), CopyKind::device_to_host);
  return out;
}

void write_floats(ocl::OpenCLRuntime& rt, void* p, const std::vector<float>& v) {
  rt.memcpy(0, p, v.data(), v.size() * sizeof(float), CopyKind::host_to_device);
}

// A command that waits for a user event: the stream stays busy until the
// test completes it.
cl_event gate(ocl::OpenCLRuntime& rt, accelkit::StreamHandle s) {
  cl_int err = CL_SUCCESS;
  cl_event user = clCreateUserEvent(rt.cl_context_of(0), &err);
  REQUIRE(err == CL_SUCCESS);
  rt.enqueue_on(0, s, "gate", [&](cl_command_queue q, cl_event* e) {
    return clEnqueueBarrierWithWaitList(q, 1, &user, e);
  });
  return user;
}

// o[i] = s * a[i] + o[i] * keep, a kernel of the test's own program.
struct Program {
  cl_program program = nullptr;
  cl_kernel kernel = nullptr;
  explicit Program(ocl::OpenCLRuntime& rt) {
    const char* src =
        "kernel void axpy(global float* o, global const float* a, float s, float keep) {"
        "  size_t i = get_global_id(0); o[i] = s * a[i] + keep * o[i]; }";
    cl_int err = CL_SUCCESS;
    program = clCreateProgramWithSource(rt.cl_context_of(0), 1, &src, nullptr, &err);
    REQUIRE(err == CL_SUCCESS);
    cl_device_id id = rt.cl_device_of(0);
    REQUIRE(clBuildProgram(program, 1, &id, "", nullptr, nullptr) == CL_SUCCESS);
    kernel = clCreateKernel(program, "axpy", &err);
    REQUIRE(err == CL_SUCCESS);
  }
  void set(void* o, const void* a, float s, float keep) {
    REQUIRE(clSetKernelArgSVMPointer(kernel, 0, o) == CL_SUCCESS);
    REQUIRE(clSetKernelArgSVMPointer(kernel, 1, a) == CL_SUCCESS);
    REQUIRE(clSetKernelArg(kernel, 2, sizeof s, &s) == CL_SUCCESS);
    REQUIRE(clSetKernelArg(kernel, 3, sizeof keep, &keep) == CL_SUCCESS);
  }
  Program(const Program&) = delete;
  Program& operator=(const Program&) = delete;
  ~Program() {
    clReleaseKernel(kernel);
    clReleaseProgram(program);
  }
};

std::int64_t code_of(const accelkit::DriverError& e) { return e.code(); }

}  // namespace

TEST_CASE("ocl: PoCL's device lists cl_khr_command_buffer at a revision the backend records with",
          "[ocl][graphs]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  auto v = rt.properties(0).extra<std::string>("ocl.command_buffer");
  REQUIRE(v.has_value());
  INFO(*v);
  std::string platform = rt.properties(0).extra<std::string>("ocl.platform").value_or("");
  if (platform.find("Portable Computing Language") != std::string::npos ||
      platform.find("PoCL") != std::string::npos)
    CHECK(v->rfind("0.9.", 0) == 0);  // PoCL 3.1: 0.9.0
  else
    CHECK(!v->empty());
}

TEST_CASE("ocl: a capture records without running, and a launch reads memory when it runs",
          "[ocl][graphs]") {
  for (ocl::Svm svm : {ocl::Svm::fine, ocl::Svm::coarse}) {
    ocl::OpenCLRuntime rt(with(svm));
    REQUIRE(rt.device_count() >= 1);
    if (!records_graphs(rt)) {
      auto s = rt.stream_create(0, 0);
      CHECK_THROWS_AS(rt.stream_begin_capture(0, s, CaptureMode::global),
                      accelkit::NotSupportedError);
      continue;
    }
    INFO((svm == ocl::Svm::fine ? "fine" : "coarse"));
    constexpr std::size_t n = 4096;
    auto s = rt.stream_create(0, 0);
    auto other = rt.stream_create(0, 0);
    auto* a = static_cast<unsigned char*>(rt.malloc(0, 2 * n));
    auto* b = static_cast<unsigned char*>(rt.malloc(0, n));
    auto* pinned = static_cast<unsigned char*>(rt.host_malloc(0, n));
    REQUIRE((a && b && pinned));
    rt.memset_async(0, a, 1, 2 * n, s);
    rt.memset_async(0, b, 0, n, s);
    rt.stream_synchronize(0, s);

    CHECK_FALSE(rt.stream_is_capturing(0, s));
    rt.stream_begin_capture(0, s, CaptureMode::global);
    CHECK(rt.stream_is_capturing(0, s));
    CHECK_FALSE(rt.stream_is_capturing(0, other));
    // pinned -> a[0, n), a fill of a[n/2, n), a[0, n) -> b (offsets inside
    // the allocations), b -> pinned... in the order queued.
    rt.memcpy_async(0, a, pinned, n, CopyKind::host_to_device, s, true);
    rt.memset_async(0, a + n / 2, 7, n / 2, s);
    rt.memcpy_async(0, b, a, n, CopyKind::device_to_device, s, false);
    rt.memcpy_async(0, a + n, b + 16, 64, CopyKind::device_to_device, s, false);
    accelkit::GraphHandle g = rt.stream_end_capture(0, s);
    CHECK_FALSE(rt.stream_is_capturing(0, s));
    CHECK(rt.stream_query(0, s));  // nothing ran
    CHECK(read(rt, b, n) == std::vector<unsigned char>(n, 0));
    CHECK(read(rt, a, n) == std::vector<unsigned char>(n, 1));

    accelkit::GraphExecHandle x = rt.graph_instantiate(0, g);
    for (unsigned char round : {3, 5}) {
      std::memset(pinned, round, n);  // read by the launch, not at capture
      rt.graph_launch(0, x, round == 3 ? s : other);  // any stream of the device
      rt.stream_synchronize(0, round == 3 ? s : other);
      std::vector<unsigned char> want(n, round);
      std::memset(want.data() + n / 2, 7, n / 2);
      CHECK(read(rt, b, n) == want);
      CHECK(read(rt, a + n, 64) == std::vector<unsigned char>(64, round));
    }
    rt.graph_exec_destroy(0, x);
    rt.graph_destroy(0, g);
    CHECK_THROWS_AS(rt.graph_instantiate(0, g), accelkit::DriverError);
    CHECK_THROWS_AS(rt.graph_launch(0, x, s), accelkit::DriverError);
    rt.host_free(0, pinned);
    rt.free(0, a);
    rt.free(0, b);
    rt.stream_destroy(0, s);
    rt.stream_destroy(0, other);
  }
}

TEST_CASE("ocl: a recorded kernel keeps the arguments it had when recorded", "[ocl][graphs]") {
  for (ocl::Svm svm : {ocl::Svm::fine, ocl::Svm::coarse}) {
    ocl::OpenCLRuntime rt(with(svm));
    REQUIRE(rt.device_count() >= 1);
    if (!records_graphs(rt)) continue;
    constexpr std::size_t n = 256;
    Program p(rt);
    auto s = rt.stream_create(0, 0);
    void* a = rt.malloc(0, n * sizeof(float));
    void* o = rt.malloc(0, n * sizeof(float));
    void* elsewhere = rt.malloc(0, n * sizeof(float));
    std::vector<float> ones(n, 1.0f), zeros(n, 0.0f);
    write_floats(rt, a, ones);
    write_floats(rt, o, zeros);
    write_floats(rt, elsewhere, zeros);

    rt.stream_begin_capture(0, s, CaptureMode::relaxed);
    p.set(o, a, 2.0f, 1.0f);  // o += 2 a
    std::size_t global = n;
    rt.enqueue_kernel(0, s, "axpy", p.kernel, 1, &global, nullptr);
    p.set(elsewhere, a, 100.0f, 0.0f);  // later arguments: not the recorded command's
    accelkit::GraphHandle g = rt.stream_end_capture(0, s);
    accelkit::GraphExecHandle x = rt.graph_instantiate(0, g);
    rt.graph_destroy(0, g);  // the exec keeps what it needs
    write_floats(rt, a, std::vector<float>(n, 3.0f));  // read when the launch runs
    rt.graph_launch(0, x, s);
    rt.graph_launch(0, x, s);
    rt.stream_synchronize(0, s);
    CHECK(read_floats(rt, o, n) == std::vector<float>(n, 12.0f));
    CHECK(read_floats(rt, elsewhere, n) == zeros);
    // The kernel itself still launches with its current arguments.
    rt.enqueue_kernel(0, s, "axpy", p.kernel, 1, &global, nullptr);
    rt.stream_synchronize(0, s);
    CHECK(read_floats(rt, elsewhere, n) == std::vector<float>(n, 300.0f));
    rt.graph_exec_destroy(0, x);
    for (void* q : {a, o, elsewhere}) rt.free(0, q);
    rt.stream_destroy(0, s);
  }
}

TEST_CASE("ocl: launches queued many times complete after their exec and graph are destroyed",
          "[ocl][graphs]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  if (!records_graphs(rt)) return;
  constexpr std::size_t n = 1024;
  Program p(rt);
  auto capture = rt.stream_create(0, 0);
  auto s = rt.stream_create(0, 0);
  void* a = rt.malloc(0, n * sizeof(float));
  void* o = rt.malloc(0, n * sizeof(float));
  write_floats(rt, a, std::vector<float>(n, 1.0f));
  write_floats(rt, o, std::vector<float>(n, 0.0f));
  rt.stream_begin_capture(0, capture, CaptureMode::per_thread);
  p.set(o, a, 1.0f, 1.0f);  // o += a
  std::size_t global = n;
  rt.enqueue_kernel(0, capture, "axpy", p.kernel, 1, &global, nullptr);
  accelkit::GraphHandle g = rt.stream_end_capture(0, capture);
  accelkit::GraphExecHandle x = rt.graph_instantiate(0, g);

  cl_event user = gate(rt, s);  // the launches wait behind it
  for (int i = 0; i < 10; ++i) rt.graph_launch(0, x, s);
  CHECK_FALSE(rt.stream_query(0, s));
  rt.graph_exec_destroy(0, x);
  rt.graph_destroy(0, g);
  CHECK(read_floats(rt, o, n) == std::vector<float>(n, 0.0f));  // none ran yet
  clSetUserEventStatus(user, CL_COMPLETE);
  rt.stream_synchronize(0, s);
  CHECK(read_floats(rt, o, n) == std::vector<float>(n, 10.0f));
  clReleaseEvent(user);
  rt.free(0, a);
  rt.free(0, o);
  rt.stream_destroy(0, s);
  rt.stream_destroy(0, capture);
}

TEST_CASE("ocl: a graph's launches queued when the runtime goes complete after it",
          "[ocl][graphs]") {
  cl_event user = nullptr;
  std::vector<float> host(256, 0.0f);
  {
    auto rt = std::make_unique<ocl::OpenCLRuntime>();
    REQUIRE(rt->device_count() >= 1);
    if (!records_graphs(*rt)) return;
    auto capture = rt->stream_create(0, 0);
    auto s = rt->stream_create(0, 0);
    auto* pinned = static_cast<float*>(rt->host_malloc(0, host.size() * sizeof(float)));
    std::memset(pinned, 0, host.size() * sizeof(float));
    void* d = rt->malloc(0, host.size() * sizeof(float));
    write_floats(*rt, d, std::vector<float>(host.size(), 2.0f));
    rt->stream_begin_capture(0, capture, CaptureMode::global);
    rt->memcpy_async(0, pinned, d, host.size() * sizeof(float), CopyKind::device_to_host, capture,
                     true);
    accelkit::GraphExecHandle x = rt->graph_instantiate(0, rt->stream_end_capture(0, capture));
    user = gate(*rt, s);
    rt->graph_launch(0, x, s);
    // The runtime goes with its graph's launch still queued (and the memory
    // it reads, which the launch's buffers keep: PoCL's clSVMFree is not
    // deferred, so the memory is left to the process here).
    rt.reset();
    std::memcpy(host.data(), pinned, host.size() * sizeof(float));
  }
  CHECK(host == std::vector<float>(256, 0.0f));  // not run yet
  REQUIRE(clSetUserEventStatus(user, CL_COMPLETE) == CL_SUCCESS);
  clReleaseEvent(user);
  // No queue is left to wait on: the launch and the release of the graph's
  // command buffer (its event's callback) run now, within this test case.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
}

TEST_CASE("ocl: what a command buffer cannot record invalidates the capture, and the stream "
          "stays usable",
          "[ocl][graphs]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  if (!records_graphs(rt)) return;
  auto s = rt.stream_create(0, 0);
  auto e = rt.event_create(0, accelkit::EventFlags::none);
  void* a = rt.malloc(0, 4096);
  void* b = rt.malloc(0, 4096);
  std::vector<unsigned char> pageable(4096, 9);

  // Begun twice: refused, the first capture goes on.
  rt.stream_begin_capture(0, s, CaptureMode::global);
  CHECK_THROWS_WITH(rt.stream_begin_capture(0, s, CaptureMode::global),
                    Catch::Contains("is capturing already"));
  rt.memset_async(0, a, 2, 4096, s);
  accelkit::GraphHandle g = rt.stream_end_capture(0, s);
  rt.graph_destroy(0, g);
  CHECK_THROWS_WITH(rt.stream_end_capture(0, s), Catch::Contains("is not capturing"));

  struct Refused {
    const char* call;
    std::function<void()> run;
  };
  std::vector<Refused> refused = {
      {"event_record", [&] { rt.event_record(0, e, s); }},
      {"stream_query", [&] { rt.stream_query(0, s); }},
      {"stream_synchronize", [&] { rt.stream_synchronize(0, s); }},
      {"stream_wait_event", [&] { rt.stream_wait_event(0, s, e); }},
      {"memcpy_async",
       [&] { rt.memcpy_async(0, a, pageable.data(), 4096, CopyKind::host_to_device, s, false); }},
      {"memcpy_async",  // "pinned", but no allocation of the device
       [&] { rt.memcpy_async(0, a, pageable.data(), 4096, CopyKind::host_to_device, s, true); }},
      {"gate", [&] { clReleaseEvent(gate(rt, s)); }},
  };
  for (const Refused& r : refused) {
    INFO(r.call);
    rt.stream_begin_capture(0, s, CaptureMode::global);
    rt.memset_async(0, b, 3, 4096, s);
    try {
      r.run();
      FAIL("not refused");
    } catch (const accelkit::DriverError& err) {
      CHECK(err.call() == r.call);
    }
    CHECK(rt.stream_is_capturing(0, s));
    // Nothing more is recorded once invalidated.
    CHECK_THROWS_WITH(rt.memset_async(0, b, 4, 4096, s), Catch::Contains("invalidated by"));
    try {
      rt.stream_end_capture(0, s);
      FAIL("an invalidated capture made a graph");
    } catch (const accelkit::DriverError& err) {
      CHECK(code_of(err) == CL_INVALID_OPERATION);
      CHECK(std::string(err.what()).find(std::string("invalidated by ") + r.call) !=
            std::string::npos);
    }
    CHECK_FALSE(rt.stream_is_capturing(0, s));
    rt.memset_async(0, b, 5, 4096, s);  // usable, and runs
    rt.stream_synchronize(0, s);
    CHECK(read(rt, b, 4096) == std::vector<unsigned char>(4096, 5));
  }

  // A launch on a capturing stream: refused, that capture invalidated.
  rt.stream_begin_capture(0, s, CaptureMode::global);
  rt.memset_async(0, a, 6, 4096, s);
  g = rt.stream_end_capture(0, s);
  accelkit::GraphExecHandle x = rt.graph_instantiate(0, g);
  rt.stream_begin_capture(0, s, CaptureMode::global);
  CHECK_THROWS_WITH(rt.graph_launch(0, x, s), Catch::Contains("cannot be recorded"));
  CHECK_THROWS_WITH(rt.stream_end_capture(0, s), Catch::Contains("invalidated by graph_launch"));

  // A graph whose memory was freed: its launch is refused, naming the address.
  rt.free(0, a);
  try {
    rt.graph_launch(0, x, s);
    FAIL("a graph over freed memory launched");
  } catch (const accelkit::DriverError& err) {
    CHECK(code_of(err) == CL_INVALID_MEM_OBJECT);
    CHECK(std::string(err.what()).find(fmt::format("{}", a)) != std::string::npos);
  }
  rt.graph_exec_destroy(0, x);
  rt.graph_destroy(0, g);

  // A stream destroyed while capturing takes its capture with it.
  auto t = rt.stream_create(0, 0);
  rt.stream_begin_capture(0, t, CaptureMode::global);
  rt.memset_async(0, b, 1, 4096, t);
  rt.stream_destroy(0, t);
  rt.memset_async(0, b, 8, 4096, s);
  rt.stream_synchronize(0, s);
  CHECK(read(rt, b, 4096) == std::vector<unsigned char>(4096, 8));
  rt.free(0, b);
  rt.event_destroy(0, e);
  rt.stream_destroy(0, s);
}

TEST_CASE("ocl: without a usable cl_khr_command_buffer, graphs are refused naming it",
          "[ocl][graphs]") {
  // OCL_COMMAND_BUFFER=0: as on a device without the extension.
  ocl::OpenCLRuntime rt(with(ocl::Svm::fine, false));
  REQUIRE(rt.device_count() >= 1);
  CHECK(rt.properties(0).extra<std::string>("ocl.command_buffer") ==
        std::string("none: cl_khr_command_buffer is turned off (OCL_COMMAND_BUFFER=0)"));
  auto s = rt.stream_create(0, 0);
  std::vector<std::pair<const char*, std::function<void()>>> members = {
      {"stream_begin_capture", [&] { rt.stream_begin_capture(0, s, CaptureMode::global); }},
      {"stream_end_capture", [&] { rt.stream_end_capture(0, s); }},
      {"graph_instantiate", [&] { rt.graph_instantiate(0, accelkit::GraphHandle{1}); }},
      {"graph_launch", [&] { rt.graph_launch(0, accelkit::GraphExecHandle{1}, s); }},
      {"graph_exec_destroy", [&] { rt.graph_exec_destroy(0, accelkit::GraphExecHandle{1}); }},
      {"graph_destroy", [&] { rt.graph_destroy(0, accelkit::GraphHandle{1}); }},
  };
  for (auto& [call, run] : members) {
    INFO(call);
    try {
      run();
      FAIL("not refused");
    } catch (const accelkit::NotSupportedError& e) {
      std::string what = e.what();
      CHECK(what.rfind("ocl: cannot capture graphs on device 0", 0) == 0);
      CHECK(what.find("cl_khr_command_buffer") != std::string::npos);
      CHECK(what.find(call) != std::string::npos);
    }
  }
  CHECK_FALSE(rt.stream_is_capturing(0, s));  // a query, answered
  rt.stream_destroy(0, s);
  CHECK_THROWS_WITH(ocl::Config::from_environment(
                        accelkit::Environment::fixed({{"OCL_COMMAND_BUFFER", "on"}})),
                    Catch::Contains("OCL_COMMAND_BUFFER='on'"));
  CHECK_FALSE(ocl::Config::from_environment(
                  accelkit::Environment::fixed({{"OCL_COMMAND_BUFFER", "0"}}))
                  .command_buffer);
}

TEST_CASE("ocl: through the SDK, a capture replays, and what the SDK refuses invalidates it",
          "[ocl][graphs]") {
  using B = accelkit::Backend<ocl::OpenCLRuntime>;
  STATIC_REQUIRE(B::has_graphs);
  B b(accelkit::Environment::fixed({}), with(ocl::Svm::fine));
  REQUIRE(b.device_count() >= 1);
  if (!records_graphs(b.runtime())) {
    auto s = b.stream_create(0, 0);
    CHECK_THROWS_AS(b.stream_begin_capture(0, s, CaptureMode::global),
                    accelkit::NotSupportedError);
    CHECK_FALSE(b.stream_is_capturing(0, s));
    return;
  }
  constexpr std::size_t n = 4096;
  auto s = b.stream_create(0, 0);
  auto e = b.event_create(0, accelkit::EventFlags::none);
  auto* a = static_cast<unsigned char*>(b.runtime().malloc(0, n));
  auto* c = static_cast<unsigned char*>(b.runtime().malloc(0, n));
  b.memset_async(0, c, 0, n, s);
  b.stream_synchronize(0, s);

  b.stream_begin_capture(0, s, CaptureMode::global);
  CHECK(b.stream_is_capturing(0, s));
  CHECK(b.capture_underway(0));
  b.memset_async(0, a, 4, n, s);
  b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, false);
  accelkit::GraphHandle g = b.stream_end_capture(0, s);
  CHECK_FALSE(b.capture_underway(0));
  CHECK(read(b.runtime(), c, n) == std::vector<unsigned char>(n, 0));
  accelkit::GraphExecHandle x = b.graph_instantiate(0, g);
  b.graph_launch(0, x, s);
  b.stream_synchronize(0, s);
  CHECK(read(b.runtime(), c, n) == std::vector<unsigned char>(n, 4));

  // The SDK refuses an event record on the capturing stream before the
  // runtime sees it; the end names it, and the stream is usable after.
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.memset_async(0, a, 5, n, s);
  CHECK_THROWS_AS(b.event_record(0, e, s), accelkit::RuntimeError);
  CHECK_THROWS_WITH(b.stream_end_capture(0, s), Catch::Contains("invalidated by event_record"));
  CHECK_FALSE(b.stream_is_capturing(0, s));
  CHECK_FALSE(b.runtime().stream_is_capturing(0, s));
  b.graph_launch(0, x, s);
  b.event_record(0, e, s);
  b.event_synchronize(0, e);
  CHECK(read(b.runtime(), c, n) == std::vector<unsigned char>(n, 4));

  b.graph_exec_destroy(0, x);
  b.graph_destroy(0, g);
  b.runtime().free(0, a);
  b.runtime().free(0, c);
  b.event_destroy(0, e);
  b.stream_destroy(0, s);
}
