// Stream-ordered semantics under real asynchrony: simdev as strict
// as a real driver (Note [simdev strictness]), pooled events reused only once
// their records complete (Note [Pooled event reuse]), memory returned to the
// driver only after the work that used it (Note [Ordered release]), and the
// SDK's state kept consistent when the driver fails, now or later.
#include "catch.hpp"
#include "support.hpp"
#include "live_ranges.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;
using Sim = simdev::SimRuntime;
using SimBackend = Backend<Sim>;
using SimStreams = Streams<Sim>;
using Allocator = DeviceCachingAllocator<Sim>;
constexpr auto all = static_cast<std::size_t>(StatType::aggregate);

using namespace accelkit_tests;
namespace {
// Opens a gate after a delay, from another thread.
struct OpenLater {
  std::thread t;
  OpenLater(std::shared_ptr<Sim::Gate> g, int ms)
      : t([g, ms] {
          std::this_thread::sleep_for(std::chrono::milliseconds(ms));
          g->open();
        }) {}
  ~OpenLater() { t.join(); }
};
// Reports (Note [Diagnostics]) collected by a test.
std::vector<std::string>& reports() {
  static std::vector<std::string> r;
  return r;
}
void collect(Severity, std::string_view backend, std::string_view message) {
  reports().push_back(std::string(backend) + ": " + std::string(message));
}
struct CollectReports {
  DiagnosticHandler previous;
  CollectReports() : previous(set_diagnostic_handler(&collect)) { reports().clear(); }
  ~CollectReports() { set_diagnostic_handler(previous); }
};
}  // namespace

// ------------------------------------------------------- simdev strictness

TEST_CASE("simdev: a wait is released by the record it saw, not by a later record elsewhere") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle a = b.stream_create(0, 0), w = b.stream_create(0, 0), c = b.stream_create(0, 0);
  void* src = b.raw_malloc(0, 4096);
  void* dst = b.raw_malloc(0, 4096);
  std::vector<char> zeros(4096, 0), out(4096, 9);
  b.memcpy(0, src, zeros.data(), 4096, CopyKind::host_to_device);
  b.memcpy(0, dst, zeros.data(), 4096, CopyKind::host_to_device);
  EventHandle e = b.event_create(0, EventFlags::none);
  auto gate = b.runtime().hold(0, a);
  b.memset_async(0, src, 7, 4096, a);
  b.event_record(0, e, a);
  b.stream_wait_event(0, w, e);
  b.event_record(0, e, c);  // c is idle: this record completes at once
  b.memcpy_async(0, dst, src, 4096, CopyKind::device_to_device, w, false);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(b.stream_query(0, w));  // still waiting for a's record
  gate->open();
  b.stream_synchronize(0, w);
  b.memcpy(0, out.data(), dst, 4096, CopyKind::device_to_host);
  CHECK(out[0] == 7);
  CHECK(out[4095] == 7);
  b.event_destroy(0, e);
  b.raw_free(0, src, 4096);
  b.raw_free(0, dst, 4096);
  for (StreamHandle s : {a, w, c}) b.stream_destroy(0, s);
}

TEST_CASE("simdev: memory still used by queued work cannot be freed, freed memory cannot be used") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 8192);
  void* q = b.raw_malloc(0, 8192);
  auto gate = b.runtime().hold(0, s);
  b.memcpy_async(0, q, p, 8192, CopyKind::device_to_device, s, false);
  CHECK(driver_code([&] { b.raw_free(0, p, 8192); }) == simdev::kInvalidValue);
  CHECK(b.runtime().bytes_in_use(0) == 16384);  // refused: nothing changed
  gate->open();
  b.stream_synchronize(0, s);
  b.raw_free(0, p, 8192);
  // Freed: work naming it is refused at once.
  CHECK(driver_code([&] { b.memcpy_async(0, q, p, 8192, CopyKind::device_to_device, s, false); }) ==
        simdev::kIllegalAddress);
  CHECK(driver_code([&] { b.memset_async(0, p, 0, 8192, s); }) == simdev::kIllegalAddress);
  b.raw_free(0, q, 8192);
  b.stream_destroy(0, s);
}

