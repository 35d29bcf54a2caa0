// Streams and events (Note [Stream pools]) on simdev, whose streams run
// their work asynchronously on worker threads, so ordering bugs show.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <chrono>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using SimBackend = Backend<simdev::SimRuntime>;
using SimStreams = Streams<simdev::SimRuntime>;
using SimEvent = accelkit::Event<simdev::SimRuntime>;

using namespace accelkit_tests;
namespace {
// Device buffers filled from the host.
struct Buffers {
  SimBackend& b;
  device_index device;
  std::size_t n;
  std::vector<void*> ptrs;
  Buffers(SimBackend& backend, device_index d, std::size_t bytes, int count)
      : b(backend), device(d), n(bytes) {
    for (int i = 0; i < count; ++i) ptrs.push_back(b.raw_malloc(d, bytes));
  }
  ~Buffers() {
    for (void* p : ptrs) b.raw_free(device, p, n);
  }
  void fill(int i, char value) {
    std::vector<char> host(n, value);
    b.memcpy(device, ptrs[static_cast<std::size_t>(i)], host.data(), n, CopyKind::host_to_device);
  }
  char first(int i) {
    char c = 0;
    b.memcpy(device, &c, ptrs[static_cast<std::size_t>(i)], 1, CopyKind::device_to_host);
    return c;
  }
};
}  // namespace

TEST_CASE("streams: the default stream is current until a thread sets another") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream def = st.default_stream(0);
  CHECK(st.default_stream(0) == def);
  CHECK(st.current_stream(0) == def);
  CHECK(st.default_stream(1) != def);
  Stream p = st.pool_stream(0);
  CHECK(st.exchange_stream(p) == def);
  CHECK(st.current_stream(0) == p);
  CHECK(st.current_stream(1) == st.default_stream(1));  // per device
  Stream seen_in_thread{};
  std::thread([&] { seen_in_thread = st.current_stream(0); }).join();
  CHECK(seen_in_thread == def);  // per thread
  CHECK(st.current_stream(0) == p);
  CHECK_THROWS_AS(st.current_stream(5), IndexError);
}

TEST_CASE("streams: pools hand out 32 streams per priority round-robin") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  std::set<std::int64_t> ids;
  std::set<std::uintptr_t> handles;
  std::vector<Stream> first;
  for (int i = 0; i < SimStreams::kStreamsPerPool; ++i) {
    Stream s = st.pool_stream(0);
    first.push_back(s);
    ids.insert(s.id);
    handles.insert(st.handle(s).value);
  }
  CHECK(ids.size() == 32);
  CHECK(handles.size() == 32);
  CHECK(st.pool_stream(0) == first[0]);  // wrapped around
  CHECK(st.priority_range(0) == std::pair<int, int>{-2, 0});
  Stream urgent = st.pool_stream(0, -1);
  Stream most = st.pool_stream(0, -2);
  CHECK(detail::stream_level(urgent.id) == 1);
  CHECK(detail::stream_level(most.id) == 2);
  CHECK(detail::stream_level(st.pool_stream(0, -10).id) == 2);  // clamped like torch.cuda
  CHECK(detail::stream_level(st.pool_stream(0, 3).id) == 0);
  CHECK(handles.count(st.handle(urgent).value) == 0);
}

TEST_CASE("streams: priorities given as levels map PyTorch's numbers as CUDA's do") {
  simdev::Config c = sim();
  c.priority_levels = 3;  // an OpenCL-like runtime: hints as levels 0 (default) .. 2
  SimBackend b(Environment::fixed({}), c);
  CHECK(b.properties(0).stream_priorities.lowest == 0);
  CHECK(b.properties(0).stream_priorities.highest == 2);
  SimStreams st(b);
  CHECK(st.priority_range(0) == std::pair<int, int>{-2, 0});
  auto level = [&](Stream s) { return b.runtime().stream_priority(0, st.handle(s)); };
  CHECK(level(st.pool_stream(0)) == 0);
  CHECK(level(st.pool_stream(0, -1)) == 1);
  CHECK(level(st.pool_stream(0, -2)) == 2);
  CHECK(level(st.pool_stream(0, -9)) == 2);  // clamped like torch.cuda
  CHECK(level(st.pool_stream(0, 4)) == 0);
  CHECK(level(st.create_stream(0, -1)) == 1);
  // CUDA's style, for comparison: the same PyTorch numbers, the driver's own.
  SimBackend cuda_like(Environment::fixed({}), sim());
  SimStreams cs(cuda_like);
  CHECK(cuda_like.runtime().stream_priority(0, cs.handle(cs.pool_stream(0, -1))) == -1);
  CHECK(cuda_like.runtime().stream_priority(0, cs.handle(cs.pool_stream(0, -2))) == -2);
}

