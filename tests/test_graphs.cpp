// Graph capture: the SDK's rules around a capture (Note [Capture rules] in
// device/captures.hpp), through Backend<R> on simdev, from one thread and
// several; simdev's own strictness under capture (Note [simdev strictness],
// Note [simdev graphs]); and the refusal of a runtime without the members
// (minimal).
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "minimal_runtime.hpp"
#include "simdev_runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using Sim = simdev::SimRuntime;
using SimBackend = Backend<Sim>;

using namespace accelkit_tests;
namespace {
constexpr std::size_t kBytes = 4096;

using Bytes = std::vector<unsigned char>;
Bytes read(SimBackend& b, const void* p, std::size_t n = kBytes, device_index d = 0) {
  Bytes h(n);
  b.memcpy(d, h.data(), p, n, CopyKind::device_to_host);
  return h;
}
void* filled(SimBackend& b, unsigned char value, std::size_t n = kBytes, device_index d = 0) {
  void* p = b.raw_malloc(d, n);
  Bytes h(n, value);
  b.memcpy(d, p, h.data(), n, CopyKind::host_to_device);
  return p;
}
Bytes all(unsigned char value, std::size_t n = kBytes) { return Bytes(n, value); }

// The message of the E that f throws, or "" when it throws none.
template <class E, class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return {};
}
std::size_t occurrences(const std::string& s, const std::string& part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

// Ends the capture of `s`, which must have been invalidated by `call`: the
// end refused naming it, the runtime's graph destroyed, the stream free.
void expect_invalidated_by(SimBackend& b, StreamHandle s, const std::string& call,
                           device_index d = 0) {
  long graphs = b.runtime().live_graphs();
  std::string m = thrown<RuntimeError>([&] { b.stream_end_capture(d, s); });
  INFO(m);
  CHECK(contains(m, "invalidated by " + call));
  CHECK(occurrences(m, "simdev") == 1);
  CHECK_FALSE(b.stream_is_capturing(d, s));
  CHECK_FALSE(b.runtime().stream_is_capturing(d, s));
  CHECK(b.runtime().live_graphs() == graphs);  // the runtime's graph was destroyed
}

// A graph of one memset of `p` to `value`, captured on `s` in `mode`.
GraphExecHandle fill_graph(SimBackend& b, StreamHandle s, void* p, int value,
                           CaptureMode mode = CaptureMode::global) {
  b.stream_begin_capture(0, s, mode);
  b.memset_async(0, p, value, kBytes, s);
  GraphHandle g = b.stream_end_capture(0, s);
  GraphExecHandle e = b.graph_instantiate(0, g);
  b.graph_destroy(0, g);
  return e;
}
}  // namespace

TEST_CASE("graphs: simdev has the members, minimal has none, and the SDK knows") {
  STATIC_REQUIRE(detail::has_graphs<Sim>);
  STATIC_REQUIRE(SimBackend::has_graphs);
  STATIC_REQUIRE_FALSE(detail::has_graphs<minimal::MinimalRuntime>);
  STATIC_REQUIRE_FALSE(Backend<minimal::MinimalRuntime>::has_graphs);
}

