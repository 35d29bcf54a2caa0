// Expandable segments of the caching device allocator (Note [Expandable
// segments]) on simdev, whose virtual memory is strict (Note [simdev virtual
// memory]): unmapping pages that queued work still uses is refused, and a
// page unmapped is unreadable.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "minimal_runtime.hpp"
#include "simdev_runtime.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;
using SimBackend = Backend<simdev::SimRuntime>;
using Allocator = DeviceCachingAllocator<simdev::SimRuntime>;

using namespace accelkit_tests;
namespace {
constexpr auto all = static_cast<std::size_t>(StatType::aggregate);
constexpr auto large = static_cast<std::size_t>(StatType::large_pool);
constexpr auto kPage = 2 * kMiB;  // simdev's granularity

simdev::Config sized(std::uint64_t mib) {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {mib << 20};
  return c;
}
AllocatorConfig expandable(const std::string& more = "") {
  return AllocatorConfig::parse("simdev", "SIMDEV_ALLOC_CONF",
                                "expandable_segments:True" + (more.empty() ? "" : "," + more));
}
char* at(void* p, std::size_t off) { return static_cast<char*>(p) + off; }

// Reserved memory is what the driver holds for the allocator (mapped pages
// and small segments), and the statistics agree with each other.
void check_held(SimBackend& b, Allocator& a) {
  DeviceStats s = a.stats();
  CHECK(s.reserved_bytes[all].current == static_cast<std::int64_t>(a.reserved_bytes()));
  CHECK(b.raw_bytes_held(0) == a.reserved_bytes());
  CHECK(s.allocated_bytes[all].current + s.inactive_split_bytes[all].current <=
        s.reserved_bytes[all].current);
}

// The snapshot's segment holding `p`, or nullptr.
const SegmentSnapshot* segment_of(const MemorySnapshot& snap, const void* p) {
  auto addr = reinterpret_cast<std::uintptr_t>(p);
  for (const SegmentSnapshot& s : snap.segments)
    if (addr >= s.address && addr - s.address < s.total_size) return &s;
  return nullptr;
}

// Opens `gate` after `ms` milliseconds, from another thread.
std::thread open_later(std::shared_ptr<simdev::SimRuntime::Gate> gate, int ms) {
  return std::thread([gate, ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    gate->open();
  });
}
}  // namespace

TEST_CASE("expandable segments: a request maps only the pages it lacks, and the segment grows in place") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  void* p = a.allocate(3 * kMiB, s);
  CHECK(a.reserved_bytes() == 2 * kPage);  // 3 MiB: two pages
  void* q = a.allocate(3 * kMiB, s);       // 1 MiB free at the end: one page more
  CHECK(q == at(p, 3 * kMiB));
  CHECK(a.reserved_bytes() == 3 * kPage);
  MemorySnapshot snap = a.snapshot();
  REQUIRE(snap.segments.size() == 1);
  CHECK(snap.segments[0].expandable);
  CHECK(snap.segments[0].total_size == 3 * kPage);  // its mapped bytes
  CHECK(snap.segments[0].segment_type == "large");
  CHECK(a.stats().segment[large].current == 1);
  check_held(b, a);
  a.deallocate(q);
  a.deallocate(p);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
  CHECK(a.stats().segment[all].current == 0);
  check_held(b, a);
}

