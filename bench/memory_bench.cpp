// Benchmarks of accelkit's caching device allocator against the runtime's raw
// driver allocation and a naive pool, all measured in the same run on simdev
// (whose raw allocation is an mmap, costing microseconds as real drivers do).
//
//   memory_bench            the full run (a minute or two)
//   memory_bench --quick    tiny sizes and counts, to check that it runs
//   memory_bench --expandable  only the expandable segments' figures
//   memory_bench --pairs ...  one window of random allocations, for
//                           bench/alloc_counts.py (see pairs_main)
//
// Prints, per workload, each allocator's figure and its ratio to accelkit's.
#include <accelkit/accelkit.hpp>

#include "machine.hpp"
#include "rounds.hpp"
#include "simdev_runtime.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;
using Clock = std::chrono::steady_clock;
using SimBackend = Backend<simdev::SimRuntime>;

namespace {

bool quick = false;

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

// ------------------------------------------------------------ allocators
// Each offers allocate(size, stream), deallocate(ptr, size) and peak
// reserved bytes (the driver memory it held at most).

struct Raw {
  static constexpr const char* name = "raw driver";
  SimBackend& b;
  std::size_t reserved = 0, peak = 0;
  void* allocate(std::size_t n, StreamHandle) {
    void* p = b.raw_malloc(0, n);
    reserved += n;
    peak = std::max(peak, reserved);
    return p;
  }
  void deallocate(void* p, std::size_t n) {
    b.raw_free(0, p, n);
    reserved -= n;
  }
  std::size_t peak_reserved() const { return peak; }
};

// One mutex, free blocks in an ordered multimap by size, best fit, no
// splitting: the pool many backends start with.
struct Naive {
  static constexpr const char* name = "naive pool";
  SimBackend& b;
  std::mutex m;
  std::multimap<std::size_t, void*> free_blocks;
  std::unordered_map<void*, std::size_t> sizes;
  std::size_t reserved = 0, peak = 0;
  void* allocate(std::size_t n, StreamHandle) {
    std::size_t size = (n + 511) / 512 * 512;
    std::lock_guard<std::mutex> lock(m);
    auto it = free_blocks.lower_bound(size);
    if (it != free_blocks.end()) {
      void* p = it->second;
      free_blocks.erase(it);
      return p;
    }
    void* p = nullptr;
    try {
      p = b.raw_malloc(0, size);
    } catch (const OutOfMemoryError&) {
      for (auto& [s, q] : free_blocks) {
        b.raw_free(0, q, s);
        sizes.erase(q);
        reserved -= s;
      }
      free_blocks.clear();
      p = b.raw_malloc(0, size);
    }
    sizes[p] = size;
    reserved += size;
    peak = std::max(peak, reserved);
    return p;
  }
  void deallocate(void* p, std::size_t) {
    std::lock_guard<std::mutex> lock(m);
    free_blocks.emplace(sizes.at(p), p);
  }
  std::size_t peak_reserved() const { return peak; }
};

struct Accelkit {
  static constexpr const char* name = "accelkit";
  DeviceCachingAllocator<simdev::SimRuntime> a;
  explicit Accelkit(SimBackend& b, AllocatorConfig c = {}) : a(b, 0, c) {}
  void* allocate(std::size_t n, StreamHandle s) { return a.allocate(n, s); }
  void deallocate(void* p, std::size_t) { a.deallocate(p); }
  std::size_t peak_reserved() {
    return static_cast<std::size_t>(a.stats().reserved_bytes[0].peak);
  }
};

std::unique_ptr<SimBackend> make_backend() {
  simdev::Config c;
  c.device_count = 1;
  c.memory_bytes = {std::uint64_t{256} << 30};  // address space only: untouched
  return std::make_unique<SimBackend>(Environment::fixed({}), c);
}

std::string human(std::size_t n) {
  if (n >= kMiB) return std::to_string(n / kMiB) + " MiB";
  if (n >= 1024) return std::to_string(n / 1024) + " KiB";
  return std::to_string(n) + " B";
}

// ------------------------------------------------------------- hit path

struct Latency {
  double p50, p99;
};

// Allocates and frees the same size over and over. Each sample is the mean
// of a batch of pairs (one clock read per batch, not per pair).
template <class A>
Latency hit_path(A& alloc, std::size_t size, StreamHandle s, int samples, int batch) {
  for (int i = 0; i < 16; ++i) alloc.deallocate(alloc.allocate(size, s), size);  // warm
  std::vector<double> per_pair;
  per_pair.reserve(static_cast<std::size_t>(samples));
  for (int i = 0; i < samples; ++i) {
    auto t0 = Clock::now();
    for (int j = 0; j < batch; ++j) alloc.deallocate(alloc.allocate(size, s), size);
    per_pair.push_back(ns_since(t0) / batch);
  }
  return {bench::percentile(per_pair, 0.5), bench::percentile(per_pair, 0.99)};
}

// Rounds of the hit path (Note [Rounds and spread] in bench/simdev_bench.py):
// in each round accelkit and the naive pool take turns (the order swapped
// every other round), each giving the median of its batches; a row prints,
// for each, the median of its rounds with the interquartile range, the
// median p99 of the batches, and the median of the per-round ratios.
void bench_hit_path() {
  const int rounds = quick ? 2 : 15, samples = quick ? 20 : 300, batch = quick ? 4 : 64;
  std::printf("\n== hit path: allocate + free of one size, warm (ns per pair; median [25%%-75%%] of "
              "%d rounds, each the median of %d batches of %d pairs) ==\n",
              rounds, samples, batch);
  std::printf("%-10s %22s %9s %22s %9s %22s %12s\n", "size", "accelkit p50", "p99", "naive pool p50",
              "p99", "naive/accelkit", "raw p50");
  std::vector<std::size_t> sizes = {256, 4096, 64 * 1024, kMiB, 16 * kMiB, 256 * kMiB};
  if (quick) sizes = {256, 4 * kMiB};
  for (std::size_t size : sizes) {
    auto backend = make_backend();
    StreamHandle s = backend->stream_create(0, 0);
    Accelkit ours(*backend);
    Naive naive{*backend, {}, {}, {}};
    Raw raw{*backend};
    std::vector<double> a50, a99, n50, n99, ratio;
    for (int r = 0; r < rounds; ++r) {
      Latency a, n;
      if (r % 2 == 0) {
        a = hit_path(ours, size, s, samples, batch);
        n = hit_path(naive, size, s, samples, batch);
      } else {
        n = hit_path(naive, size, s, samples, batch);
        a = hit_path(ours, size, s, samples, batch);
      }
      a50.push_back(a.p50), a99.push_back(a.p99), n50.push_back(n.p50), n99.push_back(n.p99);
      ratio.push_back(n.p50 / a.p50);
    }
    Latency r = hit_path(raw, size, s, quick ? 10 : 200, quick ? 2 : 8);
    std::printf("%-10s %22s %9.1f %22s %9.1f %21sx %12.0f\n", human(size).c_str(),
                bench::format(bench::spread(a50)).c_str(), bench::percentile(a99, 0.5),
                bench::format(bench::spread(n50)).c_str(), bench::percentile(n99, 0.5),
                bench::format(bench::spread(ratio), 2).c_str(), r.p50);
  }
}

// ------------------------------------------------------ random allocations

// In the manner of RMM's random_allocations: keep `live` blocks of sizes
// uniform in [min_size, max_size]; each operation frees a random one and
// allocates a new random size. The blocks, and each operation's victim and
// new size, drawn before any is timed.
struct RandomWorkload {
  std::vector<std::pair<void*, std::size_t>> blocks;
  std::vector<std::size_t> victims, sizes;
};
template <class A>
RandomWorkload random_workload(A& alloc, StreamHandle s, std::size_t live, std::size_t min_size,
                               std::size_t max_size, std::size_t ops) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<std::size_t> size_dist(min_size, max_size);
  RandomWorkload w;
  w.blocks.reserve(live);
  for (std::size_t i = 0; i < live; ++i) {
    std::size_t n = size_dist(rng);
    w.blocks.emplace_back(alloc.allocate(n, s), n);
  }
  w.victims.resize(ops);
  w.sizes.resize(ops);
  for (std::size_t i = 0; i < ops; ++i) {
    w.victims[i] = rng() % live;
    w.sizes[i] = size_dist(rng);
  }
  return w;
}
// Operations [from, to) of `w`: each frees its victim and allocates its size.
template <class A>
__attribute__((noinline)) void run_pairs(A& alloc, StreamHandle s, RandomWorkload& w,
                                         std::size_t from, std::size_t to) {
  for (std::size_t i = from; i < to; ++i) {
    auto& [p, n] = w.blocks[w.victims[i]];
    alloc.deallocate(p, n);
    n = w.sizes[i];
    p = alloc.allocate(n, s);
  }
}
template <class A>
void free_all(A& alloc, RandomWorkload& w) {
  for (auto& [p, n] : w.blocks) alloc.deallocate(p, n);
}

