// simdev's copy engine (examples/simdev/copy_engine.hpp, Note [Copy
// direction and 4K aliasing]): which copies it stages through its buffer,
// that it copies the same bytes as memcpy at every size and offset,
// and that a device-to-host copy into pageable memory it takes over still
// comes after the stream's work and still reports that work's errors.
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

namespace {
constexpr std::size_t kMiB = std::size_t{1} << 20;
// Addresses only compared, never touched: a page-aligned source (as device
// memory is) and destinations at chosen offsets 1 GiB away.
constexpr std::uintptr_t kSrc = std::uintptr_t{1} << 40;
constexpr std::uintptr_t kDst = kSrc + (std::uintptr_t{1} << 30);
constexpr std::size_t kFrom = 64 * kMiB;  // the engine's threshold in these checks

using simdev::CopyPath;
// The engine's path for a copy, on a CPU with AVX2 or without.
CopyPath path(std::uintptr_t dst, std::uintptr_t src, std::size_t n, bool avx2 = false) {
  return simdev::copy_path(dst, src, n, kFrom, avx2);
}
bool staged(std::uintptr_t dst, std::uintptr_t src, std::size_t n) {
  return path(dst, src, n) == CopyPath::staged;
}
}  // namespace

TEST_CASE("simdev stages large copies through its buffer when dst lies just past src modulo a page") {
  // A CPU tensor's data starts 64 bytes into its page: device-to-host.
  CHECK(staged(kDst + 64, kSrc, 256 * kMiB) == bool(SIMDEV_COPY_ENGINE_X86));
  for (std::uintptr_t d : {1, 16, 256, 2047})
    CHECK(staged(kDst + d, kSrc, kFrom) == bool(SIMDEV_COPY_ENGINE_X86));
  // With AVX2, those under kLag bytes past go in one pipelined pass instead.
  const CopyPath taken = SIMDEV_COPY_ENGINE_X86 ? CopyPath::pipelined : CopyPath::library;
  for (std::uintptr_t d : {1, 16, 64, 255}) CHECK(path(kDst + d, kSrc, kFrom, true) == taken);
  for (std::uintptr_t d : {256, 2047})
    CHECK(path(kDst + d, kSrc, kFrom, true) ==
          (SIMDEV_COPY_ENGINE_X86 ? CopyPath::staged : CopyPath::library));
  CHECK(path(kDst + 64, kSrc, kFrom - 1, true) == CopyPath::library);
  // Forward copies that meet no store of theirs: the C library's.
  for (std::uintptr_t d : {0, 2048, 4032, 4095}) CHECK_FALSE(staged(kDst + d, kSrc, 256 * kMiB));
  // The other direction (host-to-device: dst 64 bytes before src's offset).
  CHECK_FALSE(staged(kSrc, kDst + 64, 256 * kMiB));
  // Smaller copies stay with the C library, whose temporal stores leave the
  // store queue quickly (and which copies backward itself under 256 bytes).
  CHECK_FALSE(staged(kDst + 64, kSrc, kFrom - 1));
  // Overlapping ranges are the C library's memmove.
  CHECK_FALSE(staged(kSrc + 64, kSrc, 8 * kMiB));
  CHECK_FALSE(staged(kSrc, kSrc + 64, 8 * kMiB));
  CHECK(simdev::engine_threshold() >= 4 * kMiB);
}

#if SIMDEV_COPY_ENGINE_X86
TEST_CASE("simdev's staged and pipelined copies give memcpy's bytes at every size and offset") {
  namespace d = simdev::detail;
  // The staged copy with SSE2 and with AVX2, and the pipelined one (nullptr
  // here), where the CPU has AVX2.
  std::vector<d::StageCopy> stages = {d::stage_sse2};
#if defined(__GNUC__)
  if (d::has_avx2()) stages.push_back(d::stage_avx2), stages.push_back(nullptr);
#endif
  constexpr std::size_t kGuard = 64;
  const std::size_t sizes[] = {0,    1,    63,   64,   127,   128,   200,  2047,
                               2048, 2049, 2111, 4095, 6144,  8193,  16384, 16447,
                               3 * 16384 + 5 * 64 + 17};
  const std::size_t offsets[] = {0, 1, 16, 64, 2047, 2048, 4032, 4095};
  std::vector<unsigned char> src_buf(4 * 16384 + 2 * 4096);
  for (std::size_t i = 0; i < src_buf.size(); ++i)
    src_buf[i] = static_cast<unsigned char>(i * 131 + (i >> 8));
  std::vector<unsigned char> dst_buf(src_buf.size() + 4096 + 2 * kGuard);
  for (std::size_t g = 0; g < stages.size(); ++g)
    for (std::size_t n : sizes)
      for (std::size_t src_off : {std::size_t{0}, std::size_t{5}, std::size_t{64}})
        for (std::size_t dst_off : offsets) {
          std::fill(dst_buf.begin(), dst_buf.end(), 0xEE);
          const unsigned char* src = src_buf.data() + src_off;
          unsigned char* dst = dst_buf.data() + kGuard + dst_off;
          if (stages[g])
            d::copy_staged(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), n,
                           stages[g]);
          else
            d::copy_pipelined(reinterpret_cast<char*>(dst), reinterpret_cast<const char*>(src), n);
          INFO((g == 0 ? "staged SSE2, " : g == 1 ? "staged AVX2, " : "pipelined AVX2, ")
               << n << " bytes, src +" << src_off << ", dst +" << dst_off);
          REQUIRE(std::memcmp(dst, src, n) == 0);
          bool guards = true;
          for (std::size_t i = 0; i < dst_buf.size(); ++i)
            if ((dst_buf.data() + i < dst || dst_buf.data() + i >= dst + n) && dst_buf[i] != 0xEE)
              guards = false;
          REQUIRE(guards);  // nothing written outside [dst, dst + n)
        }
}
#endif

