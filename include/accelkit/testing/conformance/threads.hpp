// accelkit: the conformance kit's threads checks: streams, copies and pinned
// memory used from several threads at once. Included by
// testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct ThreadChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::pageable;
  using Tools::pinned;

  static void threads_copy_independently(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    std::atomic<int> wrong{0}, errors{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        try {
          b.set_device(0);
          StreamHandle s = b.stream_create(0, 0);
          std::size_t n = 65536 + static_cast<std::size_t>(t);
          auto* host = static_cast<unsigned char*>(b.raw_host_malloc(0, n));
          void* dev = b.raw_malloc(0, n);
          for (int i = 0; i < 50; ++i) {
            std::vector<unsigned char> in = pattern(n, static_cast<unsigned>(t * 100 + i));
            b.memcpy_async(0, dev, in.data(), n, CopyKind::host_to_device, s, pageable);
            b.memcpy_async(0, host, dev, n, CopyKind::device_to_host, s, pinned);
            b.stream_synchronize(0, s);
            if (std::memcmp(host, in.data(), n) != 0) ++wrong;
          }
          b.raw_free(0, dev, n);
          b.raw_host_free(0, host);
          b.stream_destroy(0, s);
        } catch (...) {
          ++errors;
        }
      });
    for (std::thread& t : threads) t.join();
    v.require(errors == 0, fmt::format("{} of 4 threads failed with an error", errors.load()));
    v.require(wrong == 0, fmt::format("{} of 200 round trips on 4 threads came back wrong",
                                      wrong.load()));
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_THREADS_CHECKS(X)                                                       \
  X(threads, threads_copy_independently, "streams, copies and pinned memory work from many threads")