// The largest size of the random allocations (a smaller one with --quick).
constexpr std::size_t kRandomMaxSize = 64 * 1024;

// Sizes uniform in [1, max_size]: ns per operation (an alloc or a free).
template <class A>
double random_allocations(A& alloc, StreamHandle s, std::size_t live, std::size_t max_size,
                          std::size_t ops) {
  RandomWorkload w = random_workload(alloc, s, live, 1, max_size, ops);
  auto t0 = Clock::now();
  run_pairs(alloc, s, w, 0, ops);
  double ns = ns_since(t0) / static_cast<double>(2 * ops);
  free_all(alloc, w);
  return ns;
}

void bench_random() {
  std::size_t max_size = quick ? 4096 : kRandomMaxSize;
  std::printf("\n== random allocations: sizes uniform in [1 B, %s], N live (ns per op, median "
              "[25%%-75%%] of %d runs) ==\n",
              human(max_size).c_str(), quick ? 1 : 7);
  std::printf("%-8s %22s %22s %12s %14s %14s\n", "N", "accelkit", "naive pool", "raw driver",
              "naive/accelkit", "raw/accelkit");
  std::vector<std::size_t> counts = {1000, 10000, 100000};
  if (quick) counts = {100, 1000};
  double first = 0, last = 0;
  // Each figure is the median of `reps` runs, the three allocators taking
  // turns: on a shared 2-core machine a run now and then lands in a burst
  // of someone else's work.
  const int reps = quick ? 1 : 7;
  for (std::size_t n : counts) {
    std::size_t ops = quick ? 2000 : 200000;
    std::vector<double> as, nvs, rs;
    for (int rep = 0; rep < reps; ++rep) {
      auto backend = make_backend();
      StreamHandle s = backend->stream_create(0, 0);
      Accelkit ours(*backend);
      Naive naive{*backend, {}, {}, {}};
      Raw raw{*backend};
      as.push_back(random_allocations(ours, s, n, max_size, ops));
      nvs.push_back(random_allocations(naive, s, n, max_size, ops));
      rs.push_back(random_allocations(raw, s, n, max_size, quick ? 200 : 20000));
    }
    double a = bench::percentile(as, 0.5), nv = bench::percentile(nvs, 0.5), r = bench::percentile(rs, 0.5);
    std::printf("%-8zu %22s %22s %12.1f %13.2fx %13.1fx\n", n, bench::format(bench::spread(as)).c_str(),
                bench::format(bench::spread(nvs)).c_str(), r, nv / a, r / a);
    if (first == 0) first = a;
    last = a;
  }
  std::printf("accelkit ns/op at the largest N / at the smallest N: %.2f (target <= 2)\n",
              last / first);
}