TEST_CASE("expandable segments: the fragmentation workload reserves at most 1.25x its peak") {
  SimBackend b(Environment::fixed({}), sized(512));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  std::vector<void*> ps;
  for (int i = 0; i < 8; ++i) ps.push_back(a.allocate(16 * kMiB, s));
  for (void* p : ps) a.deallocate(p);
  ps.clear();
  for (int i = 0; i < 4; ++i) ps.push_back(a.allocate(32 * kMiB, s));
  auto peak = static_cast<double>(a.stats().reserved_bytes[all].peak);
  CHECK(peak <= 1.25 * 128 * kMiB);  // 2.00x with fixed segments
  for (void* p : ps) a.deallocate(p);
  check_held(b, a);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: empty_cache unmaps the free end only after the work queued on it") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  char* kept = static_cast<char*>(a.allocate(4 * kMiB, s));
  char* freed = static_cast<char*>(a.allocate(6 * kMiB, s));
  REQUIRE(freed == kept + 4 * kMiB);  // one segment, grown in place
  CHECK(a.reserved_bytes() == 10 * kMiB);
  // Work on the stream, held back, still writes the freed block's pages
  // when the cache is emptied: simdev refuses to unmap them until it ran.
  auto gate = b.runtime().hold(0, s);
  std::atomic<bool> ran{false};
  b.runtime().launch(
      0, s, "fill",
      [&] {
        std::memset(freed, 7, 6 * kMiB);
        ran = true;
      },
      {{freed, 6 * kMiB}});
  a.deallocate(freed);  // stream-ordered: the work is ahead of any reuse
  std::thread opener = open_later(gate, 100);
  a.empty_cache();  // waits for the stream, then unmaps the three pages
  opener.join();
  CHECK(ran);
  CHECK(a.reserved_bytes() == 4 * kMiB);  // the segment shrank around `kept`
  MemorySnapshot snap = a.snapshot();
  REQUIRE(snap.segments.size() == 1);
  CHECK(snap.segments[0].total_size == 4 * kMiB);
  CHECK(segment_of(snap, kept) != nullptr);
  CHECK(a.stats().num_device_free >= 1);
  check_held(b, a);
  // It grows again at the same end.
  void* again = a.allocate(6 * kMiB, s);
  CHECK(again == freed);
  CHECK(a.reserved_bytes() == 10 * kMiB);
  std::memset(again, 1, 6 * kMiB);  // mapped again: writable
  a.deallocate(again);
  a.deallocate(kept);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
  check_held(b, a);
}

TEST_CASE("expandable segments: free interior pages move to the growing end while the stream is idle") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  char* x = static_cast<char*>(a.allocate(4 * kMiB, s));
  char* hole = static_cast<char*>(a.allocate(4 * kMiB, s));
  char* z = static_cast<char*>(a.allocate(4 * kMiB, s));
  REQUIRE(z == x + 8 * kMiB);
  a.deallocate(hole);
  // 6 MiB fit in no free block: the free block's two pages move to the end
  // and one page is new.
  char* d = static_cast<char*>(a.allocate(6 * kMiB, s));
  CHECK(d == z + 4 * kMiB);
  CHECK(a.reserved_bytes() == 14 * kMiB);
  CHECK(a.stats().allocated_bytes[all].current == 14 * static_cast<std::int64_t>(kMiB));
  check_held(b, a);
  std::memset(d, 3, 6 * kMiB);  // mapped
  CHECK_FALSE(a.contains(hole));  // unmapped: not memory the allocator holds
  CHECK(a.contains(x + 4 * kMiB - 1));
  // The snapshot shows a segment per run of mapped pages, as CUDA's: the
  // hole's bytes are in none of them.
  {
    MemorySnapshot snap = a.snapshot();
    std::vector<std::pair<std::uintptr_t, std::size_t>> runs;
    std::size_t total = 0;
    for (const SegmentSnapshot& seg : snap.segments) {
      CHECK(seg.expandable);
      std::size_t blocks = 0;
      for (const BlockSnapshot& blk : seg.blocks) {
        CHECK((blk.address + blk.size <= reinterpret_cast<std::uintptr_t>(hole) ||
               blk.address >= reinterpret_cast<std::uintptr_t>(hole + 4 * kMiB)));
        blocks += blk.size;
      }
      CHECK(blocks == seg.total_size);
      runs.emplace_back(seg.address, seg.total_size);
      total += seg.total_size;
    }
    CHECK(total == a.reserved_bytes());
    CHECK(runs == std::vector<std::pair<std::uintptr_t, std::size_t>>{
                      {reinterpret_cast<std::uintptr_t>(x), 4 * kMiB},
                      {reinterpret_cast<std::uintptr_t>(z), 10 * kMiB}});
  }
  // The hole's addresses are not handed out again.
  void* e = a.allocate(2 * kMiB, s);
  CHECK((static_cast<char*>(e) < hole || static_cast<char*>(e) >= hole + 4 * kMiB));
  a.deallocate(e);
  a.deallocate(d);
  a.deallocate(x);
  a.deallocate(z);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
  CHECK(b.raw_bytes_held(0) == 0);
  check_held(b, a);
}

