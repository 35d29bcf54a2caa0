// accelkit: the conformance kit's streams checks: stream_query, stream order
// across streams, priorities and host signals. Included by
// testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <chrono>
#include <thread>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct StreamChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;
  using Tools::pageable;
  using Tools::no_host_side;

  static void stream_query_never_blocks(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    v.require(b.stream_query(0, s), "a new stream is not idle (stream_query false)");
    Busy w = make_busy(kit, 0);
    auto t0 = std::chrono::steady_clock::now();
    queue_busy(kit, 0, w, s, 16);
    auto t1 = std::chrono::steady_clock::now();
    bool idle = b.stream_query(0, s);
    auto t2 = std::chrono::steady_clock::now();
    b.stream_synchronize(0, s);
    auto t3 = std::chrono::steady_clock::now();
    double query = std::chrono::duration<double>(t2 - t1).count();
    double work = std::chrono::duration<double>(t3 - t0).count();
    if (!idle)
      v.require(query < 0.5 * work + 0.001,
                fmt::format("stream_query took {:.1f} ms with {:.1f} ms of work queued: it must "
                            "not wait for the work",
                            query * 1e3, work * 1e3));
    else
      v.require(query < 0.5 * work || work < 0.002,
                fmt::format("stream_query returned true after {:.1f} ms, with {:.1f} ms of work "
                            "queued: it waited for the work",
                            query * 1e3, work * 1e3));
    v.require(b.stream_query(0, s), "stream_query is false after stream_synchronize");
    free_busy(kit, 0, w);
    b.stream_destroy(0, s);
  }
  // An event recorded behind a stream's last work completes no earlier than
  // that work, so once it is complete the stream is idle (CUDA: an event's
  // completion means the work before it is done). A runtime that signals the
  // event before it counts the work done answers "busy" in between.
  static void stream_idle_after_event(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    EventHandle e = b.event_create(0, EventFlags::none);
    constexpr std::size_t n = 4096;
    void* a = b.raw_malloc(0, n);
    constexpr int kRounds = 1000;
    int busy = 0;
    for (int i = 0; i < kRounds; ++i) {
      b.memset_async(0, a, i & 0xff, n, s);
      b.event_record(0, e, s);
      b.event_synchronize(0, e);
      if (!b.stream_query(0, s)) ++busy;
    }
    b.stream_synchronize(0, s);
    v.require(busy == 0,
              fmt::format("stream_query was false right after event_synchronize returned for an "
                          "event recorded behind the stream's last work, {} times in {}: the "
                          "stream must be idle once that event is complete",
                          busy, kRounds));
    b.raw_free(0, a, n);
    b.event_destroy(0, e);
    b.stream_destroy(0, s);
  }
  static void cross_stream_wait(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    std::size_t n = 1 << 20;
    std::vector<unsigned char> out(n, 0);
    queue_busy(kit, 0, w, s1, 8);
    b.memset_async(0, w.b, 0x3c, n, s1);  // the last work before the event
    EventHandle e = b.event_create(0, EventFlags::none);
    b.event_record(0, e, s1);
    b.stream_wait_event(0, s2, e);
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, c, w.b, n, CopyKind::device_to_device, s2, no_host_side);
    b.stream_synchronize(0, s2);
    b.memcpy(0, out.data(), c, n, CopyKind::device_to_host);
    std::size_t bad = static_cast<std::size_t>(
        std::find_if(out.begin(), out.end(), [](unsigned char x) { return x != 0x3c; }) -
        out.begin());
    v.require(bad == n, fmt::format("work queued on a stream after stream_wait_event ran before "
                                    "the event's work on another stream completed (byte {} of "
                                    "{} not yet written)",
                                    bad, n));
    b.stream_synchronize(0, s1);
    b.raw_free(0, c, n);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.stream_destroy(0, s1);
    b.stream_destroy(0, s2);
  }
  // Host signals (Note [Host signals]): work queued after a stream's wait
  // for a signal runs only once the host completes it; a failed signal is
  // the stream's error, once; a signal a stream waits for is not destroyed
  // before completion.
  static void signal_wait_orders(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    if constexpr (!Kit::SdkBackend::has_stream_signals) {
      v.skip("the runtime has no host signal members (signal_create, stream_wait_signal, "
             "signal_complete, signal_destroy): the SDK waits for its own signals on the host");
    } else {
      auto& b = kit.backend();
      StreamHandle s = b.stream_create(0, 0);
      std::size_t n = 4096;
      std::vector<unsigned char> out(n, 0);
      void* a = b.raw_malloc(0, n);
      b.memset_async(0, a, 0x11, n, s);
      SignalHandle g = b.signal_create(0);
      b.stream_wait_signal(0, s, g);
      b.memset_async(0, a, 0x22, n, s);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      bool held = !b.stream_query(0, s);
      bool refused = false;
      try {
        b.signal_destroy(0, g);
      } catch (const DriverError&) {
        refused = true;
      }
      b.signal_complete(0, g, 0);
      b.stream_synchronize(0, s);
      b.memcpy(0, out.data(), a, n, CopyKind::device_to_host);
      if (!refused) v.require(false, "signal_destroy of a signal a stream waits for, not "
                                     "completed, did not throw DriverError");
      else b.signal_destroy(0, g);
      v.require(held, "a stream waiting for a signal not completed was idle after 20 ms: the "
                      "work queued after the wait ran");
      v.require(out[0] == 0x22 && out[n - 1] == 0x22,
                "the work queued after stream_wait_signal did not run once the signal was "
                "completed");
      SignalHandle f = b.signal_create(0);
      b.stream_wait_signal(0, s, f);
      // The runtime's own report, once (through the Backend the SDK keeps
      // a failure itself while the signal lives; Note [Failed waits]).
      b.runtime().signal_complete(b.physical(0), f, 5);
      bool failed = false;
      try {
        b.runtime().stream_synchronize(b.physical(0), s);
      } catch (const DriverError&) {
        failed = true;
      }
      v.require(failed, "a stream that waited for a signal completed with an error did not "
                        "report an asynchronous error at stream_synchronize");
      b.runtime().stream_synchronize(b.physical(0), s);  // once
      b.signal_destroy(0, f);
      b.raw_free(0, a, n);
      b.stream_destroy(0, s);
    }
  }
  static void priorities_in_range(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamPriorityRange r = b.properties(0).stream_priorities;
    int lo = std::min(r.lowest, r.highest), hi = std::max(r.lowest, r.highest);
    for (int p = lo; p <= hi; ++p) {
      StreamHandle s = b.runtime().stream_create(b.physical(0), p);
      std::vector<unsigned char> in = pattern(4096, 5), out(4096);
      void* a = b.raw_malloc(0, in.size());
      b.runtime().memcpy_async(b.physical(0), a, in.data(), in.size(), CopyKind::host_to_device, s,
                               pageable);
      b.runtime().memcpy_async(b.physical(0), out.data(), a, out.size(), CopyKind::device_to_host,
                               s, pageable);
      b.runtime().stream_synchronize(b.physical(0), s);
      b.runtime().stream_destroy(b.physical(0), s);
      b.raw_free(0, a, in.size());
      if (!v.require(in == out, fmt::format("a stream of priority {} (range {}..{}) copied wrong",
                                            p, r.lowest, r.highest)))
        return;
    }
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_STREAMS_CHECKS(X)                                                    \
  X(streams, stream_query_never_blocks, "stream_query never waits for queued work")               \
  X(streams, stream_idle_after_event,                                                             \
    "stream_query is true once an event recorded behind the stream's last work is complete")      \
  X(streams, cross_stream_wait, "stream_wait_event orders later work after the event's work")     \
  X(streams, priorities_in_range, "every priority in the reported range makes a working stream")  \
  X(streams, signal_wait_orders,                                                                  \
    "work queued after stream_wait_signal runs once the host completes the signal; a failed "     \
    "signal is the stream's error, once; a signal waited for is not destroyed before completion")