// ------------------------------------------------------ a window of pairs
// `memory_bench --pairs accelkit|naive N WARMUP K [SIZE]`: the random
// allocations above (the same seed, sizes and victims), WARMUP of them to
// reach a steady state, then K more inside measured_pairs(), a function of
// its own, so that callgrind can count them alone (--toggle-collect):
// bench/alloc_counts.py. With SIZE, every size is SIZE (with N = 1, the hit
// path: the same block freed and taken again).
template <class A>
__attribute__((noinline)) void measured_pairs(A& alloc, StreamHandle s, RandomWorkload& w,
                                              std::size_t from, std::size_t to) {
  run_pairs(alloc, s, w, from, to);
}

template <class A>
void pairs_window(A& alloc, StreamHandle s, std::size_t live, std::size_t warm, std::size_t k,
                  std::size_t fixed) {
  RandomWorkload w =
      random_workload(alloc, s, live, fixed ? fixed : 1, fixed ? fixed : kRandomMaxSize, warm + k);
  run_pairs(alloc, s, w, 0, warm);
  measured_pairs(alloc, s, w, warm, warm + k);
  free_all(alloc, w);
  std::printf("%s: %zu live, %zu frees and allocations, then %zu measured\n", A::name, live,
              warm, k);
}

int pairs_main(int argc, char** argv) {
  if (argc < 6 || argc > 7 ||
      (std::strcmp(argv[2], "accelkit") != 0 && std::strcmp(argv[2], "naive") != 0)) {
    std::fprintf(stderr, "usage: memory_bench --pairs accelkit|naive N WARMUP K [SIZE]\n");
    return 2;
  }
  std::size_t live = std::strtoull(argv[3], nullptr, 10);
  if (live == 0) {
    std::fprintf(stderr, "memory_bench --pairs: N must be at least 1, not '%s'\n", argv[3]);
    return 2;
  }
  std::size_t fixed = argc == 7 ? std::strtoull(argv[6], nullptr, 10) : 0;
  std::size_t warm = std::strtoull(argv[4], nullptr, 10), k = std::strtoull(argv[5], nullptr, 10);
  auto backend = make_backend();
  StreamHandle s = backend->stream_create(0, 0);
  if (argv[2][0] == 'a') {
    Accelkit a(*backend);
    pairs_window(a, s, live, warm, k, fixed);
  } else {
    Naive n{*backend, {}, {}, {}};
    pairs_window(n, s, live, warm, k, fixed);
  }
  return 0;
}

