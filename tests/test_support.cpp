// The helpers of include/accelkit/support/ on their own: handle tables, host
// signal tables, range maps and fake device addresses, with their errors and
// under threads.
#include "catch.hpp"

#include <accelkit/support/address_space.hpp>
#include <accelkit/support/handle_table.hpp>
#include <accelkit/support/host_signals.hpp>
#include <accelkit/support/range_map.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

using accelkit::DriverError;
using accelkit::EventHandle;
using accelkit::SignalHandle;
using accelkit::StreamHandle;
using accelkit::ValueError;
using namespace accelkit::support;

namespace {
constexpr std::int64_t kBadHandle = 400, kBadValue = 1, kTwice = 2, kBusy = 800;

struct Obj {
  int id = 0;
};

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

template <class F>
std::int64_t driver_code(F&& f) {
  try {
    f();
  } catch (const DriverError& e) {
    return e.code();
  }
  return 0;
}
template <class F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// ------------------------------------------------------------ handle tables

TEST_CASE("support: a handle table finds its objects, and a stale handle is a driver error "
          "naming the backend, the call and the handle") {
  HandleTable<StreamHandle, Obj> streams("acme", "stream", kBadHandle);
  StreamHandle a = streams.add(std::make_shared<Obj>(Obj{1}));
  StreamHandle b = streams.add(std::make_shared<Obj>(Obj{2}));
  CHECK(a != b);
  CHECK(streams.get(a, "stream_query")->id == 1);
  CHECK(streams.get(b, "stream_query", 0)->id == 2);
  CHECK(streams.size() == 2);
  std::shared_ptr<Obj> kept = streams.get(a, "stream_query");
  CHECK(streams.remove(a, "stream_destroy")->id == 1);
  CHECK(kept->id == 1);  // alive for whoever found it before the removal
  CHECK(streams.find(a) == nullptr);
  try {
    streams.get(a, "stream_synchronize", 1);
    FAIL("no error");
  } catch (const DriverError& e) {
    CHECK(e.code() == kBadHandle);
    CHECK(e.call() == "stream_synchronize");
    CHECK(contains(e.what(), "acme"));
    CHECK(contains(e.what(), fmt::format("stream {:#x} is not a live stream of device 1",
                                         a.value)));
  }
  CHECK(driver_code([&] { streams.remove(a, "stream_destroy"); }) == kBadHandle);
  CHECK(driver_code([&] { streams.get(StreamHandle{}, "stream_query"); }) == kBadHandle);
  CHECK(streams.objects().size() == 1);
  streams.clear();
  CHECK(streams.size() == 0);
}

TEST_CASE("support: minted handles are never given twice, even when an object's address is "
          "reused") {
  HandleTable<EventHandle, Obj> events("acme", "event", kBadHandle);
  std::set<std::uintptr_t> seen;
  for (int i = 0; i < 1000; ++i) {
    EventHandle h = events.add(std::make_shared<Obj>(Obj{i}));
    CHECK(seen.insert(h.value).second);
    events.remove(h, "event_destroy");  // the next object may take this one's address
    CHECK(driver_code([&] { events.get(h, "event_query"); }) == kBadHandle);
  }
  // Another table of the same kind mints from the same counter.
  HandleTable<EventHandle, Obj> other("other", "event", kBadHandle);
  CHECK(seen.count(other.add(std::make_shared<Obj>()).value) == 0);
}

TEST_CASE("support: a handle table keeps a driver's own handles, refuses one given twice, and "
          "a refused removal keeps the handle") {
  HandleTable<StreamHandle, Obj> streams("acme", "stream", kBadHandle);
  int native = 0;
  StreamHandle h = StreamHandle::from_pointer(&native);
  streams.add(h, std::make_shared<Obj>(Obj{7}));
  CHECK(streams.get(h, "stream_query")->id == 7);
  CHECK_THROWS_AS(streams.add(h, std::make_shared<Obj>()), std::logic_error);
  CHECK(driver_code([&] {
          streams.remove(h, "stream_destroy", -1,
                         [](const Obj&) { throw DriverError("acme", kBusy, "stream_destroy", "busy"); });
        }) == kBusy);
  CHECK(streams.get(h, "stream_query")->id == 7);
  streams.remove(h, "stream_destroy");
  CHECK(streams.size() == 0);
}

TEST_CASE("support: a handle table without a driver code reports a stale handle as a "
          "ValueError") {
  HandleTable<SignalHandle, Obj> table("acme", "signal");
  SignalHandle h = table.add(std::make_shared<Obj>());
  table.remove(h, "signal_destroy");
  try {
    table.get(h, "signal_complete");
    FAIL("no error");
  } catch (const ValueError& e) {
    CHECK(contains(e.what(), "acme"));
    CHECK(contains(e.what(), "signal_complete"));
    CHECK(contains(e.what(), "is not a live signal"));
  }
}

TEST_CASE("support: a handle table under threads: each thread's handles name its own objects "
          "and no value is given twice") {
  HandleTable<StreamHandle, Obj> streams("acme", "stream", kBadHandle);
  constexpr int kThreads = 4, kRounds = 2000;
  std::vector<std::vector<std::uintptr_t>> given(kThreads);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<StreamHandle> mine;
      for (int i = 0; i < kRounds; ++i) {
        StreamHandle h = streams.add(std::make_shared<Obj>(Obj{t * kRounds + i}));
        given[static_cast<std::size_t>(t)].push_back(h.value);
        mine.push_back(h);
        if (streams.get(h, "stream_query")->id != t * kRounds + i) ++wrong;
        if (i % 3 == 2) {  // remove one of the earlier ones
          StreamHandle old = mine[mine.size() - 2];
          streams.remove(old, "stream_destroy");
          if (streams.find(old)) ++wrong;
          mine.erase(mine.end() - 2);
        }
        // A snapshot now and then (each copies the whole table: under
        // ThreadSanitizer one per round made this test take seconds).
        if (i % 64 == 0) (void)streams.objects();
      }
      for (StreamHandle h : mine) streams.remove(h, "stream_destroy");
    });
  for (auto& th : threads) th.join();
  CHECK(wrong == 0);
  CHECK(streams.size() == 0);
  std::set<std::uintptr_t> all;
  for (auto& g : given) all.insert(g.begin(), g.end());
  CHECK(all.size() == static_cast<std::size_t>(kThreads * kRounds));
}

