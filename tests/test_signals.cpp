// Host signals (Note [Host signals] in device/backend.hpp): a stream waits,
// on the device, for a signal the host completes; simdev as strict as the
// contract (Note [simdev host signals]); the SDK's host wait for a runtime
// without the members.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using Sim = simdev::SimRuntime;
using SimBackend = Backend<Sim>;

using namespace accelkit_tests;
namespace {
// One byte of device memory, read back synchronously.
char read_byte(SimBackend& b, void* p) {
  char c = 0;
  b.memcpy(0, &c, p, 1, CopyKind::device_to_host);
  return c;
}
}  // namespace

TEST_CASE("signals: simdev has them, the SDK knows") {
  STATIC_REQUIRE(detail::has_stream_signals<Sim>);
  STATIC_REQUIRE(SimBackend::has_stream_signals);
}

TEST_CASE("signals: a stream waiting for a signal runs nothing queued after it until it is completed") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 4096);
  b.memset_async(0, p, 1, 4096, s);
  SignalHandle g = b.signal_create(0);
  b.stream_wait_signal(0, s, g);  // returns at once
  b.memset_async(0, p, 2, 4096, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(b.stream_query(0, s));
  CHECK(read_byte(b, p) == 1);  // the fill before the wait ran, the one after did not
  // A second stream may wait for the same signal; a third, waiting after
  // completion, does not wait.
  StreamHandle t = b.stream_create(0, 0);
  b.stream_wait_signal(0, t, g);
  CHECK_FALSE(b.stream_query(0, t));
  b.signal_complete(0, g, 0);
  b.stream_synchronize(0, s);
  b.stream_synchronize(0, t);
  CHECK(read_byte(b, p) == 2);
  StreamHandle u = b.stream_create(0, 0);
  b.stream_wait_signal(0, u, g);
  b.stream_synchronize(0, u);
  b.signal_destroy(0, g);
  b.raw_free(0, p, 4096);
  for (StreamHandle h : {s, t, u}) b.stream_destroy(0, h);
}

TEST_CASE("signals: completing from another thread releases the wait") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(1, 0);
  SignalHandle g = b.signal_create(1);
  b.stream_wait_signal(1, s, g);
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    b.signal_complete(1, g, 0);
  });
  auto t0 = std::chrono::steady_clock::now();
  b.stream_synchronize(1, s);  // waits for the other thread's completion
  completer.join();
  CHECK(std::chrono::steady_clock::now() - t0 >= std::chrono::milliseconds(25));
  b.signal_destroy(1, g);
  b.stream_destroy(1, s);
}

TEST_CASE("signals: a stream that waited for a signal completed with an error stays failed until "
          "the signal is destroyed") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle other = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 4096);
  SignalHandle g = b.signal_create(0);
  b.stream_wait_signal(0, s, g);
  b.memset_async(0, p, 3, 4096, s);  // runs after the failed wait: the stream goes on
  b.signal_complete(0, g, 1234, "all_reduce failed: rank 1 exited");
  // The runtime's report of the failed wait (once) gives way to the failure,
  // which stays, for every synchronize and query of the stream and of its
  // device, naming the reason; other streams are not affected
  // (Note [Failed waits]).
  for (int i = 0; i < 3; ++i) {
    CHECK_THROWS_WITH(b.stream_synchronize(0, s),
                      Catch::Contains("waited for work on the host that failed") &&
                          Catch::Contains("error 1234") &&
                          Catch::Contains("all_reduce failed: rank 1 exited") &&
                          Catch::Contains("stream_synchronize"));
    CHECK_THROWS_AS(b.stream_query(0, s), RuntimeError);
    CHECK_THROWS_WITH(b.device_synchronize(0), Catch::Contains("device_synchronize"));
  }
  b.stream_synchronize(0, other);
  CHECK(b.stream_query(0, other));
  CHECK(read_byte(b, p) == 3);
  b.signal_destroy(0, g);  // the failure ends with the signal
  b.stream_synchronize(0, s);
  CHECK(b.stream_query(0, s));
  b.device_synchronize(0);
  b.raw_free(0, p, 4096);
  b.stream_destroy(0, s);
  b.stream_destroy(0, other);
}

TEST_CASE("signals: another thread's synchronize does not consume a failed wait") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  SignalHandle g = b.signal_create(0);
  b.stream_wait_signal(0, s, g);
  b.signal_complete(0, g, 7);
  std::thread other([&] {
    try {
      b.device_synchronize(0);  // takes the runtime's asynchronous error
    } catch (const std::exception&) {
    }
  });
  other.join();
  // The thread that made the stream wait still finds the failure.
  CHECK_THROWS_AS(b.stream_synchronize(0, s), RuntimeError);
  CHECK_THROWS_AS(b.stream_synchronize(0, s), RuntimeError);
  b.signal_destroy(0, g);
  b.stream_synchronize(0, s);
  b.stream_destroy(0, s);
}

TEST_CASE("signals: a wait queued on a signal that failed already fails its stream; a destroyed "
          "stream is forgotten") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  SignalHandle g = b.signal_create(0);
  b.signal_complete(0, g, 3, "broadcast failed");
  b.stream_wait_signal(0, s, g);
  try {
    b.stream_synchronize(0, s);
  } catch (const DriverError&) {  // the runtime's own report of it, if any
  } catch (const RuntimeError&) {
  }
  CHECK_THROWS_WITH(b.stream_synchronize(0, s), Catch::Contains("broadcast failed"));
  b.stream_destroy(0, s);
  b.device_synchronize(0);  // no stream of the device waited for it now
  b.signal_destroy(0, g);
}

