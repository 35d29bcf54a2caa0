// Virtual memory: the optional members (Note [Virtual memory] in
// device/backend.hpp) through Backend<R> on simdev (Note [simdev virtual
// memory]): a round trip in each host-access mode, every member's errors,
// unmapping refused while queued work uses the pages, work naming unmapped
// pages failing as for freed memory, capacity, injected faults, and the
// refusal of a runtime without the members (minimal). After each failure the
// state stays usable and no capacity is lost.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "minimal_runtime.hpp"
#include "simdev_runtime.hpp"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using Sim = simdev::SimRuntime;
using SimBackend = Backend<Sim>;

using namespace accelkit_tests;
namespace {
constexpr std::size_t kG = std::size_t{2} << 20;  // simdev's granularity

using Bytes = std::vector<unsigned char>;

// The message of the E that f throws, or "" when it throws none.
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}
std::size_t occurrences(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

simdev::Config sim_mode(HostAccessLevel access, int devices = 2, std::uint64_t mib = 64) {
  simdev::Config c = sim(devices, mib);
  c.host_access = access;
  return c;
}

char* at(void* base, std::size_t pages) { return static_cast<char*>(base) + pages * kG; }

void write(SimBackend& b, void* p, const Bytes& h, device_index d = 0) {
  b.memcpy(d, p, h.data(), h.size(), CopyKind::host_to_device);
}
Bytes read(SimBackend& b, const void* p, std::size_t n, device_index d = 0) {
  Bytes h(n);
  b.memcpy(d, h.data(), p, n, CopyKind::device_to_host);
  return h;
}
Bytes pattern(std::size_t n, unsigned seed) {
  Bytes h(n);
  for (std::size_t i = 0; i < n; ++i) h[i] = static_cast<unsigned char>((i * 131 + seed) & 0xff);
  return h;
}

// Nothing of device `d`'s memory or of the runtime's objects is held.
void expect_nothing_held(SimBackend& b, device_index d = 0) {
  CHECK(b.raw_bytes_held(d) == 0);
  CHECK(b.runtime().bytes_in_use(d) == 0);
  CHECK(b.runtime().live_physical() == 0);
  CHECK(b.runtime().vm_pieces(d) == 0);
  CHECK(b.runtime().vm_reservations(d) == 0);
  MemoryInfo info = b.memory_info(d);
  CHECK(info.free == info.total);
}

// A range of `pages` pages reserved and, from page `first`, `mapped` pages
// mapped, one physical piece per page; undone by release().
struct Mapped {
  SimBackend& b;
  device_index d;
  char* base = nullptr;
  std::size_t pages = 0;
  std::vector<std::pair<char*, PhysicalHandle>> pieces;

  Mapped(SimBackend& backend, std::size_t pages_, std::size_t first, std::size_t mapped,
         device_index device = 0)
      : b(backend), d(device), pages(pages_) {
    base = static_cast<char*>(b.vm_reserve(d, pages * kG));
    if (base == nullptr) throw std::runtime_error("vm_reserve gave nullptr");
    for (std::size_t i = first; i < first + mapped; ++i) map(i);
  }
  void map(std::size_t page) {
    PhysicalHandle h = b.vm_create(d, kG);
    if (!h) throw std::runtime_error("vm_create gave a null handle");
    b.vm_map(d, at(base, page), kG, h);
    pieces.emplace_back(at(base, page), h);
  }
  void release() {
    for (auto& [p, h] : pieces) {
      b.vm_unmap(d, p, kG);
      b.vm_destroy(d, h);
    }
    pieces.clear();
    b.vm_release(d, base, pages * kG);
  }
};
}  // namespace

TEST_CASE("virtual memory: simdev has the members, minimal has none, and the SDK knows") {
  STATIC_REQUIRE(detail::has_virtual_memory<Sim>);
  STATIC_REQUIRE(SimBackend::has_virtual_memory());
  STATIC_REQUIRE_FALSE(detail::has_virtual_memory<minimal::MinimalRuntime>);
  STATIC_REQUIRE_FALSE(Backend<minimal::MinimalRuntime>::has_virtual_memory());
  STATIC_REQUIRE_FALSE(PhysicalHandle{});
  STATIC_REQUIRE(PhysicalHandle{7});
}

