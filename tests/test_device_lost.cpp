// Lost devices (Note [Lost devices] in error.hpp): a failure that ends a
// device surfaces once as DeviceLostError naming the device; every later
// call that would run work on it is refused at once, naming the first
// failure, without calling the runtime; releases still reach the runtime
// and never throw through the pools; other devices work on. simdev loses a
// device on demand (SIMDEV_STICKY_FAULTS, Note [simdev sticky faults]).
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>
#include <accelkit/testing/wrap.hpp>

#include "simdev_runtime.hpp"

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using namespace accelkit_tests;
using Sim = simdev::SimRuntime;

namespace {

// simdev, counting the calls the SDK makes of it.
struct Counted : testing::Wrap<Counted, Sim> {
  using Wrap::Wrap;
  void note(testing::Member) { calls.fetch_add(1); }
  std::atomic<long> calls{0};
};

// simdev whose releases fail once its device is lost, as CUDA's do after a
// sticky error.
struct ReleasesFailWhenLost : testing::Wrap<ReleasesFailWhenLost, Sim> {
  using Wrap::Wrap;
  void free(device_index device, void* ptr) {
    if (lost.load()) device_lost(700, "free", "gone");
    inner().free(device, ptr);
  }
  void host_free(device_index device, void* ptr) {
    if (lost.load()) device_lost(700, "host_free", "gone");
    inner().host_free(device, ptr);
  }
  std::atomic<bool> lost{false};
};

simdev::Config sticky(int devices = 2) {
  simdev::Config c = sim(devices, 64);
  c.sticky_faults = true;
  return c;
}

std::size_t count(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// The DeviceLostError `f` throws (fails the test when it throws nothing or
// something else).
template <class F>
DeviceLostError lost_error(F&& f) {
  try {
    f();
  } catch (const DeviceLostError& e) {
    return e;
  } catch (const std::exception& e) {
    FAIL("expected DeviceLostError, got: " << e.what());
  }
  FAIL("expected DeviceLostError, nothing was thrown");
  throw;  // not reached
}

std::vector<std::string>& reports() {
  static std::vector<std::string> r;
  return r;
}
std::mutex reports_mutex;
void collect(Severity, std::string_view backend, std::string_view message) {
  std::lock_guard<std::mutex> lock(reports_mutex);
  reports().push_back(std::string(backend) + ": " + std::string(message));
}
struct CollectReports {
  DiagnosticHandler previous;
  CollectReports() : previous(set_diagnostic_handler(&collect)) { reports().clear(); }
  ~CollectReports() { set_diagnostic_handler(previous); }
};

}  // namespace

TEST_CASE("lost device: the loss surfaces once, naming the device, later work is refused at "
          "once naming it, without the runtime, releases still run, the other device works") {
  Backend<Counted> b(Environment::fixed({}), sticky());
  StreamHandle s = b.stream_create(0, 0);
  EventHandle ev = b.event_create(0, EventFlags::none);
  void* p = b.raw_malloc(0, 4096);
  b.runtime().inner().inject_fault("memset_async", 1, true);
  b.memset_async(0, p, 1, 4096, s);  // queued; fails on the device

  DeviceLostError first = lost_error([&] { b.stream_synchronize(0, s); });
  INFO(first.what());
  CHECK(std::string(first.what()).rfind("simdev: device 0 lost: driver error 719 in ", 0) == 0);
  CHECK(first.refused().empty());
  CHECK(first.device() == 0);
  CHECK(first.code() == simdev::kLaunchFailure);
  CHECK(first.kind() == ErrorKind::driver);
  CHECK(b.is_lost(0));
  CHECK_FALSE(b.is_lost(1));
  REQUIRE(b.lost_error(0));
  CHECK(b.lost_error(0)->call() == first.call());

  std::vector<unsigned char> host(4096, 7);
  long before = b.runtime().calls.load();
  std::vector<std::pair<std::string, std::function<void()>>> work = {
      {"stream_synchronize", [&] { b.stream_synchronize(0, s); }},
      {"stream_query", [&] { (void)b.stream_query(0, s); }},
      {"memset_async", [&] { b.memset_async(0, p, 2, 4096, s); }},
      {"memcpy_async",
       [&] { b.memcpy_async(0, p, host.data(), 4096, CopyKind::host_to_device, s, false); }},
      {"memcpy", [&] { b.memcpy(0, host.data(), p, 4096, CopyKind::device_to_host); }},
      {"malloc", [&] { (void)b.raw_malloc(0, 4096); }},
      {"host_malloc", [&] { (void)b.raw_host_malloc(0, 4096); }},
      {"stream_create", [&] { (void)b.stream_create(0, 0); }},
      {"event_create", [&] { (void)b.event_create(0, EventFlags::none); }},
      {"event_record", [&] { b.event_record(0, ev, s); }},
      {"event_synchronize", [&] { b.event_synchronize(0, ev); }},
      {"event_query", [&] { (void)b.event_query(0, ev); }},
      {"stream_wait_event", [&] { b.stream_wait_event(0, s, ev); }},
      {"device_synchronize", [&] { b.device_synchronize(0); }},
      {"signal_create", [&] { (void)b.signal_create(0); }},
  };
  for (auto& [call, f] : work) {
    DeviceLostError e = lost_error(f);
    INFO(call << ": " << e.what());
    CHECK(e.refused() == call);
    CHECK(e.device() == 0);
    CHECK(e.code() == first.code());
    CHECK(e.call() == first.call());
    std::string what = e.what();
    CHECK(what.rfind("simdev: device 0 is lost (driver error 719 in " + first.call(), 0) == 0);
    CHECK(count(what, "simdev") == 1);
    CHECK(what.find(call + " refused") != std::string::npos);
  }
  CHECK(b.runtime().calls.load() == before);  // refused without the runtime

  // The other device works, and a peer copy into the lost one is refused.
  StreamHandle s1 = b.stream_create(1, 0);
  void* q = b.raw_malloc(1, 4096);
  std::vector<unsigned char> in(4096, 5), out(4096, 0);
  b.memcpy_async(1, q, in.data(), 4096, CopyKind::host_to_device, s1, false);
  b.memcpy_async(1, out.data(), q, 4096, CopyKind::device_to_host, s1, false);
  b.stream_synchronize(1, s1);
  CHECK(in == out);
  CHECK(lost_error([&] { b.memcpy_peer_async(p, 0, q, 1, 4096, s1); }).refused() ==
        "memcpy_peer_async");

  // Releases reach the runtime and succeed.
  b.raw_free(0, p, 4096);
  b.event_destroy(0, ev);
  b.stream_destroy(0, s);
  CHECK(b.runtime().calls.load() > before);
  CHECK(b.raw_bytes_held(0) == 0);
  b.raw_free(1, q, 4096);
  b.stream_destroy(1, s1);
}

TEST_CASE("lost device: of many threads that meet the loss at once, one gets it and the others "
          "the refusal naming it") {
  for (int round = 0; round < 20; ++round) {
    Backend<Sim> b(Environment::fixed({}), sticky(1));
    StreamHandle s = b.stream_create(0, 0);
    void* p = b.raw_malloc(0, 1 << 16);
    b.runtime().inject_fault("memset_async", 1, true);
    b.memset_async(0, p, 1, 1 << 16, s);
    std::atomic<int> losses{0}, refusals{0}, others{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t)
      threads.emplace_back([&, t] {
        try {
          if (t % 2) b.stream_synchronize(0, s);
          else b.device_synchronize(0);
          others.fetch_add(1);  // returned before the failure ran: then the next call
          b.device_synchronize(0);
        } catch (const DeviceLostError& e) {
          (e.refused().empty() ? losses : refusals).fetch_add(1);
        } catch (...) {
          others.fetch_add(100);
        }
      });
    for (auto& t : threads) t.join();
    CHECK(losses.load() == 1);
    CHECK(losses.load() + refusals.load() == 6);
    CHECK(others.load() < 100);
    b.raw_free(0, p, 1 << 16);
    b.stream_destroy(0, s);
  }
}

TEST_CASE("lost device: the pools refuse new memory, frees and empty_cache do not throw, and "
          "memory goes back to the driver") {
  Backend<Sim> b(Environment::fixed({}), sticky());
  StreamHandle s = b.stream_create(0, 0);
  DeviceCachingAllocator<Sim> alloc(b, 0, AllocatorConfig{});
  HostAllocator<Sim> pinned(b);
  void* p = alloc.allocate(1 << 20, s);
  void* kept = alloc.allocate(1 << 20, s);
  void* h = pinned.allocate(0, 4096);
  b.runtime().inject_fault("memset_async", 1, true);
  b.memset_async(0, p, 1, 1 << 20, s);
  CHECK_THROWS_AS(b.stream_synchronize(0, s), DeviceLostError);
  alloc.deallocate(p);
  // Cached memory is not handed out on a lost device either.
  CHECK(lost_error([&] { (void)alloc.allocate(1 << 20, s); }).refused() == "malloc");
  alloc.deallocate(kept);
  pinned.deallocate(h);
  CHECK_NOTHROW(alloc.empty_cache());
  CHECK_NOTHROW(pinned.empty_cache());
  CHECK(b.raw_bytes_held(0) == 0);
  CHECK(b.runtime().bytes_in_use(0) == 0);
  b.stream_destroy(0, s);
}

TEST_CASE("lost device: a release the runtime refuses leaves the pools and is reported, once") {
  CollectReports collected;
  Backend<ReleasesFailWhenLost> b(Environment::fixed({}), sticky());
  StreamHandle s = b.stream_create(0, 0);
  DeviceCachingAllocator<ReleasesFailWhenLost> alloc(b, 0, AllocatorConfig{});
  void* p = alloc.allocate(1 << 20, s);
  b.runtime().inner().inject_fault("memset_async", 1, true);
  b.memset_async(0, p, 1, 1 << 20, s);
  CHECK_THROWS_AS(b.stream_synchronize(0, s), DeviceLostError);
  b.runtime().lost = true;
  alloc.deallocate(p);
  CHECK_NOTHROW(alloc.empty_cache());
  CHECK_NOTHROW(alloc.empty_cache());  // nothing left to try again
  std::size_t n = 0;
  for (const std::string& r : reports())
    if (r.find("device 0 is lost") != std::string::npos && r.find("left to it") != std::string::npos)
      ++n;
  CHECK(n == 1);
  CHECK(alloc.stats().reserved_bytes[0].current == 0);
  b.runtime().lost = false;
}

TEST_CASE("simdev: SIMDEV_STICKY_FAULTS takes 0 or 1, and a fault at the call stays a plain "
          "error") {
  auto env = [](std::string v) {
    return Environment::fixed({{"SIMDEV_STICKY_FAULTS", std::move(v)}});
  };
  CHECK(simdev::Config::from_environment(env("1")).sticky_faults);
  CHECK_FALSE(simdev::Config::from_environment(env("0")).sticky_faults);
  CHECK_THROWS_WITH(simdev::Config::from_environment(env("yes")),
                    Catch::Matchers::Contains("SIMDEV_STICKY_FAULTS='yes': expected 0 or 1"));
  Backend<Sim> b(Environment::fixed({}), sticky(1));
  StreamHandle s = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 4096);
  b.runtime().inject_fault("memset_async", 1, false);
  try {
    b.memset_async(0, p, 1, 4096, s);
    FAIL("the injected fault did not fire");
  } catch (const DeviceLostError&) {
    FAIL("a fault at the call lost the device");
  } catch (const DriverError& e) {
    CHECK(e.code() == simdev::kInjectedFault);
  }
  CHECK_FALSE(b.is_lost(0));
  b.memset_async(0, p, 1, 4096, s);
  b.stream_synchronize(0, s);
  b.raw_free(0, p, 4096);
  b.stream_destroy(0, s);
}
