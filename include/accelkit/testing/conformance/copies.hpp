// accelkit: the conformance kit's copies checks: synchronous and stream-
// ordered copies and fills, exact in every direction and in queue order.
// Included by testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <algorithm>
#include <cstring>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct CopyChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::pinned;
  using Tools::no_host_side;

  static void copies_every_direction(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    for (int d = 0; d < kit.devices(); ++d) {
      for (std::size_t n : {std::size_t{1}, std::size_t{3}, std::size_t{512}, std::size_t{4099},
                            (std::size_t{1} << 20) + 7}) {
        std::vector<unsigned char> in = pattern(n, static_cast<unsigned>(n)), out(n, 0);
        void* a = b.raw_malloc(d, n);
        void* c = b.raw_malloc(d, n);
        b.memcpy(d, a, in.data(), n, CopyKind::host_to_device);
        b.memcpy(d, c, a, n, CopyKind::device_to_device);
        b.memcpy(d, out.data(), c, n, CopyKind::device_to_host);
        b.raw_free(d, a, n);
        b.raw_free(d, c, n);
        std::size_t bad = static_cast<std::size_t>(
            std::mismatch(in.begin(), in.end(), out.begin()).first - in.begin());
        if (!v.require(bad == n, fmt::format("device {}: {} bytes host->device->device->host "
                                             "came back different from byte {}",
                                             d, n, bad)))
          return;
      }
    }
  }
  static void async_copies_ordered(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::size_t n = (std::size_t{4} << 20) + 5;
    StreamHandle s = b.stream_create(0, 0);
    auto* host_in = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
    auto* host_out = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
    std::vector<unsigned char> in = pattern(n, 3);
    std::memcpy(host_in, in.data(), n);
    std::memset(host_out, 0, n);
    void* a = b.raw_malloc(0, n);
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, a, host_in, n, CopyKind::host_to_device, s, pinned);
    b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, no_host_side);
    b.memset_async(0, static_cast<char*>(c) + 100, 0x7e, 1000, s);
    b.memset_async(0, a, 0, n, s);  // after the copy out of a: must not reach c
    b.memcpy_async(0, host_out, c, n, CopyKind::device_to_host, s, pinned);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> want = in;
    std::memset(want.data() + 100, 0x7e, 1000);
    std::size_t bad =
        static_cast<std::size_t>(std::mismatch(want.begin(), want.end(), host_out).first - want.begin());
    v.require(bad == n, fmt::format("copies and fills queued on one stream ran out of order or "
                                    "wrong: byte {} of {} differs",
                                    bad, n));
    b.raw_free(0, a, n);
    b.raw_free(0, c, n);
    b.raw_host_free(0, host_in);
    b.raw_host_free(0, host_out);
    b.stream_destroy(0, s);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_COPIES_CHECKS(X)                                           \
  X(copies, copies_every_direction, "copies in every direction and size are exact")     \
  X(copies, async_copies_ordered, "copies and fills queued on one stream run in order")