// --------------------------------------------------------- fragmentation

struct Replay {
  std::size_t requested = 0, peak_requested = 0;
  std::vector<std::pair<void*, std::size_t>> live;
};

template <class A>
void* take(A& alloc, Replay& r, std::size_t n, StreamHandle s) {
  void* p = alloc.allocate(n, s);
  r.requested += n;
  r.peak_requested = std::max(r.peak_requested, r.requested);
  return p;
}
template <class A>
void give(A& alloc, Replay& r, void* p, std::size_t n) {
  alloc.deallocate(p, n);
  r.requested -= n;
}

// 8 x 16 MiB freed, then 4 x 32 MiB (or the reverse).
template <class A>
double phases(A& alloc, StreamHandle s, std::size_t first_size, int first_count,
              std::size_t second_size, int second_count) {
  Replay r;
  std::vector<void*> ps;
  for (int i = 0; i < first_count; ++i) ps.push_back(take(alloc, r, first_size, s));
  for (void* p : ps) give(alloc, r, p, first_size);
  ps.clear();
  for (int i = 0; i < second_count; ++i) ps.push_back(take(alloc, r, second_size, s));
  for (void* p : ps) give(alloc, r, p, second_size);
  return static_cast<double>(alloc.peak_reserved()) / static_cast<double>(r.peak_requested);
}

// A training step replayed: parameters live throughout; the forward pass
// allocates each layer's activations (and short-lived temporaries), the
// backward pass frees them in reverse while producing gradients, and the
// optimizer step frees the gradients.
template <class A>
double training_replay(A& alloc, StreamHandle s, int steps) {
  Replay r;
  struct Layer {
    std::size_t weight, bias, activation, workspace;
  };
  std::vector<Layer> layers;
  std::size_t batch = quick ? 8 : 256;
  std::size_t widths[] = {784, 2048, 2048, 1024, 1024, 512, 512, 256, 10};
  for (std::size_t i = 0; i + 1 < std::size(widths); ++i)
    layers.push_back({widths[i] * widths[i + 1] * 4, widths[i + 1] * 4,
                      batch * widths[i + 1] * 4, batch * widths[i + 1] * 2});
  std::vector<void*> weights, biases;
  for (const Layer& l : layers) {
    weights.push_back(take(alloc, r, l.weight, s));
    biases.push_back(take(alloc, r, l.bias, s));
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<void*> acts;
    for (const Layer& l : layers) {
      void* tmp = take(alloc, r, l.workspace, s);
      acts.push_back(take(alloc, r, l.activation, s));
      give(alloc, r, tmp, l.workspace);
    }
    std::vector<std::pair<void*, std::size_t>> grads;
    void* grad_out = nullptr;
    std::size_t grad_out_size = 0;
    for (std::size_t i = layers.size(); i-- > 0;) {
      const Layer& l = layers[i];
      grads.emplace_back(take(alloc, r, l.weight, s), l.weight);
      grads.emplace_back(take(alloc, r, l.bias, s), l.bias);
      void* grad_in = take(alloc, r, i > 0 ? layers[i - 1].activation : batch * 784 * 4, s);
      if (grad_out) give(alloc, r, grad_out, grad_out_size);
      grad_out = grad_in;
      grad_out_size = i > 0 ? layers[i - 1].activation : batch * 784 * 4;
      give(alloc, r, acts[i], l.activation);
    }
    give(alloc, r, grad_out, grad_out_size);
    for (auto& [p, n] : grads) give(alloc, r, p, n);
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    give(alloc, r, weights[i], layers[i].weight);
    give(alloc, r, biases[i], layers[i].bias);
  }
  return static_cast<double>(alloc.peak_reserved()) / static_cast<double>(r.peak_requested);
}

