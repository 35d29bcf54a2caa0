// Device discovery, initialization, current device and fork behaviour of
// Backend<R>, against the simdev runtime.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

using namespace accelkit;
using SimBackend = Backend<simdev::SimRuntime>;

using namespace accelkit_tests;
namespace {
simdev::Config devices(int n) {
  simdev::Config c;
  c.device_count = n;
  c.memory_bytes = {64ull << 20};
  return c;
}

Environment env(std::map<std::string, std::string> vars = {}) {
  return Environment::fixed(std::move(vars));
}

}  // namespace

TEST_CASE("discovery: device_count counts devices without creating a context") {
  SimBackend b(env(), devices(3));
  CHECK(b.device_count() == 3);
  CHECK(b.init_error().empty());
  CHECK(b.runtime().contexts_created() == 0);
  CHECK_FALSE(b.is_initialized());
  CHECK_FALSE(b.runtime().initialized());
}

TEST_CASE("discovery: initialization is lazy, runs once, and then creates contexts") {
  SimBackend b(env(), devices(2));
  CHECK(b.device_count() == 2);
  b.set_device(1);
  CHECK(b.is_initialized());
  CHECK(b.runtime().initialized());
  CHECK(b.runtime().contexts_created() == 1);
  CHECK(b.runtime().get_device() == 1);
}

