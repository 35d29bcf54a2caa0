// accelkit: the conformance kit's errors checks: a failure of queued work
// surfaces once, as a DriverError naming the backend, and the device works
// after it, or the failure was a loss (DeviceLostError) and all later work
// on the device is refused. Needs the runtime's fault hook (has_fault_hook);
// skipped without it. Each check runs in the kit's second process. Included
// by testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>
#include <accelkit/testing/conformance/peer.hpp>

#include <algorithm>
#include <chrono>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// Whether R offers the kit's fault hook: `void inject_fault(const
// std::string& member, int nth, bool async)` makes the nth call of `member`
// from now on fail (with `async`: its queued work fails later). Not part of
// the contract: a test hook, as simdev's, that the errors group needs.
template <class R, class = void>
inline constexpr bool has_fault_hook = false;
template <class R>
inline constexpr bool has_fault_hook<
    R, std::void_t<decltype(std::declval<R&>().inject_fault(std::declval<const std::string&>(), 1,
                                                            true))>> = true;

// Where an injected fault shows: the call itself fails, or the call queues
// work that fails later (the fault hook's `async`).
enum class FaultTiming { at_call, in_queued_work };

// Arms R's fault hook: the nth call of `member` from now on fails, `when`.
template <class R>
void inject_fault(R& runtime, const std::string& member, int nth, FaultTiming when) {
  runtime.inject_fault(member, nth, when == FaultTiming::in_queued_work);
}

template <class R>
struct ErrorChecks : CheckTools<R> {
  using Tools = CheckTools<R>;
  using typename Tools::Kit;
  using Tools::no_device;
  using Tools::pattern;
  using Tools::pageable;
  using Tools::no_host_side;

