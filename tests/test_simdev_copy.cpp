// simdev's copy engine (examples/simdev/copy_engine.hpp, Note [Copy
// direction and 4K aliasing]): which copies it runs from the end to the
// start, that every way it copies gives the same bytes, and that a
// device-to-host copy into pageable memory it takes over still comes after
// the stream's work and still reports that work's errors.
#include "catch.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using Plan = simdev::CopyPlan;

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
// Addresses only compared, never touched: a page-aligned source (as device
// memory is) and destinations at chosen offsets 1 GiB away.
constexpr std::uintptr_t kSrc = std::uintptr_t{1} << 40;
constexpr std::uintptr_t kDst = kSrc + (std::uintptr_t{1} << 30);

Plan plan(std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
  return simdev::plan_copy(dst, src, n, /*streaming_from=*/64 * kMiB);
}
bool backward(const Plan& p) { return p.order == Plan::Order::backward; }
}  // namespace

TEST_CASE("simdev copies large copies backward when dst lies just past src modulo a page") {
#if SIMDEV_COPY_ENGINE_X86
  // A CPU tensor's data starts 64 bytes into its page: device-to-host.
  Plan d2h = plan(kDst + 64, kSrc, 256 * kMiB);
  CHECK(backward(d2h));
  CHECK(d2h.streaming);
  Plan mid = plan(kDst + 64, kSrc, 16 * kMiB);
  CHECK(backward(mid));
  CHECK_FALSE(mid.streaming);  // below streaming_from: through the caches
  for (std::uintptr_t d : {1, 16, 256, 2047}) CHECK(backward(plan(kDst + d, kSrc, 256 * kMiB)));
#endif
  // Forward copies meet no store of theirs: the C library's.
  for (std::uintptr_t d : {0, 2048, 4032, 4095})
    CHECK(plan(kDst + d, kSrc, 256 * kMiB).order == Plan::Order::library);
  // The other direction (host-to-device: dst 64 bytes before src's offset).
  CHECK(plan(kSrc, kDst + 64, 256 * kMiB).order == Plan::Order::library);
  // Small copies stay with the C library, whose paths for them go backward
  // on their own when they alias.
  CHECK(plan(kDst + 64, kSrc, simdev::kEngineMinBytes - 1).order == Plan::Order::library);
  // Overlapping ranges are the C library's memmove.
  CHECK(plan(kSrc + 64, kSrc, 8 * kMiB).order == Plan::Order::library);
  CHECK(plan(kSrc, kSrc + 64, 8 * kMiB).order == Plan::Order::library);
  // The default threshold for non-temporal stores is never below the engine's.
  CHECK(simdev::streaming_threshold() >= simdev::kEngineMinBytes);
}

TEST_CASE("simdev's copy engine copies the same bytes every way, at every offset") {
  const std::vector<Plan> plans = {
      {Plan::Order::library, false},
      {Plan::Order::backward, false},
      {Plan::Order::backward, true},
  };
  constexpr std::size_t kGuard = 64;
  const std::size_t sizes[] = {0, 1, 63, 64, 127, 128, 200, 4095, 8192, 8193, 3 * 4096 + 100,
                               kMiB + 37};
  const std::size_t offsets[] = {0, 1, 16, 64, 2047, 2048, 4032, 4095};
  std::vector<unsigned char> src_buf(kMiB + 2 * 4096);
  for (std::size_t i = 0; i < src_buf.size(); ++i)
    src_buf[i] = static_cast<unsigned char>(i * 131 + (i >> 8));
  std::vector<unsigned char> dst_buf(kMiB + 3 * 4096 + 2 * kGuard);
  for (const Plan& p : plans)
    for (std::size_t n : sizes)
      for (std::size_t src_off : {std::size_t{0}, std::size_t{5}, std::size_t{64}})
        for (std::size_t dst_off : offsets) {
          std::fill(dst_buf.begin(), dst_buf.end(), 0xEE);
          const unsigned char* src = src_buf.data() + src_off;
          unsigned char* dst = dst_buf.data() + kGuard + dst_off;
          simdev::copy_with(p, dst, src, n);
          INFO("plan " << static_cast<int>(p.order) << (p.streaming ? " streaming" : "") << ", "
                       << n << " bytes, src +" << src_off << ", dst +" << dst_off);
          REQUIRE(std::memcmp(dst, src, n) == 0);
          bool guards = true;
          for (std::size_t i = 0; i < dst_buf.size(); ++i)
            if ((dst_buf.data() + i < dst || dst_buf.data() + i >= dst + n) && dst_buf[i] != 0xEE)
              guards = false;
          REQUIRE(guards);  // nothing written outside [dst, dst + n)
        }
  // Overlapping ranges, both ways.
  std::vector<unsigned char> both(src_buf.begin(), src_buf.begin() + 10000);
  std::vector<unsigned char> want(both);
  std::memmove(want.data() + 64, want.data(), 9000);
  simdev::copy_bytes(both.data() + 64, both.data(), 9000);
  CHECK(both == want);
  std::memmove(want.data(), want.data() + 100, 9000);
  simdev::copy_bytes(both.data(), both.data() + 100, 9000);
  CHECK(both == want);
}

