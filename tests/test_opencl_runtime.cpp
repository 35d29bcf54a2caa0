// The ocl runtime (examples/opencl) on the machine's OpenCL device (PoCL
// here), member by member, in both SVM kinds: what the SDK relies on.
#include "catch.hpp"

#include <accelkit/accelkit.hpp>

#include "opencl_runtime.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

using accelkit::CopyKind;
using accelkit::EventFlags;

namespace {

ocl::Config with(ocl::Svm svm) {
  ocl::Config c;
  c.svm = svm;
  return c;
}

// A command that waits for a user event: the stream stays busy until the
// test completes (or fails) the user event.
cl_event gate(ocl::OpenCLRuntime& rt, int device, accelkit::StreamHandle s) {
  cl_int err = CL_SUCCESS;
  cl_event user = clCreateUserEvent(rt.cl_context_of(device), &err);
  REQUIRE(err == CL_SUCCESS);
  rt.enqueue_on(device, s, "gate", [&](cl_command_queue q, cl_event* e) {
    return clEnqueueBarrierWithWaitList(q, 1, &user, e);
  });
  return user;
}

template <class F>
bool eventually(F&& f) {
  for (int i = 0; i < 2000; ++i) {
    if (f()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

}  // namespace

TEST_CASE("ocl: discovery finds an SVM device and its properties are sound", "[ocl]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  accelkit::DeviceProperties p = rt.properties(0);
  CHECK(p.architecture.empty());  // unknown in OpenCL
  accelkit::fill_unknown(p, "ocl", 0);  // the UUID, unless cl_khr_device_uuid gave one
  CHECK(accelkit::property_problems(p, "ocl").empty());
  CHECK(p.extra<std::string>("ocl.svm").has_value());
  CHECK(p.memory_alignment == 128);  // PoCL's largest SVM alignment, declared
  CHECK_FALSE(p.async_copy_engines.has_value());  // OpenCL cannot tell
  CHECK_THROWS_AS(rt.properties(rt.device_count()), accelkit::DriverError);
}

TEST_CASE("ocl: OCL_SVM chooses the SVM kind, and a bad value names itself", "[ocl]") {
  CHECK_THROWS_WITH(ocl::Config::from_environment(accelkit::Environment::fixed({{"OCL_SVM", "wide"}})),
                    Catch::Contains("OCL_SVM='wide'"));
  ocl::OpenCLRuntime coarse(with(ocl::Svm::coarse));
  REQUIRE(coarse.device_count() >= 1);
  CHECK(coarse.properties(0).host_access == accelkit::HostAccessLevel::mapped);
  CHECK(coarse.properties(0).extra<std::string>("ocl.svm") == std::string("coarse"));
}

TEST_CASE("ocl: coarse-grained memory is mapped for the host with host_map and host_unmap",
          "[ocl]") {
  ocl::OpenCLRuntime coarse(with(ocl::Svm::coarse));
  REQUIRE(coarse.device_count() >= 1);
  constexpr std::size_t n = 8192;
  auto* p = static_cast<unsigned char*>(coarse.malloc(0, n));
  REQUIRE(p != nullptr);
  std::vector<unsigned char> in(n), out(n);
  for (std::size_t i = 0; i < n; ++i) in[i] = static_cast<unsigned char>(i * 7);
  coarse.memcpy(0, p, in.data(), n, CopyKind::host_to_device);
  CHECK(coarse.host_map(0, p + 256, 1024) == p + 256);  // SVM maps in place
  CHECK(std::memcmp(p + 256, in.data() + 256, 1024) == 0);
  for (std::size_t i = 256; i < 256 + 1024; ++i) p[i] = static_cast<unsigned char>(~in[i]);
  coarse.host_unmap(0, p + 256, 1024);
  coarse.memcpy(0, out.data(), p, n, CopyKind::device_to_host);
  for (std::size_t i = 0; i < n; ++i) {
    bool inside = i >= 256 && i < 256 + 1024;
    REQUIRE(out[i] == (inside ? static_cast<unsigned char>(~in[i]) : in[i]));
  }
  coarse.free(0, p);
  ocl::Config unmapped = with(ocl::Svm::coarse);
  unmapped.host_map = false;  // OCL_HOST_MAP=0
  ocl::OpenCLRuntime none(unmapped);
  REQUIRE(none.device_count() >= 1);
  CHECK(none.properties(0).host_access == accelkit::HostAccessLevel::none);
  CHECK_THROWS_WITH(ocl::Config::from_environment(
                        accelkit::Environment::fixed({{"OCL_HOST_MAP", "yes"}})),
                    Catch::Contains("OCL_HOST_MAP='yes'"));
}

TEST_CASE("ocl: memory is aligned as declared, copies and fills land, in both SVM kinds", "[ocl]") {
  for (ocl::Svm svm : {ocl::Svm::fine, ocl::Svm::coarse}) {
    ocl::OpenCLRuntime rt(with(svm));
    REQUIRE(rt.device_count() >= 1);
    auto s = rt.stream_create(0, 0);
    std::vector<void*> blocks;
    for (std::size_t n : {1u, 100u, 4096u, 1000000u}) {
      void* p = rt.malloc(0, n);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % rt.properties(0).memory_alignment == 0);
      blocks.push_back(p);
    }
    const std::size_t n = 1000000;
    std::vector<unsigned char> src(n), back(n, 0);
    for (std::size_t i = 0; i < n; ++i) src[i] = static_cast<unsigned char>(i * 7 + 3);
    // pageable host -> device (blocking), device -> device, device -> host
    rt.memcpy_async(0, blocks[3], src.data(), n, CopyKind::host_to_device, s, false);
    void* other = rt.malloc(0, n);
    rt.memcpy_async(0, other, blocks[3], n, CopyKind::device_to_device, s, false);
    rt.memset_async(0, blocks[3], 0xab, 100, s);
    rt.memcpy_async(0, back.data(), other, n, CopyKind::device_to_host, s, false);
    CHECK(back == src);
    // pinned: asynchronous, complete after synchronize
    auto* pinned = static_cast<unsigned char*>(rt.host_malloc(0, n));
    REQUIRE(pinned != nullptr);
    rt.memcpy_async(0, pinned, blocks[3], n, CopyKind::device_to_host, s, true);
    rt.stream_synchronize(0, s);
    CHECK(pinned[0] == 0xab);
    CHECK(pinned[99] == 0xab);
    CHECK(std::memcmp(pinned + 100, src.data() + 100, n - 100) == 0);
    std::memset(back.data(), 0, n);
    rt.memcpy(0, back.data(), other, n, CopyKind::device_to_host);
    CHECK(back == src);
    rt.host_free(0, pinned);
    CHECK_THROWS_AS(rt.host_free(0, src.data()), accelkit::DriverError);
    for (void* p : blocks) rt.free(0, p);
    rt.free(0, other);
    CHECK_THROWS_WITH(rt.free(0, src.data()), Catch::Contains("was not allocated on device 0"));
    rt.stream_destroy(0, s);
  }
}

TEST_CASE("ocl: an idle queue is idle, and a busy one busy until its work completes", "[ocl]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  auto s = rt.stream_create(0, 0);
  CHECK(rt.stream_query(0, s));  // nothing queued
  void* p = rt.malloc(0, 4096);
  rt.memset_async(0, p, 1, 4096, s);
  rt.stream_synchronize(0, s);
  CHECK(rt.stream_query(0, s));  // queued work done: idle, and asking enqueued nothing
  CHECK(rt.stream_query(0, s));

  cl_event user = gate(rt, 0, s);
  auto e = rt.event_create(0, EventFlags::none);
  rt.event_record(0, e, s);
  CHECK_FALSE(rt.stream_query(0, s));
  CHECK_FALSE(rt.event_query(0, e));
  // free does not wait for the device: memory no queued work uses is
  // released while a queue is held (a synchronizing free would hang here).
  void* other = rt.malloc(0, 1 << 20);
  rt.free(0, other);
  CHECK_FALSE(rt.stream_query(0, s));
  clSetUserEventStatus(user, CL_COMPLETE);
  CHECK(eventually([&] { return rt.stream_query(0, s); }));
  CHECK(rt.event_query(0, e));
  // The record captured the queue at the call: later work does not delay it.
  cl_event user2 = gate(rt, 0, s);
  CHECK(rt.event_query(0, e));
  CHECK_FALSE(rt.stream_query(0, s));
  // A second stream waiting for a record of the first waits on the device.
  auto s2 = rt.stream_create(0, 0);
  rt.event_record(0, e, s);
  rt.stream_wait_event(0, s2, e);
  CHECK_FALSE(rt.stream_query(0, s2));
  clSetUserEventStatus(user2, CL_COMPLETE);
  rt.stream_synchronize(0, s2);
  CHECK(rt.event_query(0, e));
  clReleaseEvent(user);
  clReleaseEvent(user2);
  rt.event_destroy(0, e);
  rt.free(0, p);
  rt.stream_destroy(0, s);
  rt.stream_destroy(0, s2);
  CHECK(rt.event_query(0, rt.event_create(0, EventFlags::none)));  // never recorded
}

TEST_CASE("ocl: timing events measure the work between them", "[ocl]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  auto s = rt.stream_create(0, 0);
  auto a = rt.event_create(0, EventFlags::timing);
  auto b = rt.event_create(0, EventFlags::timing);
  rt.event_record(0, a, s);
  cl_event user = gate(rt, 0, s);
  rt.event_record(0, b, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  clSetUserEventStatus(user, CL_COMPLETE);
  rt.event_synchronize(0, b);
  float ms = rt.event_elapsed_time(0, a, b);
  CHECK(ms >= 15.0f);
  CHECK(ms < 5000.0f);
  auto plain = rt.event_create(0, EventFlags::none);
  CHECK_THROWS_WITH(rt.event_elapsed_time(0, a, plain), Catch::Contains("timing events"));
  clReleaseEvent(user);
  rt.stream_destroy(0, s);
}

TEST_CASE("ocl: a failed command is reported once, as an asynchronous error", "[ocl]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  auto s = rt.stream_create(0, 0);
  auto e = rt.event_create(0, EventFlags::none);
  cl_event user = gate(rt, 0, s);
  rt.event_record(0, e, s);  // the same failing command, seen through an event
  clSetUserEventStatus(user, -1);
  std::string what;
  CHECK(eventually([&] {
    try {
      return rt.stream_query(0, s) && false;
    } catch (const accelkit::DriverError& err) {
      what = err.what();
      return true;
    }
  }));
  CHECK(what.find("asynchronous error") != std::string::npos);
  CHECK(what.find("stream_query") != std::string::npos);
  // Once: the stream is usable, the event's view of the same failure is not
  // reported again.
  CHECK(rt.stream_query(0, s));
  CHECK(rt.event_query(0, e));
  void* p = rt.malloc(0, 64);
  rt.memset_async(0, p, 0, 64, s);
  rt.stream_synchronize(0, s);
  CHECK(rt.stream_query(0, s));
  // A failure met by a synchronize is thrown from it.
  cl_event user2 = gate(rt, 0, s);
  clSetUserEventStatus(user2, -5);
  CHECK_THROWS_WITH(rt.stream_synchronize(0, s), Catch::Contains("asynchronous error"));
  rt.device_synchronize(0);  // reported already
  rt.free(0, p);
  clReleaseEvent(user);
  clReleaseEvent(user2);
  rt.stream_destroy(0, s);
}

TEST_CASE("ocl: a stream waits for a host signal (a user event), and a failed one is its error",
          "[ocl]") {
  ocl::OpenCLRuntime rt;
  REQUIRE(rt.device_count() >= 1);
  STATIC_REQUIRE(accelkit::Backend<ocl::OpenCLRuntime>::has_stream_signals);
  auto s = rt.stream_create(0, 0);
  auto* p = static_cast<unsigned char*>(rt.malloc(0, 64));
  rt.memset_async(0, p, 1, 64, s);
  auto g = rt.signal_create(0);
  rt.stream_wait_signal(0, s, g);
  rt.memset_async(0, p, 2, 64, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(rt.stream_query(0, s));
  unsigned char byte = 0;
  rt.memcpy(0, &byte, p, 1, CopyKind::device_to_host);
  CHECK(byte == 1);  // the fill after the wait has not run
  // Not completed while a barrier waits: refused, and still usable.
  CHECK_THROWS_WITH(rt.signal_destroy(0, g), Catch::Contains("not completed"));
  rt.signal_complete(0, g, 0);
  CHECK_THROWS_WITH(rt.signal_complete(0, g, 0), Catch::Contains("completed already"));
  rt.stream_synchronize(0, s);
  rt.memcpy(0, &byte, p, 1, CopyKind::device_to_host);
  CHECK(byte == 2);
  rt.stream_wait_signal(0, s, g);  // completed: nothing queued
  CHECK(rt.stream_query(0, s));
  rt.signal_destroy(0, g);
  // A failed signal: the waiting stream's asynchronous error, once; the
  // stream is usable after.
  auto f = rt.signal_create(0);
  rt.stream_wait_signal(0, s, f);
  rt.signal_complete(0, f, 1);
  CHECK_THROWS_WITH(rt.stream_synchronize(0, s), Catch::Contains("asynchronous error"));
  rt.signal_destroy(0, f);
  rt.memset_async(0, p, 3, 64, s);
  rt.stream_synchronize(0, s);
  rt.memcpy(0, &byte, p, 1, CopyKind::device_to_host);
  CHECK(byte == 3);
  rt.free(0, p);
  rt.stream_destroy(0, s);
}