TEST_CASE("simdev's copies of overlapping ranges move them") {
  std::vector<unsigned char> both(10000), want;
  for (std::size_t i = 0; i < both.size(); ++i) both[i] = static_cast<unsigned char>(i * 7);
  want = both;
  std::memmove(want.data() + 64, want.data(), 9000);
  simdev::copy_bytes(both.data() + 64, both.data(), 9000);
  CHECK(both == want);
  std::memmove(want.data(), want.data() + 100, 9000);
  simdev::copy_bytes(both.data(), both.data() + 100, 9000);
  CHECK(both == want);
}

TEST_CASE("simdev: a device-to-host copy into pageable memory through the engine keeps stream order") {
  // As large as the engine takes (a quarter of the last-level cache).
  const std::size_t n = simdev::engine_threshold() + 4096 + 100;
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {n + 4 * kMiB};
  Backend<simdev::SimRuntime> b(Environment::fixed({}), c);
  StreamHandle s = b.stream_create(0, 0);
  void* dev = b.raw_malloc(0, n);  // page-aligned
  // Pageable memory 64 bytes into a page, as a CPU tensor's.
  std::vector<unsigned char> host(n + 2 * 4096);
  auto* out = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(host.data()) + 4095) / 4096 * 4096 + 64);
  REQUIRE((simdev::copy_path(reinterpret_cast<std::uintptr_t>(out),
                             reinterpret_cast<std::uintptr_t>(dev), n) != CopyPath::library) ==
          bool(SIMDEV_COPY_ENGINE_X86));
  // The fill is queued behind a gate opened later from another thread: the
  // copy, which returns only when done, must wait for it.
  auto gate = b.runtime().hold(0, s);
  b.memset_async(0, dev, 7, n, s);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate->open();
  });
  b.memcpy_async(0, out, dev, n, CopyKind::device_to_host, s, false);
  opener.join();
  CHECK(out[-1] == 0);
  CHECK(out[0] == 7);
  CHECK(out[n / 2] == 7);
  CHECK(out[n - 1] == 7);
  CHECK(out[n] == 0);
  // A failure of the queued work surfaces at the copy or the next
  // synchronization.
  b.runtime().inject_fault("memset_async", 1, /*async=*/true);
  b.memset_async(0, dev, 9, n, s);
  try {
    b.memcpy_async(0, out, dev, n, CopyKind::device_to_host, s, false);
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

TEST_CASE("memcpy_async: the host side's pinning is the SDK's claim, and simdev checks it") {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {16 * kMiB};
  Backend<simdev::SimRuntime> b(Environment::fixed({}), c);
  StreamHandle s = b.stream_create(0, 0);
  const std::size_t n = 4096;
  void* dev = b.raw_malloc(0, n);
  auto error_of = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const DriverError& e) {
      CHECK(e.code() == simdev::kInvalidValue);
      return e.what();
    }
    return "no error";
  };
  // Pageable memory claimed pinned, and a claim on a copy without host side.
  std::vector<char> pageable(n, 'p');
  CHECK(error_of([&] {
          b.memcpy_async(0, dev, pageable.data(), n, CopyKind::host_to_device, s, true);
        }).find("is claimed pinned but is not memory from host_malloc") != std::string::npos);
  CHECK(error_of([&] {
          b.memcpy_async(0, dev, dev, n, CopyKind::device_to_device, s, true);
        }).find("host_pinned is true for a device_to_device copy") != std::string::npos);

  // A claimed copy is queued: it returns while the stream is held.
  auto* pinned = static_cast<char*>(b.raw_host_malloc(0, n));
  std::memset(pinned, 'q', n);
  auto gate = b.runtime().hold(0, s);
  b.memcpy_async(0, dev, pinned, n, CopyKind::host_to_device, s, true);
  gate->open();
  b.stream_synchronize(0, s);
  std::vector<char> back(n, 0);
  b.memcpy(0, back.data(), dev, n, CopyKind::device_to_host);
  CHECK(back == std::vector<char>(n, 'q'));

  // Pinned memory not claimed is pageable: consumed before the call returns,
  // after the held stream's work.
  std::memset(pinned, 'r', n);
  gate = b.runtime().hold(0, s);
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    gate->open();
  });
  b.memcpy_async(0, dev, pinned, n, CopyKind::host_to_device, s, false);
  std::memset(pinned, 'x', n);  // the copy has consumed it
  opener.join();
  b.stream_synchronize(0, s);
  b.memcpy(0, back.data(), dev, n, CopyKind::device_to_host);
  CHECK(back == std::vector<char>(n, 'r'));
  b.raw_host_free(0, pinned);
  b.raw_free(0, dev, n);
}
