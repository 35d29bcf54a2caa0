// accelkit: the conformance kit's properties checks: the capability schema
// as the runtime fills it, and what each reported capability promises
// (allocations, host access, timing). Included by testing/conformance.hpp,
// which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct PropertiesChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;

  static void properties_valid(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    for (int d = 0; d < kit.devices(); ++d) {
      // As the SDK reads them: a UUID the runtime leaves empty (unknown to
      // the driver) is derived (Note [Derived UUID]), not a broken rule.
      int phys = kit.backend().physical(d);
      DeviceProperties p = kit.runtime().properties(phys);
      fill_unknown(p, R::name, phys);
      std::vector<std::string> problems = property_problems(p, R::name);
      std::string all;
      for (const std::string& p : problems) all += (all.empty() ? "" : "; ") + p;
      if (!v.require(problems.empty(), fmt::format("device {}: {}", d, all))) return;
    }
  }
  static void max_allocation_allocates(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::size_t n = b.properties(0).max_allocation;
    if (n > (std::size_t{1} << 30) && !std::getenv("ACCELKIT_CONFORMANCE_LARGE"))
      return v.skip(fmt::format("max_allocation is {} bytes; set ACCELKIT_CONFORMANCE_LARGE=1 to "
                                "allocate it",
                                n));
    void* p = b.runtime().malloc(b.physical(0), n);
    if (!v.require(p != nullptr, fmt::format("malloc of max_allocation ({} bytes) returned nullptr "
                                             "on an idle device",
                                             n)))
      return;
    b.runtime().free(b.physical(0), p);
  }
  // A test allocation of device d, freed when it goes out of scope, so that
  // a member throwing in the middle of a check (host_map, a copy) leaves
  // nothing behind; free() frees it on the way that may report.
  template <class B>
  struct TestAllocation {
    B& b;
    int d;
    std::size_t n;
    unsigned char* p = static_cast<unsigned char*>(b.raw_malloc(d, n));
    TestAllocation(B& backend, int device, std::size_t bytes) : b(backend), d(device), n(bytes) {}
    TestAllocation(const TestAllocation&) = delete;
    TestAllocation& operator=(const TestAllocation&) = delete;
    ~TestAllocation() {
      if (p == nullptr) return;
      try {
        b.raw_free(d, p, n);
      } catch (...) {  // an exception is already on its way out of the check
      }
    }
    void free() {
      unsigned char* q = std::exchange(p, nullptr);
      if (q != nullptr) b.raw_free(d, q, n);
    }
  };
  static void host_visible_memory_is_visible(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    bool checked = false;
    for (int d = 0; d < kit.devices(); ++d) {
      if (!b.properties(d).host_visible_memory) continue;
      checked = true;
      std::vector<unsigned char> in = pattern(8192, 2), out(8192);
      TestAllocation<std::remove_reference_t<decltype(b)>> a(b, d, in.size());
      unsigned char* p = a.p;
      if (!v.require(p != nullptr, fmt::format("device {}: malloc of {} bytes failed", d, in.size())))
        return;
      b.memcpy(d, p, in.data(), in.size(), CopyKind::host_to_device);
      bool read = std::memcmp(p, in.data(), in.size()) == 0;
      for (std::size_t i = 0; i < in.size(); ++i) p[i] = static_cast<unsigned char>(in[i] ^ 0x5a);
      b.memcpy(d, out.data(), p, out.size(), CopyKind::device_to_host);
      a.free();
      if (!v.require(read, fmt::format("device {} reports host_visible_memory, but the host read "
                                       "other bytes than a copy wrote",
                                       d)))
        return;
      for (std::size_t i = 0; i < in.size(); ++i)
        if (!v.require(out[i] == static_cast<unsigned char>(in[i] ^ 0x5a),
                       fmt::format("device {} reports host_visible_memory, but a copy did not "
                                   "see what the host wrote (byte {})",
                                   d, i)))
          return;
    }
    if (!checked) v.skip("no device reports host_visible_memory: nothing to check");
  }
  // host_access mapped: the host reads and writes a range between host_map
  // and host_unmap at the address host_map returns (a whole allocation, and
  // a part of one at an offset, as the SDK maps a tensor's storage inside a
  // pooled block), and a copy sees what it wrote after the unmap.
  static void host_mapped_memory_is_visible(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    bool checked = false;
    for (int d = 0; d < kit.devices(); ++d) {
      if (b.properties(d).host_access != HostAccessLevel::mapped) continue;
      checked = true;
      constexpr std::size_t n = 3 * 4096;
      std::vector<unsigned char> in = pattern(n, 3), out(n);
      TestAllocation<std::remove_reference_t<decltype(b)>> a(b, d, n);
      unsigned char* p = a.p;
      if (!v.require(p != nullptr, fmt::format("device {}: malloc of {} bytes failed", d, n)))
        return;
      struct Range {
        std::size_t at, bytes;
      };
      bool ok = true;
      for (Range r : {Range{0, n}, Range{4096 + 128, 1000}}) {
        b.memcpy(d, p, in.data(), n, CopyKind::host_to_device);
        auto* h = static_cast<unsigned char*>(b.host_map(d, p + r.at, r.bytes));
        bool read = std::memcmp(h, in.data() + r.at, r.bytes) == 0;
        for (std::size_t i = 0; i < r.bytes; ++i)
          h[i] = static_cast<unsigned char>(in[r.at + i] ^ 0x5a);
        b.host_unmap(d, p + r.at, r.bytes);
        b.memcpy(d, out.data(), p, n, CopyKind::device_to_host);
        ok = v.require(read, fmt::format("device {} reports host_access mapped, but the host "
                                         "read other bytes than a copy wrote at the address "
                                         "host_map returned, mapping {} bytes at offset {}",
                                         d, r.bytes, r.at));
        for (std::size_t i = 0; ok && i < n; ++i) {
          bool inside = i >= r.at && i < r.at + r.bytes;
          auto want = static_cast<unsigned char>(inside ? in[i] ^ 0x5a : in[i]);
          ok = v.require(out[i] == want,
                         fmt::format("device {} reports host_access mapped, but after "
                                     "host_unmap a copy did not see what the host wrote (byte "
                                     "{}, mapped {} bytes at offset {})",
                                     d, i, r.bytes, r.at));
        }
        if (!ok) break;
      }
      a.free();
      if (!ok) return;
    }
    if (!checked) v.skip("no device reports host_access mapped: nothing to check");
  }
  static void event_timing_matches(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    EventHandle e1 = b.event_create(0, EventFlags::timing), e2 = b.event_create(0, EventFlags::timing);
    b.event_record(0, e1, s);
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s, 2);
    b.event_record(0, e2, s);
    b.stream_synchronize(0, s);
    if (b.properties(0).event_timing) {
      float ms = b.event_elapsed_time(0, e1, e2);
      v.require(ms >= 0 && ms < 600000,
                fmt::format("event_timing is reported, and two records around 128 MiB of "
                            "copies are {} ms apart",
                            ms));
    } else {
      bool refused = false;
      try {
        (void)b.event_elapsed_time(0, e1, e2);
      } catch (const NotSupportedError&) {
        refused = true;
      }
      v.require(refused, "event_timing is false, yet elapsed_time did not refuse");
    }
    free_busy(kit, 0, w);
    b.event_destroy(0, e1);
    b.event_destroy(0, e2);
    b.stream_destroy(0, s);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_PROPERTIES_CHECKS(X)                                                \
  X(properties, properties_valid, "properties are complete and consistent (the schema's rules)") \
  X(properties, max_allocation_allocates, "max_allocation bytes can be allocated")               \
  X(properties, host_visible_memory_is_visible,                                                  \
    "host_visible_memory: the host reads and writes device memory directly")                     \
  X(properties, host_mapped_memory_is_visible,                                                   \
    "host_access mapped: the host reads and writes memory between host_map and host_unmap")      \
  X(properties, event_timing_matches,                                                            \
    "event_timing says whether elapsed_time works: it measures, or is refused")
