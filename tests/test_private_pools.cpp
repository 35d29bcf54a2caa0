// Private pools of the caching device allocator (Note [Private pools]) and
// its behaviour while a stream captures (Note [Frees during capture]), on
// simdev.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;
using SimBackend = Backend<simdev::SimRuntime>;
using Allocator = DeviceCachingAllocator<simdev::SimRuntime>;

using namespace accelkit_tests;
namespace {
simdev::Config sized(std::uint64_t mib = 64) {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {mib << 20};
  return c;
}
AllocatorConfig conf(const std::string& text) {
  return AllocatorConfig::parse("simdev", "SIMDEV_ALLOC_CONF", text);
}
constexpr auto all = static_cast<std::size_t>(StatType::aggregate);
constexpr MempoolId kGraph{1, 0};
constexpr MempoolId kOther{2, 0};
constexpr MempoolId kUser{0, 1};

auto on(StreamHandle s) {
  return [s](StreamHandle x) { return x == s; };
}

std::int64_t reserved(Allocator& a, MempoolId id) {
  return a.stats(id).reserved_bytes[all].current;
}

// The pool id of the segment that holds `p`; {~0, ~0} if none does.
MempoolId pool_of(Allocator& a, const void* p) {
  auto addr = reinterpret_cast<std::uintptr_t>(p);
  for (const SegmentSnapshot& s : a.snapshot().segments)
    if (addr >= s.address && addr - s.address < s.total_size) return s.pool_id;
  return {~std::uint64_t{0}, ~std::uint64_t{0}};
}

// The figures of every pool add up to the device's, and reserved memory
// matches what the allocator holds.
void check_sums(Allocator& a, const std::vector<MempoolId>& ids) {
  DeviceStats whole = a.stats();
  DeviceStats parts = a.stats(MempoolId{});
  for (MempoolId id : ids) parts.merge(a.stats(id));
  CHECK(whole.reserved_bytes[all].current == parts.reserved_bytes[all].current);
  CHECK(whole.allocated_bytes[all].current == parts.allocated_bytes[all].current);
  CHECK(whole.active[all].current == parts.active[all].current);
  CHECK(whole.reserved_bytes[all].current == static_cast<std::int64_t>(a.reserved_bytes()));
}

// A capture of `s` that must end cleanly: the allocator never invalidated it.
struct Capture {
  SimBackend& b;
  StreamHandle s;
  bool open = true;
  Capture(SimBackend& backend, StreamHandle stream, CaptureMode mode = CaptureMode::global)
      : b(backend), s(stream) {
    b.stream_begin_capture(0, s, mode);
  }
  void end() {
    open = false;
    GraphHandle g = b.stream_end_capture(0, s);  // throws if it was invalidated
    b.graph_destroy(0, g);
  }
  ~Capture() {
    if (!open) return;
    try {
      b.graph_destroy(0, b.stream_end_capture(0, s));
    } catch (...) {
    }
  }
};
}  // namespace

