// accelkit: the conformance kit's virtual memory checks: reserved addresses,
// physical memory mapped into them and unmapped again (Note [Virtual
// memory] in device/backend.hpp). Included by testing/conformance.hpp, which
// registers them. A runtime without the members skips them, after the SDK's
// refusal is checked.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct VirtualMemoryChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::read;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;
  using Tools::no_host_side;

  // True (the check skipped) when there is no device, or when the runtime
  // has no virtual memory members, after checking that the SDK then refuses
  // them with NotSupportedError naming the backend.
  static bool no_virtual_memory(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return true;
    if constexpr (Kit::SdkBackend::has_virtual_memory()) {
      return false;
    } else {
      std::string what;
      try {
        kit.backend().vm_reserve(0, std::size_t{2} << 20);
        what = "vm_reserve succeeded";
      } catch (const NotSupportedError& e) {
        if (std::string(e.what()).find(std::string(R::name)) == std::string::npos)
          what = fmt::format("the refusal does not name the backend: {}", e.what());
      } catch (const std::exception& e) {
        what = fmt::format("vm_reserve threw other than NotSupportedError: {}", e.what());
      }
      v.require(what.empty(), fmt::format("without the virtual memory members the SDK must "
                                          "refuse them with NotSupportedError naming the "
                                          "backend: {}",
                                          what));
      v.skip(fmt::format("{} has no virtual memory members (vm_granularity, vm_reserve, ...); "
                         "the SDK refuses them, and the caching allocator refuses "
                         "expandable_segments",
                         R::name));
      return true;
    }
  }

  // A reservation of `pages` pages with physical memory of one page mapped
  // at each page listed; undone by release(), which unmaps page by page.
  struct Range {
    Kit& kit;
    std::size_t g = 0;
    char* base = nullptr;
    std::size_t pages = 0;
    std::vector<std::pair<char*, PhysicalHandle>> mapped;

    Range(Kit& k, std::size_t pages_) : kit(k), pages(pages_) {
      auto& b = kit.backend();
      g = b.vm_granularity(0);
      base = static_cast<char*>(b.vm_reserve(0, pages * g));
      if (base == nullptr)
        throw std::runtime_error(fmt::format("vm_reserve(0, {}) gave nullptr", pages * g));
    }
    char* page(std::size_t i) const { return base + i * g; }
    PhysicalHandle create(std::size_t n = 1) {
      PhysicalHandle h = kit.backend().vm_create(0, n * g);
      if (!h)
        throw std::runtime_error(fmt::format("vm_create(0, {}) gave a null handle", n * g));
      return h;
    }
    void map(std::size_t i) {
      PhysicalHandle h = create();
      try {
        kit.backend().vm_map(0, page(i), g, h);
      } catch (...) {
        kit.backend().vm_destroy(0, h);
        throw;
      }
      mapped.emplace_back(page(i), h);
    }
    void release() {
      auto& b = kit.backend();
      for (auto& [p, h] : mapped) {
        b.vm_unmap(0, p, g);
        b.vm_destroy(0, h);
      }
      mapped.clear();
      b.vm_release(0, base, pages * g);
    }
  };


  // Mapped pages are device memory: copies and fills of every kind work on
  // them, across the boundary of two pieces mapped side by side, and a run
  // of pieces unmaps and the range releases.
  static void round_trip(Kit& kit, Verdict& v) {
    if (no_virtual_memory(kit, v)) return;
    auto& b = kit.backend();
    Range r(kit, 4);
    std::size_t g = r.g;
    v.require(r.base != nullptr && reinterpret_cast<std::uintptr_t>(r.base) % g == 0,
              fmt::format("vm_reserve gave {}, not aligned to the granularity ({} bytes)",
                          static_cast<void*>(r.base), g));
    PhysicalHandle one = r.create(), two = r.create();
    b.vm_map(0, r.page(1), g, one);
    b.vm_map(0, r.page(2), g, two);
    std::vector<unsigned char> h = pattern(2 * g, 41);
    b.memcpy(0, r.page(1), h.data(), 2 * g, CopyKind::host_to_device);
    v.require(read(kit, r.page(1), 2 * g) == h,
              "bytes written to two pieces mapped side by side came back different through a "
              "copy spanning both");
    StreamHandle s = b.stream_create(0, 0);
    b.memset_async(0, r.page(2) - 512, 0x3c, 1024, s);
    b.memcpy_async(0, r.page(1), r.page(2), g / 2, CopyKind::device_to_device, s, no_host_side);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> want = h;
    std::fill(want.begin() + static_cast<std::ptrdiff_t>(g - 512),
              want.begin() + static_cast<std::ptrdiff_t>(g + 512), 0x3c);
    std::copy(want.begin() + static_cast<std::ptrdiff_t>(g),
              want.begin() + static_cast<std::ptrdiff_t>(g + g / 2), want.begin());
    v.require(read(kit, r.page(1), 2 * g) == want,
              "a memset_async across the boundary of two mapped pieces and a device-to-device "
              "copy between them did not leave the expected bytes");
    b.stream_destroy(0, s);
    b.vm_unmap(0, r.page(1), 2 * g);  // a run of two pieces, in one call
    b.vm_destroy(0, one);
    b.vm_destroy(0, two);
    b.vm_release(0, r.base, 4 * g);
  }

  // vm_map refuses a range outside one reservation and pages mapped
  // already, with a DriverError, changing nothing.
  static void map_refused_outside_or_over(Kit& kit, Verdict& v) {
    if (no_virtual_memory(kit, v)) return;
    auto& b = kit.backend();
    Range r(kit, 2);
    std::size_t g = r.g;
    r.map(0);
    std::vector<unsigned char> h = pattern(g, 43);
    b.memcpy(0, r.page(0), h.data(), g, CopyKind::host_to_device);
    PhysicalHandle two = r.create(2);
    auto refused = [&](auto&& f, const char* what) {
      std::string outcome = "was not refused";
      try {
        f();
      } catch (const DriverError&) {
        outcome.clear();
      } catch (const std::exception& e) {
        outcome = fmt::format("threw other than a DriverError: {}", e.what());
      }
      return v.require(outcome.empty(), fmt::format("vm_map {} {}", what, outcome));
    };
    bool ok = refused([&] { b.vm_map(0, r.page(1), 2 * g, two); },
                      "of two pages at the last page of a two-page reservation (past its end)") &&
              refused([&] { b.vm_map(0, r.page(0), 2 * g, two); },
                      "over a page mapped already");
    v.require(read(kit, r.page(0), g) == h,
              "a refused vm_map changed the bytes of the page mapped before");
    if (ok) {  // the refusals changed nothing: the memory maps where it may
      b.vm_unmap(0, r.page(0), g);
      b.vm_destroy(0, r.mapped[0].second);
      r.mapped.clear();
      b.vm_map(0, r.page(0), 2 * g, two);
      b.vm_unmap(0, r.page(0), 2 * g);
    }
    b.vm_destroy(0, two);
    r.release();
  }

  // Work queued on pages after they are unmapped fails, at the call or as
  // the stream's asynchronous error, and never runs on other memory; the
  // device goes on.
  static void unmap_then_use_faults(Kit& kit, Verdict& v) {
    if (no_virtual_memory(kit, v)) return;
    auto& b = kit.backend();
    Range r(kit, 2);
    std::size_t g = r.g;
    r.map(0);
    r.map(1);
    PhysicalHandle gone = r.mapped[1].second;
    r.mapped.pop_back();
    b.vm_unmap(0, r.page(1), g);
    StreamHandle s = b.stream_create(0, 0);
    std::string error;
    try {
      b.memset_async(0, r.page(1), 0x11, 4096, s);
      b.stream_synchronize(0, s);
    } catch (const Error& e) {
      error = e.what();
    }
    v.require(!error.empty(), "a memset_async of unmapped pages, then a stream_synchronize, "
                              "ran without an error (vm_unmap must leave the pages unusable)");
    b.vm_destroy(0, gone);
    // The device goes on.
    b.memset_async(0, r.page(0), 0x22, 4096, s);
    b.stream_synchronize(0, s);
    v.require(read(kit, r.page(0), 4096) == std::vector<unsigned char>(4096, 0x22),
              "after work on unmapped pages failed, a memset of a mapped page did not work");
    b.stream_destroy(0, s);
    r.release();
  }

  // vm_unmap is refused while work queued on a stream still uses the
  // range, as free is; the work completes on the mapped pages.
  static void unmap_refused_while_queued(Kit& kit, Verdict& v) {
    if (no_virtual_memory(kit, v)) return;
    auto& b = kit.backend();
    Range r(kit, 1);
    std::size_t g = r.g;
    r.map(0);
    StreamHandle s = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s, 8);
    b.memset_async(0, r.page(0), 0x5e, g, s);
    bool refused = false;
    std::string other;
    try {
      b.vm_unmap(0, r.page(0), g);
    } catch (const DriverError&) {
      refused = true;
    } catch (const std::exception& e) {
      other = e.what();
    }
    bool queued = !b.stream_query(0, s);
    b.stream_synchronize(0, s);
    if (refused || queued)
      v.require(refused, other.empty()
                             ? "vm_unmap returned while work queued on a stream still used the "
                               "range (it must refuse with a DriverError, as free does)"
                             : fmt::format("vm_unmap under queued work threw other than a "
                                           "DriverError: {}",
                                           other));
    if (refused)
      v.require(read(kit, r.page(0), g) == std::vector<unsigned char>(g, 0x5e),
                "the queued memset of the pages a refused vm_unmap named did not complete");
    free_busy(kit, 0, w);
    b.stream_destroy(0, s);
    if (!refused) {  // unmapped already
      b.vm_destroy(0, r.mapped[0].second);
      r.mapped.clear();
    }
    r.release();
  }

  // vm_create counts against the device's capacity: free memory drops by
  // what it made and comes back when it is destroyed, and a request larger
  // than the device's free memory gives a null handle, not an exception.
  static void capacity_counted(Kit& kit, Verdict& v) {
    if (no_virtual_memory(kit, v)) return;
    auto& b = kit.backend();
    std::size_t g = b.vm_granularity(0);
    std::uint64_t before = b.memory_info(0).free;
    PhysicalHandle h = b.vm_create(0, 4 * g);
    v.require(static_cast<bool>(h), "vm_create of four pages gave a null handle");
    std::uint64_t during = b.memory_info(0).free;
    v.require(during + 4 * g <= before,
              fmt::format("vm_create of {} bytes took {} bytes of the device's free memory",
                          4 * g, before > during ? before - during : 0));
    if (h) b.vm_destroy(0, h);
    std::uint64_t after = b.memory_info(0).free;
    v.require(after + g >= before, fmt::format("vm_destroy gave back {} of {} bytes",
                                               after > during ? after - during : 0, 4 * g));
    std::uint64_t total = b.memory_info(0).total;
    std::size_t too_much = static_cast<std::size_t>((total / g + 1) * g);
    PhysicalHandle none{};
    std::string threw;
    try {
      none = b.vm_create(0, too_much);
    } catch (const std::exception& e) {
      threw = e.what();
    }
    if (none) b.vm_destroy(0, none);
    v.require(!none && threw.empty(),
              fmt::format("vm_create of {} bytes, more than the device's {} bytes, must give a "
                          "null handle; it {}",
                          too_much, total,
                          none ? "gave memory" : fmt::format("threw: {}", threw)));
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

#define ACCELKIT_CONFORMANCE_VIRTUAL_MEMORY_CHECKS(X)                                          \
  X(virtual_memory, round_trip,                                                                \
    "mapped pages are device memory for copies and fills; pieces side by side join; a run "    \
    "of pieces unmaps in one call")                                                            \
  X(virtual_memory, map_refused_outside_or_over,                                               \
    "vm_map refuses a range outside one reservation or over mapped pages, changing nothing")   \
  X(virtual_memory, unmap_then_use_faults,                                                     \
    "work queued on pages after vm_unmap fails, at the call or asynchronously")                \
  X(virtual_memory, unmap_refused_while_queued,                                                \
    "vm_unmap is refused while queued work still uses the range, as free is")                  \
  X(virtual_memory, capacity_counted,                                                          \
    "vm_create counts against the device's capacity and gives a null handle when there is "    \
    "no room")
