// accelkit: the conformance kit's graphs checks: a capture records work
// without running it, a launch reads memory when it runs, and the SDK's
// rules around a capture (Note [Capture rules]). Included by
// testing/conformance.hpp, which registers them. A runtime without the graph
// members skips them, after the SDK's refusal is checked.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

#include <cstddef>
#include <string>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

template <class R>
struct GraphChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using typename Tools::Busy;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::read;
  using Tools::make_busy;
  using Tools::queue_busy;
  using Tools::free_busy;
  using Tools::no_host_side;
  static constexpr std::size_t kBytes = 64 << 10;

  // True (the check skipped) when there is no device, when the runtime has
  // no graph members (after checking that the SDK then refuses graphs with
  // NotSupportedError naming the backend and reports no capture), or when
  // the runtime has them but device 0 cannot capture: its
  // stream_begin_capture throws NotSupportedError (an OpenCL device without
  // cl_khr_command_buffer), which must name the backend.
  static bool no_graphs(Kit& kit, Verdict& v) {
    if (no_device(kit, v)) return true;
    if constexpr (Kit::SdkBackend::has_graphs) {
      auto& b = kit.backend();
      StreamHandle s = b.stream_create(0, 0);
      std::string reason;
      try {
        b.stream_begin_capture(0, s, CaptureMode::global);
        b.graph_destroy(0, b.stream_end_capture(0, s));
      } catch (const NotSupportedError& e) {
        reason = e.what();
      }
      bool still = b.stream_is_capturing(0, s);
      b.stream_destroy(0, s);
      if (reason.empty()) return false;
      v.require(reason.find(std::string(R::name)) != std::string::npos,
                fmt::format("a device that cannot capture must say so naming the backend: {}",
                            reason));
      v.require(!still, "a refused stream_begin_capture left the stream capturing");
      v.skip(fmt::format("device 0 cannot capture graphs: {}", reason));
      return true;
    } else {
      auto& b = kit.backend();
      StreamHandle s = b.stream_create(0, 0);
      std::string what;
      try {
        b.stream_begin_capture(0, s, CaptureMode::global);
        what = "stream_begin_capture succeeded";
      } catch (const NotSupportedError& e) {
        if (std::string(e.what()).find(std::string(R::name)) == std::string::npos)
          what = fmt::format("the refusal does not name the backend: {}", e.what());
      } catch (const std::exception& e) {
        what = fmt::format("stream_begin_capture threw other than NotSupportedError: {}",
                           e.what());
      }
      v.require(what.empty(), fmt::format("without the graph members the SDK must refuse to "
                                          "capture with NotSupportedError naming the backend: "
                                          "{}",
                                          what));
      v.require(!b.stream_is_capturing(0, s) && !b.capture_underway(0),
                "without the graph members no stream may report capturing");
      b.stream_destroy(0, s);
      v.skip(fmt::format("{} has no graph members (stream_begin_capture ...); the SDK refuses "
                         "graphs with NotSupportedError",
                         R::name));
      return true;
    }
  }

  // Device memory holding `bytes` of `value`, or the pattern when value < 0.
  static void* filled(Kit& kit, std::size_t bytes, int value, unsigned seed = 1) {
    auto& b = kit.backend();
    void* p = b.raw_malloc(0, bytes);
    std::vector<unsigned char> h =
        value < 0 ? pattern(bytes, seed) : std::vector<unsigned char>(bytes, static_cast<unsigned char>(value));
    b.memcpy(0, p, h.data(), bytes, CopyKind::host_to_device);
    return p;
  }

  // Work queued on a capturing stream is recorded, not run: after the
  // capture ends, the memory it would have written is unchanged; the launch
  // then runs it, in the order captured.
  static void capture_does_not_execute(Kit& kit, Verdict& v) {
    if (no_graphs(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    void* src = filled(kit, kBytes, -1, 7);
    void* dst = filled(kit, kBytes, 0x33);
    b.stream_begin_capture(0, s, CaptureMode::global);
    b.memset_async(0, dst, 0x11, kBytes, s);
    b.memcpy_async(0, dst, src, kBytes / 2, CopyKind::device_to_device, s, no_host_side);
    GraphHandle g = b.stream_end_capture(0, s);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> after = read(kit, dst, kBytes);
    v.require(after == std::vector<unsigned char>(kBytes, 0x33),
              "a memset_async and a device-to-device copy queued on a capturing stream ran "
              "during the capture (their destination changed before any graph_launch)");
    GraphExecHandle e = b.graph_instantiate(0, g);
    b.graph_launch(0, e, s);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> want = pattern(kBytes, 7);
    std::fill(want.begin() + kBytes / 2, want.end(), 0x11);
    v.require(read(kit, dst, kBytes) == want,
              "the launch of a captured memset then copy did not leave the copy's bytes over "
              "the fill's (work missing or out of the captured order)");
    b.graph_exec_destroy(0, e);
    b.graph_destroy(0, g);
    b.raw_free(0, src, kBytes);
    b.raw_free(0, dst, kBytes);
    b.stream_destroy(0, s);
  }

  // A launch reads device memory when it runs: the graph holds addresses,
  // never contents copied at capture.
  static void replay_reads_memory_at_run_time(Kit& kit, Verdict& v) {
    if (no_graphs(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    void* src = filled(kit, kBytes, 0x01);
    void* dst = filled(kit, kBytes, 0x00);
    b.stream_begin_capture(0, s, CaptureMode::global);
    b.memcpy_async(0, dst, src, kBytes, CopyKind::device_to_device, s, no_host_side);
    GraphHandle g = b.stream_end_capture(0, s);
    GraphExecHandle e = b.graph_instantiate(0, g);
    for (unsigned seed : {11u, 12u}) {
      std::vector<unsigned char> now = pattern(kBytes, seed);
      b.memcpy(0, src, now.data(), kBytes, CopyKind::host_to_device);
      b.graph_launch(0, e, s);
      b.stream_synchronize(0, s);
      if (!v.require(read(kit, dst, kBytes) == now,
                     fmt::format("after the source was rewritten ({} time{}), a launch of a "
                                 "captured copy did not copy the source's bytes as they were at "
                                 "the launch (stale data from the capture?)",
                                 seed - 10, seed == 11 ? "" : "s")))
        break;
    }
    b.graph_exec_destroy(0, e);
    b.graph_destroy(0, g);
    b.raw_free(0, src, kBytes);
    b.raw_free(0, dst, kBytes);
    b.stream_destroy(0, s);
  }

  // A second capture of a capturing stream is refused, and the first goes
  // on unharmed.
  static void begin_twice_refused(Kit& kit, Verdict& v) {
    if (no_graphs(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    void* dst = filled(kit, kBytes, 0x00);
    b.stream_begin_capture(0, s, CaptureMode::global);
    b.memset_async(0, dst, 0x5a, kBytes, s);
    bool refused = false;
    try {
      b.stream_begin_capture(0, s, CaptureMode::relaxed);
    } catch (const RuntimeError&) {
      refused = true;
    }
    v.require(refused, "stream_begin_capture of a capturing stream was not refused");
    GraphHandle g = b.stream_end_capture(0, s);
    v.require(!b.stream_is_capturing(0, s), "the stream is capturing after stream_end_capture");
    GraphExecHandle e = b.graph_instantiate(0, g);
    b.graph_launch(0, e, s);
    b.stream_synchronize(0, s);
    v.require(read(kit, dst, kBytes) == std::vector<unsigned char>(kBytes, 0x5a),
              "the capture refused a second begin lost the work recorded before it");
    b.graph_exec_destroy(0, e);
    b.graph_destroy(0, g);
    b.raw_free(0, dst, kBytes);
    b.stream_destroy(0, s);
  }

  // A synchronize of a capturing stream is refused and invalidates the
  // capture; ending it is refused naming the call; the stream then runs
  // work again, at once, and neither the SDK nor the runtime calls it
  // capturing.
  static void invalidated_capture_ends_usable(Kit& kit, Verdict& v) {
    if (no_graphs(kit, v)) return;
    auto& b = kit.backend();
    StreamHandle s = b.stream_create(0, 0);
    void* dst = filled(kit, kBytes, 0x00);
    b.stream_begin_capture(0, s, CaptureMode::global);
    b.memset_async(0, dst, 0x22, kBytes, s);
    bool refused = false;
    try {
      b.stream_synchronize(0, s);
    } catch (const RuntimeError&) {
      refused = true;
    }
    v.require(refused, "stream_synchronize of a capturing stream was not refused");
    std::string message;
    try {
      GraphHandle g = b.stream_end_capture(0, s);
      b.graph_destroy(0, g);
    } catch (const RuntimeError& e) {
      message = e.what();
    }
    v.require(message.find("stream_synchronize") != std::string::npos,
              fmt::format("stream_end_capture of an invalidated capture must be refused naming "
                          "the call that invalidated it; it {}",
                          message.empty() ? "returned a graph" : "said: " + message));
    bool driver_capturing = false;
    if constexpr (Kit::SdkBackend::has_graphs)
      driver_capturing = b.runtime().stream_is_capturing(b.physical(0), s);
    v.require(!b.stream_is_capturing(0, s) && !driver_capturing,
              "the stream is still capturing after the end of an invalidated capture (the "
              "runtime's stream_end_capture must end the capture even when it fails)");
    b.memset_async(0, dst, 0x44, kBytes, s);
    b.stream_synchronize(0, s);
    v.require(read(kit, dst, kBytes) == std::vector<unsigned char>(kBytes, 0x44),
              "after an invalidated capture ended, work queued on the stream did not run");
    b.raw_free(0, dst, kBytes);
    b.stream_destroy(0, s);
  }

  // Launches of one exec queue behind each other, and destroying the exec
  // and its graph while they are queued leaves them whole: each launch
  // shifts a buffer by one byte, so the result counts the launches that ran.
  static void launches_outlive_destroy(Kit& kit, Verdict& v) {
    if (no_graphs(kit, v)) return;
    auto& b = kit.backend();
    constexpr int kLaunches = 8;
    StreamHandle s = b.stream_create(0, 0);
    std::vector<unsigned char> x0 = pattern(kBytes, 3);
    for (auto& c : x0) c = static_cast<unsigned char>(c | 1);  // no zero byte
    void* x = b.raw_malloc(0, kBytes);
    b.memcpy(0, x, x0.data(), kBytes, CopyKind::host_to_device);
    void* y = filled(kit, kBytes, 0x00);
    b.stream_begin_capture(0, s, CaptureMode::global);
    b.memcpy_async(0, static_cast<char*>(y) + 1, x, kBytes - 1, CopyKind::device_to_device, s,
                   no_host_side);
    b.memcpy_async(0, x, y, kBytes, CopyKind::device_to_device, s, no_host_side);
    GraphHandle g = b.stream_end_capture(0, s);
    GraphExecHandle e = b.graph_instantiate(0, g);
    b.graph_destroy(0, g);  // execs outlive their graph
    Busy w = make_busy(kit, 0);
    queue_busy(kit, 0, w, s, 8);  // the launches below stay queued a while
    for (int i = 0; i < kLaunches; ++i) b.graph_launch(0, e, s);
    b.graph_exec_destroy(0, e);
    b.stream_synchronize(0, s);
    std::vector<unsigned char> want(kBytes, 0);
    std::copy(x0.begin(), x0.end() - kLaunches, want.begin() + kLaunches);
    std::vector<unsigned char> got = read(kit, x, kBytes);
    std::size_t ran = 0;
    while (ran < kBytes && got[ran] == 0) ++ran;
    v.require(got == want, fmt::format("{} launches of one exec queued, then the exec and its "
                                       "graph destroyed: the result shows {} launch{} ran "
                                       "(whole and in order)",
                                       kLaunches, ran, ran == 1 ? "" : "es"));
    free_busy(kit, 0, w);
    b.raw_free(0, x, kBytes);
    b.raw_free(0, y, kBytes);
    b.stream_destroy(0, s);
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

#define ACCELKIT_CONFORMANCE_GRAPHS_CHECKS(X)                                                  \
  X(graphs, capture_does_not_execute,                                                          \
    "work queued on a capturing stream is recorded, not run; a launch runs it in order")       \
  X(graphs, replay_reads_memory_at_run_time,                                                   \
    "a graph launch reads device memory as it is when the launch runs")                        \
  X(graphs, begin_twice_refused,                                                               \
    "stream_begin_capture of a capturing stream is refused; the first capture goes on")        \
  X(graphs, invalidated_capture_ends_usable,                                                   \
    "ending an invalidated capture is refused naming the call; the stream is usable after")    \
  X(graphs, launches_outlive_destroy,                                                          \
    "launches queued before graph_exec_destroy and graph_destroy all complete")