TEST_CASE("private pools: use counts, and the ids and calls refused") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  CHECK(a.pool_use_count(kGraph) == 0);
  CHECK_THROWS_AS(a.create_pool(MempoolId{}), ValueError);
  CHECK_THROWS_AS(a.begin_allocate_to_pool(MempoolId{}, on(s)), ValueError);
  CHECK_THROWS_AS(a.begin_allocate_to_pool(kGraph, nullptr), ValueError);
  CHECK(a.pool_use_count(kGraph) == 0);  // a refused begin adds no use
  try {
    a.release_pool(kGraph);
    FAIL("releasing an unknown pool succeeded");
  } catch (const ValueError& e) {
    CHECK(contains(e.what(), "release_pool on simdev:0: pool (1, 0) is not a private pool in use"));
  }
  CHECK_THROWS_AS(a.release_pool(MempoolId{}), ValueError);
  CHECK_THROWS_AS(a.end_allocate_to_pool(kGraph), ValueError);

  a.create_pool(kGraph);
  CHECK(a.pool_use_count(kGraph) == 1);
  a.begin_allocate_to_pool(kGraph, on(s));  // a use, as create_pool
  CHECK(a.pool_use_count(kGraph) == 2);
  a.end_allocate_to_pool(kGraph);  // no decref
  CHECK(a.pool_use_count(kGraph) == 2);
  CHECK_THROWS_AS(a.end_allocate_to_pool(kGraph), ValueError);  // no route left
  a.release_pool(kGraph);
  CHECK(a.pool_use_count(kGraph) == 1);
  a.release_pool(kGraph);
  CHECK(a.pool_use_count(kGraph) == 0);
  CHECK_THROWS_AS(a.release_pool(kGraph), ValueError);  // no use left to drop
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("private pools: a route sends the filter's streams to the pool, and only them") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  void* routed_small = a.allocate(1000, s);
  void* routed_large = a.allocate(3 * kMiB, s);
  void* eager = a.allocate(1000, t);
  CHECK(pool_of(a, routed_small) == kGraph);
  CHECK(pool_of(a, routed_large) == kGraph);
  CHECK(pool_of(a, eager) == MempoolId{});
  DeviceStats ps = a.stats(kGraph);
  CHECK(ps.allocation[all].current == 2);
  CHECK(ps.requested_bytes[all].current == static_cast<std::int64_t>(1000 + 3 * kMiB));
  CHECK(a.stats(MempoolId{}).allocation[all].current == 1);
  CHECK(a.stats().allocation[all].current == 3);
  a.end_allocate_to_pool(kGraph);
  void* after = a.allocate(1000, s);  // no route: the stream's own pool
  CHECK(pool_of(a, after) == MempoolId{});
  check_sums(a, {kGraph});
  for (void* p : {routed_small, routed_large, eager, after}) a.deallocate(p);
  a.release_pool(kGraph);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("private pools: the route begun last is asked first, and a pool is reused by id") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  a.begin_allocate_to_pool(kOther, on(s));
  void* p = a.allocate(4096, s);
  CHECK(pool_of(a, p) == kOther);
  a.end_allocate_to_pool(kOther);
  void* q = a.allocate(4096, s);
  CHECK(pool_of(a, q) == kGraph);
  a.end_allocate_to_pool(kGraph);
  a.deallocate(p);
  a.deallocate(q);
  a.release_pool(kOther);
  CHECK(a.pool_use_count(kOther) == 0);
  CHECK(a.stats(kOther).reserved_bytes[all].current == 0);  // forgotten: zeros
  a.release_pool(kGraph);
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("private pools: freed blocks go back to their pool only, never to a stream's pool") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  for (std::size_t size : {std::size_t{1000}, 4 * kMiB}) {
    CAPTURE(size);
    a.begin_allocate_to_pool(kGraph, on(s));
    void* during = a.allocate(size, s);
    a.deallocate(during);                 // freed while routed
    CHECK(a.allocate(size, s) == during);  // the pool reuses it
    a.end_allocate_to_pool(kGraph);
    a.deallocate(during);  // freed after the route ended
    void* eager = a.allocate(size, s);
    CHECK(eager != during);  // the stream's pool never got it
    CHECK(pool_of(a, eager) == MempoolId{});
    a.begin_allocate_to_pool(kGraph, on(s));
    void* again = a.allocate(size, s);
    CHECK(again == during);  // still the pool's
    a.end_allocate_to_pool(kGraph);
    a.deallocate(again);
    a.deallocate(eager);
    a.release_pool(kGraph);
    a.release_pool(kGraph);
    CHECK(a.pool_use_count(kGraph) == 0);
    a.empty_cache();
    CHECK(a.reserved_bytes() == 0);
  }
}

