// Benchmark of accelkit's pinned host allocator against PyTorch's own
// at::CachingHostAllocatorImpl (the template CUDA, XPU and others
// instantiate) over the same simdev driver, and the raw driver calls, all in
// the same run. The only accelkit program that includes PyTorch headers.
//
//   host_alloc_bench            the full run
//   host_alloc_bench --quick    tiny counts, to check that it runs
#include <ATen/core/CachingHostAllocator.h>

#include <accelkit/accelkit.hpp>

#include "machine.hpp"
#include "rounds.hpp"
#include "simdev_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using Clock = std::chrono::steady_clock;
using SimBackend = Backend<simdev::SimRuntime>;

namespace {

bool quick = false;

// The stream the benchmark's c10::Streams stand for (CPU placeholders: this
// program registers no device with PyTorch).
StreamHandle g_stream;

struct SimStream {
  int device = 0;
  StreamHandle handle;
  SimStream(int d, StreamHandle h) : device(d), handle(h) {}
  explicit SimStream(c10::Stream) : handle(g_stream) {}
  operator c10::Stream() const {
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(c10::DeviceType::CPU));
  }
  bool operator==(const SimStream& o) const { return device == o.device && handle == o.handle; }
};
struct SimEvent {
  int device = 0;
  EventHandle handle;
};
}  // namespace

template <>
struct std::hash<SimStream> {
  std::size_t operator()(const SimStream& s) const noexcept {
    return std::hash<std::uintptr_t>()(s.handle.value) ^ static_cast<std::size_t>(s.device);
  }
};

namespace {

// PyTorch's caching host allocator, wired to simdev the way a vendor wires
// it to its driver.
class TorchHostAllocator final : public at::CachingHostAllocatorImpl<SimStream, SimEvent> {
 public:
  TorchHostAllocator(SimBackend& b, StreamHandle current) : b_(b), current_{0, current} {}

 private:
  void allocate_host_memory(std::size_t size, void** ptr) override {
    *ptr = b_.raw_host_malloc(0, size);
  }
  void free_block(at::HostBlock<SimStream>* block) override { b_.raw_host_free(0, block->ptr_); }
  // Events are pooled, as CUDA's instance of this template does.
  void record_stream(std::optional<std::vector<SimEvent>>& events, SimStream s) override {
    SimEvent e{s.device, {}};
    {
      std::lock_guard<std::mutex> lock(events_mutex_);
      if (!free_events_.empty()) {
        e.handle = free_events_.back();
        free_events_.pop_back();
      }
    }
    if (e.handle == EventHandle{}) e.handle = b_.event_create(s.device, EventFlags::none);
    b_.event_record(s.device, e.handle, s.handle);
    if (!events) events.emplace();
    events->push_back(e);
  }
  bool query_event(SimEvent& e) override {
    bool done = b_.event_query(e.device, e.handle);
    if (done) {
      std::lock_guard<std::mutex> lock(events_mutex_);
      free_events_.push_back(e.handle);
    }
    return done;
  }
  SimStream get_current_stream() const override { return current_; }
  bool stream_is_capturing(SimStream) const override { return false; }

  SimBackend& b_;
  SimStream current_;
  std::mutex events_mutex_;
  std::vector<EventHandle> free_events_;
};

double ns_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

struct Latency {
  double p50, p99;
};

Latency measure(const std::function<void()>& pair, int samples, int batch) {
  for (int i = 0; i < 16; ++i) pair();
  std::vector<double> v;
  for (int i = 0; i < samples; ++i) {
    auto t0 = Clock::now();
    for (int j = 0; j < batch; ++j) pair();
    v.push_back(ns_since(t0) / batch);
  }
  return {bench::percentile(v, 0.5), bench::percentile(v, 0.99)};
}

std::string human(std::size_t n) {
  if (n >= (1u << 20)) return std::to_string(n >> 20) + " MiB";
  if (n >= 1024) return std::to_string(n >> 10) + " KiB";
  return std::to_string(n) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bench::print_machine();
  simdev::Config c;
  c.device_count = 1;
  SimBackend backend(Environment::fixed({}), c);
  StreamHandle s = backend.stream_create(0, 0);
  g_stream = s;
  HostAllocator<simdev::SimRuntime> ours(backend);
  TorchHostAllocator torch_alloc(backend, s);

  std::printf("accelkit pinned host allocator benchmark%s\n",
              quick ? " (quick smoke run: figures not meaningful)" : "");
  std::puts("\n== pinned hit path: allocate + free of one size, warm (ns per pair) ==");
  std::printf("%-9s %20s %26s %20s %12s %12s\n", "size", "accelkit p50/p99",
              "at::CachingHostAllocator", "raw driver p50", "torch/ours", "raw/ours");
  std::vector<std::size_t> sizes = {512, 4096, 64 * 1024, 1 << 20, 16 << 20};
  if (quick) sizes = {4096};
  int samples = quick ? 10 : 2000, batch = quick ? 4 : 64;
  for (std::size_t size : sizes) {
    Latency a = measure([&] { ours.deallocate(ours.allocate(0, size)); }, samples, batch);
    Latency t = measure(
        [&] {
          auto [ptr, ctx] = torch_alloc.allocate(size);
          (void)ptr;
          torch_alloc.free(ctx);
        },
        samples, batch);
    Latency r = measure([&] { backend.raw_host_free(0, backend.raw_host_malloc(0, size)); },
                        quick ? 4 : 200, quick ? 2 : 8);
    std::printf("%-9s %9.1f /%8.1f %14.1f /%9.1f %19.1f %11.2fx %11.0fx\n", human(size).c_str(),
                a.p50, a.p99, t.p50, t.p99, r.p50, t.p50 / a.p50, r.p50 / a.p50);
  }

  std::puts("\n== pinned blocks used by a stream: allocate, record_stream, free (ns per round) ==");
  Latency a = measure(
      [&] {
        void* p = ours.allocate(0, 65536);
        ours.record_stream(p, 0, s);
        ours.deallocate(p);
      },
      samples, batch);
  Latency t = measure(
      [&] {
        auto [ptr, ctx] = torch_alloc.allocate(65536);
        torch_alloc.record_event(ptr, ctx, c10::Stream(c10::Stream::DEFAULT,
                                                       c10::Device(c10::DeviceType::CPU)));
        torch_alloc.free(ctx);
      },
      samples, batch);
  std::printf("accelkit %.1f / %.1f   at::CachingHostAllocator %.1f / %.1f   (p50 / p99)\n",
              a.p50, a.p99, t.p50, t.p99);
  HostStats st = ours.stats();
  std::printf("accelkit pinned stats: %lld driver allocations, %lld live, %lld bytes reserved\n",
              static_cast<long long>(st.num_host_alloc),
              static_cast<long long>(st.allocation.current),
              static_cast<long long>(st.reserved_bytes.current));
  return 0;
}