TEST_CASE("expandable segments: growth starts a request on a page boundary when that maps no more pages") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  char* x = static_cast<char*>(a.allocate(3 * kMiB, s));  // two pages, 1 MiB free at the end
  // Two pages either way: the free MiB stays free below the boundary.
  char* y = static_cast<char*>(a.allocate(4 * kMiB, s));
  CHECK(y == x + 4 * kMiB);
  CHECK(a.reserved_bytes() == 8 * kMiB);
  char* z = static_cast<char*>(a.allocate(4 * kMiB, s));
  CHECK(z == x + 8 * kMiB);
  CHECK(a.reserved_bytes() == 12 * kMiB);
  a.deallocate(y);
  // y's two whole pages move to the end, one page is new (were y at x +
  // 3 MiB, only one of its pages would be whole: two new).
  char* w = static_cast<char*>(a.allocate(6 * kMiB, s));
  CHECK(w == x + 12 * kMiB);
  CHECK(a.reserved_bytes() == 14 * kMiB);
  check_held(b, a);
  std::memset(w, 1, 6 * kMiB);  // mapped
  // The MiB below the boundary serves a smaller request.
  void* v = a.allocate(kMiB, s);
  CHECK(v == x + 3 * kMiB);
  a.deallocate(v);
  a.deallocate(w);
  a.deallocate(z);
  a.deallocate(x);
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
  check_held(b, a);
}