TEST_CASE("graphs: a runtime without the members is refused with NotSupportedError naming the "
          "backend once, and never captures") {
  Backend<minimal::MinimalRuntime> b(Environment::fixed({}));
  StreamHandle s = b.stream_create(0, 0);
  std::string m = thrown<NotSupportedError>([&] { b.stream_begin_capture(0, s, CaptureMode::global); });
  INFO(m);
  CHECK(contains(m, "minimal: cannot capture graphs"));
  CHECK(contains(m, "stream_begin_capture"));
  CHECK(occurrences(m, "minimal") == 1);
  CHECK(contains(thrown<NotSupportedError>([&] { b.stream_end_capture(0, s); }),
                 "stream_end_capture on device 0"));
  CHECK(contains(thrown<NotSupportedError>([&] { b.graph_instantiate(0, GraphHandle{1}); }),
                 "graph_instantiate"));
  CHECK(contains(thrown<NotSupportedError>([&] { b.graph_launch(0, GraphExecHandle{1}, s); }),
                 "graph_launch"));
  CHECK(contains(thrown<NotSupportedError>([&] { b.graph_exec_destroy(0, GraphExecHandle{1}); }),
                 "graph_exec_destroy"));
  CHECK(contains(thrown<NotSupportedError>([&] { b.graph_destroy(0, GraphHandle{1}); }),
                 "graph_destroy"));
  CHECK_FALSE(b.stream_is_capturing(0, s));
  CHECK_FALSE(b.capture_underway(0));
  // What cannot be captured is still refused by name (there is no capture).
  CHECK(contains(thrown<RuntimeError>([&] { b.capture_refuse(0, s, "aten::nonzero"); }),
                 "aten::nonzero cannot be captured into a graph"));
  b.stream_synchronize(0, s);  // nothing else changed
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: captured work does not run; each launch runs it, in order, reading memory "
          "as it is at the launch") {
  SimBackend b(Environment::fixed({}), sim());
  Sim& rt = b.runtime();
  StreamHandle s = b.stream_create(0, 0);
  void* src = filled(b, 1);
  void* dst = filled(b, 0);
  long captured = rt.graphs_captured(), launched = rt.graph_launches();
  CHECK_FALSE(b.capture_underway(0));
  b.stream_begin_capture(0, s, CaptureMode::global);
  CHECK(b.stream_is_capturing(0, s));
  CHECK(rt.stream_is_capturing(0, s));
  CHECK(b.capture_underway(0));
  CHECK_FALSE(b.capture_underway(1));
  b.memset_async(0, dst, 7, kBytes, s);
  b.memcpy_async(0, dst, src, kBytes / 2, CopyKind::device_to_device, s, false);
  GraphHandle g = b.stream_end_capture(0, s);
  CHECK_FALSE(b.stream_is_capturing(0, s));
  CHECK_FALSE(b.capture_underway(0));
  CHECK(rt.graphs_captured() == captured + 1);
  b.stream_synchronize(0, s);
  CHECK(read(b, dst) == all(0));  // nothing ran
  GraphExecHandle e = b.graph_instantiate(0, g);
  for (unsigned char v : {1, 2, 3}) {
    Bytes h(kBytes, v);
    b.memcpy(0, src, h.data(), kBytes, CopyKind::host_to_device);
    b.graph_launch(0, e, s);
    b.stream_synchronize(0, s);
    Bytes want(kBytes, 7);
    std::fill(want.begin(), want.begin() + kBytes / 2, v);
    CHECK(read(b, dst) == want);
  }
  CHECK(rt.graph_launches() == launched + 3);
  b.graph_exec_destroy(0, e);
  b.graph_destroy(0, g);
  CHECK(rt.live_graphs() == 0);
  CHECK(rt.live_graph_execs() == 0);
  b.raw_free(0, src, kBytes);
  b.raw_free(0, dst, kBytes);
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: pinned copies and the runtime's kernels are captured; a captured kernel runs "
          "once per launch, never at capture") {
  SimBackend b(Environment::fixed({}), sim());
  Sim& rt = b.runtime();
  StreamHandle s = b.stream_create(0, 0);
  void* dst = filled(b, 0);
  auto* pinned = static_cast<unsigned char*>(b.raw_host_malloc(0, kBytes));
  std::fill(pinned, pinned + kBytes, 9);
  std::atomic<int> runs{0};
  b.stream_begin_capture(0, s, CaptureMode::relaxed);
  b.memcpy_async(0, dst, pinned, kBytes, CopyKind::host_to_device, s, true);
  rt.launch(0, s, "count", [&] { runs.fetch_add(1); }, {{dst, kBytes}});
  GraphExecHandle e = b.graph_instantiate(0, b.stream_end_capture(0, s));
  b.stream_synchronize(0, s);
  CHECK(runs.load() == 0);
  CHECK(read(b, dst) == all(0));
  std::fill(pinned, pinned + kBytes, 5);  // read at the launch, not at capture
  b.graph_launch(0, e, s);
  b.graph_launch(0, e, s);
  b.stream_synchronize(0, s);
  CHECK(runs.load() == 2);
  CHECK(read(b, dst) == all(5));
  b.graph_exec_destroy(0, e);
  CHECK(rt.live_graphs() == 1);  // the graph itself was never destroyed
  b.raw_host_free(0, pinned);
  b.raw_free(0, dst, kBytes);
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: a call naming a capturing stream is refused and invalidates the capture; the "
          "stream is usable after its end") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  StreamHandle other = b.stream_create(0, 0);
  StreamHandle peer = b.stream_create(1, 0);
  EventHandle e = b.event_create(0, EventFlags::none);
  EventHandle peer_event = b.event_create(1, EventFlags::none);
  b.event_record(1, peer_event, peer);
  void* p = filled(b, 0);
  void* q = filled(b, 0, kBytes, 1);
  Bytes host(kBytes, 3);
  GraphExecHandle exec = fill_graph(b, other, p, 1);
  SignalHandle signal = b.signal_create(0);
  b.signal_complete(0, signal, 0);

  struct Case {
    const char* call;
    std::function<void()> run;
  };
  std::vector<Case> cases = {
      {"stream_synchronize", [&] { b.stream_synchronize(0, s); }},
      {"stream_query", [&] { b.stream_query(0, s); }},
      {"event_record", [&] { b.event_record(0, e, s); }},
      {"stream_wait_event", [&] { b.stream_wait_event(0, s, e); }},
      {"stream_wait_signal", [&] { b.stream_wait_signal(0, s, signal); }},
      {"stream_wait_peer_event", [&] { b.stream_wait_peer_event(0, s, 1, peer_event); }},
      {"memcpy_peer_async", [&] { b.memcpy_peer_async(q, 1, p, 0, kBytes, s); }},
      {"graph_launch", [&] { b.graph_launch(0, exec, s); }},
      {"memcpy_async of pageable host memory",
       [&] { b.memcpy_async(0, p, host.data(), kBytes, CopyKind::host_to_device, s, false); }},
      {"stream_destroy", [&] { b.stream_destroy(0, s); }},
  };
  for (const Case& c : cases) {
    for (CaptureMode mode : {CaptureMode::global, CaptureMode::per_thread, CaptureMode::relaxed}) {
      INFO(c.call << " in mode " << to_string(mode));
      b.stream_begin_capture(0, s, mode);
      b.memset_async(0, p, 2, kBytes, s);
      std::string m = thrown<RuntimeError>(c.run);
      INFO(m);
      CHECK(contains(m, std::string("simdev: ") + c.call));
      CHECK(contains(m, fmt::format("stream {:#x} of device 0", s.value)));
      CHECK(contains(m, fmt::format("mode {}", to_string(mode))));
      CHECK(contains(m, "the capture is invalidated"));
      CHECK(occurrences(m, "simdev") == 1);
      CHECK(b.stream_is_capturing(0, s));  // until its end
      expect_invalidated_by(b, s, c.call);
      // Usable: work runs at once again.
      b.memset_async(0, p, 4, kBytes, s);
      b.stream_synchronize(0, s);
      CHECK(read(b, p) == all(4));
    }
  }
  // The same calls on another stream of the device are not affected.
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.event_record(0, e, other);
  b.stream_wait_event(0, other, e);
  b.graph_launch(0, exec, other);
  b.stream_synchronize(0, other);
  CHECK(b.stream_query(0, other));
  b.memset_async(0, p, 6, kBytes, s);
  GraphHandle g = b.stream_end_capture(0, s);
  b.graph_destroy(0, g);
  b.graph_exec_destroy(0, exec);
  b.signal_destroy(0, signal);
  b.event_destroy(0, e);
  b.event_destroy(1, peer_event);
  b.raw_free(0, p, kBytes);
  b.raw_free(1, q, kBytes);
  for (auto [d, t] : {std::pair{0, s}, std::pair{0, other}, std::pair{1, peer}}) b.stream_destroy(d, t);
}

