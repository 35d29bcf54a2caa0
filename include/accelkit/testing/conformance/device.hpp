// accelkit: the conformance kit's device checks: device_synchronize covers
// every stream of the device. Included by testing/conformance.hpp, which
// registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct DeviceChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;

  static void device_synchronize_covers_streams(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    Busy w = make_busy(kit, 0);
    std::vector<StreamHandle> streams;
    for (int i = 0; i < 3; ++i) {
      streams.push_back(b.stream_create(0, 0));
      queue_busy(kit, 0, w, streams.back(), 4);
    }
    b.device_synchronize(0);
    for (StreamHandle s : streams)
      v.require(b.stream_query(0, s), "a stream still has work after device_synchronize");
    for (StreamHandle s : streams) b.stream_destroy(0, s);
    free_busy(kit, 0, w);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_DEVICE_CHECKS(X)                                               \
  X(device, device_synchronize_covers_streams, "device_synchronize waits for every stream")