TEST_CASE("simdev: an asynchronous fault surfaces once, at the next synchronizing call") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 4096);
  std::vector<char> host(4096, 0);
  b.memcpy(0, p, host.data(), 4096, CopyKind::host_to_device);
  b.runtime().inject_fault("memset_async", 1, /*async=*/true);
  b.memset_async(0, p, 5, 4096, s);  // returns normally
  try {
    b.stream_synchronize(0, s);
    FAIL("no asynchronous error");
  } catch (const DriverError& e) {
    CHECK(e.code() == simdev::kLaunchFailure);
    CHECK(contains(e.what(), "simdev: driver error 719 in stream_synchronize"));
    CHECK(contains(e.what(), "queued memset_async failed"));
  }
  b.stream_synchronize(0, s);  // reported once
  b.memcpy(0, host.data(), p, 4096, CopyKind::device_to_host);
  CHECK(host[0] == 0);  // the failed fill did not happen
  // The next stream-ordered call reports it too.
  b.runtime().inject_fault("memset_async", 1, true);
  b.memset_async(0, p, 5, 4096, s);
  for (int i = 0; i < 2000 && !b.runtime().async_error_pending(0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(b.runtime().async_error_pending(0));
  CHECK(driver_code([&] { b.memset_async(0, p, 6, 4096, s); }) == simdev::kLaunchFailure);
  b.memset_async(0, p, 6, 4096, s);
  b.stream_synchronize(0, s);
  b.memcpy(0, host.data(), p, 4096, CopyKind::device_to_host);
  CHECK(host[0] == 6);
  // Members that queue no work cannot fail asynchronously.
  CHECK_THROWS_AS(b.runtime().inject_fault("malloc", 1, true), ValueError);
  b.raw_free(0, p, 4096);
  b.stream_destroy(0, s);
}

TEST_CASE("simdev: SIMDEV_INJECT_FAULT takes :async, refuses duplicates, and 1 MiB devices work") {
  auto env = [](std::string v) {
    return Environment::fixed({{"SIMDEV_INJECT_FAULT", std::move(v)}});
  };
  simdev::Config c = simdev::Config::from_environment(env("memcpy_async@3:async,free"));
  CHECK(c.faults.at("memcpy_async").nth == 3);
  CHECK(c.faults.at("memcpy_async").async);
  CHECK_FALSE(c.faults.at("free").async);
  CHECK_THROWS_WITH(simdev::Config::from_environment(env("free,free@2")),
                    Catch::Matchers::Contains("named twice"));
  CHECK_THROWS_WITH(simdev::Config::from_environment(env("malloc:async")),
                    Catch::Matchers::Contains("cannot fail asynchronously"));
  CHECK_THROWS_WITH(simdev::Config::from_environment(env("free:later")),
                    Catch::Matchers::Contains("member[@n][:async|:refuse]"));
  CHECK_THROWS_WITH(simdev::Config::from_environment(env("free:refuse")),
                    Catch::Matchers::Contains("only malloc can refuse"));
  CHECK(simdev::Config::from_environment(env("malloc@2:refuse")).faults.at("malloc").refuse);
  SimBackend b(Environment::fixed({}), sim(1, 1));
  CHECK(b.properties(0).total_memory == 1u << 20);
  void* p = b.raw_malloc(0, 4096);
  b.raw_free(0, p, 4096);
}

// ------------------------------------------------------------ event pools

TEST_CASE("event pool: a released event is not reused before its record completes") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  EventPool<Sim> pool(b, 0);
  EventHandle e = pool.acquire();
  auto gate = b.runtime().hold(0, s);
  b.event_record(0, e, s);
  pool.release(e);
  EventHandle other = pool.acquire();
  CHECK(other != e);  // e's record is pending
  CHECK(pool.created() == 2);
  gate->open();
  b.stream_synchronize(0, s);
  pool.release(other);
  EventHandle x = pool.acquire();
  EventHandle y = pool.acquire();
  CHECK(((x == e && y == other) || (x == other && y == e)));
  CHECK(pool.created() == 2);
  pool.release(x);
  pool.release(y);
  b.stream_destroy(0, s);
}