// The random allocations of bench_random (sizes uniform in [1 B, 64 KiB],
// `live` blocks, each operation a free and an allocation), with a seed of
// their own.
template <class A>
double random_replay(A& alloc, StreamHandle s, std::size_t live, std::size_t ops) {
  Replay r;
  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::size_t> size_dist(1, kRandomMaxSize);
  std::vector<std::pair<void*, std::size_t>> blocks;
  for (std::size_t i = 0; i < live; ++i) {
    std::size_t n = size_dist(rng);
    blocks.emplace_back(take(alloc, r, n, s), n);
  }
  for (std::size_t i = 0; i < ops; ++i) {
    auto& [p, n] = blocks[rng() % live];
    give(alloc, r, p, n);
    n = size_dist(rng);
    p = take(alloc, r, n, s);
  }
  for (auto& [p, n] : blocks) give(alloc, r, p, n);
  return static_cast<double>(alloc.peak_reserved()) / static_cast<double>(r.peak_requested);
}

// A serving-like workload: 2,000 requests, each holding a buffer (a
// sequence's cache) whose size is drawn from a lognormal distribution
// (fixed seed 2024; median 4 MiB, sigma 1.0, clamped to [1 MiB, 64 MiB],
// rounded up to 64 KiB), so that most are a few MiB and a few are tens of
// MiB. Requests arrive one per tick and finish out of order: each lives
// for a number of ticks proportional to its size (a longer sequence takes
// longer to generate) times a uniform factor in [0.5, 1.5], about 24 ticks
// for the median; before each arrival the requests finished by then are
// freed, so about two dozen are live at once, more when long ones cluster.
template <class A>
double serving_replay(A& alloc, StreamHandle s, int requests) {
  Replay r;
  std::mt19937_64 rng(2024);
  std::lognormal_distribution<double> length(std::log(4.0 * kMiB), 1.0);
  std::uniform_real_distribution<double> jitter(0.5, 1.5);
  struct Live {
    double finish;
    void* p;
    std::size_t n;
  };
  std::vector<Live> live;
  for (int tick = 0; tick < requests; ++tick) {
    for (std::size_t k = 0; k < live.size();) {
      if (live[k].finish <= tick) {
        give(alloc, r, live[k].p, live[k].n);
        live[k] = live.back();
        live.pop_back();
      } else {
        ++k;
      }
    }
    double len = std::min(std::max(length(rng), 1.0 * kMiB), 64.0 * kMiB);
    std::size_t n = (static_cast<std::size_t>(len) + 65535) / 65536 * 65536;
    double ticks = 24.0 * len / (4.0 * kMiB) * jitter(rng);
    live.push_back({tick + std::max(1.0, ticks), take(alloc, r, n, s), n});
  }
  for (Live& l : live) give(alloc, r, l.p, l.n);
  return static_cast<double>(alloc.peak_reserved()) / static_cast<double>(r.peak_requested);
}