TEST_CASE("graphs: device_synchronize with a capture underway is refused and invalidates every "
          "capture of that device only") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0), t = b.stream_create(0, 0), u = b.stream_create(1, 0);
  void* p = filled(b, 0);
  void* q = filled(b, 0, kBytes, 1);
  b.stream_begin_capture(0, s, CaptureMode::relaxed);
  b.stream_begin_capture(0, t, CaptureMode::global);
  b.stream_begin_capture(1, u, CaptureMode::global);
  b.memset_async(1, q, 8, kBytes, u);
  std::string m = thrown<RuntimeError>([&] { b.device_synchronize(0); });
  INFO(m);
  CHECK(contains(m, "simdev: device_synchronize on device 0"));
  CHECK(contains(m, fmt::format("stream {:#x} (mode relaxed)", s.value)));
  CHECK(contains(m, fmt::format("stream {:#x} (mode global)", t.value)));
  CHECK(contains(m, "the capture is invalidated"));
  expect_invalidated_by(b, s, "device_synchronize");
  expect_invalidated_by(b, t, "device_synchronize");
  b.device_synchronize(0);  // nothing captures there now
  GraphExecHandle e = b.graph_instantiate(1, b.stream_end_capture(1, u));  // unharmed
  b.graph_launch(1, e, u);
  b.stream_synchronize(1, u);
  CHECK(read(b, q, kBytes, 1) == all(8));
  b.graph_exec_destroy(1, e);
  b.raw_free(0, p, kBytes);
  b.raw_free(1, q, kBytes);
  for (auto [d, x] : {std::pair{0, s}, std::pair{0, t}, std::pair{1, u}}) b.stream_destroy(d, x);
}

