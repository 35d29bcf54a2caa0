// The caching allocator's memory history (memory/history.hpp, Note [History
// contexts]), its snapshot entries and JSON, and its out-of-memory observers
// and message (Note [Out-of-memory message]), on simdev.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using namespace accelkit_tests;
using memory_constants::kMiB;
using SimBackend = Backend<simdev::SimRuntime>;
using Allocator = DeviceCachingAllocator<simdev::SimRuntime>;
using A = TraceEntry::Action;

namespace {

// A context as a gatherer captures it: numbered, and counted while alive.
std::atomic<int> live_contexts{0};
struct FakeContext : HistoryContext {
  explicit FakeContext(int n) : id(n) { ++live_contexts; }
  ~FakeContext() override { --live_contexts; }
  int id;
};

// A cheap gatherer that counts its calls.
struct CountingGatherer {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  ContextGatherer fn() const {
    auto c = calls;
    return [c] { return std::make_shared<FakeContext>(++*c); };
  }
};

int id_of(const std::shared_ptr<HistoryContext>& c) {
  auto* f = dynamic_cast<FakeContext*>(c.get());
  return f ? f->id : 0;
}

std::vector<A> actions(const std::vector<TraceEntry>& t) {
  std::vector<A> out;
  for (const TraceEntry& e : t) out.push_back(e.action);
  return out;
}

auto addr(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }

const BlockSnapshot* block_at(const MemorySnapshot& s, const void* p) {
  for (const SegmentSnapshot& seg : s.segments)
    for (const BlockSnapshot& b : seg.blocks)
      if (b.address == addr(p)) return &b;
  return nullptr;
}

}  // namespace

TEST_CASE("history: a known sequence on two streams gives CUDA's trace in order") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s1 = b.stream_create(0, 0);
  StreamHandle s2 = b.stream_create(0, 0);
  a.record_history(HistoryOptions{});

  void* small = a.allocate(4000, s1);      // a 2 MiB small segment on s1
  void* large = a.allocate(12 * kMiB, s2);  // its own 12 MiB segment on s2
  a.record_stream(small, s2);
  auto gate = b.runtime().hold(0, s2);
  a.deallocate(small);  // queued behind s2's use

  MemorySnapshot snap = a.snapshot();
  const BlockSnapshot* pending = block_at(snap, small);
  REQUIRE(pending);
  CHECK(pending->state == "active_pending_free");
  CHECK(pending->requested_size == 4000);
  CHECK(block_at(snap, large)->state == "active_allocated");

  gate->open();
  b.stream_synchronize(0, s2);
  a.deallocate(large);
  a.empty_cache();  // completes the queued free, then returns both segments
  snap = a.snapshot();
  CHECK(snap.segments.empty());

  std::vector<TraceEntry> t = snap.trace;
  REQUIRE(t.size() == 12);
  std::vector<A> expected_head = {A::segment_alloc, A::alloc,          A::segment_alloc,
                                  A::alloc,         A::free_requested, A::snapshot,
                                  A::free_requested, A::free_completed, A::free_completed};
  std::vector<A> got = actions(t);
  CHECK(std::vector<A>(got.begin(), got.begin() + 9) == expected_head);
  CHECK(t[9].action == A::segment_free);
  CHECK(t[10].action == A::segment_free);
  CHECK(t[11].action == A::snapshot);

  CHECK(t[0].size == 2 * kMiB);
  CHECK(t[0].stream == s1);
  CHECK(t[1].address == addr(small));
  CHECK(t[1].size == 4000);  // the bytes asked for, as CUDA records
  CHECK(t[1].stream == s1);
  CHECK(t[2].size == 12 * kMiB);
  CHECK(t[2].stream == s2);
  CHECK(t[3].address == addr(large));
  CHECK(t[3].stream == s2);
  CHECK(t[4].address == addr(small));
  CHECK(t[4].size == 4000);
  CHECK(t[5].size == 4096 + 12 * kMiB);  // active bytes when the snapshot was taken
  CHECK(t[6].address == addr(large));
  CHECK(t[7].address == addr(large));    // the large free completes at once
  CHECK(t[8].address == addr(small));    // the queued one at empty_cache
  CHECK(t[8].size == 4000);
  CHECK(t[8].stream == s1);
  std::vector<std::size_t> freed = {t[9].size, t[10].size};
  std::sort(freed.begin(), freed.end());
  CHECK(freed == std::vector<std::size_t>{2 * kMiB, 12 * kMiB});
  for (const TraceEntry& e : t) {
    CHECK(e.pool_id == MempoolId{});
    CHECK(e.context == nullptr);  // no gatherer
  }
  for (std::size_t i = 1; i < t.size(); ++i) CHECK(t[i - 1].time_ns <= t[i].time_ns);
}