TEST_CASE("private pools: a stream's cached blocks never serve a routed request") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  void* small = a.allocate(1000, s);
  void* large = a.allocate(4 * kMiB, s);
  a.deallocate(small);
  a.deallocate(large);  // both cached in s's pool
  std::int64_t stream_reserved = reserved(a, MempoolId{});
  a.begin_allocate_to_pool(kGraph, on(s));
  void* p = a.allocate(1000, s);
  void* q = a.allocate(4 * kMiB, s);
  CHECK(p != small);
  CHECK(q != large);
  CHECK(pool_of(a, p) == kGraph);
  CHECK(pool_of(a, q) == kGraph);
  CHECK(a.stats(kGraph).num_device_alloc == 2);  // its own segments
  CHECK(reserved(a, MempoolId{}) == stream_reserved);
  a.end_allocate_to_pool(kGraph);
  a.deallocate(p);
  a.deallocate(q);
  a.release_pool(kGraph);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("private pools: memory stays reserved while in use and goes back at use count 0") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  void* small = a.allocate(1000, s);
  void* large = a.allocate(4 * kMiB, s);
  void* kept = a.allocate(12 * kMiB, s);  // a segment of its own, still allocated at release
  a.end_allocate_to_pool(kGraph);
  a.deallocate(small);
  a.deallocate(large);
  std::int64_t pool_reserved = reserved(a, kGraph);
  CHECK(pool_reserved > 0);
  a.empty_cache();  // every free segment but the pool's in use
  CHECK(reserved(a, kGraph) == pool_reserved);
  a.empty_cache(kGraph);  // reserved while in use
  CHECK(reserved(a, kGraph) == pool_reserved);
  CHECK(static_cast<std::int64_t>(a.reserved_bytes()) == pool_reserved);
  std::int64_t frees = a.stats(kGraph).num_device_free;

  a.release_pool(kGraph);  // use count 0: the free segments go at once
  CHECK(a.pool_use_count(kGraph) == 0);
  CHECK(a.reserved_bytes() == 12 * kMiB);
  CHECK(reserved(a, kGraph) == static_cast<std::int64_t>(12 * kMiB));
  CHECK(a.stats(kGraph).num_device_free == frees + 2);
  a.deallocate(kept);  // the rest as its blocks are freed
  CHECK(a.reserved_bytes() == 0);
  CHECK(a.stats(kGraph).reserved_bytes[all].current == 0);
  DeviceStats st = a.stats();  // the pool's totals stay in the device's
  CHECK(st.allocation[all].allocated == 3);
  CHECK(st.num_device_free == st.num_device_alloc);
}

TEST_CASE("private pools: blocks of a released pool freed after other streams' uses go at the next empty_cache") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  void* p = a.allocate(4 * kMiB, s);
  a.end_allocate_to_pool(kGraph);
  a.record_stream(p, t);
  a.release_pool(kGraph);
  CHECK(a.reserved_bytes() > 0);
  auto gate = b.runtime().hold(0, t);
  a.deallocate(p);  // pending on t
  CHECK(a.reserved_bytes() > 0);
  gate->open();
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
  CHECK(a.pool_use_count(kGraph) == 0);
}

TEST_CASE("private pools: two graphs share a pool, use count 2") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  // The first graph's capture: its output stays, its temporary is freed.
  a.begin_allocate_to_pool(kGraph, on(s));
  void* out1 = a.allocate(4 * kMiB, s);
  void* tmp = a.allocate(4 * kMiB, s);
  a.deallocate(tmp);
  a.end_allocate_to_pool(kGraph);
  std::int64_t after_first = reserved(a, kGraph);
  // The second graph's capture, sharing the pool: it reuses the freed block.
  a.begin_allocate_to_pool(kGraph, on(s));
  CHECK(a.pool_use_count(kGraph) == 2);
  void* out2 = a.allocate(4 * kMiB, s);
  CHECK(out2 == tmp);
  a.end_allocate_to_pool(kGraph);
  CHECK(reserved(a, kGraph) == after_first);  // no new memory
  a.deallocate(out1);
  a.deallocate(out2);
  a.release_pool(kGraph);  // the first graph goes: the second still uses the pool
  CHECK(a.pool_use_count(kGraph) == 1);
  a.empty_cache();
  CHECK(reserved(a, kGraph) == after_first);
  a.release_pool(kGraph);
  CHECK(a.pool_use_count(kGraph) == 0);
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("private pools: out of memory while routed, consistent, and the pool's memory back at release") {
  SimBackend b(Environment::fixed({}), sized(64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  void* cached = a.allocate(20 * kMiB, t);
  a.deallocate(cached);  // t's cache: returned by the retry
  a.begin_allocate_to_pool(kGraph, on(s));
  void* p = a.allocate(30 * kMiB, s);
  void* q = a.allocate(20 * kMiB, s);  // fits once t's cache is returned
  CHECK(pool_of(a, q) == kGraph);
  CHECK(a.stats(kGraph).num_alloc_retries == 1);
  CHECK_THROWS_AS(a.allocate(30 * kMiB, s), OutOfMemoryError);
  DeviceStats ps = a.stats(kGraph);
  CHECK(ps.num_ooms == 1);
  CHECK(ps.allocation[all].current == 2);
  CHECK(ps.allocated_bytes[all].current == static_cast<std::int64_t>(50 * kMiB));
  CHECK(a.stats().num_ooms == 1);
  check_sums(a, {kGraph});
  a.end_allocate_to_pool(kGraph);
  a.deallocate(p);
  a.deallocate(q);
  CHECK(a.reserved_bytes() == 50 * kMiB);  // reserved while in use
  // The pool's free memory is not for others while it is in use.
  CHECK_THROWS_AS(a.allocate(30 * kMiB, t), OutOfMemoryError);
  CHECK(a.stats(MempoolId{}).num_ooms == 1);
  a.release_pool(kGraph);
  CHECK(a.reserved_bytes() == 0);
  void* whole = a.allocate(60 * kMiB, t);  // the device's memory is whole again
  a.deallocate(whole);
}

TEST_CASE("private pools: a pool serving two streams reuses each block in its own stream's order") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kUser, [](StreamHandle) { return true; });  // this thread, say
  void* on_s = a.allocate(4096, s);
  void* on_t = a.allocate(4096, t);
  CHECK(pool_of(a, on_s) == kUser);
  CHECK(pool_of(a, on_t) == kUser);
  auto gate = b.runtime().hold(0, t);  // t has not passed the free
  a.deallocate(on_t);
  void* next = a.allocate(4096, s);
  CHECK(next != on_t);  // s is not ordered after t's work
  CHECK(a.allocate(4096, t) == on_t);  // t's own order: reused at once
  gate->open();
  a.end_allocate_to_pool(kUser);
  for (void* p : {on_s, next, on_t}) a.deallocate(p);
  b.stream_synchronize(0, t);
  a.release_pool(kUser);
  CHECK(a.reserved_bytes() == 0);
  CHECK(a.pool_use_count(kUser) == 0);
}