TEST_CASE("discovery: many threads initializing at once initialize once") {
  SimBackend b(env(), devices(2));
  b.runtime().inject_fault("initialize", 2);  // a second initialize() would throw
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      try {
        b.lazy_init();
        if (b.device_count() != 2) ++failures;
      } catch (...) {
        ++failures;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(failures == 0);
  CHECK(b.is_initialized());
}

TEST_CASE("discovery: the visibility variable filters and reorders devices") {
  SimBackend b(env({{"SIMDEV_VISIBLE_DEVICES", "2,0"}}), devices(3));
  REQUIRE(b.device_count() == 2);
  CHECK(b.visible_devices() == std::vector<int>{2, 0});
  simdev::SimRuntime reference(devices(3));
  CHECK(b.properties(0).uuid == reference.properties(2).uuid);
  CHECK(b.properties(1).uuid == reference.properties(0).uuid);
  b.set_device(0);
  CHECK(b.runtime().get_device() == 2);  // logical 0 is physical 2
}

TEST_CASE("discovery: the visibility variable accepts UUIDs") {
  simdev::SimRuntime reference(devices(2));
  std::string uuid1 = reference.properties(1).uuid;
  SimBackend b(env({{"SIMDEV_VISIBLE_DEVICES", uuid1}}), devices(2));
  REQUIRE(b.device_count() == 1);
  CHECK(b.properties(0).uuid == uuid1);
  CHECK(b.runtime().contexts_created() == 0);  // matching UUIDs created no context
}

TEST_CASE("discovery: a malformed visibility variable gives 0 devices and a clear error") {
  SimBackend b(env({{"SIMDEV_VISIBLE_DEVICES", "0,banana"}}), devices(2));
  CHECK(b.device_count() == 0);  // never throws
  CHECK(contains(b.init_error(), "SIMDEV_VISIBLE_DEVICES='0,banana'"));
  CHECK(contains(b.init_error(), "entry 'banana'"));
  CHECK_THROWS_AS(b.lazy_init(), ValueError);
  try {
    b.set_device(0);
    FAIL("set_device succeeded without devices");
  } catch (const ValueError& e) {
    CHECK(e.backend() == "simdev");
    CHECK(contains(e.what(), "entry 'banana'"));
  }
  CHECK(b.device_count() == 0);  // the state stays consistent
}

TEST_CASE("discovery: a hidden-everything variable gives 0 devices and a RuntimeError on use") {
  SimBackend b(env({{"SIMDEV_VISIBLE_DEVICES", ""}}), devices(2));
  CHECK(b.device_count() == 0);
  CHECK(b.init_error().empty());
  try {
    b.lazy_init();
    FAIL("lazy_init succeeded without devices");
  } catch (const RuntimeError& e) {
    CHECK(contains(e.what(), "no simdev device is visible (all are hidden)"));
    CHECK(contains(e.what(), "SIMDEV_VISIBLE_DEVICES=''"));
  }
}

TEST_CASE("discovery: a driver failure in device_count gives 0 devices with the reason") {
  simdev::Config c = devices(2);
  c.faults["device_count"] = {1, false};
  SimBackend b(env(), c);
  CHECK(b.device_count() == 0);
  CHECK(contains(b.init_error(), "simdev: driver error 999 in device_count: injected fault"));
  try {
    b.lazy_init();
    FAIL("lazy_init succeeded after a failed discovery");
  } catch (const DriverError& e) {
    CHECK(e.code() == simdev::kInjectedFault);
    CHECK(e.call() == "device_count");
  }
}

TEST_CASE("discovery: a malformed runtime variable surfaces as a ValueError naming it") {
  // SimRuntime() reads the process environment at its first device_count.
  ::setenv("SIMDEV_DEVICE_COUNT", "two", 1);
  SimBackend b(env());
  int count = b.device_count();
  ::unsetenv("SIMDEV_DEVICE_COUNT");
  CHECK(count == 0);
  CHECK(contains(b.init_error(), "SIMDEV_DEVICE_COUNT='two': expected a non-negative integer"));
  CHECK_THROWS_AS(b.lazy_init(), ValueError);

  auto error_of = [](std::map<std::string, std::string> vars) -> std::string {
    try {
      simdev::Config::from_environment(Environment::fixed(std::move(vars)));
    } catch (const ValueError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(contains(error_of({{"SIMDEV_DEVICE_COUNT", "65"}}), "must be in 0..64"));
  CHECK(contains(error_of({{"SIMDEV_DEVICE_COUNT", "-1"}}), "SIMDEV_DEVICE_COUNT='-1'"));
  CHECK(contains(error_of({{"SIMDEV_MEMORY_MB", "0"}}), "SIMDEV_MEMORY_MB='0'"));
  CHECK(contains(error_of({{"SIMDEV_MEMORY_MB", "2,3,4"}}), "gives 3 capacities for 2 devices"));
  CHECK(contains(error_of({{"SIMDEV_HOST_VISIBLE", "yes"}}), "expected 0, 1 or mapped"));
  CHECK(contains(error_of({{"SIMDEV_INJECT_FAULT", "@3"}}), "entry '@3' is not member[@n]"));
  CHECK(contains(error_of({{"SIMDEV_INJECT_FAULT", "malloc,"}}), "entry '' is not member[@n]"));
  CHECK(contains(error_of({{"SIMDEV_MEMORY_MB", "16,,32"}}),
                 "SIMDEV_MEMORY_MB='16,,32': entry '' is not a capacity in MiB"));
  CHECK(contains(error_of({{"SIMDEV_MEMORY_MB", " "}}), "gives 0 capacities for 2 devices"));
  CHECK(error_of({{"SIMDEV_MEMORY_MB", "16, 32"}, {"SIMDEV_INJECT_FAULT", " malloc@2 , free"}})
            .empty());
}

TEST_CASE("discovery: a failing initialize() throws and the next use retries") {
  SimBackend b(env(), devices(1));
  b.runtime().inject_fault("initialize");
  CHECK_THROWS_AS(b.lazy_init(), DriverError);
  CHECK_FALSE(b.is_initialized());
  CHECK_NOTHROW(b.set_device(0));
  CHECK(b.is_initialized());
}

TEST_CASE("discovery: an out-of-range device index is an IndexError naming index and count") {
  SimBackend b(env(), devices(2));
  for (int bad : {2, -1, 1000}) {
    try {
      b.set_device(bad);
      FAIL("set_device accepted " << bad);
    } catch (const IndexError& e) {
      CHECK(e.backend() == "simdev");
      CHECK(contains(e.what(), "invalid device index " + std::to_string(bad) +
                                   ": simdev has 2 visible devices (valid: 0..1)"));
    }
  }
  CHECK_THROWS_AS(b.properties(2), IndexError);
  CHECK_THROWS_AS(b.raw_malloc(5, 16), IndexError);
  CHECK(b.current_device() == 0);  // nothing changed

  SimBackend one(env({{"SIMDEV_VISIBLE_DEVICES", "1"}}), devices(2));
  try {
    one.set_device(1);
    FAIL("set_device accepted a hidden device");
  } catch (const IndexError& e) {
    CHECK(contains(e.what(), "simdev has 1 visible device (valid: 0); "
                             "SIMDEV_VISIBLE_DEVICES='1'"));
  }
}

TEST_CASE("current device: per thread, and the runtime is told only on change") {
  SimBackend b(env(), devices(2));
  CHECK(b.current_device() == 0);
  b.set_device(1);
  CHECK(b.current_device() == 1);
  int seen_in_thread = -1;
  std::thread([&] {
    seen_in_thread = b.current_device();
    b.set_device(0);
  }).join();
  CHECK(seen_in_thread == 0);   // a new thread starts on device 0
  CHECK(b.current_device() == 1);  // the other thread's change did not leak here
  CHECK(b.exchange_device(0) == 1);
  CHECK(b.current_device() == 0);

  b.runtime().inject_fault("set_device");  // a driver call would now fail...
  CHECK_NOTHROW(b.set_device(0));          // ...but setting the same device makes none
  CHECK_THROWS_AS(b.set_device(1), DriverError);
  CHECK(b.current_device() == 0);          // a failed set leaves the device as it was
}

TEST_CASE("current device: backends of the same runtime keep separate current devices") {
  SimBackend a(env(), devices(2));
  SimBackend c(env(), devices(2));
  a.set_device(1);
  CHECK(c.current_device() == 0);
}

TEST_CASE("device guard: restores the previous device, also after an exception") {
  SimBackend b(env(), devices(2));
  b.set_device(0);
  try {
    DeviceGuard<simdev::SimRuntime> guard(b, 1);
    CHECK(b.current_device() == 1);
    CHECK(guard.previous() == 0);
    throw std::runtime_error("user code failed");
  } catch (const std::runtime_error&) {
  }
  CHECK(b.current_device() == 0);
  CHECK_THROWS_AS(DeviceGuard<simdev::SimRuntime>(b, 7), IndexError);
  CHECK(b.current_device() == 0);
}

TEST_CASE("capabilities: the typed query API answers from the validated schema") {
  simdev::Config c = devices(2);
  c.memory_bytes = {32ull << 20, 64ull << 20};
  SimBackend b(env(), c);
  CHECK(b.properties(0).total_memory == 32ull << 20);
  CHECK(b.properties(1).total_memory == 64ull << 20);
  CHECK(b.properties(0).event_timing);
  CHECK(b.supports(0, DType::float8_e4m3fn));
  CHECK(b.extra<bool>(0, "simdev.host_memory_backed") == true);
  CHECK_FALSE(b.extra<bool>(0, "simdev.absent").has_value());
  try {
    b.extra<std::string>(1, "simdev.host_memory_backed");
    FAIL("a bool extra was read as a string");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()) ==
          "simdev: device 1: device extra 'simdev.host_memory_backed' is of type bool, not "
          "string");
  }
  CHECK(b.can_access_peer(0, 1));
  CHECK(b.peer_access_matrix() == std::vector<std::vector<bool>>{{true, true}, {true, true}});

  simdev::Config hidden = devices(2);
  hidden.host_access = accelkit::HostAccessLevel::none;
  SimBackend nv(env(), hidden);
  CHECK_FALSE(nv.properties(0).host_visible_memory);
  CHECK(nv.peer_access_matrix() == std::vector<std::vector<bool>>{{true, false}, {false, true}});
}

TEST_CASE("capabilities: unknown fields are reported unknown and the derived UUID selects devices") {
  simdev::Config c = devices(2);
  c.unknown_properties = true;
  SimBackend b(env(), c);
  const DeviceProperties& p0 = b.properties(0);
  CHECK(p0.uuid_derived);
  CHECK(p0.architecture.empty());
  CHECK_FALSE(p0.async_copy_engines.has_value());
  SimBackend again(env(), c);  // another backend (as another process) derives the same
  CHECK(again.properties(0).uuid == p0.uuid);
  CHECK(again.properties(1).uuid != p0.uuid);
  std::string j = report_json(b);
  CHECK(contains(j, "\"architecture\": null"));
  CHECK(contains(j, "\"async_copy_engines\": null"));
  CHECK(contains(j, "\"uuid_derived\": true"));
  std::string t = report_text(b);
  CHECK(contains(t, "architecture unknown"));
  CHECK(contains(t, "unknown copy engines"));
  CHECK(contains(t, "(derived by accelkit)"));
  // The visibility variable matches the derived UUID.
  std::string uuid1 = again.properties(1).uuid;
  SimBackend by_uuid(Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", uuid1.substr(0, 8)}}), c);
  REQUIRE(by_uuid.device_count() == 1);
  CHECK(by_uuid.visible_devices() == std::vector<int>{1});
}

TEST_CASE("capabilities: free memory is live") {
  SimBackend b(env(), devices(1));
  MemoryInfo before = b.memory_info(0);
  CHECK(before.total == 64ull << 20);
  CHECK(before.free == before.total);
  void* p = b.raw_malloc(0, 10ull << 20);
  CHECK(b.memory_info(0).free == before.free - (10ull << 20));
  b.raw_free(0, p, 10ull << 20);
  CHECK(b.memory_info(0).free == before.free);
}

TEST_CASE("capabilities: a driver failure in properties() is not cached") {
  simdev::Config c = devices(1);
  c.faults["properties"] = {1, false};  // first properties() call fails in the driver
  SimBackend b(env(), c);
  CHECK_THROWS_AS(b.properties(0), DriverError);
  CHECK(b.properties(0).name == "SimDev S1");
}

TEST_CASE("raw memory: out of memory is an OutOfMemoryError and the next allocation works") {
  SimBackend b(env(), devices(1));  // 64 MiB
  void* a = b.raw_malloc(0, 48ull << 20);
  try {
    b.raw_malloc(0, 32ull << 20);
    FAIL("allocation beyond capacity succeeded");
  } catch (const OutOfMemoryError& e) {
    CHECK(e.kind() == ErrorKind::out_of_memory);
    CHECK(contains(e.what(), "out of memory allocating 33554432 bytes on simdev:0 (capacity "
                             "67108864 bytes, 50331648 bytes held"));
  }
  void* c = b.raw_malloc(0, 8ull << 20);  // still usable
  CHECK(c != nullptr);
  b.raw_free(0, c, 8ull << 20);
  b.raw_free(0, a, 48ull << 20);
  CHECK(b.raw_bytes_held(0) == 0);
  CHECK(b.runtime().bytes_in_use(0) == 0);

  try {
    b.raw_malloc(0, std::size_t{1} << 62);
    FAIL("a huge allocation succeeded");
  } catch (const OutOfMemoryError& e) {
    CHECK(contains(e.what(), "cannot allocate 4611686018427387904 bytes on simdev:0: the "
                             "largest single allocation on this device is 67108864 bytes"));
  }
  CHECK(b.raw_malloc(0, 0) == nullptr);
}

TEST_CASE("raw memory: a driver's nullptr with memory free is a refusal, not out of memory") {
  SimBackend b(env(), devices(1));  // 64 MiB, all free
  b.runtime().inject_refusal();
  try {
    b.raw_malloc(0, 1ull << 20);
    FAIL("a refused allocation succeeded");
  } catch (const OutOfMemoryError&) {
    FAIL("a refusal was reported as exhaustion");
  } catch (const RuntimeError& e) {
    CHECK(e.kind() == ErrorKind::runtime);
    CHECK(e.backend() == "simdev");
    CHECK(contains(e.what(), "the driver refused to allocate 1048576 bytes aligned to 256 B on "
                             "simdev:0 although 67108864 bytes are free"));
  }
  CHECK(b.raw_bytes_held(0) == 0);
  void* p = b.raw_malloc(0, 1ull << 20);  // the next one works
  CHECK(p != nullptr);
  b.raw_free(0, p, 1ull << 20);
}

TEST_CASE("raw memory: memory is aligned as the device declares, and no more is assumed") {
  for (std::size_t alignment : {std::size_t{128}, std::size_t{256}, std::size_t{4096}}) {
    simdev::Config c = devices(1);
    c.alignment = alignment;
    SimBackend b(env(), c);
    CHECK(b.properties(0).memory_alignment == alignment);
    void* p = b.raw_malloc(0, 1000);
    auto v = reinterpret_cast<std::uintptr_t>(p);
    CHECK(v % alignment == 0);
    if (alignment < 4096) CHECK(v % (2 * alignment) != 0);  // simdev gives exactly that
    std::memset(p, 1, 1000);
    b.raw_free(0, p, 1000);
  }
}

TEST_CASE("raw operations: a driver failure mid-copy is a DriverError and state stays usable") {
  SimBackend b(env(), devices(2));
  StreamHandle s = b.stream_create(0, 0);
  std::vector<char> host(1024, 'x'), back(1024, 0);
  void* d = b.raw_malloc(0, 1024);
  b.runtime().inject_fault("memcpy_async");
  CHECK_THROWS_AS(b.memcpy_async(0, d, host.data(), 1024, CopyKind::host_to_device, s, false),
                  DriverError);
  b.memcpy_async(0, d, host.data(), 1024, CopyKind::host_to_device, s, false);
  b.stream_synchronize(0, s);
  b.memcpy(0, back.data(), d, 1024, CopyKind::device_to_host);
  CHECK(back == host);

  // Peer copy between devices, and its host-staged default path.
  void* d1 = b.raw_malloc(1, 1024);
  StreamHandle s1 = b.stream_create(1, 0);
  b.memset_async(1, d1, 0, 1024, s1);
  b.stream_synchronize(1, s1);
  b.memcpy_peer_async(d1, 1, d, 0, 1024, s);
  b.stream_synchronize(0, s);  // the synchronous memcpy is not ordered with streams
  std::vector<char> peer(1024, 0);
  b.memcpy(1, peer.data(), d1, 1024, CopyKind::device_to_host);
  CHECK(peer == host);

  // Use after destroy is a driver error, not a crash.
  b.stream_destroy(0, s);
  CHECK_THROWS_AS(b.stream_query(0, s), DriverError);
  b.raw_free(0, d, 1024);
  b.raw_free(1, d1, 1024);
}

TEST_CASE("raw operations: events time work and elapsed time needs recorded timing events") {
  SimBackend b(env(), devices(1));
  StreamHandle s = b.stream_create(0, -1);
  EventHandle start = b.event_create(0, EventFlags::timing);
  EventHandle end = b.event_create(0, EventFlags::timing);
  CHECK(b.event_query(0, start));  // never recorded counts as complete
  b.event_record(0, start, s);
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  b.event_record(0, end, s);
  b.event_synchronize(0, end);
  CHECK(b.event_elapsed_time(0, start, end) >= 1.0f);
  EventHandle plain = b.event_create(0, EventFlags::none);
  CHECK_THROWS_AS(b.event_elapsed_time(0, plain, end), DriverError);
  b.event_destroy(0, start);
  CHECK_THROWS_AS(b.event_record(0, start, s), DriverError);
  CHECK_THROWS_AS(b.stream_create(0, 5), DriverError);  // outside simdev's priority range
}

namespace {
// simdev without its optional members (event timing, peer access, peer
// copies, initialize), and with a hook to alter the properties it reports;
// ForkSafe: its fork_safe_discovery.
template <bool ForkSafe>
struct NoTimingT : Runtime<NoTimingT<ForkSafe>> {
  static constexpr std::string_view name = "notiming";
  static constexpr bool fork_safe_discovery = ForkSafe;
  NoTimingT() = default;
  explicit NoTimingT(simdev::Config c) : sim(std::move(c)) {}
  simdev::SimRuntime sim{devices(2)};
  std::function<void(DeviceProperties&)> tweak = [](DeviceProperties&) {};
  int device_count() { return sim.device_count(); }
  DeviceProperties properties(device_index d) {
    DeviceProperties p = sim.properties(d);
    p.extras.clear();  // simdev's extras are namespaced "simdev."
    tweak(p);
    return p;  // claims event_timing, which the SDK overrides
  }
  device_index get_device() { return sim.get_device(); }
  void set_device(device_index d) { sim.set_device(d); }
  void* malloc(device_index d, std::size_t n) { return sim.malloc(d, n); }
  void free(device_index d, void* p) { sim.free(d, p); }
  void* host_malloc(device_index d, std::size_t n) { return sim.host_malloc(d, n); }
  void host_free(device_index d, void* p) { sim.host_free(d, p); }
  void memcpy(device_index d, void* dst, const void* src, std::size_t n, CopyKind k) {
    sim.memcpy(d, dst, src, n, k);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    sim.memcpy_async(d, dst, src, n, k, s, pinned);
  }
  void memset_async(device_index d, void* p, int v, std::size_t n, StreamHandle s) {
    sim.memset_async(d, p, v, n, s);
  }
  StreamHandle stream_create(device_index d, int p) { return sim.stream_create(d, p); }
  void stream_destroy(device_index d, StreamHandle s) { sim.stream_destroy(d, s); }
  bool stream_query(device_index d, StreamHandle s) { return sim.stream_query(d, s); }
  void stream_synchronize(device_index d, StreamHandle s) { sim.stream_synchronize(d, s); }
  void stream_wait_event(device_index d, StreamHandle s, EventHandle e) {
    sim.stream_wait_event(d, s, e);
  }
  EventHandle event_create(device_index d, EventFlags f) { return sim.event_create(d, f); }
  void event_destroy(device_index d, EventHandle e) { sim.event_destroy(d, e); }
  void event_record(device_index d, EventHandle e, StreamHandle s) { sim.event_record(d, e, s); }
  bool event_query(device_index d, EventHandle e) { return sim.event_query(d, e); }
  void event_synchronize(device_index d, EventHandle e) { sim.event_synchronize(d, e); }
  void device_synchronize(device_index d) { sim.device_synchronize(d); }
};
using NoTiming = NoTimingT<true>;
}  // namespace

TEST_CASE("optional members: absent ones get their documented defaults") {
  Backend<NoTiming> b(env());
  CHECK_FALSE(b.properties(0).event_timing);  // overridden: no event_elapsed_time member
  CHECK_FALSE(b.can_access_peer(0, 1));
  CHECK(b.can_access_peer(1, 1));
  StreamHandle s = b.stream_create(0, 0);
  EventHandle e = b.event_create(0, EventFlags::timing);
  b.event_record(0, e, s);
  try {
    b.event_elapsed_time(0, e, e);
    FAIL("elapsed time without support");
  } catch (const NotSupportedError& err) {
    CHECK(std::string(err.what()) ==
          "notiming: notiming:0 does not support event timing (event_elapsed_time); check "
          "properties().event_timing");
  }
  // Peer copy staged through pinned host memory.
  std::vector<int> host(256, 7), back(256, 0);
  void* a = b.raw_malloc(0, 1024);
  void* c = b.raw_malloc(1, 1024);
  b.memcpy(0, a, host.data(), 1024, CopyKind::host_to_device);
  b.memcpy_peer_async(c, 1, a, 0, 1024, s);
  b.memcpy(1, back.data(), c, 1024, CopyKind::device_to_host);
  CHECK(back == host);
  CHECK(b.runtime().sim.pinned_blocks() == 0);  // the staging buffer was returned
  // memory_info default: total minus what the SDK holds.
  CHECK(b.memory_info(0).free == b.properties(0).total_memory - 1024);
  b.raw_free(0, a, 1024);
  b.raw_free(1, c, 1024);
}

TEST_CASE("capabilities: an inconsistent schema from the runtime is a ValueError on query") {
  Backend<NoTiming> b(env());
  b.runtime().tweak = [](DeviceProperties& p) {
    p.max_allocation = p.total_memory * 2;
    p.subgroup_size = 3;
  };
  for (int attempt = 0; attempt < 2; ++attempt) {  // reported on every query
    try {
      b.properties(1);
      FAIL("inconsistent properties were accepted");
    } catch (const ValueError& e) {
      CHECK(std::string(e.what()) ==
            "notiming: device 1 reports inconsistent properties: max_allocation (134217728) "
            "exceeds total_memory (67108864); subgroup_size is 3 (must be a power of two)");
    }
  }
  std::string report = report_json(b);  // the report carries the error instead of throwing
  CHECK(contains(report, "\"error\": \"notiming: device 0 reports inconsistent properties"));
  b.runtime().tweak = [](DeviceProperties&) {};
  CHECK(b.properties(1).subgroup_size == 32);  // fixed at the source: accepted
}

namespace {
// Runs `child` in a forked process and returns its exit status.
template <class F>
int in_child(F child) {
  pid_t pid = ::fork();
  if (pid == 0) {
    int code = 99;
    try {
      code = child();
    } catch (...) {
      code = 98;
    }
    ::_exit(code);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}
}  // namespace

TEST_CASE("fork: a child of an initialized process gets a clear error but can count devices") {
  SimBackend b(env(), devices(2));
  b.set_device(1);
  int status = in_child([&] {
    if (b.device_count() != 2) return 1;
    try {
      b.set_device(0);
      return 2;  // device use must fail in the child
    } catch (const RuntimeError& e) {
      std::string what = e.what();
      if (what.find("cannot use simdev in a process forked after simdev was initialized") ==
          std::string::npos)
        return 3;
      if (what.find("'spawn'") == std::string::npos) return 4;
    }
    try {
      b.properties(0);
      return 5;
    } catch (const RuntimeError&) {
    }
    return 0;
  });
  CHECK(status == 0);
  CHECK_NOTHROW(b.set_device(0));  // the parent is unaffected
}

TEST_CASE("fork: streams whose device tables exist refuse use in a child too") {
  // Streams skip the device checks once a device's table is made; a fork
  // since must still be caught (Note [Fork safety]).
  SimBackend b(env(), devices(2));
  Streams<simdev::SimRuntime> streams(b);
  Stream s = streams.pool_stream(1);
  streams.exchange_stream(s);
  int status = in_child([&] {
    try {
      streams.set_current_stream(s);
      return 1;
    } catch (const RuntimeError& e) {
      if (std::string(e.what()).find("forked after simdev was initialized") == std::string::npos)
        return 2;
    }
    try {
      streams.synchronize(s);
      return 3;
    } catch (const RuntimeError&) {
    }
    return 0;
  });
  CHECK(status == 0);
  CHECK_NOTHROW(streams.set_current_stream(s));  // the parent is unaffected
}

TEST_CASE("fork: a runtime whose discovery starts threads has a child forked after it refused") {
  simdev::Config c = devices(2);
  c.discovery_thread = true;  // as PoCL's first device query starts workers
  Backend<NoTimingT<false>> b(env(), c);
  CHECK(b.device_count() == 2);  // discovery only: no context
  CHECK_FALSE(b.is_initialized());
  int status = in_child([&] {
    if (b.device_count() != 2) return 1;  // still answered from the cache
    if (!b.in_bad_fork()) return 2;
    try {
      b.set_device(1);
      return 3;  // device use must fail in the child, before the driver
    } catch (const DriverError&) {
      return 4;  // the driver was reached
    } catch (const RuntimeError& e) {
      if (std::string(e.what()).find("forked after notiming's device discovery") ==
          std::string::npos)
        return 5;
    }
    try {
      b.properties(0);
      return 6;
    } catch (const DriverError&) {
      return 7;
    } catch (const RuntimeError&) {
    }
    return 0;
  });
  CHECK(status == 0);
  CHECK_NOTHROW(b.set_device(1));  // the parent is unaffected
  CHECK_FALSE(b.in_bad_fork());
}

TEST_CASE("fork: simdev's discovery thread makes a child that reaches the driver fail loudly") {
  simdev::Config c = devices(2);
  c.discovery_thread = true;
  SimBackend b(env(), c);  // simdev declares its discovery fork-safe: the SDK lets it through
  CHECK(b.device_count() == 2);
  int status = in_child([&] {
    try {
      b.set_device(1);
      return 1;
    } catch (const DriverError& e) {
      if (e.code() != simdev::kNotPermitted) return 2;
      if (std::string(e.what()).find("does not exist in this process, forked since") ==
          std::string::npos)
        return 3;
    }
    return 0;
  });
  CHECK(status == 0);
  CHECK_NOTHROW(b.set_device(1));
}

TEST_CASE("fork: a child of a process that only counted devices may initialize") {
  SimBackend b(env(), devices(2));
  CHECK(b.device_count() == 2);
  int status = in_child([&] {
    b.set_device(1);
    return b.current_device() == 1 ? 0 : 1;
  });
  CHECK(status == 0);
}

TEST_CASE("host access mapped: memory is the host's only between host_map and host_unmap, "
          "counted once per range by HostMaps") {
  simdev::Config c = devices(1);
  c.host_access = HostAccessLevel::mapped;
  SimBackend b(env(), c);
  CHECK(b.properties(0).host_access == HostAccessLevel::mapped);
  CHECK_FALSE(b.properties(0).host_visible_memory);  // derived: direct only
  constexpr std::size_t n = 3 * 4096;
  auto* p = static_cast<unsigned char*>(b.raw_malloc(0, n));
  REQUIRE(p != nullptr);
  std::vector<unsigned char> in(n, 7), out(n);
  b.memcpy(0, p, in.data(), n, CopyKind::host_to_device);

  // The host never reaches the memory at the device pointer, and reaches it
  // at the address host_map returned only while mapped (a child process
  // tries).
  auto child_reads = [&](const unsigned char* at) {
    pid_t pid = ::fork();
    if (pid == 0) {
      volatile unsigned char v = at[0];
      static_cast<void>(v);
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  };
  CHECK_FALSE(child_reads(p + 4096));

  HostMaps<simdev::SimRuntime> maps(b);
  auto whole = maps.acquire(0, p, n);
  auto part = maps.acquire(0, p + 4096 + 128, 64);  // inside: counted, not mapped again
  CHECK(b.runtime().host_maps() == 1);
  CHECK(maps.open_count() == 1);
  auto* h = static_cast<unsigned char*>(maps.host_ptr(0, p));
  CHECK(h != p);  // simdev's host view is a mapping of its own
  CHECK(maps.host_ptr(0, p + 4096 + 128) == h + 4096 + 128);
  CHECK(maps.host_ptr(0, p + n) == h + n);  // the end, for empty views
  CHECK_FALSE(child_reads(p + 4096));
  CHECK(child_reads(h + 4096));
  CHECK(h[4096] == 7);
  maps.release(whole);
  h[4096 + 128] = 9;  // still held by `part`
  CHECK_THROWS_AS(maps.acquire(0, p + n - 64, 4096), RuntimeError);  // overlaps in part
  maps.release(part);
  CHECK(maps.open_count() == 0);
  CHECK_FALSE(child_reads(h + 4096));  // the view is unmapped
  CHECK_THROWS_WITH(maps.host_ptr(0, p + 8), Catch::Contains("is not inside memory mapped for "
                                                             "the host"));
  b.memcpy(0, out.data(), p, n, CopyKind::device_to_host);
  CHECK(out[4096 + 128] == 9);
  CHECK(out[0] == 7);

  // Freed while held: forget() unmaps, the holder's release finds it gone,
  // and a new map of the same address is not mistaken for the old one.
  auto held = maps.acquire(0, p, n);
  maps.forget(0, p);
  CHECK(maps.open_count() == 0);
  auto again = maps.acquire(0, p, n);
  maps.release(held);
  CHECK(maps.open_count() == 1);
  // simdev refuses to free memory that is still mapped.
  CHECK_THROWS_AS(b.raw_free(0, p, n), DriverError);
  maps.release(again);
  b.raw_free(0, p, n);
}

TEST_CASE("host access mapped: a range inside another of the same scope only counts, in either "
          "order (HostMaps::acquire_all)") {
  simdev::Config c = devices(1);
  c.host_access = HostAccessLevel::mapped;
  SimBackend b(env(), c);
  constexpr std::size_t n = 3 * 4096;
  auto* p = static_cast<unsigned char*>(b.raw_malloc(0, n));
  REQUIRE(p != nullptr);
  HostMaps<simdev::SimRuntime> maps(b);
  using Range = std::pair<void*, std::size_t>;
  const Range whole{p, n}, part{p + 4096 + 128, 64};
  for (std::vector<Range> order : {std::vector<Range>{part, whole}, std::vector<Range>{whole, part}}) {
    long before = b.runtime().host_maps();
    std::vector<HostMaps<simdev::SimRuntime>::Ticket> tickets;
    REQUIRE_NOTHROW(maps.acquire_all(0, order, tickets));
    CHECK(tickets.size() == 2);
    CHECK(b.runtime().host_maps() == before + 1);  // the whole range, mapped once
    CHECK(maps.open_count() == 1);
    *static_cast<unsigned char*>(maps.host_ptr(0, p + 4096 + 128)) = 5;
    for (auto it = tickets.rbegin(); it != tickets.rend(); ++it) maps.release(*it);
    CHECK(maps.open_count() == 0);
  }
  // One range at a time (two holders), the part first: the whole is refused,
  // since the part may be in use by its holder.
  auto held = maps.acquire(0, p + 4096 + 128, 64);
  CHECK_THROWS_AS(maps.acquire(0, p, n), RuntimeError);
  maps.release(held);
  CHECK(maps.open_count() == 0);

  // An unmap that fails leaves the range open (the driver may still map
  // it); the free's forget() unmaps it again, and the driver's free succeeds.
  auto failing = maps.acquire(0, p, n);
  b.runtime().inject_fault("host_unmap", 1, false);
  CHECK_THROWS_AS(maps.release(failing), DriverError);
  CHECK(maps.open_count() == 1);
  maps.release(failing);  // its hold is gone: nothing
  CHECK(maps.open_count() == 1);
  maps.forget(0, p);
  CHECK(maps.open_count() == 0);
  b.raw_free(0, p, n);
}

namespace {
// simdev's required members only: a runtime without host_map and host_unmap.
struct WithoutMaps : accelkit::Runtime<WithoutMaps> {
  static constexpr std::string_view name = "simdev";
  explicit WithoutMaps(simdev::Config c) : sim(std::move(c)) {}
#define FORWARD_(member, Ret, params, kind, args) \
  Ret member params { return sim.member args; }
  ACCELKIT_REQUIRED_MEMBERS(FORWARD_)
#undef FORWARD_
  simdev::SimRuntime sim;
};
}  // namespace

TEST_CASE("host access mapped: a runtime without host_map and host_unmap may not report it") {
  simdev::Config c = devices(1);
  c.host_access = HostAccessLevel::mapped;
  Backend<WithoutMaps> b(env(), c);
  CHECK_THROWS_WITH(b.properties(0), Catch::Contains("reports host_access mapped, but the "
                                                     "runtime lacks host_map or host_unmap"));
  CHECK_THROWS_AS(b.host_map(0, nullptr, 0), NotSupportedError);
  c.host_access = HostAccessLevel::direct;
  Backend<WithoutMaps> direct(env(), c);
  CHECK(direct.properties(0).host_visible_memory);
}

TEST_CASE("host access mapped: threads map, translate and unmap ranges of one allocation at once") {
  simdev::Config c = devices(1);
  c.host_access = HostAccessLevel::mapped;
  SimBackend b(env(), c);
  constexpr int kThreads = 4;
  constexpr std::size_t kSlice = 4 * 4096;
  auto* p = static_cast<unsigned char*>(b.raw_malloc(0, kThreads * kSlice));
  REQUIRE(p != nullptr);
  HostMaps<simdev::SimRuntime> maps(b);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      unsigned char* slice = p + t * kSlice;
      for (int round = 0; round < 100; ++round) {
        auto whole = maps.acquire(0, slice, kSlice);
        auto part = maps.acquire(0, slice + 4096 + 8, 64);  // inside: counted
        auto* h = static_cast<unsigned char*>(maps.host_ptr(0, slice + 4096 + 8));
        if (h != static_cast<unsigned char*>(maps.host_ptr(0, slice)) + 4096 + 8) ++wrong;
        *h = static_cast<unsigned char>(t * 16 + round % 16);
        maps.release(part);
        maps.release(whole);
      }
    });
  for (std::thread& t : threads) t.join();
  CHECK(wrong.load() == 0);
  CHECK(maps.open_count() == 0);
  std::vector<unsigned char> out(kThreads * kSlice);
  b.memcpy(0, out.data(), p, out.size(), CopyKind::device_to_host);
  for (int t = 0; t < kThreads; ++t)
    CHECK(out[t * kSlice + 4096 + 8] == static_cast<unsigned char>(t * 16 + 99 % 16));
  b.raw_free(0, p, kThreads * kSlice);
}

namespace {
// simdev's required members, and a host_map that gives no address.
struct NullMaps : accelkit::Runtime<NullMaps> {
  static constexpr std::string_view name = "simdev";
  explicit NullMaps(simdev::Config c) : sim(std::move(c)) {}
#define FORWARD_(member, Ret, params, kind, args) \
  Ret member params { return sim.member args; }
  ACCELKIT_REQUIRED_MEMBERS(FORWARD_)
#undef FORWARD_
  void* host_map(int, void*, std::size_t) { return nullptr; }
  void host_unmap(int, void*, std::size_t) {}
  simdev::SimRuntime sim;
};
}  // namespace

TEST_CASE("host access mapped: a host_map that returns no address is a RuntimeError naming the "
          "range, and nothing stays open") {
  simdev::Config c = devices(1);
  c.host_access = HostAccessLevel::mapped;
  Backend<NullMaps> b(env(), c);
  void* p = b.raw_malloc(0, 4096);
  REQUIRE(p != nullptr);
  HostMaps<NullMaps> maps(b);
  CHECK_THROWS_AS(maps.acquire(0, p, 64), RuntimeError);
  CHECK_THROWS_WITH(maps.acquire(0, p, 64),
                    Catch::Contains(fmt::format("simdev: device 0: host_map of 64 bytes at {} "
                                                "returned no host address",
                                                p)));
  CHECK(maps.open_count() == 0);
  b.raw_free(0, p, 4096);
}