TEST_CASE("history: entries of a private pool carry its id") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  a.record_history(HistoryOptions{});
  MempoolId id{0, 7};
  a.create_pool(id);
  a.begin_allocate_to_pool(id, [](StreamHandle) { return true; });
  void* p = a.allocate(1 * kMiB + 512, s);
  a.end_allocate_to_pool(id);
  void* q = a.allocate(4096, s);
  a.deallocate(p);
  a.deallocate(q);
  a.release_pool(id);
  MemorySnapshot snap = a.snapshot();
  bool saw_private_alloc = false, saw_default_alloc = false;
  for (const TraceEntry& e : snap.trace) {
    if (e.action == A::alloc && e.address == addr(p)) {
      CHECK(e.pool_id == id);
      saw_private_alloc = true;
    }
    if (e.action == A::alloc && e.address == addr(q)) {
      CHECK(e.pool_id == MempoolId{});
      saw_default_alloc = true;
    }
    if ((e.action == A::free_requested || e.action == A::free_completed) &&
        e.address == addr(p))
      CHECK(e.pool_id == id);
  }
  CHECK(saw_private_alloc);
  CHECK(saw_default_alloc);
}

TEST_CASE("history: max_entries keeps the newest entries, oldest dropped") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  HistoryOptions o;
  o.max_entries = 5;
  a.record_history(o);
  std::vector<void*> ptrs;
  for (int i = 0; i < 6; ++i) ptrs.push_back(a.allocate(512 * (i + 1), s));
  // 1 segment_alloc + 6 allocs recorded; the ring keeps the last 5 (the
  // snapshot's own entry included).
  MemorySnapshot snap = a.snapshot();
  REQUIRE(snap.trace.size() == 5);
  CHECK(actions(snap.trace) == std::vector<A>{A::alloc, A::alloc, A::alloc, A::alloc, A::snapshot});
  for (int i = 0; i < 4; ++i) {
    CHECK(snap.trace[static_cast<std::size_t>(i)].address == addr(ptrs[static_cast<std::size_t>(i + 2)]));
    CHECK(snap.trace[static_cast<std::size_t>(i)].size == 512u * static_cast<unsigned>(i + 3));
  }
  // Wrapping many times over keeps order.
  for (int i = 0; i < 103; ++i) a.deallocate(a.allocate(1024, s));
  snap = a.snapshot();
  REQUIRE(snap.trace.size() == 5);
  CHECK(actions(snap.trace) ==
        std::vector<A>{A::free_completed, A::alloc, A::free_requested, A::free_completed, A::snapshot});
  for (std::size_t i = 1; i < 5; ++i) CHECK(snap.trace[i - 1].time_ns <= snap.trace[i].time_ns);

  // A smaller max_entries keeps the newest of what was recorded;
  // clear_history drops them.
  o.max_entries = 2;
  a.record_history(o);
  snap = a.snapshot();
  CHECK(actions(snap.trace) == std::vector<A>{A::snapshot, A::snapshot});
  o.clear_history = true;
  a.record_history(o);
  snap = a.snapshot();
  CHECK(actions(snap.trace) == std::vector<A>{A::snapshot});
  for (void* p : ptrs) a.deallocate(p);
}

TEST_CASE("history: enabled=state keeps live blocks' contexts and no trace") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  CountingGatherer g;
  HistoryOptions o;
  o.enabled = HistoryRecord::state;
  o.context = HistoryContexts::state;
  o.gather = g.fn();
  a.record_history(o);
  void* p = a.allocate(4096, s);
  void* q = a.allocate(16 * kMiB, s);
  CHECK(*g.calls == 2);  // one per allocation; none at frees at this level
  MemorySnapshot snap = a.snapshot();
  CHECK(snap.trace.empty());
  CHECK(id_of(block_at(snap, p)->context) == 1);
  CHECK(id_of(block_at(snap, q)->context) == 2);
  a.deallocate(p);
  CHECK(*g.calls == 2);
  snap = a.snapshot();
  CHECK(block_at(snap, p)->context == nullptr);  // dropped when freed
  CHECK(id_of(block_at(snap, q)->context) == 2);
  a.deallocate(q);
  a.empty_cache();
  snap = {};
  CHECK(live_contexts == 0);  // none kept once blocks and segments are gone
}