TEST_CASE("private pools: snapshot segments carry their pool id, in the JSON as segment_pool_id") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  void* eager = a.allocate(1000, s);
  a.begin_allocate_to_pool(MempoolId{7, 0}, on(s));
  void* routed = a.allocate(4 * kMiB, s);
  a.end_allocate_to_pool(MempoolId{7, 0});
  MemorySnapshot snap = a.snapshot();
  REQUIRE(snap.segments.size() == 2);
  int graph_segments = 0;
  for (const SegmentSnapshot& seg : snap.segments)
    if (seg.pool_id == MempoolId{7, 0}) ++graph_segments;
  CHECK(graph_segments == 1);
  std::string json = to_json(snap);
  CHECK(contains(json, "\"segment_pool_id\": [\n        7,\n        0\n      ]"));
  CHECK(contains(json, "\"segment_pool_id\": [\n        0,\n        0\n      ]"));
  a.deallocate(eager);
  a.deallocate(routed);
  a.release_pool(MempoolId{7, 0});
}

TEST_CASE("private pools: statistics per pool, and the device's totals keep a forgotten pool's") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  void* eager = a.allocate(2 * kMiB + 512, t);
  a.create_pool(kUser);
  a.begin_allocate_to_pool(kGraph, on(s));
  a.begin_allocate_to_pool(kUser, [&](StreamHandle x) { return x == t; });
  void* g = a.allocate(3 * kMiB, s);
  void* u = a.allocate(1000, t);
  a.end_allocate_to_pool(kUser);
  a.end_allocate_to_pool(kGraph);
  CHECK(a.pool_use_count(kUser) == 2);
  DeviceStats gs = a.stats(kGraph), us = a.stats(kUser), ds = a.stats(MempoolId{});
  CHECK(gs.allocated_bytes[all].current == static_cast<std::int64_t>(3 * kMiB));
  CHECK(us.allocated_bytes[all].current == 1024);
  CHECK(ds.allocated_bytes[all].current == static_cast<std::int64_t>(2 * kMiB + 512));
  CHECK(us.segment[static_cast<std::size_t>(StatType::small_pool)].current == 1);
  CHECK(gs.segment[static_cast<std::size_t>(StatType::large_pool)].current == 1);
  CHECK(a.stats(MempoolId{99, 0}).allocation[all].allocated == 0);  // unknown: zeros
  check_sums(a, {kGraph, kUser});
  a.deallocate(g);
  a.deallocate(u);
  a.release_pool(kGraph);
  a.release_pool(kUser);
  a.release_pool(kUser);
  CHECK(a.stats(kGraph).allocation[all].allocated == 0);  // forgotten
  DeviceStats st = a.stats();
  CHECK(st.allocation[all].allocated == 3);  // the totals never go back
  CHECK(st.allocation[all].freed == 2);
  a.reset_accumulated_stats();
  CHECK(a.stats().allocation[all].allocated == 0);
  a.deallocate(eager);
}