TEST_CASE("graphs: event queries and synchronous copies follow the capture mode, on the capturing "
          "thread and on another") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0), t = b.stream_create(0, 0);
  EventHandle e = b.event_create(0, EventFlags::none);
  b.event_record(0, e, t);
  void* p = filled(b, 0);
  void* q = filled(b, 0, kBytes, 1);
  Bytes host(kBytes, 1);
  struct Call {
    const char* name;
    std::function<void()> run;
  };
  std::vector<Call> calls = {
      {"event_query", [&] { b.event_query(0, e); }},
      {"event_synchronize", [&] { b.event_synchronize(0, e); }},
      {"memcpy", [&] { b.memcpy(0, p, host.data(), kBytes, CopyKind::host_to_device); }},
  };
  for (const Call& c : calls) {
    for (CaptureMode mode : {CaptureMode::global, CaptureMode::per_thread, CaptureMode::relaxed}) {
      for (bool other_thread : {false, true}) {
        INFO(c.name << " in mode " << to_string(mode) << (other_thread ? " on another thread" : ""));
        b.stream_begin_capture(0, s, mode);
        b.memset_async(0, p, 2, kBytes, s);
        std::string m;
        if (other_thread)
          std::thread([&] { m = thrown<RuntimeError>(c.run); }).join();
        else
          m = thrown<RuntimeError>(c.run);
        bool refused = mode == CaptureMode::global || (mode == CaptureMode::per_thread && !other_thread);
        INFO(m);
        CHECK(m.empty() == !refused);
        // Another device is never affected.
        b.memcpy(1, q, host.data(), kBytes, CopyKind::host_to_device);
        if (refused) {
          CHECK(contains(m, std::string("simdev: ") + c.name + " on device 0"));
          CHECK(contains(m, fmt::format("mode {}", to_string(mode))));
          expect_invalidated_by(b, s, c.name);
        } else {
          GraphHandle g = b.stream_end_capture(0, s);
          b.graph_destroy(0, g);
        }
      }
    }
  }
  b.event_destroy(0, e);
  b.raw_free(0, p, kBytes);
  b.raw_free(1, q, kBytes);
  b.stream_destroy(0, s);
  b.stream_destroy(0, t);
}