// accelkit without and with expandable segments (Note [Expandable
// segments]): peak reserved / peak requested, the workloads of the issue's
// targets side by side.
void bench_expandable() {
  std::puts("\n== expandable segments: peak reserved / peak requested (1.0 ideal) ==");
  std::printf("%-40s %12s %12s %8s\n", "workload", "segments", "expandable", "target");
  std::size_t unit = quick ? kMiB : 16 * kMiB;
  auto run = [&](const char* label, const char* target, auto&& workload) {
    double v[2];
    for (int e = 0; e < 2; ++e) {
      auto backend = make_backend();
      StreamHandle s = backend->stream_create(0, 0);
      AllocatorConfig c;
      c.expandable_segments = e == 1;
      Accelkit a(*backend, c);
      v[e] = workload(a, s);
    }
    std::printf("%-40s %12.3f %12.3f %8s\n", label, v[0], v[1], target);
  };
  run("8 x 16 MiB freed, then 4 x 32 MiB", "<= 1.25",
      [&](auto& a, StreamHandle s) { return phases(a, s, unit, 8, 2 * unit, 4); });
  run("serving: 2,000 lognormal lengths", "<= 1.10",
      [&](auto& a, StreamHandle s) { return serving_replay(a, s, quick ? 200 : 2000); });
  run("training-step replay (MLP, 5 steps)", "<= 1.10",
      [&](auto& a, StreamHandle s) { return training_replay(a, s, quick ? 2 : 5); });
}

// The hit path (one size allocated and freed, warm) with expandable
// segments off and on, in alternating rounds (Note [Rounds and spread]).
void bench_expandable_hit_path() {
  const int rounds = quick ? 2 : 15, samples = quick ? 20 : 300, batch = quick ? 4 : 64;
  std::printf("\n== hit path with expandable segments off / on (ns per pair; median [25%%-75%%] "
              "of %d rounds) ==\n",
              rounds);
  std::printf("%-10s %22s %22s %14s\n", "size", "off", "on", "on/off");
  std::vector<std::size_t> sizes = {4096, 16 * kMiB};
  if (quick) sizes = {4096, 4 * kMiB};
  for (std::size_t size : sizes) {
    auto backend = make_backend();
    StreamHandle s = backend->stream_create(0, 0);
    AllocatorConfig on;
    on.expandable_segments = true;
    Accelkit off_a(*backend), on_a(*backend, on);
    std::vector<double> off, onv, ratio;
    for (int r = 0; r < rounds; ++r) {
      Latency a, b;
      if (r % 2 == 0) {
        a = hit_path(off_a, size, s, samples, batch);
        b = hit_path(on_a, size, s, samples, batch);
      } else {
        b = hit_path(on_a, size, s, samples, batch);
        a = hit_path(off_a, size, s, samples, batch);
      }
      off.push_back(a.p50), onv.push_back(b.p50), ratio.push_back(b.p50 / a.p50);
    }
    std::printf("%-10s %22s %22s %13sx\n", human(size).c_str(),
                bench::format(bench::spread(off)).c_str(), bench::format(bench::spread(onv)).c_str(),
                bench::format(bench::spread(ratio), 2).c_str());
  }
}

void bench_fragmentation() {
  std::puts("\n== fragmentation: peak reserved / peak requested (lower is better, 1.0 ideal) ==");
  std::printf("%-36s %10s %11s %11s\n", "workload", "accelkit", "naive pool", "raw driver");
  std::size_t unit = quick ? kMiB : 16 * kMiB;
  auto run = [&](const char* label, auto&& workload) {
    double v[3];
    {
      auto backend = make_backend();
      StreamHandle s = backend->stream_create(0, 0);
      Accelkit a(*backend);
      v[0] = workload(a, s);
    }
    {
      auto backend = make_backend();
      StreamHandle s = backend->stream_create(0, 0);
      Naive n{*backend, {}, {}, {}};
      v[1] = workload(n, s);
    }
    {
      auto backend = make_backend();
      StreamHandle s = backend->stream_create(0, 0);
      Raw raw{*backend};
      v[2] = workload(raw, s);
    }
    std::printf("%-36s %10.3f %11.3f %11.3f\n", label, v[0], v[1], v[2]);
  };
  run("8 x 16 MiB freed, then 4 x 32 MiB",
      [&](auto& a, StreamHandle s) { return phases(a, s, unit, 8, 2 * unit, 4); });
  run("4 x 32 MiB freed, then 8 x 16 MiB",
      [&](auto& a, StreamHandle s) { return phases(a, s, 2 * unit, 4, unit, 8); });
  run("training-step replay (MLP, 5 steps)",
      [&](auto& a, StreamHandle s) { return training_replay(a, s, quick ? 2 : 5); });
  // Operations: 100 a live block at N = 1e3, 2 at 1e5 (the raw driver's
  // mmap per allocation bounds the count).
  run("random to 64 KiB, N = 1e3 live",
      [&](auto& a, StreamHandle s) { return random_replay(a, s, 1000, quick ? 2000 : 100000); });
  if (!quick)
    run("random to 64 KiB, N = 1e5 live",
        [&](auto& a, StreamHandle s) { return random_replay(a, s, 100000, 200000); });
}