TEST_CASE("virtual memory: a runtime without the members is refused with NotSupportedError "
          "naming the backend and the members") {
  Backend<minimal::MinimalRuntime> b(Environment::fixed({}));
  auto check = [](const std::string& m, const char* call) {
    INFO(m);
    CHECK(contains(m, "minimal: "));
    CHECK(contains(m, call));
    CHECK(contains(m, "vm_granularity, vm_reserve, vm_release, vm_create, vm_destroy, vm_map "
                      "and vm_unmap"));
  };
  check(thrown<NotSupportedError>([&] { b.vm_granularity(0); }), "vm_granularity");
  check(thrown<NotSupportedError>([&] { b.vm_reserve(0, kG); }), "vm_reserve");
  check(thrown<NotSupportedError>([&] { b.vm_release(0, nullptr, kG); }), "vm_release");
  check(thrown<NotSupportedError>([&] { b.vm_create(0, kG); }), "vm_create");
  check(thrown<NotSupportedError>([&] { b.vm_destroy(0, PhysicalHandle{1}); }), "vm_destroy");
  check(thrown<NotSupportedError>([&] { b.vm_map(0, nullptr, kG, PhysicalHandle{1}); }),
        "vm_map");
  check(thrown<NotSupportedError>([&] { b.vm_unmap(0, nullptr, kG); }), "vm_unmap");
  // A bad device is still an IndexError first.
  CHECK(contains(thrown<IndexError>([&] { b.vm_create(3, kG); }), "invalid device index 3"));
}