TEST_CASE("graphs: a capture begun twice is refused and the first goes on; ending a stream that "
          "does not capture is refused") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = filled(b, 0);
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.memset_async(0, p, 5, kBytes, s);
  std::string m = thrown<RuntimeError>([&] { b.stream_begin_capture(0, s, CaptureMode::relaxed); });
  INFO(m);
  CHECK(contains(m, "simdev: stream_begin_capture"));
  CHECK(contains(m, "is capturing already (mode global, begun by this thread)"));
  std::thread([&] {
    CHECK(contains(thrown<RuntimeError>([&] { b.stream_begin_capture(0, s, CaptureMode::global); }),
                   "begun by another thread"));
  }).join();
  CHECK(b.stream_is_capturing(0, s));
  GraphExecHandle e = b.graph_instantiate(0, b.stream_end_capture(0, s));
  b.graph_launch(0, e, s);
  b.stream_synchronize(0, s);
  CHECK(read(b, p) == all(5));
  CHECK(contains(thrown<RuntimeError>([&] { b.stream_end_capture(0, s); }),
                 fmt::format("stream {:#x} of device 0 is not capturing", s.value)));
  b.graph_exec_destroy(0, e);
  b.raw_free(0, p, kBytes);
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: capture_refuse names what cannot be captured and invalidates the capture") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  b.stream_begin_capture(0, s, CaptureMode::per_thread);
  std::string m = thrown<RuntimeError>([&] { b.capture_refuse(0, s, "aten::nonzero (a host kernel)"); });
  INFO(m);
  CHECK(contains(m, "simdev: aten::nonzero (a host kernel) cannot be captured into a graph"));
  CHECK(contains(m, "mode thread_local"));
  CHECK(contains(m, "the capture is invalidated"));
  expect_invalidated_by(b, s, "aten::nonzero (a host kernel)");
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: launches queued behind held work complete after their exec and graph are "
          "destroyed; nothing they use is freed early") {
  SimBackend b(Environment::fixed({}), sim());
  Sim& rt = b.runtime();
  StreamHandle s = b.stream_create(0, 0);
  constexpr int kLaunches = 4;
  // Each launch shifts x right by one byte through y: the result counts them.
  Bytes x0(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) x0[i] = static_cast<unsigned char>(1 + i % 250);
  void* x = b.raw_malloc(0, kBytes);
  b.memcpy(0, x, x0.data(), kBytes, CopyKind::host_to_device);
  void* y = filled(b, 0);
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.memcpy_async(0, static_cast<char*>(y) + 1, x, kBytes - 1, CopyKind::device_to_device, s, false);
  b.memcpy_async(0, x, y, kBytes, CopyKind::device_to_device, s, false);
  GraphHandle g = b.stream_end_capture(0, s);
  GraphExecHandle e = b.graph_instantiate(0, g);
  auto gate = rt.hold(0, s);
  for (int i = 0; i < kLaunches; ++i) b.graph_launch(0, e, s);
  b.graph_exec_destroy(0, e);
  b.graph_destroy(0, g);
  CHECK(rt.live_graphs() == 0);
  CHECK(rt.live_graph_execs() == 0);
  CHECK_FALSE(b.stream_query(0, s));
  // The queued launches still use x and y: simdev refuses to free them.
  CHECK(driver_code([&] { b.raw_free(0, x, kBytes); }) == simdev::kInvalidValue);
  gate->open();
  b.stream_synchronize(0, s);
  Bytes want(kBytes, 0);
  std::copy(x0.begin(), x0.end() - kLaunches, want.begin() + kLaunches);
  CHECK(read(b, x) == want);
  b.raw_free(0, x, kBytes);
  b.raw_free(0, y, kBytes);
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: a launch whose memory was freed after the capture is refused, naming the work "
          "and the address") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  void* p = filled(b, 0);
  void* keep = filled(b, 0);
  GraphExecHandle e = fill_graph(b, s, p, 3);
  b.raw_free(0, p, kBytes);
  long launched = b.runtime().graph_launches();
  std::string m = thrown<DriverError>([&] { b.graph_launch(0, e, s); });
  INFO(m);
  CHECK(driver_code([&] { b.graph_launch(0, e, s); }) == simdev::kIllegalAddress);
  CHECK(contains(m, "memset_async"));
  CHECK(contains(m, fmt::format("{}", p)));
  CHECK(contains(m, "freed since the capture"));
  CHECK(b.runtime().graph_launches() == launched);
  // The refused launch queued nothing; the stream runs other work.
  b.memset_async(0, keep, 1, kBytes, s);
  b.stream_synchronize(0, s);
  CHECK(read(b, keep) == all(1));
  b.graph_exec_destroy(0, e);
  b.raw_free(0, keep, kBytes);
  b.stream_destroy(0, s);
}