TEST_CASE("invariant checks: an event released twice is caught at the next acquire") {
  // The checks are on in the core tests: ACCELKIT_ENABLE_ASSERTS
  // (Note [Invariant checks]).
  REQUIRE(ACCELKIT_ASSERTS_ON);
  SimBackend b(Environment::fixed({}), sim());
  EventPool<Sim> pool(b, 0);
  EventHandle e = pool.acquire();
  pool.release(e, true);
  pool.release(e, true);  // a bug in a caller: the pool would hand e out twice
  try {
    pool.acquire();
    FAIL("the broken invariant went unnoticed");
  } catch (const std::logic_error& err) {
    CHECK(contains(err.what(), "internal invariant broken: an event pool holds only events it "
                               "created, each once"));
  }
}

TEST_CASE("streams: wait_stream's pooled event cannot release the wait early") {
  // The pooled event of wait_stream goes back to the pool at once; a record
  // of a pooled event on an idle stream must not release the earlier wait.
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream a = st.create_stream(0), w = st.create_stream(0), c = st.create_stream(0);
  void* src = b.raw_malloc(0, 4096);
  void* dst = b.raw_malloc(0, 4096);
  auto gate = b.runtime().hold(0, st.handle(a));
  b.memset_async(0, src, 3, 4096, st.handle(a));
  st.wait_stream(w, a);
  st.wait_stream(c, c);  // takes a pooled event and records it on idle c
  Event<Sim> ev(st);
  ev.record(c);
  b.memcpy_async(0, dst, src, 4096, CopyKind::device_to_device, st.handle(w), false);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK_FALSE(st.query(w));
  gate->open();
  st.synchronize(w);
  char first = 0;
  b.memcpy(0, &first, dst, 1, CopyKind::device_to_host);
  CHECK(first == 3);
  b.raw_free(0, src, 4096);
  b.raw_free(0, dst, 4096);
}

TEST_CASE("streams: a stream id that names no stream is a ValueError, not a read out of bounds") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream pooled = st.pool_stream(0, 0);
  Stream bad_level{0, detail::make_stream_id(0, detail::StreamKind::pooled, 9, 0)};
  Stream bad_index{0, detail::make_stream_id(0, detail::StreamKind::pooled, 0, 40)};
  Stream bad_kind{0, (std::int64_t{7} << 36)};
  Stream not_created{0, detail::make_stream_id(0, detail::StreamKind::pooled, 2, 0)};
  for (const Stream& s : {bad_level, bad_index, bad_kind}) {
    CHECK_THROWS_AS(st.handle(s), ValueError);
    CHECK_THROWS_AS(st.set_current_stream(s), ValueError);
  }
  CHECK_THROWS_WITH(st.handle(bad_level), Catch::Matchers::Contains("priority level 9"));
  CHECK_THROWS_AS(st.handle(not_created), ValueError);  // level 2 exists, its pool does not yet
  CHECK(st.handle(pooled) != StreamHandle{});
}

TEST_CASE("streams: a pool whose creation fails part-way leaks no stream and is created later") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  st.default_stream(0);
  long before = b.runtime().live_streams();
  b.runtime().inject_fault("stream_create", 5);
  CHECK_THROWS_AS(st.pool_stream(0, -1), DriverError);
  CHECK(b.runtime().live_streams() == before);  // the four created first were destroyed
  Stream s = st.pool_stream(0, -1);
  CHECK(st.handle(s) != StreamHandle{});
  CHECK(b.runtime().live_streams() == before + SimStreams::kStreamsPerPool);
}

// ---------------------------------------------------------- ordered release