TEST_CASE("streams: work on one stream runs in order, off the calling thread") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream s = st.pool_stream(0);
  Buffers buf(b, 0, 4096, 3);
  buf.fill(0, 'a');
  buf.fill(1, 'x');
  buf.fill(2, 'y');
  auto gate = b.runtime().hold(0, st.handle(s));
  b.memcpy_async(0, buf.ptrs[1], buf.ptrs[0], 4096, CopyKind::device_to_device, st.handle(s), false);
  b.memcpy_async(0, buf.ptrs[2], buf.ptrs[1], 4096, CopyKind::device_to_device, st.handle(s), false);
  CHECK_FALSE(st.query(s));  // queued behind the gate
  CHECK(buf.first(2) == 'y');
  gate->open();
  st.synchronize(s);
  CHECK(st.query(s));
  CHECK(buf.first(2) == 'a');  // the second copy saw the first's result
}

TEST_CASE("streams: an event orders work across streams") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream s1 = st.pool_stream(0);
  Stream s2 = st.pool_stream(0);
  Buffers buf(b, 0, 4096, 3);
  buf.fill(0, 'a');
  buf.fill(1, 'x');
  buf.fill(2, 'y');
  auto gate = b.runtime().hold(0, st.handle(s1));
  b.memcpy_async(0, buf.ptrs[1], buf.ptrs[0], 4096, CopyKind::device_to_device, st.handle(s1), false);
  SimEvent e(st);
  e.record(s1);
  e.block(s2);
  b.memcpy_async(0, buf.ptrs[2], buf.ptrs[1], 4096, CopyKind::device_to_device, st.handle(s2), false);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK_FALSE(e.query());
  CHECK_FALSE(st.query(s2));  // s2 waits for s1's event
  CHECK(buf.first(2) == 'y');
  gate->open();
  st.synchronize(s2);
  CHECK(e.query());
  CHECK(buf.first(2) == 'a');
}

TEST_CASE("streams: wait_stream orders one stream after another") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream s1 = st.create_stream(0);
  Stream s2 = st.create_stream(0, -1);
  Buffers buf(b, 0, 1 << 16, 2);
  buf.fill(0, 'q');
  buf.fill(1, 'z');
  auto gate = b.runtime().hold(0, st.handle(s1));
  st.wait_stream(s2, s1);
  b.memcpy_async(0, buf.ptrs[1], buf.ptrs[0], 1 << 16, CopyKind::device_to_device,
                 st.handle(s2), false);
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  CHECK(buf.first(1) == 'z');
  gate->open();
  st.device_synchronize(0);
  CHECK(buf.first(1) == 'q');
  st.destroy_stream(s1);
  st.destroy_stream(s2);
}

TEST_CASE("events: never recorded counts as complete; pooled, not created per use") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  {
    SimEvent e(st);
    CHECK_FALSE(e.was_recorded());
    CHECK(e.query());
    CHECK_NOTHROW(e.synchronize());
    CHECK_NOTHROW(e.block(st.default_stream(0)));
  }
  Stream s = st.pool_stream(0);
  long before = b.runtime().events_created();
  for (int i = 0; i < 100; ++i) {
    SimEvent e(st);
    e.record(s);
    e.synchronize();
    CHECK(e.query());
  }
  CHECK(b.runtime().events_created() - before == 1);
}

TEST_CASE("events: elapsed time is positive and monotonic for real work") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream s = st.pool_stream(0);
  SimEvent start(st, EventFlags::timing), middle(st, EventFlags::timing),
      end(st, EventFlags::timing);
  // Each wait below starts after the earlier record has completed, so the
  // intervals hold however late the stream's worker runs on a loaded machine.
  start.record(s);
  start.synchronize();
  auto gate = b.runtime().hold(0, st.handle(s));
  middle.record(s);
  auto gate2 = b.runtime().hold(0, st.handle(s));
  end.record(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  gate->open();
  middle.synchronize();
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  gate2->open();
  float a = start.elapsed_time(middle);
  float c = start.elapsed_time(end);
  CHECK(a >= 2.0f);
  CHECK(c > a);
  CHECK(middle.elapsed_time(end) >= 2.0f);
}