TEST_CASE("graphs: simdev itself refuses what a capture cannot hold, and ends an invalidated "
          "capture with the stream free") {
  Sim rt(sim());
  rt.device_count();
  accelkit::StreamHandle s = rt.stream_create(0, 0);
  accelkit::EventHandle e = rt.event_create(0, EventFlags::none);
  void* p = rt.malloc(0, kBytes);
  Bytes host(kBytes);
  struct Case {
    const char* call;
    std::function<void()> run;
  };
  std::vector<Case> cases = {
      {"stream_synchronize", [&] { rt.stream_synchronize(0, s); }},
      {"stream_query", [&] { rt.stream_query(0, s); }},
      {"event_record", [&] { rt.event_record(0, e, s); }},
      {"stream_wait_event", [&] { rt.stream_wait_event(0, s, e); }},
      {"device_synchronize", [&] { rt.device_synchronize(0); }},
      {"memcpy_async",
       [&] { rt.memcpy_async(0, host.data(), p, kBytes, CopyKind::device_to_host, s, false); }},
  };
  for (const Case& c : cases) {
    INFO(c.call);
    rt.stream_begin_capture(0, s, CaptureMode::relaxed);
    CHECK(driver_code([&] { rt.stream_begin_capture(0, s, CaptureMode::relaxed); }) ==
          simdev::kInvalidValue);
    rt.memset_async(0, p, 1, kBytes, s);
    CHECK(driver_code(c.run) == simdev::kCaptureUnsupported);
    CHECK(rt.stream_is_capturing(0, s));
    std::string m = thrown<DriverError>([&] { rt.stream_end_capture(0, s); });
    CHECK(contains(m, std::string("invalidated by ") + c.call));
    CHECK_FALSE(rt.stream_is_capturing(0, s));
    CHECK(driver_code([&] { rt.stream_end_capture(0, s); }) == simdev::kInvalidValue);
    rt.stream_synchronize(0, s);  // usable
  }
  // A stream of another device, or another stream, is not touched.
  accelkit::StreamHandle t = rt.stream_create(0, 0);
  rt.stream_begin_capture(0, s, CaptureMode::global);
  rt.event_record(0, e, t);
  rt.stream_synchronize(0, t);
  rt.device_synchronize(1);
  rt.graph_destroy(0, rt.stream_end_capture(0, s));
  rt.event_destroy(0, e);
  rt.free(0, p);
  rt.stream_destroy(0, s);
  rt.stream_destroy(0, t);
}

TEST_CASE("graphs: captures on two streams from two threads at once, while a third thread asks "
          "which streams capture") {
  SimBackend b(Environment::fixed({}), sim());
  constexpr int kRounds = 50;
  std::atomic<bool> done{false};
  std::atomic<long> seen{0};
  StreamHandle streams[2] = {b.stream_create(0, 0), b.stream_create(0, 0)};
  void* buffers[2] = {filled(b, 0), filled(b, 0)};
  std::thread watcher([&] {
    while (!done.load()) {
      seen += b.capture_underway(0);
      seen += b.stream_is_capturing(0, streams[0]) + b.stream_is_capturing(0, streams[1]);
    }
  });
  std::vector<std::thread> capturers;
  std::atomic<int> failures{0};
  for (int i = 0; i < 2; ++i) {
    capturers.emplace_back([&, i] {
      // Not global: each thread reads its result back with a synchronous
      // copy, which a global capture on the other thread would refuse.
      CaptureMode mode = i == 0 ? CaptureMode::relaxed : CaptureMode::per_thread;
      for (int r = 0; r < kRounds; ++r) {
        StreamHandle s = streams[i];
        b.stream_begin_capture(0, s, mode);
        b.memset_async(0, buffers[i], (r + i) % 256, kBytes, s);
        GraphHandle g = b.stream_end_capture(0, s);
        GraphExecHandle e = b.graph_instantiate(0, g);
        b.graph_destroy(0, g);
        b.graph_launch(0, e, s);
        b.stream_synchronize(0, s);
        b.graph_exec_destroy(0, e);
        if (read(b, buffers[i])[0] != (r + i) % 256) ++failures;
      }
    });
  }
  for (auto& t : capturers) t.join();
  done = true;
  watcher.join();
  CHECK(failures.load() == 0);
  CHECK_FALSE(b.capture_underway(0));
  CHECK(b.runtime().graphs_captured() == 2 * kRounds);
  CHECK(b.runtime().live_graphs() == 0);
  for (int i = 0; i < 2; ++i) {
    b.raw_free(0, buffers[i], kBytes);
    b.stream_destroy(0, streams[i]);
  }
}