  // Note [Asynchronous errors in the kit]
  // Problem: the contract lets a failure of queued work surface at the
  // next synchronize, query or stream-ordered call on the device, and the
  // observer's marker records (Note [Observing a runtime]) are such calls,
  // so which call reports it is not fixed. The failure may also end the
  // device (Note [Lost devices]), as every failure of queued work does on
  // Vulkan and CUDA's sticky errors do: such a device never works again in
  // that process, and the kit's other checks still need one.
  // Decision: each check runs in the kit's second process (Note [The kit's
  // second process]), which reports its verdict and exits, so that a lost
  // device ends nothing in the kit's own process and a check that hangs
  // fails at the peer timeout. It runs a whole sequence of calls after the
  // fault and tallies them: exactly one failure is reported, a DriverError
  // naming the backend. Then either the device works again (a plain
  // DriverError: a copy comes back right), or the failure was a loss
  // (DeviceLostError): every later call of the sequence and a copy after it
  // are refused with DeviceLostError naming the first failure, the runtime
  // itself refuses work on the device (a memcpy called on it directly
  // throws a DriverError: a runtime that reports a loss and runs later work
  // lies about one or the other), and releases (free, event and stream
  // destroys) return or throw a DriverError.
  // Limits: only faults the runtime's hook can inject are checked; a
  // runtime without the hook skips the group. Where the second process
  // cannot be started the checks run in the kit's process, and a lost
  // device 0 then fails the checks after them.
  struct Tally {
    int reported = 0;     // failures reported: DriverErrors but the SDK's refusals
    bool lost = false;    // the first was a DeviceLostError
    std::string what;     // its message
    std::string first;    // "driver error <code> in <call>", of the first
    std::string problem;  // a call that broke the rules after a loss, said once
    // Runs one call of the sequence.
    template <class F>
    void operator()(const char* call, F&& f) {
      try {
        f();
        if (lost && problem.empty())
          problem = fmt::format("{} returned normally after the device was lost", call);
      } catch (const DeviceLostError& e) {
        if (!e.refused().empty()) {
          if (!lost && problem.empty())
            problem = fmt::format("{} was refused as on a lost device before any loss was "
                                  "reported: {}",
                                  call, e.what());
          else if (std::string(e.what()).find(first) == std::string::npos && problem.empty())
            problem = fmt::format("{}'s refusal does not name the first failure ({}): {}", call,
                                  first, e.what());
          return;
        }
        if (reported++ == 0) {
          lost = true;
          what = e.what();
          first = fmt::format("driver error {} in {}", e.code(), e.call());
        }
      } catch (const DriverError& e) {
        if (reported++ == 0) what = e.what();
        if (lost && problem.empty())
          problem = fmt::format("{} failed with a DriverError that is not a DeviceLostError "
                                "after the device was lost: {}",
                                call, e.what());
      }
    }
    // Runs a release of the sequence: returns, or throws a DriverError.
    template <class F>
    void release(const char* call, F&& f) {
      try {
        f();
      } catch (const DriverError&) {
        // A driver may refuse a release on a lost device.
      } catch (const std::exception& e) {
        if (problem.empty())
          problem = fmt::format("{} threw what is not a DriverError: {}", call, e.what());
      }
    }
  };
  static bool no_fault_hook(Verdict& v) {
    if constexpr (has_fault_hook<R>) {
      (void)v;
      return false;
    } else {
      v.skip("the runtime offers no fault hook (inject_fault(member, nth, async)): asynchronous "
             "errors cannot be provoked");
      return true;
    }
  }
  // Runs `body` in the kit's second process, and takes its verdict.
  template <class F>
  static void in_second_process(Kit& kit, Verdict& v, const char* check, F&& body) {
    if (PeerChannel* ch = kit.peer()) {
      body(kit, v);
      std::string message = v.message();
      std::replace(message.begin(), message.end(), '\n', ' ');
      ch->send(fmt::format("verdict {} {}", to_string(v.status()), message));
      return;
    }
    if (no_fault_hook(v) || no_device(kit, v)) return;
    if (!PeerProcess::unavailable().empty()) return body(kit, v);
    try {
      PeerProcess peer("errors", check, Kit::runtime_type());
      std::string line = peer.channel().receive("the check's verdict");
      peer.finish();
      std::size_t space = line.find(' ', 8);
      std::string status = line.substr(8, space == std::string::npos ? space : space - 8);
      std::string message = space == std::string::npos ? std::string() : line.substr(space + 1);
      if (line.compare(0, 8, "verdict ") != 0)
        v.require(false, fmt::format("the second process answered \"{}\", not a verdict", line));
      else if (status == "fail")
        v.require(false, message);
      else if (status == "skip")
        v.skip(message);
    } catch (const std::exception& e) {
      v.require(false, fmt::format("run in the kit's second process: {}", e.what()));
    }
  }
  template <class F>
  static void error_surfaces_once(Kit& kit, Verdict& v, const char* check, const char* member,
                                  const char* where, F&& sequence) {
    in_second_process(kit, v, check, [&](Kit& kit, Verdict& v) {
      if (no_fault_hook(v) || no_device(kit, v)) return;
      if constexpr (has_fault_hook<R>) {
        auto& b = kit.backend();
        StreamHandle s = b.stream_create(0, 0);
        std::size_t n = 1 << 20;
        void* a = b.raw_malloc(0, n);
        inject_fault(b.runtime().inner(), member, 1, FaultTiming::in_queued_work);
        Tally t;
        sequence(b, s, a, n, t);
        v.require(t.reported == 1, fmt::format("a failure of queued {} surfaced {} time(s) {} "
                                               "(once is the rule)",
                                               member, t.reported, where));
        if (t.reported >= 1)
          v.require(t.what.find(std::string(R::name)) != std::string::npos,
                    fmt::format("the error does not name the backend: {}", t.what));
        std::vector<unsigned char> in = pattern(n, 9), out(n, 0);
        v.require(t.problem.empty(), t.problem);
        if (t.lost) {
          lost_then_refused(kit, v, s, a, in, t);
        } else {
          // The device works again.
          try {
            b.memcpy_async(0, a, in.data(), n, CopyKind::host_to_device, s, pageable);
            b.memcpy_async(0, out.data(), a, n, CopyKind::device_to_host, s, pageable);
            b.stream_synchronize(0, s);
            v.require(in == out, "after an asynchronous error, a copy came back wrong");
          } catch (const DriverError& e) {
            v.require(false, fmt::format("after an asynchronous error reported as a plain "
                                         "DriverError, the device did not work ({}): a failure "
                                         "that ends the device is reported as DeviceLostError "
                                         "(Runtime<Self>::device_lost)",
                                         e.what()));
          }
        }
        release(v, "free", [&] { b.raw_free(0, a, n); });
        release(v, "stream_destroy", [&] { b.stream_destroy(0, s); });
      }
    });
  }
  // After a loss: the SDK refuses a copy naming the first failure, and the
  // runtime refuses one too.
  static void lost_then_refused(Kit& kit, Verdict& v, StreamHandle s, void* a,
                                std::vector<unsigned char>& in, const Tally& t) {
    auto& b = kit.backend();
    try {
      b.memcpy_async(0, a, in.data(), in.size(), CopyKind::host_to_device, s, pageable);
      v.require(false, "after the device was lost, the SDK ran a copy on it");
    } catch (const DeviceLostError& e) {
      v.require(!e.refused().empty() && std::string(e.what()).find(t.first) != std::string::npos,
                fmt::format("after the loss, a copy was not refused naming the first failure "
                            "({}): {}",
                            t.first, e.what()));
    }
    try {
      kit.runtime().memcpy(b.physical(0), a, in.data(), 64, CopyKind::host_to_device);
      v.require(false, fmt::format("the runtime reported device 0 lost ({}) and then ran a "
                                   "memcpy on it without an error: a lost device runs no more "
                                   "work (every call fails with a DriverError); a failure the "
                                   "device recovers from is a plain DriverError",
                                   t.what));
    } catch (const DriverError&) {
      // Refused, as a lost device must.
    }
  }
  // A release after the failure: returns, or throws a DriverError.
  template <class F>
  static void release(Verdict& v, const char* call, F&& f) {
    try {
      f();
    } catch (const DriverError&) {
      // A driver may refuse a release on a lost device; the SDK keeps the
      // resource out of its pools.
    } catch (const std::exception& e) {
      v.require(false, fmt::format("{} after the failure threw what is not a DriverError: {}",
                                   call, e.what()));
    }
  }
  static void error_at_synchronize(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "error_at_synchronize", "memset_async",
        "by the call, its stream's synchronize, and a second synchronize",
        [](auto& b, StreamHandle s, void* a, std::size_t n, Tally& t) {
          t("memset_async", [&] { b.memset_async(0, a, 1, n, s); });
          t("stream_synchronize", [&] { b.stream_synchronize(0, s); });
          t("stream_synchronize", [&] { b.stream_synchronize(0, s); });
        });
  }
  static void error_at_query(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "error_at_query", "memset_async", "while its stream was queried until idle",
        [](auto& b, StreamHandle s, void* a, std::size_t n, Tally& t) {
          t("memset_async", [&] { b.memset_async(0, a, 2, n, s); });
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          bool idle = false;
          while (!idle && !t.lost && std::chrono::steady_clock::now() < deadline)
            t("stream_query", [&] { idle = b.stream_query(0, s); });
          t("stream_query", [&] { idle = b.stream_query(0, s); });
          if (!idle && !t.lost) t.reported = -1;  // never idle: said as "-1 time(s)"
        });
  }
  static void error_at_event(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "error_at_event", "memcpy_async",
        "by the copy, an event recorded after it, the event's synchronize and its query",
        [](auto& b, StreamHandle s, void* a, std::size_t n, Tally& t) {
          EventHandle ev{};
          void* c = nullptr;
          t("event_create", [&] { ev = b.event_create(0, EventFlags::none); });
          t("malloc", [&] { c = b.raw_malloc(0, n); });
          t("memcpy_async",
            [&] { b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, no_host_side); });
          t("event_record", [&] { b.event_record(0, ev, s); });
          t("event_synchronize", [&] { b.event_synchronize(0, ev); });
          t("event_query", [&] { (void)b.event_query(0, ev); });
          t("device_synchronize", [&] { b.device_synchronize(0); });
          if (ev) t.release("event_destroy", [&] { b.event_destroy(0, ev); });
          if (c) t.release("free", [&] { b.raw_free(0, c, n); });
        });
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_ERRORS_CHECKS(X)                                                     \
  X(errors, error_at_synchronize,                                                                 \
    "a failure of queued work surfaces once, as a DriverError naming the backend, at the next "   \
    "synchronize or stream-ordered call; the device then works, or the failure was a loss "       \
    "(DeviceLostError) and later work is refused naming it")                                      \
  X(errors, error_at_query, "a failure of queued work surfaces once while its stream is queried") \
  X(errors, error_at_event,                                                                       \
    "a failure of queued work surfaces once through an event recorded after it")