TEST_CASE("history: the context level decides which entries carry a context") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  CountingGatherer g;
  HistoryOptions o;
  o.gather = g.fn();

  SECTION("state: contexts on live blocks, none in the trace") {
    o.context = HistoryContexts::state;
    a.record_history(o);
    void* p = a.allocate(4096, s);
    MemorySnapshot snap = a.snapshot();
    CHECK(id_of(block_at(snap, p)->context) == 1);
    for (const TraceEntry& e : snap.trace) CHECK(e.context == nullptr);
    a.deallocate(p);
    CHECK(*g.calls == 1);
  }
  SECTION("alloc: alloc and segment entries carry the allocation's; frees carry it too") {
    o.context = HistoryContexts::alloc;
    a.record_history(o);
    void* p = a.allocate(4096, s);
    a.deallocate(p);
    CHECK(*g.calls == 1);  // nothing gathered at the free
    MemorySnapshot snap = a.snapshot();
    REQUIRE(actions(snap.trace) == std::vector<A>{A::segment_alloc, A::alloc, A::free_requested,
                                                  A::free_completed, A::snapshot});
    for (std::size_t i = 0; i < 4; ++i) CHECK(id_of(snap.trace[i].context) == 1);
    CHECK(snap.trace[4].context == nullptr);
    CHECK(id_of(snap.segments.at(0).context) == 1);  // the segment's allocation
  }
  SECTION("all: frees carry the context gathered at the free") {
    o.context = HistoryContexts::all;
    a.record_history(o);
    void* p = a.allocate(4096, s);
    a.deallocate(p);
    CHECK(*g.calls == 2);
    a.empty_cache();
    CHECK(*g.calls == 3);
    MemorySnapshot snap = a.snapshot();
    REQUIRE(actions(snap.trace) == std::vector<A>{A::segment_alloc, A::alloc, A::free_requested,
                                                  A::free_completed, A::segment_free,
                                                  A::snapshot});
    CHECK(id_of(snap.trace[1].context) == 1);
    CHECK(id_of(snap.trace[2].context) == 2);
    CHECK(id_of(snap.trace[3].context) == 2);
    CHECK(id_of(snap.trace[4].context) == 3);  // empty_cache's
  }
  SECTION("none: nothing gathered") {
    o.context = HistoryContexts::none;
    a.record_history(o);
    a.deallocate(a.allocate(4096, s));
    CHECK(*g.calls == 0);
    CHECK(a.snapshot().trace.size() == 5);
  }
}

TEST_CASE("history: contexts of small and large blocks follow allocation and free") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle other = b.stream_create(0, 0);
  CountingGatherer g;
  HistoryOptions o;
  o.context = HistoryContexts::state;
  o.gather = g.fn();
  a.record_history(o);
  std::vector<void*> small, large;
  for (int i = 0; i < 8; ++i) small.push_back(a.allocate(1024 * static_cast<std::size_t>(i + 1), s));
  for (int i = 0; i < 3; ++i) large.push_back(a.allocate(3 * kMiB, s));
  MemorySnapshot snap = a.snapshot();
  for (std::size_t i = 0; i < small.size(); ++i)
    CHECK(id_of(block_at(snap, small[i])->context) == static_cast<int>(i + 1));
  for (std::size_t i = 0; i < large.size(); ++i)
    CHECK(id_of(block_at(snap, large[i])->context) == static_cast<int>(i + 9));
  // A free queued behind another stream keeps its context until it completes.
  a.record_stream(small[0], other);
  auto gate = b.runtime().hold(0, other);
  a.deallocate(small[0]);
  snap = a.snapshot();
  CHECK(block_at(snap, small[0])->state == "active_pending_free");
  CHECK(id_of(block_at(snap, small[0])->context) == 1);
  gate->open();
  b.stream_synchronize(0, other);
  for (void* p : small) a.deallocate(p == small[0] ? nullptr : p);
  for (void* p : large) a.deallocate(p);
  a.empty_cache();
  CHECK(a.snapshot().segments.empty());
  snap = {};
  CHECK(live_contexts == 0);
  // The same address allocated again gets the new context, not a stale one.
  void* p = a.allocate(1024, s);
  CHECK(id_of(block_at(a.snapshot(), p)->context) == 12);
  a.deallocate(p);
}

TEST_CASE("history: skip_actions leaves those actions out") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  HistoryOptions o;
  o.skip_actions = {A::alloc, A::free_requested, A::snapshot};
  a.record_history(o);
  a.deallocate(a.allocate(4096, s));
  a.empty_cache();
  CHECK(actions(a.snapshot().trace) ==
        std::vector<A>{A::segment_alloc, A::free_completed, A::segment_free});
}