TEST_CASE("graphs: another thread synchronizing an event while a capture is underway: refused in "
          "global mode only, the capture invalidated then") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0), t = b.stream_create(0, 0);
  void* p = filled(b, 0);
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::per_thread, CaptureMode::relaxed}) {
    INFO(to_string(mode));
    EventHandle e = b.event_create(0, EventFlags::none);
    std::string refusal;
    bool finished = false;
    b.stream_begin_capture(0, s, mode);
    // The other thread records on its own stream (allowed in every mode),
    // then synchronizes the event while this thread goes on capturing.
    std::thread other([&] {
      b.memset_async(0, p, 1, kBytes, t);
      b.event_record(0, e, t);
      refusal = thrown<RuntimeError>([&] { b.event_synchronize(0, e); });
      finished = true;
    });
    b.memset_async(0, p, 9, kBytes, s);
    other.join();
    CHECK(finished);
    if (mode == CaptureMode::global) {
      CHECK(contains(refusal, "simdev: event_synchronize on device 0"));
      expect_invalidated_by(b, s, "event_synchronize");
    } else {
      CHECK(refusal.empty());
      GraphExecHandle x = b.graph_instantiate(0, b.stream_end_capture(0, s));
      b.graph_launch(0, x, s);
      b.stream_synchronize(0, s);
      CHECK(read(b, p) == all(9));
      b.graph_exec_destroy(0, x);
    }
    b.stream_synchronize(0, t);
    b.event_destroy(0, e);
  }
  CHECK(b.runtime().live_graphs() == 2);  // per_thread's and relaxed's, never destroyed
  b.raw_free(0, p, kBytes);
  b.stream_destroy(0, s);
  b.stream_destroy(0, t);
}

TEST_CASE("graphs: the event pool queries no parked event while a global capture is underway, "
          "so the capture survives the pool's use on other streams") {
  SimBackend b(Environment::fixed({}), sim());
  EventPool<Sim> pool(b, 0);
  StreamHandle s = b.stream_create(0, 0), t = b.stream_create(0, 0);
  void* p = filled(b, 0);
  pool.release(pool.record(t));  // parked: its record may be pending
  b.stream_synchronize(0, t);
  b.stream_begin_capture(0, s, CaptureMode::global);
  b.memset_async(0, p, 3, kBytes, s);
  EventHandle e = pool.record(t);  // a new event, the parked one not queried
  CHECK(pool.created() == 2);
  GraphExecHandle x = b.graph_instantiate(0, b.stream_end_capture(0, s));  // not invalidated
  b.graph_launch(0, x, s);
  b.stream_synchronize(0, s);
  CHECK(read(b, p) == all(3));
  pool.release(e);
  b.stream_synchronize(0, t);
  pool.release(pool.acquire());  // after the capture, parked events are reused again
  CHECK(pool.created() == 2);
  b.graph_exec_destroy(0, x);
  b.raw_free(0, p, kBytes);
  b.stream_destroy(0, s);
  b.stream_destroy(0, t);
}
