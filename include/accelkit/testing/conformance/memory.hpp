// accelkit: the conformance kit's memory checks: malloc's alignment, and
// nullptr (not an exception) when memory runs out. Included by
// testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct MemoryChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using Tools::no_device;

  static void malloc_aligned(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    for (int d = 0; d < kit.devices(); ++d) {
      std::size_t align = b.properties(d).memory_alignment;
      std::vector<std::pair<void*, std::size_t>> held;
      for (std::size_t n : {1, 7, 128, 255, 256, 4097, 65536 + 3, 1 << 20}) {
        void* p = b.runtime().malloc(b.physical(d), n);
        if (!v.require(p != nullptr, fmt::format("malloc({}, {}) returned nullptr", d, n))) break;
        held.emplace_back(p, n);
        v.require(reinterpret_cast<std::uintptr_t>(p) % align == 0,
                  fmt::format("malloc({}, {}) returned {}, not aligned to memory_alignment {}", d, n,
                              p, align));
      }
      for (auto [p, n] : held) b.runtime().free(b.physical(d), p);
      if (v.status() != CheckStatus::pass) return;
    }
  }
  static void exhaustion_is_nullptr(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    const DeviceProperties& p = b.properties(0);
    if (p.total_memory > (std::size_t{4} << 30) && !std::getenv("ACCELKIT_CONFORMANCE_LARGE"))
      return v.skip(fmt::format("total_memory is {} bytes; set ACCELKIT_CONFORMANCE_LARGE=1 to "
                                "exhaust it",
                                p.total_memory));
    std::size_t chunk = std::max<std::size_t>(p.max_allocation / 2, 1 << 20);
    std::vector<void*> held;
    void* last = nullptr;
    for (std::size_t i = 0; i < 4 * (p.total_memory / chunk + 2); ++i) {
      last = b.runtime().malloc(b.physical(0), chunk);
      if (!last) break;
      held.push_back(last);
    }
    v.require(last == nullptr, fmt::format("malloc never returned nullptr after {} bytes ({} "
                                           "bytes of capacity)",
                                           held.size() * chunk, p.total_memory));
    for (void* q : held) b.runtime().free(b.physical(0), q);
    void* again = b.runtime().malloc(b.physical(0), chunk);
    v.require(again != nullptr, "after exhaustion and freeing everything, malloc still failed");
    if (again) b.runtime().free(b.physical(0), again);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_MEMORY_CHECKS(X)                                    \
  X(memory, malloc_aligned, "malloc returns memory aligned to memory_alignment") \
  X(memory, exhaustion_is_nullptr,                                               \
    "malloc returns nullptr when memory runs out, and works again after frees")