TEST_CASE("history: recording off gathers and records nothing") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  CHECK(a.snapshot().trace.empty());  // never started
  CountingGatherer g;
  HistoryOptions o;
  o.gather = g.fn();
  a.record_history(o);
  void* p = a.allocate(4096, s);
  CHECK(*g.calls == 1);
  HistoryOptions off;
  off.enabled = HistoryRecord::off;
  off.gather = g.fn();
  a.record_history(off);
  a.deallocate(p);
  a.deallocate(a.allocate(8 * kMiB, s));
  a.empty_cache();
  CHECK(*g.calls == 1);
  MemorySnapshot snap = a.snapshot();
  CHECK(snap.trace.empty());
  CHECK(live_contexts == 0);
}

TEST_CASE("history: the gatherer runs outside every allocator lock") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  // A gatherer that takes every pool's lock itself: it would deadlock if
  // called with one held.
  std::atomic<int> calls{0};
  HistoryOptions o;
  o.gather = [&]() -> std::shared_ptr<HistoryContext> {
    (void)a.stats();
    return std::make_shared<FakeContext>(++calls);
  };
  a.record_history(o);
  void* p = a.allocate(4096, s);
  void* q = a.allocate(12 * kMiB, s);
  a.deallocate(p);
  a.deallocate(q);
  a.empty_cache();
  CHECK(calls == 5);
  o.enabled = HistoryRecord::off;
  a.record_history(o);
}

TEST_CASE("history: recording while other threads allocate, free and take snapshots") {
  SimBackend b(Environment::fixed({}), sim(1, 256));
  Allocator a(b, 0, AllocatorConfig{});
  CountingGatherer g;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      StreamHandle s = b.stream_create(0, 0);
      std::vector<void*> held;
      for (int i = 0; i < 3000; ++i) {
        held.push_back(a.allocate(static_cast<std::size_t>(512 + (i * 7919 + t) % 3000000), s));
        if (held.size() > 8) {
          a.deallocate(held.front());
          held.erase(held.begin());
        }
      }
      for (void* p : held) a.deallocate(p);
    });
  std::atomic<std::size_t> longest{0};
  std::thread toggler([&] {
    for (int i = 0; !stop; ++i) {
      HistoryOptions o;
      o.enabled = i % 3 == 0 ? HistoryRecord::off : i % 3 == 1 ? HistoryRecord::state : HistoryRecord::all;
      o.max_entries = 64;
      o.gather = g.fn();
      a.record_history(o);
      MemorySnapshot snap = a.snapshot();
      longest = std::max(longest.load(), snap.trace.size());
      (void)to_json(snap);
    }
  });
  for (std::thread& t : threads) t.join();
  stop = true;
  toggler.join();
  CHECK(longest <= 64);
  HistoryOptions off;
  off.enabled = HistoryRecord::off;
  a.record_history(off);
  a.empty_cache();
  CHECK(a.stats().allocated_bytes[0].current == 0);
  CHECK(live_contexts == 0);
}

TEST_CASE("history: out-of-memory observers get the figures, then the error is thrown") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  a.record_history(HistoryOptions{});
  std::vector<OomInfo> seen;
  std::vector<int> order;
  a.attach_oom_observer([&](const OomInfo& i) {
    order.push_back(1);
    seen.push_back(i);
    throw std::runtime_error("an observer that throws");
  });
  a.attach_oom_observer([&](const OomInfo& i) {
    order.push_back(2);
    seen.push_back(i);
    (void)a.stats();  // no allocator lock is held
  });
  void* big = a.allocate(50 * kMiB, s);
  void* small = a.allocate(4096, s);  // a small segment, mostly free
  std::string message;
  try {
    a.allocate(30 * kMiB, s);
    FAIL("allocation beyond capacity succeeded");
  } catch (const OutOfMemoryError& e) {
    message = e.what();
  }
  REQUIRE(order == std::vector<int>{1, 2});
  std::size_t device_free = b.memory_info(0).free;
  for (const OomInfo& i : seen) {
    CHECK(i.device == 0);
    CHECK(i.requested == 30 * kMiB);
    CHECK(i.allocated == 50 * kMiB + 4096);
    CHECK(i.device_free == device_free);
  }
  CHECK(contains(message, "tried to allocate 30.00 MiB"));
  CHECK(contains(message, "The device has 64.00 MiB in total, " +
                              detail::format_bytes(device_free) + " free"));
  CHECK(contains(message, "52.00 MiB reserved, 50.00 MiB of it allocated"));
  // Reserved but unallocated: the small segment's free remainder, also the
  // largest free cached block.
  std::string rest = detail::format_bytes(2 * kMiB - 4096);
  CHECK(contains(message, rest + " is reserved but unallocated"));
  CHECK(contains(message, "the largest free cached block is " + rest));
  CHECK(contains(message, "torch.simdev.memory._record_memory_history()"));
  CHECK(contains(message, "SIMDEV_ALLOC_CONF="));
  if (detail::has_virtual_memory<simdev::SimRuntime>)
    CHECK(contains(message, "SIMDEV_ALLOC_CONF=expandable_segments:True"));
  MemorySnapshot snap = a.snapshot();
  auto oom = std::find_if(snap.trace.begin(), snap.trace.end(),
                          [](const TraceEntry& e) { return e.action == A::oom; });
  REQUIRE(oom != snap.trace.end());
  CHECK(oom->size == 30 * kMiB);
  CHECK(oom->device_free == device_free);
  CHECK(oom->stream == s);
  std::string json = to_json(snap);
  CHECK(contains(json, "\"action\": \"oom\""));
  CHECK(contains(json, "\"device_free\": " + std::to_string(device_free)));
  a.deallocate(small);
  a.deallocate(big);
  CHECK(a.stats().num_ooms == 1);
}