TEST_CASE("signals: destroying a signal a stream still waits for is refused, and it stays usable") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  SignalHandle g = b.signal_create(0);
  b.stream_wait_signal(0, s, g);
  CHECK(driver_code([&] { b.signal_destroy(0, g); }) == simdev::kNotPermitted);
  CHECK_FALSE(b.stream_query(0, s));
  b.signal_complete(0, g, 0);  // still live
  b.stream_synchronize(0, s);
  b.signal_destroy(0, g);
  // A signal nobody waits for may go without being completed.
  SignalHandle h = b.signal_create(0);
  b.signal_destroy(0, h);
  // Destroyed after completion while the wait is still queued behind a held
  // stream: the wait passes later.
  SignalHandle k = b.signal_create(0);
  auto gate = b.runtime().hold(0, s);
  b.stream_wait_signal(0, s, k);
  b.signal_complete(0, k, 0);
  b.signal_destroy(0, k);
  gate->open();
  b.stream_synchronize(0, s);
  b.stream_destroy(0, s);
}

TEST_CASE("signals: simdev refuses misuse with driver errors naming it") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s0 = b.stream_create(0, 0);
  SignalHandle g = b.signal_create(1);
  CHECK(driver_code([&] { b.stream_wait_signal(0, s0, g); }) == simdev::kInvalidValue);
  CHECK(driver_code([&] { b.signal_complete(0, g, 0); }) == simdev::kInvalidValue);
  b.signal_complete(1, g, 0);
  CHECK(driver_code([&] { b.signal_complete(1, g, 0); }) == simdev::kInvalidValue);
  b.signal_destroy(1, g);
  CHECK(driver_code([&] { b.signal_complete(1, g, 0); }) == simdev::kInvalidHandle);
  CHECK(driver_code([&] { b.stream_wait_signal(1, b.stream_create(1, 0), g); }) ==
        simdev::kInvalidHandle);
  CHECK(driver_code([&] { b.signal_destroy(1, g); }) == simdev::kInvalidHandle);
  // An injected asynchronous fault of the wait: the error arrives later,
  // once, and the wait still waits for its signal.
  SignalHandle h = b.signal_create(0);
  b.runtime().inject_fault("stream_wait_signal", 1, /*async=*/true);
  b.stream_wait_signal(0, s0, h);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(driver_code([&] { b.stream_query(0, s0); }) == simdev::kLaunchFailure);
  CHECK_FALSE(b.stream_query(0, s0));
  b.signal_complete(0, h, 0);
  b.stream_synchronize(0, s0);
  b.signal_destroy(0, h);
  b.stream_destroy(0, s0);
}

namespace {
// A runtime with the required members only, over one device: the SDK's
// default applies (its own signals, waited for on the host).
struct Plain : Runtime<Plain> {
  static constexpr std::string_view name = "plain";
  int device_count() { return 1; }
  DeviceProperties properties(device_index) { return {}; }
  device_index get_device() { return 0; }
  void set_device(device_index) {}
  void* malloc(device_index, std::size_t) { return nullptr; }
  void free(device_index, void*) {}
  void* host_malloc(device_index, std::size_t) { return nullptr; }
  void host_free(device_index, void*) {}
  void memcpy(device_index, void*, const void*, std::size_t, CopyKind) {}
  void memcpy_async(device_index, void*, const void*, std::size_t, CopyKind, StreamHandle, bool) {}
  void memset_async(device_index, void*, int, std::size_t, StreamHandle) {}
  StreamHandle stream_create(device_index, int) { return StreamHandle{1}; }
  void stream_destroy(device_index, StreamHandle) {}
  bool stream_query(device_index, StreamHandle) { return true; }
  void stream_synchronize(device_index, StreamHandle) {}
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}
  EventHandle event_create(device_index, EventFlags) { return {}; }
  void event_destroy(device_index, EventHandle) {}
  void event_record(device_index, EventHandle, StreamHandle) {}
  bool event_query(device_index, EventHandle) { return true; }
  void event_synchronize(device_index, EventHandle) {}
  void device_synchronize(device_index) {}
};
}  // namespace

TEST_CASE("signals: without the members, a stream's wait is the calling thread's") {
  STATIC_REQUIRE_FALSE(Backend<Plain>::has_stream_signals);
  Backend<Plain> b(Environment::fixed({}));
  SignalHandle g = b.signal_create(0);
  std::atomic<bool> completed{false};
  std::thread completer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    completed = true;
    b.signal_complete(0, g, 0);
  });
  b.stream_wait_signal(0, StreamHandle{1}, g);  // returns once completed
  CHECK(completed);
  completer.join();
  b.stream_wait_signal(0, StreamHandle{1}, g);  // completed: no wait
  CHECK_THROWS_AS(b.signal_complete(0, g, 0), ValueError);
  b.signal_destroy(0, g);
  CHECK_THROWS_AS(b.signal_destroy(0, g), ValueError);
  // A failed signal: RuntimeError at the wait, naming the backend and error.
  SignalHandle h = b.signal_create(0);
  b.signal_complete(0, h, 7);
  try {
    b.stream_wait_signal(0, StreamHandle{1}, h);
    FAIL("no error");
  } catch (const RuntimeError& e) {
    CHECK(contains(e.what(), "plain"));
    CHECK(contains(e.what(), "error 7"));
  }
  b.signal_destroy(0, h);
  CHECK_THROWS_AS(b.signal_create(3), IndexError);
}
