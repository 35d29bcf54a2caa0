// simdev's copy engine (examples/simdev/copy_engine.hpp) against the C
// library's memcpy, at the level of bytes: what a device-to-host copy into
// pageable memory costs on this machine, without PyTorch in the way.
//
//   copy_bench            256 MiB and 64 MiB, 41 rounds each
//   copy_bench --quick    small sizes and few rounds, to check that it runs
//
// Baseline: memcpy between two buffers at the same page offset (d = 0, as
// a CPU tensor's own copy), the copy every other row is divided by. Rows, each
// against the baseline measured in the same round (Note [Rounds and spread]
// in bench/simdev_bench.py; the per-round ratio's median and interquartile
// range are printed):
//   - glibc, d = 64: memcpy from page-aligned "device" memory into a buffer
//     64 bytes into its page, as a CPU tensor's data is (the 4K-aliasing
//     shape, Note [Copy direction and 4K aliasing]);
//   - engine, d = 64: the same copy through simdev::copy_bytes (pipelined
//     where the CPU has AVX2, else staged);
//   - staged, d = 64: the same copy staged through the engine's buffer, to
//     compare the two paths in one run;
//   - engine, d = 0: a copy the engine leaves to the C library (pinned memory).
#include "copy_engine.hpp"
#include "machine.hpp"
#include "rounds.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

struct Free {
  void operator()(char* p) const noexcept { std::free(p); }
};
using Buffer = std::unique_ptr<char, Free>;

Buffer page_aligned(std::size_t n, int fill) {
  Buffer b(static_cast<char*>(std::aligned_alloc(4096, (n + 8192) / 4096 * 4096)));
  if (!b) {
    std::fprintf(stderr, "copy_bench: cannot allocate %zu bytes\n", n);
    std::exit(1);
  }
  std::memset(b.get(), fill, n + 4096);  // touched: no page faults while timing
  return b;
}

void bench_size(std::size_t n, int rounds) {
  Buffer dev = page_aligned(n, 1), host = page_aligned(n, 2), other = page_aligned(n, 3);
  auto gbps = [n](auto&& copy) {
    auto t0 = std::chrono::steady_clock::now();
    copy();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return static_cast<double>(n) / s / 1e9;
  };
  std::vector<double> base, glibc, engine, staged, engine0;
  for (int r = 0; r < rounds; ++r) {
    double m = gbps([&] { std::memcpy(other.get() + 64, host.get() + 64, n); });
    base.push_back(m);
    glibc.push_back(gbps([&] { std::memcpy(host.get() + 64, dev.get(), n); }) / m);
    engine.push_back(gbps([&] { simdev::copy_bytes(host.get() + 64, dev.get(), n); }) / m);
#if SIMDEV_COPY_ENGINE_X86
    staged.push_back(gbps([&] { simdev::detail::copy_staged(host.get() + 64, dev.get(), n); }) / m);
#endif
    engine0.push_back(gbps([&] { simdev::copy_bytes(other.get(), dev.get(), n); }) / m);
  }
  if (std::memcmp(host.get() + 64, dev.get(), n) != 0) {
    std::fprintf(stderr, "copy_bench: the engine's copy differs from its source\n");
    std::exit(1);
  }
  simdev::CopyPath path = simdev::copy_path(reinterpret_cast<std::uintptr_t>(host.get() + 64),
                                            reinterpret_cast<std::uintptr_t>(dev.get()), n);
  const char* how = path == simdev::CopyPath::pipelined ? " (pipelined)"
                    : path == simdev::CopyPath::staged  ? " (staged)"
                                                        : " (C library)";
  std::string staged_row =
      staged.empty() ? "" : " | staged, d = 64: " + bench::format(bench::spread(staged), 2) + "x";
  std::printf("%4zu MiB  memcpy (d = 0) %s GB/s | glibc, d = 64: %sx | engine, d = 64%s: %sx%s | "
              "engine, d = 0: %sx\n",
              n >> 20, bench::format(bench::spread(base), 2).c_str(),
              bench::format(bench::spread(glibc), 2).c_str(), how,
              bench::format(bench::spread(engine), 2).c_str(), staged_row.c_str(),
              bench::format(bench::spread(engine0), 2).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bench::print_machine();
  std::printf("simdev copy engine vs memcpy; the engine takes copies from %zu MiB "
              "(a quarter of the last-level cache)\n",
              simdev::engine_threshold() >> 20);
  std::printf("(per-round ratios to the memcpy baseline of the same round: median [25%%-75%%] of "
              "%d rounds)\n",
              quick ? 3 : 41);
  if (quick) {
    bench_size(simdev::engine_threshold(), 3);
    return 0;
  }
  for (std::size_t mib : {std::size_t{256}, std::size_t{64}}) bench_size(mib << 20, 41);
}