TEST_CASE("events: elapsed time errors name what is missing") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream s0 = st.pool_stream(0);
  Stream s1 = st.pool_stream(1);
  SimEvent plain(st), timed(st, EventFlags::timing), unrecorded(st, EventFlags::timing),
      other(st, EventFlags::timing);
  plain.record(s0);
  timed.record(s0);
  other.record(s1);
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const ValueError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(contains(error_of([&] { plain.elapsed_time(timed); }), "timing enabled"));
  CHECK(contains(error_of([&] { timed.elapsed_time(unrecorded); }), "recorded first"));
  CHECK(contains(error_of([&] { timed.elapsed_time(other); }),
                 "elapsed_time between events of simdev:0 and simdev:1"));
  CHECK(contains(error_of([&] { timed.record(s1); }),
                 "an event of simdev:0 cannot be recorded on pool stream"));
  timed.block(s1);  // across devices, no error (Note [Cross-device waits])
  timed.synchronize();  // still usable after the errors
  CHECK(timed.query());
}

TEST_CASE("streams: use after destroy or after a device reset is a clear error") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  Stream mine = st.create_stream(0);
  CHECK(st.query(mine));
  st.destroy_stream(mine);
  try {
    st.query(mine);
    FAIL("a destroyed stream was usable");
  } catch (const RuntimeError& e) {
    CHECK(contains(e.what(), "simdev: stream 0x"));
    CHECK(contains(e.what(), "of simdev:0 was destroyed"));
  }
  CHECK_THROWS_AS(st.destroy_stream(mine), RuntimeError);
  CHECK_THROWS_AS(st.destroy_stream(st.pool_stream(0)), ValueError);

  Stream pooled = st.pool_stream(0);
  SimEvent e(st);
  e.record(pooled);
  e.synchronize();
  st.reset_device(0);
  try {
    st.synchronize(pooled);
    FAIL("a stream from before the reset was usable");
  } catch (const RuntimeError& err) {
    CHECK(contains(err.what(), "belongs to the device before it was reset"));
  }
  CHECK_THROWS_AS(e.query(), RuntimeError);
  CHECK_THROWS_AS(st.set_current_stream(pooled), RuntimeError);
  Stream fresh = st.pool_stream(0);  // the device works after the reset
  CHECK(st.query(fresh));
  CHECK(st.generation(0) == 1);
  CHECK(st.query(st.default_stream(1)));  // other devices untouched
}

TEST_CASE("streams: vendor streams are wrapped without taking ownership") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  StreamHandle native = b.stream_create(1, 0);
  Stream wrapped = st.wrap_external(1, native);
  CHECK(st.handle(wrapped) == native);
  st.set_current_stream(wrapped);
  CHECK(st.current_stream(1) == wrapped);
  CHECK(st.query(wrapped));
  st.destroy_stream(wrapped);                  // forgets it...
  CHECK_NOTHROW(b.stream_query(1, native));    // ...but the vendor's stream lives on
  CHECK_THROWS_AS(st.query(wrapped), RuntimeError);
  b.stream_destroy(1, native);
}

TEST_CASE("events: moving an event keeps its record") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  SimEvent a(st, EventFlags::timing);
  a.record(st.pool_stream(0));
  SimEvent moved(std::move(a));
  CHECK(moved.was_recorded());
  CHECK_FALSE(a.was_recorded());
  CHECK(a.query());
  moved.synchronize();
  CHECK(moved.query());
}

TEST_CASE("streams: the memory pool orders stream uses with the stream layer's events") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  DeviceCachingAllocator<simdev::SimRuntime> alloc(b, 0, AllocatorConfig{},
                                                   st.events(0, EventFlags::none));
  Stream s1 = st.pool_stream(0);
  Stream s2 = st.pool_stream(0);
  long before = b.runtime().events_created();
  for (int i = 0; i < 50; ++i) {
    void* p = alloc.allocate(4096, st.handle(s1));
    alloc.record_stream(p, st.handle(s2));
    alloc.deallocate(p);
    st.wait_stream(s1, s2);  // the stream layer takes events from the same pool
    st.synchronize(s2);
  }
  CHECK(b.runtime().events_created() - before <= 2);
  CHECK(st.events(0, EventFlags::none).created() <= 2);
  CHECK_THROWS_AS(DeviceCachingAllocator<simdev::SimRuntime>(b, 1, AllocatorConfig{},
                                                             st.events(0, EventFlags::none)),
                  ValueError);
}

TEST_CASE("streams: CachingAllocator can take every device's events from the stream layer") {
  SimBackend b(Environment::fixed({}), sim());
  SimStreams st(b);
  CachingAllocator<simdev::SimRuntime> pool(
      b, AllocatorConfig{}, [&](device_index d) { return &st.events(d, EventFlags::none); });
  Stream s1 = st.pool_stream(1);
  Stream s2 = st.pool_stream(1);
  void* p = pool.allocate(1, 1 << 12, st.handle(s1));
  pool.record_stream(1, p, st.handle(s2));
  pool.deallocate(1, p);
  CHECK(st.events(1, EventFlags::none).created() == 1);  // the free's event came from here
  st.synchronize(s2);
}