TEST_CASE("expandable segments: free pages that queued work may use do not move") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  char* x = static_cast<char*>(a.allocate(4 * kMiB, s));
  char* used = static_cast<char*>(a.allocate(4 * kMiB, s));
  char* z = static_cast<char*>(a.allocate(4 * kMiB, s));
  REQUIRE(z == x + 8 * kMiB);
  auto gate = b.runtime().hold(0, s);
  std::atomic<bool> ran{false};
  b.runtime().launch(
      0, s, "fill",
      [&] {
        std::memset(used, 5, 4 * kMiB);
        ran = true;
      },
      {{used, 4 * kMiB}});
  a.deallocate(used);  // stream-ordered: the fill is still queued
  char* d = static_cast<char*>(a.allocate(6 * kMiB, s));
  CHECK(d == z + 4 * kMiB);
  CHECK(a.reserved_bytes() == 18 * kMiB);  // three new pages: none moved
  gate->open();
  b.stream_synchronize(0, s);
  CHECK(ran);
  check_held(b, a);
  a.deallocate(d);
  a.deallocate(x);
  a.deallocate(z);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: a block used on another stream is unmapped after that stream's work") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s1 = b.stream_create(0, 0);
  StreamHandle s2 = b.stream_create(0, 0);
  char* kept = static_cast<char*>(a.allocate(2 * kMiB, s1));
  char* used = static_cast<char*>(a.allocate(4 * kMiB, s1));
  REQUIRE(used == kept + 2 * kMiB);
  a.record_stream(used, s2);
  auto gate = b.runtime().hold(0, s2);
  std::atomic<bool> ran{false};
  b.runtime().launch(
      0, s2, "read",
      [&] {
        volatile char c = used[4 * kMiB - 1];
        static_cast<void>(c);
        ran = true;
      },
      {{used, 4 * kMiB}});
  a.deallocate(used);  // pending on s2's event
  CHECK(a.reserved_bytes() == 6 * kMiB);
  std::thread opener = open_later(gate, 100);
  a.empty_cache();  // waits for s2's event, then unmaps the pages
  opener.join();
  CHECK(ran);
  CHECK(a.reserved_bytes() == 2 * kMiB);
  check_held(b, a);
  a.deallocate(kept);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: the out-of-memory retry takes free end pages from other streams") {
  SimBackend b(Environment::fixed({}), sized(32));
  Allocator a(b, 0, expandable());
  StreamHandle s1 = b.stream_create(0, 0);
  StreamHandle s2 = b.stream_create(0, 0);
  char* kept = static_cast<char*>(a.allocate(4 * kMiB, s1));
  char* spare = static_cast<char*>(a.allocate(20 * kMiB, s1));
  REQUIRE(spare == kept + 4 * kMiB);
  a.deallocate(spare);  // cached by s1's pool, at its segment's end
  void* p = a.allocate(20 * kMiB, s2);  // no room until s1's end pages go back
  CHECK(p != nullptr);
  CHECK(a.stats().num_alloc_retries == 1);
  CHECK(a.reserved_bytes() == 24 * kMiB);
  check_held(b, a);
  a.deallocate(p);
  a.deallocate(kept);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: garbage collection takes free end pages back before growing") {
  SimBackend b(Environment::fixed({}), sized(64));
  Allocator a(b, 0, expandable("garbage_collection_threshold:0.5"));
  StreamHandle s1 = b.stream_create(0, 0);
  StreamHandle s2 = b.stream_create(0, 0);
  char* kept = static_cast<char*>(a.allocate(4 * kMiB, s1));
  char* spare = static_cast<char*>(a.allocate(20 * kMiB, s1));
  REQUIRE(spare == kept + 4 * kMiB);
  a.deallocate(spare);
  void* p = a.allocate(10 * kMiB, s2);  // 24 + 10 MiB would pass 32 MiB
  CHECK(a.stats().num_alloc_retries == 0);
  CHECK(a.reserved_bytes() == 14 * kMiB);
  check_held(b, a);
  a.deallocate(p);
  a.deallocate(kept);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: vm_map refused mid-growth: a DriverError, nothing leaked") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  void* first = a.allocate(3 * kMiB, s);  // two pages
  std::uint64_t held = b.raw_bytes_held(0);
  std::uint64_t free_before = b.memory_info(0).free;
  b.runtime().inject_fault("vm_map", 2);  // the second page of the next growth
  CHECK(driver_code([&] { a.allocate(7 * kMiB, s); }) == simdev::kInjectedFault);
  CHECK(b.raw_bytes_held(0) == held);
  CHECK(b.memory_info(0).free == free_before);
  CHECK(a.reserved_bytes() == held);
  CHECK(a.stats().allocated_bytes[all].current == 3 * static_cast<std::int64_t>(kMiB));
  check_held(b, a);
  // Usable after: the same request grows the same segment in place.
  void* p = a.allocate(7 * kMiB, s);
  CHECK(p == at(first, 3 * kMiB));
  a.deallocate(p);
  a.deallocate(first);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: vm_create failing mid-growth: a DriverError, nothing leaked") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  b.runtime().inject_fault("vm_create", 3);
  CHECK(driver_code([&] { a.allocate(9 * kMiB, s); }) == simdev::kInjectedFault);
  CHECK(b.raw_bytes_held(0) == 0);
  CHECK(a.reserved_bytes() == 0);
  CHECK(a.stats().segment[all].current == 0);
  check_held(b, a);
  void* p = a.allocate(9 * kMiB, s);
  a.deallocate(p);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: vm_create without room mid-growth: the cache goes back, then OutOfMemoryError") {
  SimBackend b(Environment::fixed({}), sized(16));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  // A refusal (a null handle) with memory free at the second page: the
  // first page is undone, and the retry serves the request.
  b.runtime().inject_refusal(2, "vm_create");
  void* p = a.allocate(6 * kMiB, s);
  CHECK(a.stats().num_alloc_retries == 1);
  CHECK(a.reserved_bytes() == 6 * kMiB);
  check_held(b, a);
  // Someone else's memory leaves room for two of the three pages.
  void* other = b.raw_malloc(0, 6 * kMiB);
  std::uint64_t held = b.raw_bytes_held(0);
  std::string message;
  try {
    a.allocate(6 * kMiB, s);
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  REQUIRE_FALSE(message.empty());
  // The message does not suggest the setting already on.
  CHECK(message.find("expandable_segments") == std::string::npos);
  CHECK(message.find("max_split_size_mb") != std::string::npos);
  CHECK(b.raw_bytes_held(0) == held);  // the two pages made for it are gone
  CHECK(a.reserved_bytes() == 6 * kMiB);
  CHECK(a.stats().num_ooms == 1);
  CHECK(a.stats().num_alloc_retries == 2);
  b.raw_free(0, other, 6 * kMiB);
  check_held(b, a);
  void* r = a.allocate(6 * kMiB, s);  // usable: the segment grows in place
  CHECK(r == at(p, 6 * kMiB));
  a.deallocate(r);
  a.deallocate(p);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
  check_held(b, a);
}

