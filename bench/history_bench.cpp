// What recording the caching allocator's history costs (memory/history.hpp):
// nanoseconds per allocate + free pair on the hit path (one size again and
// again, warm) and for random sizes, with recording off, on without a
// context gatherer, and on with a cheap fake gatherer (it hands out one
// shared context: what remains is the allocator's own bookkeeping, not the
// cost of capturing stack frames).
//
//   history_bench           the full run (about a minute)
//   history_bench --quick   tiny counts, to check that it runs
//
// Built against a tree without memory/history.hpp (an older accelkit), it
// measures recording off alone, so that the two builds' figures compare.
#include <accelkit/accelkit.hpp>

#if __has_include(<accelkit/memory/history.hpp>)
#include <accelkit/memory/history.hpp>
#define HISTORY_BENCH_RECORDS 1
#else
#define HISTORY_BENCH_RECORDS 0
#endif

#include "machine.hpp"
#include "rounds.hpp"
#include "simdev_runtime.hpp"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;
using Clock = std::chrono::steady_clock;
using SimBackend = Backend<simdev::SimRuntime>;
using Allocator = DeviceCachingAllocator<simdev::SimRuntime>;

namespace {

bool quick = false;

enum class Mode { off, on_no_gatherer, on_fake_gatherer };
const char* name(Mode m) {
  switch (m) {
    case Mode::off: return "recording off";
    case Mode::on_no_gatherer: return "on, no gatherer";
    case Mode::on_fake_gatherer: return "on, fake gatherer";
  }
  return "?";
}

#if HISTORY_BENCH_RECORDS
struct FakeContext : HistoryContext {};
#endif

// One allocator on its own simdev device, recording as `mode` says.
struct Setup {
  std::unique_ptr<SimBackend> backend;
  std::unique_ptr<Allocator> alloc;
  StreamHandle stream;
  explicit Setup(Mode mode) {
    simdev::Config c;
    c.device_count = 1;
    c.memory_bytes = {std::uint64_t{64} << 30};  // address space only: untouched
    backend = std::make_unique<SimBackend>(Environment::fixed({}), c);
    alloc = std::make_unique<Allocator>(*backend, 0, AllocatorConfig{});
    stream = backend->stream_create(0, 0);
#if HISTORY_BENCH_RECORDS
    if (mode != Mode::off) {
      HistoryOptions o;  // enabled and context "all", as _record_memory_history's defaults
      o.max_entries = 1 << 16;  // a ring that wraps: the steady state
      if (mode == Mode::on_fake_gatherer) {
        auto shared = std::make_shared<FakeContext>();
        o.gather = [shared] { return std::shared_ptr<HistoryContext>(shared); };
      }
      alloc->record_history(o);
    }
#else
    (void)mode;
#endif
  }
};

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// The median over `batches` of the mean ns per pair of `pairs` pairs.
template <class F>
double median_per_pair(int batches, int pairs, F&& pair) {
  std::vector<double> v;
  for (int i = 0; i < batches; ++i) {
    auto t0 = Clock::now();
    for (int j = 0; j < pairs; ++j) pair();
    v.push_back(ns_since(t0) / pairs);
  }
  return bench::percentile(v, 0.5);
}

double hit_path(Setup& s, std::size_t size, int batches, int pairs) {
  Allocator& a = *s.alloc;
  StreamHandle st = s.stream;
  for (int i = 0; i < 64; ++i) a.deallocate(a.allocate(size, st));  // warm
  return median_per_pair(batches, pairs, [&] { a.deallocate(a.allocate(size, st)); });
}

// Random sizes, in the manner of RMM's random_allocations: `live` blocks of
// sizes drawn from 512 B to 4 MiB (log-uniform, so small ones dominate as
// in training); each pair frees a random live block and allocates a new
// size in its place. Everything drawn before timing, from a fixed seed.
struct RandomSizes {
  std::vector<std::size_t> sizes, victims;
  RandomSizes(std::size_t ops, std::size_t live) {
    std::mt19937_64 rng(42);
    std::uniform_real_distribution<double> exp(9.0, 22.0);  // 2^9 .. 2^22 bytes
    std::uniform_int_distribution<std::size_t> pick(0, live - 1);
    for (std::size_t i = 0; i < ops + live; ++i)
      sizes.push_back(static_cast<std::size_t>(std::exp2(exp(rng))));
    for (std::size_t i = 0; i < ops; ++i) victims.push_back(pick(rng));
  }
};

double random_sizes(Setup& s, const RandomSizes& w, std::size_t live, int batches, int pairs) {
  Allocator& a = *s.alloc;
  StreamHandle st = s.stream;
  std::vector<void*> blocks;
  for (std::size_t i = 0; i < live; ++i) blocks.push_back(a.allocate(w.sizes[i], st));
  std::size_t next = 0;
  std::size_t ops = w.victims.size();
  double ns = median_per_pair(batches, pairs, [&] {
    std::size_t k = next % ops;
    void*& victim = blocks[w.victims[k]];
    a.deallocate(victim);
    victim = a.allocate(w.sizes[live + k], st);
    ++next;
  });
  for (void* p : blocks) a.deallocate(p);
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--quick") == 0) quick = true;
  bench::print_machine();
  const int rounds = quick ? 2 : 11, batches = quick ? 5 : 101, pairs = quick ? 16 : 256;
  const std::size_t live = 256;
  RandomSizes w(quick ? 1024 : 65536, live);
  std::vector<Mode> modes = {Mode::off};
  if (HISTORY_BENCH_RECORDS) modes = {Mode::off, Mode::on_no_gatherer, Mode::on_fake_gatherer};
  std::printf("history recording: ns per allocate + free pair, median [25%%-75%%] of %d rounds "
              "(each the median of %d batches of %d pairs; modes take turns in each round)\n",
              rounds, batches, pairs);
  std::printf("%-20s %24s %24s %24s\n", "mode", "hit 4 KiB", "hit 4 MiB", "random 512 B-4 MiB");
  std::vector<std::vector<std::vector<double>>> figures(
      modes.size(), std::vector<std::vector<double>>(3));
  for (int r = 0; r < rounds; ++r) {
    for (std::size_t k = 0; k < modes.size(); ++k) {
      std::size_t m = (k + static_cast<std::size_t>(r)) % modes.size();  // rotate the order
      Setup s(modes[m]);
      figures[m][0].push_back(hit_path(s, 4096, batches, pairs));
      figures[m][1].push_back(hit_path(s, 4 * kMiB, batches, pairs));
      figures[m][2].push_back(random_sizes(s, w, live, batches, pairs));
    }
  }
  for (std::size_t m = 0; m < modes.size(); ++m)
    std::printf("%-20s %24s %24s %24s\n", name(modes[m]),
                bench::format(bench::spread(figures[m][0])).c_str(),
                bench::format(bench::spread(figures[m][1])).c_str(),
                bench::format(bench::spread(figures[m][2])).c_str());
  return 0;
}