TEST_CASE("allocator: empty_cache returns a segment only after the work queued on it") {
  SimBackend b(Environment::fixed({}), sim());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  std::size_t n = 12 * kMiB;
  void* y = a.allocate(n, s);
  void* out = a.allocate(n, s);
  b.memset_async(0, y, 4, n, s);
  {
    auto gate = b.runtime().hold(0, s);
    b.memcpy_async(0, out, y, n, CopyKind::device_to_device, s, false);
    a.deallocate(y);  // stream-ordered: cached while the copy is queued
    OpenLater later(gate, 50);
    a.empty_cache();  // must wait for the copy before returning y's segment
  }
  std::vector<char> host(n);
  b.memcpy(0, host.data(), out, n, CopyKind::device_to_host);
  CHECK(host[0] == 4);
  CHECK(host[n - 1] == 4);
  a.deallocate(out);
  a.empty_cache();
  CHECK(b.runtime().bytes_in_use(0) == 0);
  CHECK(a.stats().reserved_bytes[all].current == 0);
  b.stream_destroy(0, s);
}

TEST_CASE("allocator: a release the driver refuses or cannot order keeps the segment reserved") {
  // The driver refuses the free, or the stream that used the segment cannot
  // be synchronized: either way the segment stays reserved (the books say
  // what the driver holds) until a later release returns it.
  for (const char* member : {"free", "stream_synchronize"}) {
    INFO(member);
    SimBackend b(Environment::fixed({}), sim());
    Allocator a(b, 0, AllocatorConfig{});
    StreamHandle s = b.stream_create(0, 0);
    void* p = a.allocate(12 * kMiB, s);
    a.deallocate(p);
    std::uint64_t held = b.runtime().bytes_in_use(0);
    REQUIRE(held > 0);
    b.runtime().inject_fault(member);
    CHECK_THROWS_AS(a.empty_cache(), DriverError);
    CHECK(static_cast<std::uint64_t>(a.stats().reserved_bytes[all].current) == held);
    CHECK(a.stats().segment[all].current == 1);
    CHECK(b.runtime().bytes_in_use(0) == held);
    void* q = a.allocate(1 * kMiB, s);  // still usable
    a.deallocate(q);
    a.empty_cache();
    CHECK(b.runtime().bytes_in_use(0) == 0);
    CHECK(a.stats().reserved_bytes[all].current == 0);
    CHECK(a.stats().segment[all].current == 0);
    b.stream_destroy(0, s);
  }
}

TEST_CASE("allocator: without caching a refused free is reported, kept, and freed later") {
  CollectReports collected;
  SimBackend b(Environment::fixed({}), sim());
  AllocatorConfig config;
  config.caching = false;
  Allocator a(b, 0, config);
  StreamHandle s = b.stream_create(0, 0);
  void* p = a.allocate(4096, s);
  void* q = a.allocate(4096, s);
  b.memset_async(0, q, 1, 4096, s);
  {
    auto gate = b.runtime().hold(0, s);
    b.memcpy_async(0, q, p, 4096, CopyKind::device_to_device, s, false);
    OpenLater later(gate, 30);
    a.deallocate(p);  // waits for the queued copy before the driver's free
  }
  CHECK(b.runtime().bytes_in_use(0) == 4096);
  b.runtime().inject_fault("free");
  CHECK_NOTHROW(a.deallocate(q));
  REQUIRE(reports().size() == 1);
  CHECK(contains(reports()[0], "simdev: device 0: the free of"));
  CHECK(contains(reports()[0], "injected fault"));
  CHECK(b.runtime().bytes_in_use(0) == 4096);
  CHECK(a.stats().reserved_bytes[all].current == 4096);
  CHECK(a.stats().allocated_bytes[all].current == 0);
  a.empty_cache();
  CHECK(b.runtime().bytes_in_use(0) == 0);
  CHECK(a.stats().reserved_bytes[all].current == 0);
  b.stream_destroy(0, s);
}