#if SIMDEV_COPY_ENGINE_X86
TEST_CASE("simdev's backward copy gives the same bytes with SSE2 and with AVX2") {
  namespace d = simdev::detail;
  std::vector<d::GroupCopy> groups = {d::copy_group_sse2<false>, d::copy_group_sse2<true>};
#if defined(__GNUC__)
  if (d::has_avx2()) groups.insert(groups.end(), {d::copy_group_avx2<false>, d::copy_group_avx2<true>});
#endif
  const std::size_t n = 3 * d::kGroup + 5 * d::kLine + 17;
  std::vector<unsigned char> src(n + 64), dst(n + 4096 + 128);
  for (std::size_t i = 0; i < src.size(); ++i) src[i] = static_cast<unsigned char>(i * 7 + (i >> 12));
  for (std::size_t g = 0; g < groups.size(); ++g) {
    std::fill(dst.begin(), dst.end(), 0);
    unsigned char* out = dst.data() + 64 + 64;  // not aligned like src
    bool streaming = g % 2 == 1;
    if (streaming)
      d::copy_backward<true>(reinterpret_cast<char*>(out), reinterpret_cast<const char*>(src.data() + 3), n, groups[g]);
    else
      d::copy_backward<false>(reinterpret_cast<char*>(out), reinterpret_cast<const char*>(src.data() + 3), n, groups[g]);
    INFO("group copy " << g);
    CHECK(std::memcmp(out, src.data() + 3, n) == 0);
    CHECK(out[-1] == 0);
    CHECK(out[n] == 0);
  }
}
#endif

TEST_CASE("simdev: a device-to-host copy into pageable memory through the engine keeps stream order") {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {std::uint64_t{64} << 20};
  Backend<simdev::SimRuntime> b(Environment::fixed({}), c);
  StreamHandle s = b.stream_create(0, 0);
  const std::size_t n = simdev::kEngineMinBytes + 4096 + 100;
  void* dev = b.raw_malloc(0, n);  // page-aligned
  // Pageable memory 64 bytes into a page: the engine's backward copy.
  std::vector<unsigned char> host(n + 2 * 4096);
  auto* out = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(host.data()) + 4095) / 4096 * 4096 + 64);
  REQUIRE(plan(reinterpret_cast<std::uintptr_t>(out), reinterpret_cast<std::uintptr_t>(dev), n)
              .order == (SIMDEV_COPY_ENGINE_X86 ? Plan::Order::backward : Plan::Order::library));
  // The fill is queued behind a gate opened later from another thread: the
  // copy, which returns only when done, must wait for it.
  auto gate = b.runtime().hold(0, s);
  b.memset_async(0, dev, 7, n, s);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate->open();
  });
  b.memcpy_async(0, out, dev, n, CopyKind::device_to_host, s);
  opener.join();
  CHECK(out[0] == 7);
  CHECK(out[n / 2] == 7);
  CHECK(out[n - 1] == 7);
  // A failure of the queued work surfaces at the copy.
  b.runtime().inject_fault("memset_async", 1, /*async=*/true);
  b.memset_async(0, dev, 9, n, s);
  try {
    b.memcpy_async(0, out, dev, n, CopyKind::device_to_host, s);
    b.stream_synchronize(0, s);
    FAIL("no asynchronous error");
  } catch (const DriverError& e) {
    CHECK(e.code() == simdev::kLaunchFailure);
    CHECK(std::string(e.what()).find("queued memset_async failed") != std::string::npos);
  }
  b.stream_synchronize(0, s);
  b.raw_free(0, dev, n);
  b.stream_destroy(0, s);
}