TEST_CASE("private pools: pools made and released in a loop stay consistent") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  for (std::uint64_t n = 1; n <= 50; ++n) {
    MempoolId id{n, 0};
    a.begin_allocate_to_pool(id, on(s));
    void* p = a.allocate(n * 4096, s);
    void* q = a.allocate(n * 64 * 1024, s);
    a.end_allocate_to_pool(id);
    CHECK(pool_of(a, p) == id);
    a.deallocate(p);
    a.release_pool(id);
    CHECK(a.pool_use_count(id) == 0);
    a.deallocate(q);  // the last block: the pool's memory goes
    CHECK(a.reserved_bytes() == 0);
  }
  DeviceStats st = a.stats();
  CHECK(st.allocation[all].allocated == 100);
  CHECK(st.allocation[all].current == 0);
  CHECK(st.num_device_alloc == st.num_device_free);
}

TEST_CASE("private pools: with caching off, routed blocks still count in their pool") {
  SimBackend b(Environment::fixed({}), sized());
  AllocatorConfig config;
  config.caching = false;
  Allocator a(b, 0, config);
  StreamHandle s = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  void* p = a.allocate(4096, s);
  CHECK(a.stats(kGraph).allocation[all].current == 1);
  a.deallocate(p);
  CHECK(a.reserved_bytes() == 0);
  a.end_allocate_to_pool(kGraph);
  a.release_pool(kGraph);
  CHECK(a.pool_use_count(kGraph) == 0);
}

TEST_CASE("private pools: threads allocating on other streams while a route is active") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  constexpr int kThreads = 3;
  std::vector<StreamHandle> streams;
  for (int i = 0; i < kThreads; ++i) streams.push_back(b.stream_create(0, 0));
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::vector<void*>> kept(kThreads);
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      while (!go.load()) std::this_thread::yield();
      std::vector<void*> live;
      unsigned x = 12345u + static_cast<unsigned>(i);
      for (int n = 0; !stop.load() || n < 2000; ++n) {
        x = x * 1103515245u + 12345u;
        std::size_t size = 512 + (x >> 8) % (x & 1 ? 4096 : 3 * kMiB);
        live.push_back(a.allocate(size, streams[static_cast<std::size_t>(i)]));
        if (live.size() > 16) {
          a.deallocate(live.front());
          live.erase(live.begin());
        }
      }
      kept[static_cast<std::size_t>(i)] = std::move(live);
    });
  }
  // One thread per filter kind: this thread's requests on s go to the pool.
  std::thread::id me = std::this_thread::get_id();
  a.begin_allocate_to_pool(kGraph, [s, me](StreamHandle x) {
    return x == s && std::this_thread::get_id() == me;
  });
  go = true;
  std::vector<void*> routed;
  for (int n = 0; n < 300; ++n) {
    routed.push_back(a.allocate(512 + static_cast<std::size_t>(n % 7) * 30000, s));
    if (n % 3 == 0) {
      a.deallocate(routed.back());
      routed.pop_back();
    }
  }
  stop = true;
  for (std::thread& th : threads) th.join();
  a.end_allocate_to_pool(kGraph);
  for (void* p : routed) CHECK(pool_of(a, p) == kGraph);
  for (const auto& live : kept)
    for (void* p : live) CHECK(pool_of(a, p) == MempoolId{});
  // Every allocation the threads made came from their streams' pools: the
  // device's allocations are the pool's plus the streams' pools'.
  CHECK(a.stats(kGraph).allocation[all].current == static_cast<std::int64_t>(routed.size()));
  check_sums(a, {kGraph});
  for (const auto& live : kept)
    for (void* p : live) a.deallocate(p);
  for (void* p : routed) a.deallocate(p);
  a.release_pool(kGraph);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("capture: release paths skip the capturing stream's pool and never invalidate it") {
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::per_thread, CaptureMode::relaxed}) {
    CAPTURE(to_string(mode));
    SimBackend b(Environment::fixed({}), sized(64));
    Allocator a(b, 0, AllocatorConfig{});
    StreamHandle s = b.stream_create(0, 0);
    StreamHandle t = b.stream_create(0, 0);
    a.deallocate(a.allocate(8 * kMiB, s));  // s's cache
    a.deallocate(a.allocate(8 * kMiB, t));  // t's cache
    Capture cap(b, s, mode);
    a.begin_allocate_to_pool(kGraph, on(s));
    a.empty_cache();
    CHECK(reserved(a, MempoolId{}) == static_cast<std::int64_t>(8 * kMiB));  // s's only
    a.deallocate(a.allocate(8 * kMiB, t));
    // The out-of-memory retry, routed: returns t's cache, keeps s's.
    void* big = a.allocate(50 * kMiB, s);
    CHECK(pool_of(a, big) == kGraph);
    CHECK(a.stats(kGraph).num_alloc_retries == 1);
    CHECK(reserved(a, MempoolId{}) == static_cast<std::int64_t>(8 * kMiB));
    a.end_allocate_to_pool(kGraph);
    CHECK_NOTHROW(cap.end());
    a.empty_cache();  // no capture now: s's cache goes
    CHECK(reserved(a, MempoolId{}) == 0);
    a.deallocate(big);
    a.release_pool(kGraph);
    CHECK(a.reserved_bytes() == 0);
  }
}