// ------------------------------------------------------- host signal tables

TEST_CASE("support: a host signal releases its waits when completed, with its error") {
  HostSignalTable<> signals("acme", {kBadHandle, kBadValue, kTwice, kBusy});
  SignalHandle g = signals.create(0);
  auto s = signals.get(g, "stream_wait_signal");
  CHECK(s->device() == 0);
  CHECK_FALSE(s->result());
  std::atomic<int> got{-1};
  REQUIRE(s->add_waiter());
  std::thread waiter([&] { got = s->wait(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(got == -1);  // still waiting
  signals.complete(g, 0, 5);
  waiter.join();
  CHECK(got == 5);
  CHECK(s->result() == 5);
  // Completed with an error: a later wait is counted and gets the error at once.
  REQUIRE(s->add_waiter());
  CHECK(s->wait() == 5);
  signals.destroy(g, 0);
  // Completed with success: nothing to wait for, nothing counted.
  SignalHandle h = signals.create(1);
  signals.complete(h, 1, 0);
  CHECK_FALSE(signals.get(h, "stream_wait_signal")->add_waiter());
  signals.destroy(h, 1);
  CHECK(signals.size() == 0);
}

TEST_CASE("support: a host signal table refuses misuse with the runtime's codes") {
  HostSignalTable<> signals("acme", {kBadHandle, kBadValue, kTwice, kBusy});
  SignalHandle g = signals.create(1);
  auto s = signals.get(g, "stream_wait_signal");
  CHECK(driver_code([&] { signals.check_stream_device(*s, 0); }) == kBadValue);
  CHECK_NOTHROW(signals.check_stream_device(*s, 1));
  CHECK(driver_code([&] { signals.complete(g, 0, 0); }) == kBadValue);
  CHECK(driver_code([&] { signals.destroy(g, 0); }) == kBadValue);
  // Waited for and not completed: destroy is refused and the signal stays.
  REQUIRE(s->add_waiter());
  std::string busy = error_text([&] { signals.destroy(g, 1); });
  CHECK(contains(busy, "is not completed and 1 queued wait(s)"));
  CHECK(driver_code([&] { signals.destroy(g, 1); }) == kBusy);
  // A wait that could not be queued is taken back.
  s->cancel_waiter();
  REQUIRE(s->add_waiter());
  signals.complete(g, 1, 0);
  CHECK(driver_code([&] { signals.complete(g, 1, 0); }) == kTwice);
  CHECK(contains(error_text([&] { signals.complete(g, 1, 0); }), "was completed already"));
  signals.destroy(g, 1);  // completed: the pending wait holds its state
  CHECK(s->wait() == 0);
  CHECK(driver_code([&] { signals.get(g, "stream_wait_signal"); }) == kBadHandle);
  CHECK(driver_code([&] { signals.complete(g, 1, 0); }) == kBadHandle);
  CHECK(driver_code([&] { signals.destroy(g, 1); }) == kBadHandle);
  // A signal nobody waits for may go without being completed.
  signals.destroy(signals.create(0), 0);
}

TEST_CASE("support: a host signal's payload runs under its lock at completion, a failure "
          "leaves it uncompleted, and it is released with the last reference") {
  struct Payload {
    std::shared_ptr<int> live;
  };
  HostSignalTable<Payload> signals("acme", {kBadHandle, kBadValue, kTwice, kBusy});
  auto token = std::make_shared<int>(0);
  SignalHandle g = signals.create(0, Payload{token});
  CHECK(token.use_count() == 2);
  CHECK_THROWS_AS(signals.complete(g, 0, 0, [](auto&) { throw std::runtime_error("driver"); }),
                  std::runtime_error);
  auto s = signals.get(g, "stream_wait_signal");
  CHECK_FALSE(s->result());  // still not completed
  signals.complete(g, 0, 3, [](HostSignal<Payload>& sig) { ++*sig.payload().live; });
  CHECK(*token == 1);
  signals.destroy(g, 0);
  CHECK(token.use_count() == 2);  // `s` holds the state
  s.reset();
  CHECK(token.use_count() == 1);
}

TEST_CASE("support: a host signal table without codes (the SDK's own) throws ValueError") {
  HostSignalTable<> signals("plain");
  SignalHandle g = signals.create(0);
  signals.complete(g, 0, 0);
  CHECK_THROWS_AS(signals.complete(g, 0, 0), ValueError);
  signals.destroy(g, 0);
  CHECK_THROWS_AS(signals.destroy(g, 0), ValueError);
  CHECK_THROWS_AS(signals.get(g, "stream_wait_signal"), ValueError);
}

TEST_CASE("support: host signals under threads: every wait is released with its signal's "
          "error") {
  HostSignalTable<> signals("acme", {kBadHandle, kBadValue, kTwice, kBusy});
  constexpr int kSignals = 64, kWaitsEach = 3;
  std::vector<SignalHandle> handles;
  for (int i = 0; i < kSignals; ++i) handles.push_back(signals.create(i % 2));
  std::atomic<int> wrong{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kSignals; ++i)
    for (int k = 0; k < kWaitsEach; ++k) {
      auto s = signals.get(handles[static_cast<std::size_t>(i)], "stream_wait_signal");
      bool counted = s->add_waiter();  // before the completer can complete it
      waiters.emplace_back([&wrong, s, counted, i] {
        int error = counted ? s->wait() : 0;
        if (error != i) ++wrong;
      });
    }
  std::thread completer([&] {
    for (int i = kSignals - 1; i >= 0; --i) {
      signals.complete(handles[static_cast<std::size_t>(i)], i % 2, i);
      signals.destroy(handles[static_cast<std::size_t>(i)], i % 2);
    }
  });
  completer.join();
  for (auto& w : waiters) w.join();
  CHECK(wrong == 0);
  CHECK(signals.size() == 0);
}

// -------------------------------------------------------------- range maps

TEST_CASE("support: a range map finds the range under an address or a span, and refuses "
          "empty, wrapping and overlapping ranges") {
  RangeMap<int> map;
  auto at = [](std::uintptr_t a) { return reinterpret_cast<const void*>(a); };
  REQUIRE(map.insert(at(0x1000), 0x100, 1));
  REQUIRE(map.insert(at(0x1100), 0x100, 2));  // touching is not overlapping
  REQUIRE(map.insert(at(0x2000), 0x10, 3));
  CHECK_FALSE(map.insert(at(0x3000), 0, 4));                   // empty
  CHECK_FALSE(map.insert(at(0x10ff), 2, 4));                   // over 1's end and 2's start
  CHECK_FALSE(map.insert(at(0x0f00), 0x101, 4));               // over 1's start
  CHECK_FALSE(map.insert(at(0x1010), 0x10, 4));                // inside 1
  CHECK_FALSE(map.insert(at(UINTPTR_MAX - 0xf), 0x20, 4));     // wraps
  CHECK(map.insert(at(UINTPTR_MAX - 0xf), 0x10, 5));           // up to the last address
  CHECK(map.size() == 4);

  auto hit = map.find(at(0x1080));
  REQUIRE(hit);
  CHECK(*hit.value == 1);
  CHECK(hit.base == 0x1000);
  CHECK(hit.bytes == 0x100);
  CHECK(hit.offset == 0x80);
  CHECK(*map.find(at(0x1100)).value == 2);          // a start is its own range's
  CHECK(*map.find(at(0x10f0), 0x10).value == 1);    // a span up to the end
  CHECK_FALSE(map.find(at(0x10f0), 0x11));          // one byte into the next range
  CHECK(*map.find(at(0x1200), 0).value == 2);       // an empty span at an end
  CHECK_FALSE(map.find(at(0x1200)));                // the end itself is no byte of it
  CHECK_FALSE(map.find(at(0x0fff)));                // before every range
  CHECK_FALSE(map.find(at(0x1800)));                // in a gap
  CHECK_FALSE(map.find(at(0x1000), std::numeric_limits<std::size_t>::max()));  // overflow
  CHECK(*map.find(at(UINTPTR_MAX)).value == 5);

  CHECK_FALSE(map.at(at(0x1080)));  // at() takes starts only
  CHECK(*map.at(at(0x2000)).value == 3);
  CHECK_FALSE(map.erase(at(0x2001)));
  CHECK(map.erase(at(0x2000)) == 3);
  CHECK_FALSE(map.find(at(0x2000)));
  const RangeMap<int>& view = map;
  CHECK(*view.find(at(0x1001)).value == 1);
  int n = 0;
  view.for_each([&](std::uintptr_t, std::size_t, const int&) { ++n; });
  CHECK(n == 3);
}

// ------------------------------------------------------------ address spaces

TEST_CASE("support: an address space gives each allocation aligned, increasing addresses and "
          "maps any address inside back to (handle, offset)") {
  AddressSpace<int> space("vk", AddressSpaceOptions{});
  char* a = static_cast<char*>(space.map(11, 1000));
  char* b = static_cast<char*>(space.map(22, 4096));
  char* c = static_cast<char*>(space.map(33, 1));
  CHECK(reinterpret_cast<std::uintptr_t>(a) == (std::uintptr_t{1} << 44));
  for (char* p : {a, b, c}) CHECK(reinterpret_cast<std::uintptr_t>(p) % 4096 == 0);
  CHECK(b >= a + 1000 + 4096);  // a gap of one alignment unit at least
  CHECK(c >= b + 4096 + 4096);
  CHECK(space.size() == 3);

  // A view's pointer and a sub-allocation's: offsets from the allocation's start.
  auto at = space.locate(a + 999, 1, "memcpy_async");
  CHECK(at.handle == 11);
  CHECK(at.offset == 999);
  CHECK(at.bytes == 1000);
  at = space.locate(b + 100, 3996, "memcpy_async");
  CHECK(at.handle == 22);
  CHECK(at.offset == 100);
  CHECK(space.locate(a + 1000, 0, "memcpy_async").offset == 1000);  // an empty copy at the end
  CHECK(space.find(c)->handle == 33);
  CHECK_FALSE(space.find(c + 1));

  CHECK(space.unmap(b, "free") == 22);
  CHECK(space.size() == 2);
  // Freed addresses are not given again.
  char* d = static_cast<char*>(space.map(44, 4096));
  CHECK(d > c);
  CHECK_FALSE(space.find(b + 10));
}

TEST_CASE("support: an address space names what is wrong with an address in no allocation") {
  AddressSpaceOptions options;
  options.error_code = 700;
  AddressSpace<int> space("vk", options);
  char* a = static_cast<char*>(space.map(1, 100));
  char* b = static_cast<char*>(space.map(2, 100));
  space.unmap(b, "free");
  auto failure = [&](const void* p, std::size_t n) {
    try {
      space.locate(p, n, "memcpy_async");
    } catch (const DriverError& e) {
      CHECK(e.code() == 700);
      CHECK(e.call() == "memcpy_async");
      CHECK(contains(e.what(), "vk"));
      return std::string(e.what());
    }
    return std::string("no error");
  };
  int host = 0;
  CHECK(contains(failure(&host, 4), "outside vk's device address space"));
  CHECK(contains(failure(a + 100, 1), "run past the end of the allocation"));  // one past
  CHECK(contains(failure(a + 200, 1), "in no live allocation"));  // the gap past a's end
  CHECK(contains(failure(b + 5, 1), "was freed"));
  CHECK(contains(failure(b + (1 << 20), 1), "never given"));
  CHECK(contains(failure(a + 50, 51), "run past the end of the allocation"));
  // free takes the address malloc returned, once.
  CHECK(contains(error_text([&] { space.unmap(a + 1); }), "1 bytes into the allocation"));
  CHECK(contains(error_text([&] { space.unmap(b); }), "was freed"));
  CHECK(space.unmap(a) == 1);
  CHECK(contains(error_text([&] { space.unmap(a); }), "was freed"));
}

TEST_CASE("support: an address space refuses zero bytes, sizes that overflow and a spent "
          "span") {
  AddressSpaceOptions options;
  options.base = 0x10000;
  options.size = 0x10000;  // 64 KiB of addresses
  options.alignment = 0x1000;
  AddressSpace<int> space("vk", options);
  CHECK_THROWS_AS(space.map(1, 0), ValueError);
  CHECK(contains(error_text([&] { space.map(1, 0); }), "zero-byte"));
  CHECK(contains(error_text([&] { space.map(1, std::numeric_limits<std::size_t>::max()); }),
                 "exhausted"));
  CHECK_THROWS_AS(space.map(1, 0x10000), ValueError);  // no room for the gap after it
  void* p = space.map(1, 0xe000);                      // fits, with its gap
  CHECK(reinterpret_cast<std::uintptr_t>(p) == 0x10000);
  CHECK(contains(error_text([&] { space.map(2, 1); }), "exhausted"));
  space.unmap(p);
  CHECK_THROWS_AS(space.map(2, 1), ValueError);  // addresses are not reused
  // A span that would wrap, or is not aligned, is refused when made.
  AddressSpaceOptions wraps;
  wraps.base = UINTPTR_MAX - 0xfff;
  wraps.base &= ~std::uintptr_t{0xfff};
  wraps.size = 0x2000;
  CHECK_THROWS_AS(AddressSpace<int>("vk", wraps), ValueError);
  AddressSpaceOptions unaligned;
  unaligned.base = 0x10100;
  CHECK_THROWS_AS(AddressSpace<int>("vk", unaligned), ValueError);
}

TEST_CASE("support: an address space records ranges the driver placed (a mapped allocation, "
          "pinned host memory) and finds them as it finds its own") {
  AddressSpace<int> space("vk");
  std::vector<char> host(3 * 4096);  // stands for memory the driver mapped
  char* h = host.data();
  space.add(h, 4096, 7, "host_malloc");
  space.add(h + 4096, 4096, 8, "host_malloc");  // touching is not overlapping
  char* fake = static_cast<char*>(space.map(9, 100));
  CHECK(space.size() == 3);

  auto at = space.locate(h + 4096 + 10, 20, "memcpy_async");
  CHECK(at.handle == 8);
  CHECK(at.offset == 10);
  CHECK(at.bytes == 4096);
  CHECK(space.find(h + 4095)->handle == 7);
  CHECK_FALSE(space.find(h + 4090, 10));  // one range's end runs into the next
  CHECK_FALSE(space.find(h + 2 * 4096));  // pageable memory: not recorded
  CHECK(space.locate(fake + 50, 50, "memcpy_async").handle == 9);

  // Refused: zero bytes, an overlap with a recorded range, the fake span, a wrap.
  CHECK(contains(error_text([&] { space.add(h + 2 * 4096, 0, 1); }), "zero-byte"));
  CHECK(contains(error_text([&] { space.add(h + 100, 10, 1, "host_malloc"); }),
                 "overlap the allocation at"));
  CHECK(contains(error_text([&] { space.add(h + 4000, 200, 1); }), "still recorded"));
  CHECK(contains(error_text([&] { space.add(fake + 1 * (1 << 20), 10, 1); }),
                 "span of fake device addresses"));
  auto* top = reinterpret_cast<const void*>(UINTPTR_MAX - 10);
  CHECK(contains(error_text([&] { space.add(top, 20, 1); }), "end of the address space"));
  CHECK(space.size() == 3);

  std::vector<std::pair<void*, int>> seen;
  space.for_each([&](void* p, std::size_t, const int& handle) { seen.emplace_back(p, handle); });
  REQUIRE(seen.size() == 3);
  CHECK(std::is_sorted(seen.begin(), seen.end()));  // by address
  CHECK(std::count(seen.begin(), seen.end(), std::make_pair(static_cast<void*>(h), 7)) == 1);
  CHECK(std::count(seen.begin(), seen.end(), std::make_pair(static_cast<void*>(fake), 9)) == 1);

  CHECK(contains(error_text([&] { space.unmap(h + 1); }), "1 bytes into the allocation"));
  CHECK(space.unmap(h, "host_free") == 7);
  // A miss outside the span no longer says "not this backend's": it may be
  // a recorded range that was freed.
  CHECK(contains(error_text([&] { space.locate(h, 1, "memcpy_async"); }),
                 "in no range it recorded"));
  space.add(h, 4096, 10);  // a driver's address may come back
  CHECK(space.locate(h, 4096, "memcpy_async").handle == 10);
}

TEST_CASE("support: an address space under threads: allocations made, found and ended at once "
          "never mix") {
  // Fake ranges (map) and driver-placed ones (add: slices of each thread's
  // own host buffer, as pinned memory) made, located and ended from several
  // threads at once, with a reader walking the whole space (for_each).
  // Run under ThreadSanitizer by core.tsan.
  AddressSpace<std::uint64_t> space("vk");
  constexpr int kThreads = 4, kRounds = 2000, kSlots = 64, kSlot = 256;
  std::atomic<int> wrong{0};
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      space.for_each([&](void* p, std::size_t n, const std::uint64_t& h) {
        // A fake address holds a fake range's handle, a host one a pinned one.
        auto a = reinterpret_cast<std::uintptr_t>(p);
        bool fake = a >= (std::uintptr_t{1} << 44) && a < (std::uintptr_t{3} << 44);
        if (n == 0 || fake == static_cast<bool>(h >> 63)) ++wrong;
      });
      std::this_thread::yield();
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      std::vector<char> host(kSlots * kSlot);
      std::vector<std::pair<char*, std::uint64_t>> live, pinned;
      for (int i = 0; i < kRounds; ++i) {
        std::uint64_t handle = static_cast<std::uint64_t>(t) << 32 | static_cast<unsigned>(i);
        std::size_t bytes = 1 + static_cast<std::size_t>(i % 7) * 1000;
        char* p = static_cast<char*>(space.map(handle, bytes));
        live.emplace_back(p, handle);
        auto at = space.locate(p + bytes - 1, 1, "memcpy_async");
        if (at.handle != handle || at.offset != bytes - 1) ++wrong;
        char* slot = host.data() + (i % kSlots) * kSlot;
        space.add(slot, kSlot, handle | 1ull << 63, "host_malloc");
        pinned.emplace_back(slot, handle | 1ull << 63);
        auto pin = space.find(slot + kSlot / 2, kSlot / 2);
        if (!pin || pin->handle != (handle | 1ull << 63) || pin->offset != kSlot / 2) ++wrong;
        if (live.size() > 16) {  // a few live ranges each: the reader's walk stays short
          auto [q, h] = live.front();
          if (space.unmap(q) != h) ++wrong;
          if (space.find(q)) ++wrong;
          live.erase(live.begin());
        }
        if (pinned.size() == kSlots / 2) {  // the slot is recorded again later
          auto [q, h] = pinned.front();
          if (space.unmap(q, "host_free") != h) ++wrong;
          pinned.erase(pinned.begin());
        }
      }
      for (auto [q, h] : live)
        if (space.unmap(q) != h) ++wrong;
      for (auto [q, h] : pinned)
        if (space.unmap(q, "host_free") != h) ++wrong;
    });
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  CHECK(wrong == 0);
  CHECK(space.size() == 0);
}