TEST_CASE("history: JSON has PyTorch's fields, frames from the caller's writer") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig{});
  StreamHandle s = b.stream_create(0, 0);
  CountingGatherer g;
  HistoryOptions o;
  o.gather = g.fn();
  a.record_history(o);
  void* p = a.allocate(4096, s);
  MemorySnapshot snap = a.snapshot();
  std::string plain = to_json(snap);
  for (const char* field :
       {"\"segment_pool_id\": [", "\"expandable\": false", "\"frames\": []", "\"time_us\": ",
        "\"pool_id\": [", "\"state\": \"active_allocated\"", "\"action\": \"snapshot\""})
    CHECK(contains(plain, field));
  CHECK(!contains(plain, "device_free"));
  int written = 0, null_contexts = 0;
  std::string framed = to_json(snap, [&](detail::JsonWriter& w, const HistoryContext* c) {
    ++written;
    w.begin_array();
    if (auto* f = dynamic_cast<const FakeContext*>(c)) {
      w.begin_object()
          .field("filename", "x.py")
          .field("line", f->id)
          .field("name", "f")
          .end_object();
    } else {
      ++null_contexts;
    }
    w.end_array();
  });
  CHECK(contains(framed, "\"filename\": \"x.py\""));
  // One "frames" per segment, block and trace entry.
  std::size_t blocks = 0;
  for (const SegmentSnapshot& seg : snap.segments) blocks += seg.blocks.size();
  CHECK(written == static_cast<int>(snap.segments.size() + blocks + snap.trace.size()));
  CHECK(null_contexts > 0);  // free blocks and the snapshot entry
  a.deallocate(p);
}

TEST_CASE("history: an expandable segment shows as one, its pages as segment_map/segment_unmap") {
  if (!detail::has_virtual_memory<simdev::SimRuntime>) {
    WARN("simdev has no virtual-memory members: nothing to check");
    return;
  }
  SimBackend b(Environment::fixed({}), sim(1, 64));
  Allocator a(b, 0, AllocatorConfig::parse("simdev", "SIMDEV_ALLOC_CONF", "expandable_segments:True"));
  StreamHandle s = b.stream_create(0, 0);
  a.record_history(HistoryOptions{});
  void* p = a.allocate(6 * kMiB, s);
  MemorySnapshot snap = a.snapshot();
  const SegmentSnapshot* seg = nullptr;
  for (const SegmentSnapshot& g : snap.segments)
    if (g.segment_type == "large") seg = &g;
  REQUIRE(seg);
  CHECK(seg->expandable);
  CHECK(contains(to_json(snap), "\"expandable\": true"));
  auto mapped = std::find_if(snap.trace.begin(), snap.trace.end(),
                             [](const TraceEntry& e) { return e.action == A::segment_map; });
  REQUIRE(mapped != snap.trace.end());
  CHECK(mapped->size >= 6 * kMiB);
  CHECK(mapped->stream == s);
  a.deallocate(p);
  a.empty_cache();
  snap = a.snapshot();
  CHECK(std::any_of(snap.trace.begin(), snap.trace.end(),
                    [](const TraceEntry& e) { return e.action == A::segment_unmap; }));
}