TEST_CASE("virtual memory: reserve, map piece by piece, copy across pieces, unmap, release: "
          "in every host-access mode, capacity given back") {
  HostAccessLevel mode =
      GENERATE(HostAccessLevel::direct, HostAccessLevel::none, HostAccessLevel::mapped);
  INFO("host_access " << static_cast<int>(mode));
  SimBackend b(Environment::fixed({}), sim_mode(mode));
  REQUIRE(b.vm_granularity(0) == kG);
  REQUIRE(b.vm_granularity(1) == kG);
  Mapped m(b, 8, 1, 3);  // pages 1..3 mapped, three pieces
  CHECK(b.raw_bytes_held(0) == 3 * kG);
  CHECK(b.runtime().bytes_in_use(0) == 3 * kG);
  CHECK(b.memory_info(0).free == b.memory_info(0).total - 3 * kG);
  CHECK(b.runtime().vm_pieces(0) == 3);

  // Synchronous and queued copies over a range that spans the three pieces,
  // and a fill across a piece boundary.
  Bytes h = pattern(3 * kG, 5);
  write(b, at(m.base, 1), h);
  CHECK(read(b, at(m.base, 1), 3 * kG) == h);
  StreamHandle s = b.stream_create(0, 0);
  b.memset_async(0, at(m.base, 2) - 100, 0xab, 200, s);
  Bytes back(3 * kG);
  b.memcpy_async(0, back.data(), at(m.base, 1), 3 * kG, CopyKind::device_to_host, s, false);
  b.stream_synchronize(0, s);
  std::memset(h.data() + kG - 100, 0xab, 200);
  CHECK(back == h);
  // Device-to-device within the range.
  b.memcpy_async(0, at(m.base, 3), at(m.base, 1), kG, CopyKind::device_to_device, s, false);
  b.stream_synchronize(0, s);
  CHECK(read(b, at(m.base, 3), kG) == Bytes(h.begin(), h.begin() + kG));

  if (mode == HostAccessLevel::mapped) {
    // The host reaches the pages only between host_map and host_unmap, at
    // the address host_map returns, and what it writes is the device's.
    char* p = at(m.base, 2) - 64;
    std::memset(b.host_map(0, p, 128), 0x5a, 128);
    b.host_unmap(0, p, 128);
    CHECK(read(b, p, 128) == Bytes(128, 0x5a));
    // Unmapping pages the host holds mapped is refused.
    b.host_map(0, at(m.base, 3), 16);
    CHECK(driver_code([&] { b.vm_unmap(0, at(m.base, 3), kG); }) == simdev::kInvalidValue);
    b.host_unmap(0, at(m.base, 3), 16);
  } else {
    // Host-visible pages in the other modes (SIMDEV_HOST_VISIBLE 1 and 0).
    CHECK(static_cast<unsigned char>(*at(m.base, 1)) == h[0]);
  }
  b.stream_destroy(0, s);
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: the wrappers check device, sizes, addresses and handles (IndexError, "
          "ValueError naming the backend once and the value), calling nothing") {
  SimBackend b(Environment::fixed({}), sim());
  Mapped m(b, 4, 0, 1);
  PhysicalHandle spare = b.vm_create(0, 2 * kG);
  REQUIRE(spare);
  auto index = [](const std::string& msg) {
    INFO(msg);
    CHECK(contains(msg, "invalid device index 5"));
    CHECK(occurrences(msg, "simdev") == 2);  // "simdev: invalid ...: simdev has 2 ..."
  };
  index(thrown<IndexError>([&] { b.vm_granularity(5); }));
  index(thrown<IndexError>([&] { b.vm_reserve(5, kG); }));
  index(thrown<IndexError>([&] { b.vm_release(5, m.base, 4 * kG); }));
  index(thrown<IndexError>([&] { b.vm_create(5, kG); }));
  index(thrown<IndexError>([&] { b.vm_destroy(5, spare); }));
  index(thrown<IndexError>([&] { b.vm_map(5, at(m.base, 2), 2 * kG, spare); }));
  index(thrown<IndexError>([&] { b.vm_unmap(5, m.base, kG); }));
  CHECK(contains(thrown<IndexError>([&] { b.vm_create(-1, kG); }), "invalid device index -1"));

  auto value = [](const std::string& msg, const std::string& part) {
    INFO(msg);
    CHECK(contains(msg, part));
    CHECK(msg.rfind("simdev: ", 0) == 0);  // the backend named once, first
    CHECK_FALSE(contains(msg, "simdev: simdev"));
  };
  value(thrown<ValueError>([&] { b.vm_reserve(0, kG + 4096); }), "2101248 bytes");
  value(thrown<ValueError>([&] { b.vm_reserve(0, 0); }), "0 bytes");
  value(thrown<ValueError>([&] { b.vm_create(0, 100); }), "100 bytes");
  value(thrown<ValueError>([&] { b.vm_release(0, m.base, 4 * kG - 4096); }), "granularity");
  value(thrown<ValueError>([&] { b.vm_release(0, m.base + 4096, 4 * kG); }), "not aligned");
  value(thrown<ValueError>([&] { b.vm_release(0, nullptr, 4 * kG); }), "null");
  value(thrown<ValueError>([&] { b.vm_map(0, at(m.base, 2) + 256, 2 * kG, spare); }),
        "not aligned");
  value(thrown<ValueError>([&] { b.vm_map(0, at(m.base, 2), kG, spare); }),
        fmt::format("physical memory {:#x} is {} bytes", spare.value, 2 * kG));
  value(thrown<ValueError>([&] { b.vm_map(0, at(m.base, 2), 2 * kG, PhysicalHandle{}); }),
        "handle 0x0 is not live physical memory of simdev:0");
  value(thrown<ValueError>([&] { b.vm_map(1, at(m.base, 2), 2 * kG, spare); }),
        "not live physical memory of simdev:1");
  value(thrown<ValueError>([&] { b.vm_unmap(0, m.base, 3); }), "3 bytes");
  value(thrown<ValueError>([&] { b.vm_destroy(1, spare); }),
        "not live physical memory of simdev:1");

  // Nothing was called: the state is as it was, and usable.
  CHECK(b.runtime().vm_pieces(0) == 1);
  CHECK(b.raw_bytes_held(0) == 3 * kG);
  b.vm_map(0, at(m.base, 2), 2 * kG, spare);
  b.vm_unmap(0, at(m.base, 2), 2 * kG);
  b.vm_destroy(0, spare);
  // Destroyed: a second destroy is refused by the SDK.
  CHECK(contains(thrown<ValueError>([&] { b.vm_destroy(0, spare); }), "not live physical"));
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: simdev refuses maps outside a reservation or over mapped pages, "
          "partial unmaps, releases with mapped pages and destroys of mapped memory; nothing "
          "changes and nothing leaks") {
  HostAccessLevel mode = GENERATE(HostAccessLevel::direct, HostAccessLevel::mapped);
  SimBackend b(Environment::fixed({}), sim_mode(mode));
  Mapped m(b, 4, 1, 1);  // page 1 mapped
  PhysicalHandle two = b.vm_create(0, 2 * kG);
  PhysicalHandle one = b.vm_create(0, kG);
  REQUIRE(two);
  REQUIRE(one);
  std::uint64_t held = b.raw_bytes_held(0);
  auto refused = [&](auto&& f, const std::string& part) {
    std::string msg = thrown<DriverError>(f);
    INFO(msg);
    CHECK(contains(msg, "simdev: driver error 1 in vm_"));
    CHECK(contains(msg, part));
  };
  // Outside any reservation (an address past the range's end, or a range
  // reaching past it).
  refused([&] { b.vm_map(0, at(m.base, 4), kG, one); }, "not inside one range reserved");
  refused([&] { b.vm_map(0, at(m.base, 3), 2 * kG, two); }, "not inside one range reserved");
  // Over mapped pages, whole or in part.
  refused([&] { b.vm_map(0, at(m.base, 1), kG, one); }, "overlap pages mapped already");
  refused([&] { b.vm_map(0, at(m.base, 0), 2 * kG, two); }, "overlap pages mapped already");
  // Unmaps of pages not mapped, or of part of a piece.
  refused([&] { b.vm_unmap(0, at(m.base, 2), kG); }, "not whole mapped pieces");
  refused([&] { b.vm_unmap(0, at(m.base, 1), 2 * kG); }, "not whole mapped pieces");
  b.vm_map(0, at(m.base, 2), 2 * kG, two);
  refused([&] { b.vm_unmap(0, at(m.base, 2), kG); }, "a piece reaching past the end");
  refused([&] { b.vm_unmap(0, at(m.base, 0), 4 * kG); }, "no piece starts");
  // Release of a range with mapped pages, or not as reserved.
  refused([&] { b.vm_release(0, m.base, 4 * kG); }, "has 2 mapped piece(s)");
  refused([&] { b.vm_release(0, at(m.base, 1), 2 * kG); }, "not the start of a range");
  refused([&] { b.vm_release(0, m.base, 2 * kG); }, "released as");
  // Destroy of memory still mapped.
  refused([&] { b.vm_destroy(0, two); }, "still mapped (1 mapping(s))");

  // Nothing changed: the data of the pieces, the capacity, the pieces.
  CHECK(b.raw_bytes_held(0) == held);
  CHECK(b.runtime().vm_pieces(0) == 2);
  Bytes h = pattern(3 * kG, 9);
  write(b, at(m.base, 1), h);
  CHECK(read(b, at(m.base, 1), 3 * kG) == h);
  // A run of adjacent pieces unmaps in one call.
  b.vm_unmap(0, at(m.base, 1), 3 * kG);
  b.vm_destroy(0, m.pieces.at(0).second);
  m.pieces.clear();
  b.vm_destroy(0, two);
  b.vm_destroy(0, one);
  CHECK(driver_code([&] { b.runtime().vm_destroy(0, two); }) == simdev::kInvalidHandle);
  // Pages unmapped, the range reserved still: mapping again works.
  PhysicalHandle again = b.vm_create(0, kG);
  CHECK(again != two);  // minted, never reused (Note [Minted handles])
  CHECK(again != one);
  b.vm_map(0, at(m.base, 1), kG, again);
  CHECK(read(b, at(m.base, 1), 16) == Bytes(16, 0));  // fresh memory, not the old pages
  m.pieces.emplace_back(at(m.base, 1), again);
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: an unmap is refused while queued work on any stream uses the range, "
          "and nothing is lost; once the work is done it unmaps") {
  SimBackend b(Environment::fixed({}), sim_mode(HostAccessLevel::mapped));
  Sim& rt = b.runtime();
  Mapped m(b, 4, 0, 2);
  StreamHandle s1 = b.stream_create(0, 0);
  StreamHandle s2 = b.stream_create(0, 0);
  auto gate = rt.hold(0, s2);
  // Queued on another stream than the one a caller might think of.
  b.memset_async(0, at(m.base, 1) + 4096, 0x77, 4096, s2);
  std::string msg = thrown<DriverError>([&] { b.vm_unmap(0, at(m.base, 1), kG); });
  INFO(msg);
  CHECK(contains(msg, "simdev: driver error 1 in vm_unmap"));
  CHECK(contains(msg, "still used by queued work"));
  // A run that includes the page is refused too; the page not used is free.
  CHECK(driver_code([&] { b.vm_unmap(0, m.base, 2 * kG); }) == simdev::kInvalidValue);
  CHECK(rt.vm_pieces(0) == 2);
  gate->open();
  b.stream_synchronize(0, s2);
  CHECK(read(b, at(m.base, 1) + 4096, 4096) == Bytes(4096, 0x77));  // the work ran on mapped pages
  CHECK_FALSE(rt.async_error_pending(0));
  // A copy running on s1 blocks it too, then not.
  auto gate1 = rt.hold(0, s1);
  b.memcpy_async(0, m.base, at(m.base, 1), kG, CopyKind::device_to_device, s1, false);
  CHECK(driver_code([&] { b.vm_unmap(0, m.base, kG); }) == simdev::kInvalidValue);
  gate1->open();
  b.stream_synchronize(0, s1);
  b.stream_destroy(0, s1);
  b.stream_destroy(0, s2);
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: work naming unmapped pages fails kIllegalAddress, as for freed "
          "memory: at the call, and a graph captured on the pages when launched after a new "
          "map") {
  SimBackend b(Environment::fixed({}), sim());
  Sim& rt = b.runtime();
  Mapped m(b, 4, 0, 2);
  StreamHandle s = b.stream_create(0, 0);
  // A graph filling page 1, captured while it is mapped.
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.memset_async(0, at(m.base, 1), 1, 4096, s);
  GraphHandle g = b.stream_end_capture(0, s);
  GraphExecHandle e = b.graph_instantiate(0, g);
  b.graph_destroy(0, g);
  b.graph_launch(0, e, s);
  b.stream_synchronize(0, s);
  CHECK(read(b, at(m.base, 1), 4096) == Bytes(4096, 1));

  b.vm_unmap(0, at(m.base, 1), kG);
  b.vm_destroy(0, m.pieces[1].second);
  m.pieces.pop_back();
  auto illegal = [&](auto&& f) {
    CHECK(driver_code(f) == simdev::kIllegalAddress);
  };
  Bytes h(4096);
  illegal([&] { b.memset_async(0, at(m.base, 1), 0, 16, s); });
  illegal([&] { b.memcpy(0, h.data(), at(m.base, 1), 16, CopyKind::device_to_host); });
  illegal([&] {
    b.memcpy_async(0, h.data(), at(m.base, 1), 16, CopyKind::device_to_host, s, false);
  });
  // A range reaching from the mapped piece into the unmapped one.
  illegal([&] { b.memset_async(0, at(m.base, 1) - 16, 0, 32, s); });
  illegal([&] { rt.launch(0, s, "k", [] {}, {{at(m.base, 1), 16}}); });
  // Mapped again, with other memory: the graph's pages are not the ones it
  // captured, and its launch is refused.
  PhysicalHandle fresh = b.vm_create(0, kG);
  b.vm_map(0, at(m.base, 1), kG, fresh);
  m.pieces.emplace_back(at(m.base, 1), fresh);
  std::string msg = thrown<DriverError>([&] { b.graph_launch(0, e, s); });
  INFO(msg);
  CHECK(contains(msg, "driver error 700 in graph_launch"));
  CHECK(contains(msg, "freed since the capture"));
  // The device goes on; the mapped page works.
  b.memset_async(0, at(m.base, 1), 2, 4096, s);
  b.stream_synchronize(0, s);
  CHECK(read(b, at(m.base, 1), 4096) == Bytes(4096, 2));
  b.graph_exec_destroy(0, e);
  b.stream_destroy(0, s);
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: vm_create counts against the device's capacity: a null handle when "
          "there is no room (or a refusal), memory_info and malloc see it") {
  SimBackend b(Environment::fixed({}), sim(2, 8));  // 8 MiB devices
  std::vector<PhysicalHandle> hs;
  for (int i = 0; i < 3; ++i) hs.push_back(b.vm_create(0, kG));
  CHECK(b.memory_info(0).free == kG);
  PhysicalHandle too_big = b.vm_create(0, 4 * kG);
  CHECK_FALSE(too_big);
  CHECK(b.raw_bytes_held(0) == 3 * kG);
  CHECK(b.runtime().bytes_in_use(0) == 3 * kG);
  // malloc sees the capacity taken.
  CHECK_THROWS_AS(b.raw_malloc(0, 2 * kG + 4096), OutOfMemoryError);
  // Device 1 is not affected.
  PhysicalHandle other = b.vm_create(1, 4 * kG);
  CHECK(other);
  b.vm_destroy(1, other);
  // A refusal: a null handle with memory free.
  b.runtime().inject_refusal(1, "vm_create");
  CHECK_FALSE(b.vm_create(0, kG));
  CHECK(b.raw_bytes_held(0) == 3 * kG);
  hs.push_back(b.vm_create(0, kG));
  CHECK(hs.back());
  CHECK(b.memory_info(0).free == 0);
  for (PhysicalHandle h : hs) b.vm_destroy(0, h);
  expect_nothing_held(b);
  expect_nothing_held(b, 1);
}

TEST_CASE("virtual memory: a device's reservations are bounded (64 times its capacity): "
          "vm_reserve answers nullptr beyond, and releasing makes room") {
  SimBackend b(Environment::fixed({}), sim(1, 2));  // 2 MiB: 128 MiB of addresses
  void* all = b.vm_reserve(0, 128u << 20);
  REQUIRE(all != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(all) % kG == 0);
  CHECK(b.vm_reserve(0, kG) == nullptr);
  b.vm_release(0, all, 128u << 20);
  void* again = b.vm_reserve(0, kG);
  CHECK(again != nullptr);
  CHECK(again != all);  // released addresses are retired for a while
  b.vm_release(0, again, kG);
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: an injected fault in each member is a clear driver error; state "
          "stays usable and nothing leaks") {
  SimBackend b(Environment::fixed({}), sim());
  Sim& rt = b.runtime();
  auto injected = [&](const char* member, auto&& f) {
    rt.inject_fault(member);
    std::string msg = thrown<DriverError>(f);
    INFO(member << ": " << msg);
    CHECK(contains(msg, fmt::format("simdev: driver error 999 in {}: injected fault", member)));
    CHECK(occurrences(msg, "simdev") == 1);
    CHECK_FALSE(rt.fault_pending(member));
  };
  // vm_granularity: the SDK's first query fails, the next asks again.
  injected("vm_granularity", [&] { b.vm_granularity(0); });
  CHECK(b.vm_granularity(0) == kG);
  injected("vm_reserve", [&] { b.vm_reserve(0, 4 * kG); });
  CHECK(rt.vm_reservations(0) == 0);
  char* base = static_cast<char*>(b.vm_reserve(0, 4 * kG));
  injected("vm_create", [&] { b.vm_create(0, kG); });
  CHECK(rt.live_physical() == 0);
  CHECK(b.raw_bytes_held(0) == 0);
  PhysicalHandle h = b.vm_create(0, kG);
  injected("vm_map", [&] { b.vm_map(0, base, kG, h); });
  CHECK(rt.vm_pieces(0) == 0);
  b.vm_map(0, base, kG, h);
  write(b, base, Bytes(64, 4));
  injected("vm_unmap", [&] { b.vm_unmap(0, base, kG); });
  CHECK(rt.vm_pieces(0) == 1);
  CHECK(read(b, base, 64) == Bytes(64, 4));  // still mapped, data intact
  b.vm_unmap(0, base, kG);
  injected("vm_destroy", [&] { b.vm_destroy(0, h); });
  CHECK(rt.live_physical() == 1);
  CHECK(b.raw_bytes_held(0) == kG);
  b.vm_destroy(0, h);
  injected("vm_release", [&] { b.vm_release(0, base, 4 * kG); });
  CHECK(rt.vm_reservations(0) == 1);
  b.vm_release(0, base, 4 * kG);
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: SIMDEV_INJECT_FAULT names the members; only vm_create may refuse") {
  auto parse = [](const std::string& v) {
    return simdev::Config::from_environment(Environment::fixed({{"SIMDEV_INJECT_FAULT", v}}));
  };
  simdev::Config c = parse("vm_map@3,vm_create:refuse,vm_unmap@2");
  CHECK(c.faults.at("vm_map").nth == 3);
  CHECK(c.faults.at("vm_create").refuse);
  CHECK(c.faults.at("vm_unmap").nth == 2);
  CHECK(contains(thrown<ValueError>([&] { parse("vm_unmap:refuse"); }),
                 "only malloc can refuse (and vm_create"));
  CHECK(contains(thrown<ValueError>([&] { parse("vm_map:async"); }), "queues no work"));
  // Through a runtime configured so: the third vm_map fails.
  simdev::Config sc = sim();
  sc.faults = parse("vm_map@3").faults;
  SimBackend b(Environment::fixed({}), sc);
  Mapped m(b, 4, 0, 2);
  PhysicalHandle h = b.vm_create(0, kG);
  CHECK(driver_code([&] { b.vm_map(0, at(m.base, 2), kG, h); }) == simdev::kInjectedFault);
  b.vm_map(0, at(m.base, 2), kG, h);
  m.pieces.emplace_back(at(m.base, 2), h);
  m.release();
  expect_nothing_held(b);
}

TEST_CASE("virtual memory: threads reserving, mapping, copying and unmapping at once") {
  SimBackend b(Environment::fixed({}), sim_mode(HostAccessLevel::mapped, 2, 128));
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      try {
        device_index d = t % 2;
        StreamHandle s = b.stream_create(d, 0);
        for (int round = 0; round < 10; ++round) {
          Mapped m(b, 4, 0, 2, d);
          Bytes h = pattern(2 * kG, static_cast<unsigned>(t * 100 + round));
          b.memcpy_async(d, m.base, h.data(), h.size(), CopyKind::host_to_device, s, false);
          Bytes back(2 * kG);
          b.memcpy_async(d, back.data(), m.base, back.size(), CopyKind::device_to_host, s,
                         false);
          if (back != h) failures.fetch_add(1);
          b.stream_synchronize(d, s);
          m.release();
        }
        b.stream_destroy(d, s);
      } catch (const std::exception& e) {
        fmt::print(stderr, "{}\n", e.what());
        failures.fetch_add(1);
      }
    });
  for (auto& t : threads) t.join();
  CHECK(failures.load() == 0);
  expect_nothing_held(b, 0);
  expect_nothing_held(b, 1);
}