TEST_CASE("capture: garbage collection skips the capturing stream's pool") {
  SimBackend b(Environment::fixed({}), sized(64));
  Allocator a(b, 0, conf("garbage_collection_threshold:0.5"));
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  a.deallocate(a.allocate(12 * kMiB, s));  // s's cache
  Capture cap(b, s);
  void* y = a.allocate(22 * kMiB, t);  // over the threshold: s's cache would go
  CHECK(reserved(a, MempoolId{}) == static_cast<std::int64_t>(34 * kMiB));
  CHECK_NOTHROW(cap.end());
  a.deallocate(y);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("capture: a free of a block used on a capturing stream waits for the capture's end") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  for (std::size_t size : {std::size_t{4096}, 4 * kMiB}) {
    CAPTURE(size);
    void* p = a.allocate(size, t);
    Capture cap(b, s);
    a.record_stream(p, s);  // used by the captured work
    long events = b.runtime().events_created();
    a.deallocate(p);        // no event may be recorded on s: deferred
    CHECK(a.stats().active[all].current == 1);  // pending, not reusable
    void* other = a.allocate(size, t);
    CHECK(other != p);
    a.empty_cache();  // waits for nothing while capturing
    CHECK(b.runtime().events_created() == events);
    CHECK_NOTHROW(cap.end());
    void* reused = a.allocate(size, t);  // the deferred event, recorded and past
    b.stream_synchronize(0, s);
    if (reused != p) {
      a.deallocate(reused);
      reused = a.allocate(size, t);
    }
    CHECK(reused == p);
    a.deallocate(reused);
    a.deallocate(other);
    a.empty_cache();
    CHECK(a.reserved_bytes() == 0);
  }
}

TEST_CASE("capture: a free of a block used only on non-capturing streams records its event at once") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle t = b.stream_create(0, 0);
  StreamHandle u = b.stream_create(0, 0);
  void* p = a.allocate(4096, t);
  a.record_stream(p, u);
  Capture cap(b, s);
  long events = b.runtime().events_created();
  a.deallocate(p);
  CHECK(b.runtime().events_created() == events + 1);  // recorded on u, at the free
  void* other = a.allocate(4096, t);  // nothing pending is drained while capturing
  CHECK(other != p);
  CHECK_NOTHROW(cap.end());
  b.stream_synchronize(0, u);
  void* reused = a.allocate(4096, t);
  CHECK(reused == p);
  a.deallocate(reused);
  a.deallocate(other);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("capture: a private pool's blocks freed during capture serve the capture again") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  Capture cap(b, s);
  a.begin_allocate_to_pool(kGraph, on(s));
  void* tmp = a.allocate(4 * kMiB, s);
  a.deallocate(tmp);  // freed in stream order on s: the capture may take it again
  void* out = a.allocate(4 * kMiB, s);
  CHECK(out == tmp);
  a.end_allocate_to_pool(kGraph);
  CHECK_NOTHROW(cap.end());
  a.deallocate(out);
  void* eager = a.allocate(4 * kMiB, s);
  CHECK(eager != tmp);  // the pool's, not the stream's
  a.deallocate(eager);
  a.release_pool(kGraph);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("capture: a pool released while its stream captures keeps its memory until later") {
  SimBackend b(Environment::fixed({}), sized());
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  a.begin_allocate_to_pool(kGraph, on(s));
  a.deallocate(a.allocate(4 * kMiB, s));
  a.end_allocate_to_pool(kGraph);
  Capture cap(b, s);  // another capture on the pool's stream
  a.release_pool(kGraph);  // would synchronize s: left for later
  CHECK(a.reserved_bytes() == 4 * kMiB);
  CHECK_NOTHROW(cap.end());
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}