TEST_CASE("allocator: an asynchronous error met while ordering a free is reported, not lost") {
  CollectReports collected;
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Allocator a(b, 0, AllocatorConfig{}, st.events(0, EventFlags::none));
  StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0);
  void* p = a.allocate(4096, s1);
  a.record_stream(p, s2);
  b.runtime().inject_fault("memset_async", 1, true);
  b.memset_async(0, p, 1, 4096, s2);  // fails when s2 runs it
  for (int i = 0; i < 2000 && !b.runtime().async_error_pending(0); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(b.runtime().async_error_pending(0));
  // The free's event record on s2 meets the error: the free waits for s2
  // instead, and the error is reported through the hook.
  CHECK_NOTHROW(a.deallocate(p));
  CHECK_FALSE(b.runtime().async_error_pending(0));
  REQUIRE(reports().size() == 1);
  CHECK(contains(reports()[0], "queued memset_async failed"));
  void* q = a.allocate(4096, s1);
  CHECK(q == p);  // s2 was waited for: the block is back
  a.deallocate(q);
  b.stream_destroy(0, s1);
  b.stream_destroy(0, s2);
}

TEST_CASE("pinned allocator without caching: a block whose copy cannot be waited for is kept") {
  CollectReports collected;
  SimBackend b(Environment::fixed({}), sim());
  AllocatorConfig config;
  config.caching = false;
  HostAllocator<Sim> h(b, config);
  StreamHandle s = b.stream_create(0, 0);
  void* dev = b.raw_malloc(0, 4096);
  void* pinned = h.allocate(0, 4096);
  std::memset(pinned, 8, 4096);
  {
    auto gate = b.runtime().hold(0, s);
    b.memcpy_async(0, dev, pinned, 4096, CopyKind::host_to_device, s, /*host_pinned=*/true);
    h.record_stream(pinned, 0, s);
    b.runtime().inject_fault("event_synchronize");
    h.deallocate(pinned);  // cannot wait: not freed under the queued copy
    CHECK(b.runtime().pinned_blocks() == 1);
    CHECK(reports().size() == 1);
    gate->open();
  }
  b.stream_synchronize(0, s);
  char first = 0;
  b.memcpy(0, &first, dev, 1, CopyKind::device_to_host);
  CHECK(first == 8);
  h.empty_cache();
  CHECK(b.runtime().pinned_blocks() == 0);
  CHECK(h.stats().reserved_bytes.current == 0);
  b.raw_free(0, dev, 4096);
  b.stream_destroy(0, s);
}

TEST_CASE("both pools quarantine a block whose use can be neither recorded nor waited for") {
  // One helper, one behaviour for both pools (Note [Stream-use recording]).
  CollectReports collected;
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0);
  {
    SimStreams st(b);
    Allocator a(b, 0, AllocatorConfig{}, st.events(0, EventFlags::none));
    HostAllocator<Sim> h(b, AllocatorConfig{});
    void* dev = a.allocate(4096, s1);
    void* pinned = h.allocate(0, 4096);
    a.record_stream(dev, s2);
    h.record_stream(pinned, 0, s2);
    for (void* p : {dev, pinned}) {
      b.runtime().inject_fault("event_record");
      b.runtime().inject_fault("stream_synchronize");
      if (p == dev) a.deallocate(p);
      else h.deallocate(p);
    }
    REQUIRE(reports().size() == 4);
    CHECK(contains(reports()[0], "the free of device memory at"));
    CHECK(contains(reports()[0], "instead of recording an event"));
    CHECK(contains(reports()[1], "is kept out of the cache: its use on stream"));
    CHECK(contains(reports()[2], "the free of pinned host memory at"));
    CHECK(contains(reports()[3], "is kept out of the cache: its use on stream"));
    // Never reused.
    void* dev2 = a.allocate(4096, s1);
    void* pinned2 = h.allocate(0, 4096);
    CHECK(dev2 != dev);
    CHECK(pinned2 != pinned);
    a.deallocate(dev2);
    h.deallocate(pinned2);
    a.empty_cache();
    h.empty_cache();
    CHECK(b.runtime().pinned_blocks() == 1);  // the quarantined one, until teardown
    CHECK(b.runtime().bytes_in_use(0) > 0);
  }
  // Teardown returns both to the driver.
  CHECK(b.runtime().pinned_blocks() == 0);
  CHECK(b.runtime().bytes_in_use(0) == 0);
  b.stream_destroy(0, s1);
  b.stream_destroy(0, s2);
}