// ------------------------------------------------------------ two threads

// Each thread allocates and frees sizes 512 B .. 64 KiB on its own stream;
// aggregate pairs per second with two threads against one.
template <class A>
double throughput(A& alloc, std::vector<StreamHandle> streams, long pairs_per_thread) {
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  auto work = [&](StreamHandle s) {
    std::size_t sizes[] = {512, 4096, 1000, 65536, 2048, 30000};
    for (std::size_t sz : sizes) alloc.deallocate(alloc.allocate(sz, s), sz);  // warm
    ++ready;
    while (!go.load()) std::this_thread::yield();
    void* keep[4] = {};
    for (long i = 0; i < pairs_per_thread; ++i) {
      std::size_t sz = sizes[i % 6];
      void*& slot = keep[i & 3];
      if (slot) alloc.deallocate(slot, sz);
      slot = alloc.allocate(sz, s);
    }
    for (void* p : keep)
      if (p) alloc.deallocate(p, 0);
  };
  std::vector<std::thread> threads;
  for (StreamHandle s : streams) threads.emplace_back(work, s);
  while (ready.load() < static_cast<int>(streams.size())) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  return static_cast<double>(pairs_per_thread) * static_cast<double>(streams.size()) /
         (ns_since(t0) * 1e-9);
}

void bench_threads() {
  std::printf("\n== two threads on two streams vs one thread (million alloc+free pairs/s, median "
              "[25%%-75%%] of %d rounds) ==\n",
              quick ? 1 : 7);
  long pairs = quick ? 20000 : 2000000;
  std::printf("%-12s %20s %20s %21s\n", "allocator", "1 thread", "2 threads", "2T / 1T");
  auto run = [&](const char* name, auto make) {
    // Rounds (Note [Rounds and spread]): the median of each with its
    // interquartile range, and of the per-round ratio.
    std::vector<double> one, two, ratio;
    for (int rep = 0; rep < (quick ? 1 : 7); ++rep) {
      auto backend = make_backend();
      StreamHandle s1 = backend->stream_create(0, 0);
      StreamHandle s2 = backend->stream_create(0, 0);
      auto a = make(*backend);
      one.push_back(throughput(*a, {s1}, pairs) / 1e6);
      two.push_back(throughput(*a, {s1, s2}, pairs) / 1e6);
      ratio.push_back(two.back() / one.back());
    }
    std::printf("%-12s %20s %20s %20sx\n", name, bench::format(bench::spread(one), 2).c_str(),
                bench::format(bench::spread(two), 2).c_str(),
                bench::format(bench::spread(ratio), 2).c_str());
  };
  run("accelkit", [](SimBackend& b) { return std::make_unique<Accelkit>(b); });
  run("naive pool", [](SimBackend& b) {
    return std::unique_ptr<Naive>(new Naive{b, {}, {}, {}});
  });
  std::printf("(hardware threads on this machine: %u)\n", std::thread::hardware_concurrency());
}

void bench_driver_cost() {
  std::puts("\n== the simulated driver: one raw malloc + free (what a cache miss costs) ==");
  auto backend = make_backend();
  StreamHandle s = backend->stream_create(0, 0);
  Raw raw{*backend};
  for (std::size_t size : {std::size_t{512}, 2 * kMiB, 20 * kMiB}) {
    Latency l = hit_path(raw, size, s, quick ? 10 : 400, quick ? 2 : 8);
    std::printf("%-10s p50 %8.0f ns   p99 %8.0f ns\n", human(size).c_str(), l.p50, l.p99);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "--pairs") == 0) return pairs_main(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "--expandable") == 0) {  // those figures alone
    bench::print_machine();
    bench_expandable();
    bench_expandable_hit_path();
    return 0;
  }
  quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bench::print_machine();
  std::printf("accelkit memory benchmark%s: caching allocator vs baselines on simdev\n",
              quick ? " (quick smoke run: figures not meaningful)" : "");
  bench_driver_cost();
  bench_hit_path();
  bench_random();
  bench_fragmentation();
  bench_expandable();
  bench_expandable_hit_path();
  bench_threads();
  return 0;
}
