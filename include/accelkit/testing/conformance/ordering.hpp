// accelkit: the conformance kit's ordering checks: rules about what the SDK
// and the runtime do to each other, checked through the SDK's own pools
// (Note [Observing a runtime]). Included by testing/conformance.hpp, which
// registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <string>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct OrderingChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Obs;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;

  static void no_free_under_queued_work(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    (void)b.runtime().take_violations();
    {
      DeviceCachingAllocator<Obs> pool(b, 0, AllocatorConfig{});
      StreamHandle s = b.stream_create(0, 0), other = b.stream_create(0, 0);
      Busy w = make_busy(kit, 0);
      for (int round = 0; round < 3; ++round) {
        std::size_t n = std::size_t{24} << 20;
        void* p = pool.allocate(n, s);
        queue_busy(kit, 0, w, s, 4);
        b.memset_async(0, p, round, n, s);
        pool.record_stream(p, other);
        b.memset_async(0, p, round + 1, n, other);
        pool.deallocate(p);
        pool.empty_cache();  // frees the segment once its work is done
      }
      b.device_synchronize(0);
      free_busy(kit, 0, w);
      b.stream_destroy(0, s);
      b.stream_destroy(0, other);
    }
    std::vector<std::string> bad = b.runtime().take_violations();
    v.require(bad.empty(), bad.empty() ? "" : bad.front());
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_ORDERING_CHECKS(X)                                 \
  X(ordering, no_free_under_queued_work,                                        \
    "no memory goes back to the driver while queued work still uses it")