// --------------------------------------------------- deferred device switch

TEST_CASE("device: a switch the driver refuses where nothing may throw is retried at next use") {
  CollectReports collected;
  SimBackend b(Environment::fixed({}), sim());
  b.set_device(0);
  b.runtime().inject_fault("set_device");
  CHECK_NOTHROW(b.set_device_deferred(1));
  CHECK(reports().size() == 1);
  CHECK(contains(reports()[0], "simdev: switching this thread to device 1 failed"));
  CHECK(b.current_device() == 1);  // the driver's set_device was retried here
  // A guard restores the previous device even when the driver refuses.
  {
    DeviceGuard<Sim> guard(b, 0);
    CHECK(b.current_device() == 0);
    b.runtime().inject_fault("set_device");
  }
  CHECK(b.runtime().get_device() == 0);  // the driver is still on 0...
  CHECK(b.current_device() == 1);        // ...until the retry: the thread's device is 1
  CHECK(b.runtime().get_device() == 1);
  // A retry that fails again is thrown where throwing is safe.
  b.runtime().inject_fault("set_device");
  b.set_device_deferred(0);
  b.runtime().inject_fault("set_device");
  CHECK_THROWS_AS(b.current_device(), DriverError);
  CHECK(b.current_device() == 0);
  CHECK_THROWS_AS(b.set_device_deferred(5), IndexError);
}

TEST_CASE("memory config: a key given twice is a ValueError") {
  auto env = Environment::fixed({{"SIMDEV_ALLOC_CONF", "max_split_size_mb:64,max_split_size_mb:32"}});
  CHECK_THROWS_WITH(AllocatorConfig::from_environment("simdev", env),
                    Catch::Matchers::Contains("key 'max_split_size_mb' is given twice"));
}

// ------------------------------------------------------------------ stress

