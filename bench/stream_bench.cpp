// Benchmarks of accelkit's stream and event layer on simdev, each next to a
// baseline measured in the same run:
//  - the current stream (get; exchange and restore): thread-local, no driver
//    call, against a registry under one mutex as a hand-written backend
//    might keep it;
//  - an event recorded and queried: a pooled accelkit Event against creating
//    and destroying a driver event each time (simdev charges 2 us for a new
//    event, as real drivers do).
//
//   stream_bench            the full run
//   stream_bench --quick    tiny counts, to check that it runs
#include <accelkit/accelkit.hpp>

#include "machine.hpp"
#include "rounds.hpp"
#include "simdev_runtime.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

using namespace accelkit;

namespace {
using bench::ns_per_call;

// What a backend without accelkit often does: a map from thread to current
// stream, under one mutex.
struct MutexRegistry {
  std::mutex m;
  std::map<std::thread::id, Stream> current;
  Stream get() {
    std::lock_guard<std::mutex> lock(m);
    return current[std::this_thread::get_id()];
  }
  Stream exchange(Stream s) {
    std::lock_guard<std::mutex> lock(m);
    Stream& slot = current[std::this_thread::get_id()];
    Stream old = slot;
    slot = s;
    return old;
  }
};

volatile std::int64_t sink = 0;
}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  bench::print_machine();
  long n = quick ? 1000 : 10'000'000;
  long events = quick ? 100 : 200'000;
  simdev::Config c;
  c.device_count = 1;
  Backend<simdev::SimRuntime> backend(Environment::fixed({}), c);
  Streams<simdev::SimRuntime> streams(backend);
  Stream s = streams.pool_stream(0);
  std::printf("accelkit stream benchmark%s\n\n", quick ? " (quick smoke run: figures not meaningful)" : "");

  MutexRegistry registry;
  // Each row: `rounds` rounds of n/rounds calls, accelkit and the baseline
  // taking turns; median [25%-75%] of the rounds, and of the ratio.
  const int rounds = quick ? 3 : 9;
  const long per_round = n / rounds;
  auto row = [&](const char* what, auto&& ours, auto&& baseline, double divide) {
    bench::Spread a, b, r;
    bench::interleaved(
        rounds, [&] { return ns_per_call(per_round, ours) / divide; },
        [&] { return ns_per_call(per_round, baseline) / divide; }, a, b, r);
    std::printf("%-30s %22s %22s %16s\n", what, bench::format(a).c_str(),
                bench::format(b).c_str(), (bench::format(r, 2) + "x").c_str());
  };
  std::printf("== current stream (ns per call, median [25%%-75%%] of %d rounds) ==\n", rounds);
  std::printf("%-30s %22s %22s %16s\n", "operation", "accelkit", "mutex + map baseline",
              "baseline/ours");
  row("get current stream", [&] { sink = sink + streams.current_stream(0).id; },
      [&] { sink = sink + registry.get().id; }, 1);
  row("exchange current stream", [&] { streams.exchange_stream(streams.exchange_stream(s)); },
      [&] { registry.exchange(registry.exchange(s)); }, 2);

  // The same from two threads at once, as PyTorch's autograd and data
  // loader threads do: the thread-local path does not contend.
  auto two_threads = [&](auto&& f) {
    double per[2];
    std::thread t([&] { per[1] = ns_per_call(per_round, f); });
    per[0] = ns_per_call(per_round, f);
    t.join();
    return (per[0] + per[1]) / 2;
  };
  {
    bench::Spread a, b, r;
    bench::interleaved(
        rounds, [&] { return two_threads([&] { sink = sink + streams.current_stream(0).id; }); },
        [&] { return two_threads([&] { sink = sink + registry.get().id; }); }, a, b, r);
    std::printf("%-30s %22s %22s %16s\n", "get current, 2 threads", bench::format(a).c_str(),
                bench::format(b).c_str(), (bench::format(r, 2) + "x").c_str());
  }

  StreamHandle h = streams.handle(s);
  double pooled = ns_per_call(events, [&] {
    Event<simdev::SimRuntime> e(streams);
    e.record(s);
    sink = sink + e.query();
  });
  double fresh = ns_per_call(events, [&] {
    EventHandle e = backend.event_create(0, EventFlags::none);
    backend.event_record(0, e, h);
    sink = sink + backend.event_query(0, e);
    backend.event_destroy(0, e);
  });
  std::printf("\n== event record + query (ns per use) ==\n");
  std::printf("%-30s %10s %22s %8s\n", "operation", "pooled", "create+destroy each", "ratio");
  std::printf("%-30s %10.1f %22.1f %7.1fx\n", "record + query", pooled, fresh, fresh / pooled);
  std::printf("\n(driver events created in all: %ld)\n", backend.runtime().events_created());
  return 0;
}