TEST_CASE("expandable segments: a private pool grows its own segment and gives it back at release") {
  SimBackend b(Environment::fixed({}), sized(256));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  constexpr MempoolId kPool{1, 0};
  void* outside = a.allocate(4 * kMiB, s);
  a.begin_allocate_to_pool(kPool, [s](StreamHandle x) { return x == s; });
  void* p = a.allocate(3 * kMiB, s);
  void* q = a.allocate(3 * kMiB, s);
  a.end_allocate_to_pool(kPool);
  CHECK(q == at(p, 3 * kMiB));  // the pool's own segment, grown in place
  MemorySnapshot snap = a.snapshot();
  const SegmentSnapshot* seg = segment_of(snap, p);
  REQUIRE(seg != nullptr);
  CHECK(seg->pool_id == kPool);
  CHECK(seg->expandable);
  CHECK(segment_of(snap, outside) != seg);
  CHECK(a.stats(kPool).reserved_bytes[all].current == 6 * static_cast<std::int64_t>(kMiB));
  a.deallocate(q);
  a.empty_cache();  // a pool in use keeps its memory
  CHECK(a.stats(kPool).reserved_bytes[all].current == 6 * static_cast<std::int64_t>(kMiB));
  a.release_pool(kPool);  // q's end pages go back at once; p's at its free
  CHECK(a.stats(kPool).reserved_bytes[all].current == 4 * static_cast<std::int64_t>(kMiB));
  a.deallocate(p);
  CHECK(a.pool_use_count(kPool) == 0);
  CHECK(a.reserved_bytes() == 4 * kMiB);  // `outside` alone
  check_held(b, a);
  a.deallocate(outside);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: small requests keep their 2 MiB segments") {
  SimBackend b(Environment::fixed({}), sized(64));
  Allocator a(b, 0, expandable());
  StreamHandle s = b.stream_create(0, 0);
  void* small = a.allocate(4096, s);
  void* big = a.allocate(4 * kMiB, s);
  MemorySnapshot snap = a.snapshot();
  REQUIRE(snap.segments.size() == 2);
  CHECK(segment_of(snap, small)->segment_type == "small");
  CHECK_FALSE(segment_of(snap, small)->expandable);
  CHECK(segment_of(snap, big)->expandable);
  a.deallocate(small);
  a.deallocate(big);
  a.empty_cache();
  CHECK(b.raw_bytes_held(0) == 0);
}

TEST_CASE("expandable segments: a runtime without the virtual-memory members refuses the setting") {
  using MinimalBackend = Backend<minimal::MinimalRuntime>;
  STATIC_REQUIRE_FALSE(MinimalBackend::has_virtual_memory());
  MinimalBackend m(Environment::fixed({}));
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const NotSupportedError& e) {
      return e.what();
    }
    return "";
  };
  std::string why = message(
      [&] { DeviceCachingAllocator<minimal::MinimalRuntime> a(m, 0, expandable()); });
  CHECK(contains(why, "minimal"));
  CHECK(contains(why, "expandable_segments"));
  CHECK(contains(why, "vm_reserve"));
  CHECK(contains(why, "vm_map"));
  DeviceCachingAllocator<minimal::MinimalRuntime> a(m, 0, AllocatorConfig{});
  CHECK_FALSE(message([&] { a.set_config(expandable()); }).empty());
  CHECK_FALSE(a.config().expandable_segments);  // nothing changed
  void* p = a.allocate(4 * kMiB, StreamHandle{});
  a.deallocate(p);
}