TEST_CASE("stress: blocks written and read by queued work on many streams, the cache emptied meanwhile") {
  // Each thread allocates on its own stream, fills the block there (queued),
  // sometimes has another stream read it (an event orders the read after the
  // fill; record_stream tells the allocator), frees it at once in stream
  // order, and checks what every queued read saw. Another thread empties
  // both caches all the while. A block handed out while queued work still
  // uses it, a segment returned under queued work or an event released early
  // shows as a wrong byte, an overlap or a driver error.
  SimBackend b(Environment::fixed({}), sim(1, 512));
  SimStreams st(b);
  Allocator a(b, 0, AllocatorConfig{}, st.events(0, EventFlags::none));
  HostAllocator<Sim> h(b);
  EventPool<Sim>& order = st.events(0, EventFlags::none);
  constexpr int kThreads = 3;
  constexpr int kStreams = 4;
  const int ops = 250;
  std::vector<StreamHandle> streams;
  for (int i = 0; i < kStreams; ++i) streams.push_back(b.stream_create(0, 0));
  LiveRanges live;
  std::atomic<long> wrong{0}, errors{0}, reads{0}, allocations{0}, empties{0};
  std::atomic<bool> stop{false};

  std::thread emptier([&] {
    while (!stop.load()) {
      try {
        a.empty_cache();
        h.empty_cache();
        ++empties;
      } catch (const std::exception&) {
        ++errors;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  auto worker = [&](int id) {
    std::mt19937 rng(static_cast<unsigned>(id) * 7919u);
    StreamHandle own = streams[static_cast<std::size_t>(id)];
    struct Read {
      StreamHandle stream;
      char* host;
      std::size_t size;
      unsigned char value;
    };
    try {
      for (int op = 0; op < ops; ++op) {
        std::size_t size = rng() % 8 == 0 ? (rng() % (12 * kMiB)) + 1 : (rng() % 65536) + 1;
        auto* p = static_cast<char*>(a.allocate(size, own));
        ++allocations;
        live.add(p, size);
        auto value = static_cast<unsigned char>(((id * 31 + op) & 0x7f) | 1);
        b.memset_async(0, p, value, size, own);
        std::vector<Read> pending;
        int readers = static_cast<int>(rng() % 3);
        for (int r = 0; r < readers; ++r) {
          StreamHandle other = streams[(static_cast<std::size_t>(id) + 1 + rng() % 3) % kStreams];
          EventHandle e = order.acquire();
          b.event_record(0, e, own);
          b.stream_wait_event(0, other, e);
          order.release(e);
          auto* host = static_cast<char*>(h.allocate(0, size));
          b.memcpy_async(0, host, p, size, CopyKind::device_to_host, other, /*host_pinned=*/true);
          h.record_stream(host, 0, other);
          a.record_stream(p, other);
          pending.push_back({other, host, size, value});
        }
        auto* mine = static_cast<char*>(h.allocate(0, size));
        b.memcpy_async(0, mine, p, size, CopyKind::device_to_host, own, /*host_pinned=*/true);
        h.record_stream(mine, 0, own);
        pending.push_back({own, mine, size, value});
        live.remove(p);
        a.deallocate(p);  // in stream order: the reads above are still queued
        for (Read& r : pending) {
          b.stream_synchronize(0, r.stream);
          ++reads;
          if (static_cast<unsigned char>(r.host[0]) != r.value ||
              static_cast<unsigned char>(r.host[r.size - 1]) != r.value ||
              static_cast<unsigned char>(r.host[r.size / 2]) != r.value)
            ++wrong;
          h.deallocate(r.host);
        }
      }
    } catch (const std::exception&) {
      ++errors;
    }
  };
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) threads.emplace_back(worker, i);
  for (auto& t : threads) t.join();
  stop.store(true);
  emptier.join();
  for (StreamHandle s : streams) b.stream_synchronize(0, s);
  a.empty_cache();
  h.empty_cache();
  WARN("stress: allocations " << allocations.load() << ", queued reads checked " << reads.load()
                              << ", cache emptied " << empties.load() << " times, wrong "
                              << wrong.load() << ", overlaps " << live.overlaps());
  CHECK(allocations.load() == kThreads * ops);
  CHECK(live.overlaps() == 0);
  CHECK(wrong.load() == 0);
  CHECK(errors.load() == 0);
  CHECK(a.stats().allocated_bytes[all].current == 0);
  CHECK(a.stats().reserved_bytes[all].current == 0);
  CHECK(h.stats().reserved_bytes.current == 0);
  CHECK(b.runtime().bytes_in_use(0) == 0);
  CHECK(b.runtime().pinned_blocks() == 0);
  for (StreamHandle s : streams) b.stream_destroy(0, s);
}

TEST_CASE("asynchronous errors: an event whose captured work failed reports it once from its query") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = b.raw_malloc(0, 4096);
  EventHandle e = b.event_create(0, EventFlags::none);
  b.runtime().inject_fault("memset_async", 1, /*async=*/true);
  // Held, so that the memset fails after the record: a failure that came
  // first would be reported by the record itself (the next stream-ordered
  // call), as the contract allows.
  auto gate = b.runtime().hold(0, s);
  b.memset_async(0, p, 1, 4096, s);
  b.event_record(0, e, s);
  gate->open();
  int errors = 0;
  bool done = false;
  for (int i = 0; i < 100000 && !done; ++i) {
    try {
      done = b.event_query(0, e);  // never "not complete" forever, never a silent success
    } catch (const DriverError& err) {
      CHECK(err.code() == simdev::kLaunchFailure);
      ++errors;
    }
  }
  CHECK(errors == 1);
  CHECK(done);
  CHECK_NOTHROW(b.event_synchronize(0, e));  // once: the error is not raised again
  b.event_destroy(0, e);
  b.raw_free(0, p, 4096);
  b.stream_destroy(0, s);
}
