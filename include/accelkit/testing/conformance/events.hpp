// accelkit: the conformance kit's events checks: an event's record, re-
// record, and waits on it, on one device and across two. Included by
// testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <algorithm>
#include <chrono>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct EventChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;
  using Tools::no_host_side;

  static void event_query_before_record(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    EventHandle e = b.runtime().event_create(b.physical(0), EventFlags::none);
    v.require(b.runtime().event_query(b.physical(0), e), "an event never recorded queries false");
    b.runtime().event_synchronize(b.physical(0), e);  // must return at once
    b.runtime().event_destroy(b.physical(0), e);
  }
  static void event_rerecord_replaces(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle busy = b.stream_create(0, 0), idle = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    EventHandle e = b.event_create(0, EventFlags::none);
    auto t0 = std::chrono::steady_clock::now();
    queue_busy(kit, 0, w, busy, 16);
    b.event_record(0, e, busy);
    b.event_record(0, e, idle);  // replaces: captures the idle stream
    auto t1 = std::chrono::steady_clock::now();
    b.event_synchronize(0, e);
    auto t2 = std::chrono::steady_clock::now();
    b.stream_synchronize(0, busy);
    auto t3 = std::chrono::steady_clock::now();
    double waited = std::chrono::duration<double>(t2 - t1).count();
    double work = std::chrono::duration<double>(t3 - t0).count();
    if (work < 0.005)
      v.skip(fmt::format("1 GiB of copies took {:.1f} ms: too fast to tell", work * 1e3));
    v.require(waited < 0.5 * work,
              fmt::format("after an event was recorded again on an idle stream, "
                          "event_synchronize waited {:.1f} ms, as long as the {:.1f} ms of work "
                          "its earlier record captured",
                          waited * 1e3, work * 1e3));
    v.require(b.event_query(0, e), "an event queries false after both streams it was recorded on "
                                   "are idle");
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.stream_destroy(0, busy);
    b.stream_destroy(0, idle);
  }

  // A wait made on an event's record stays on that record: recording the
  // event again (here on an idle stream) must not release it. A driver that
  // resolves waits late, against whatever the event holds when the waiting
  // stream next runs, breaks this.
  static void rerecord_keeps_earlier_waits(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s1 = b.stream_create(0, 0), s2 = b.stream_create(0, 0),
                 s3 = b.stream_create(0, 0);
    Busy w = make_busy(kit, 0);
    std::size_t n = 1 << 20;
    std::vector<unsigned char> out(n, 0);
    queue_busy(kit, 0, w, s1, 8);
    b.memset_async(0, w.b, 0x5a, n, s1);  // the last work before the first record
    EventHandle e = b.event_create(0, EventFlags::none);
    b.event_record(0, e, s1);
    b.stream_wait_event(0, s2, e);
    b.event_record(0, e, s3);  // again, on an idle stream: only later waits see it
    void* c = b.raw_malloc(0, n);
    b.memcpy_async(0, c, w.b, n, CopyKind::device_to_device, s2, no_host_side);
    b.stream_synchronize(0, s2);
    b.memcpy(0, out.data(), c, n, CopyKind::device_to_host);
    std::size_t bad = static_cast<std::size_t>(
        std::find_if(out.begin(), out.end(), [](unsigned char x) { return x != 0x5a; }) -
        out.begin());
    v.require(bad == n, fmt::format("a stream waiting on an event ran on when the event was "
                                    "recorded again on an idle stream, before the work of the "
                                    "record it waited on completed (byte {} of {} not yet "
                                    "written)",
                                    bad, n));
    b.stream_synchronize(0, s1);
    b.raw_free(0, c, n);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    for (StreamHandle s : {s1, s2, s3}) b.stream_destroy(0, s);
  }

  // A stream of device 1 waits for an event recorded on device 0 (the
  // runtime's stream_wait_peer_event, or the SDK's wait on the host without
  // it; Note [Cross-device waits]): an event recorded behind the wait
  // completes only after the awaited event. Asked of that event, not of the
  // stream: a runtime's stream_query may still answer false for a moment
  // after an event recorded behind the stream's last work has completed.
  static void cross_device_wait(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return;
    if (kit.devices() < 2) return v.skip("one device: no wait across devices to check");
    auto& b = kit.backend();
    StreamHandle s0 = b.stream_create(0, 0), s1 = b.stream_create(1, 0);
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s0, 8);
    EventHandle e = b.event_create(0, EventFlags::none), after = b.event_create(1, EventFlags::none);
    b.event_record(0, e, s0);  // the last work of s0
    b.stream_wait_peer_event(1, s1, 0, e);
    b.event_record(1, after, s1);
    b.event_synchronize(1, after);
    v.require(b.event_query(0, e),
              "an event recorded on a stream of device 1 behind a wait for an event of device 0 "
              "completed while the awaited work was still running");
    b.stream_synchronize(0, s0);
    free_busy(kit, 0, w);
    b.event_destroy(0, e);
    b.event_destroy(1, after);
    b.stream_destroy(0, s0);
    b.stream_destroy(1, s1);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_EVENTS_CHECKS(X)                                                    \
  X(events, event_query_before_record, "an event never recorded is complete")                    \
  X(events, event_rerecord_replaces, "recording an event again replaces its last record")        \
  X(events, rerecord_keeps_earlier_waits,                                                        \
    "a wait on an event stays on the record it saw: recording the event again does not release " \
    "it")                                                                                        \
  X(events, cross_device_wait,                                                                   \
    "a stream waits for an event of another device: later work runs after the event's work")
