// accelkit: the conformance kit's errors checks: a failure of queued work
// surfaces once, as a DriverError naming the backend, and the device works
// after it. Needs the runtime's fault hook (has_fault_hook); skipped without
// it. Included by testing/conformance.hpp, which registers them.
#pragma once

#include <accelkit/testing/conformance/kit.hpp>

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
  // so which call reports it is not fixed.
  // Decision: a check runs a whole sequence of calls after the fault and
  // counts its DriverErrors: exactly one, naming the backend, and then the
  // device works again.
  // Limits: only faults the runtime's hook can inject are checked; a
  // runtime without the hook skips the group.
  template <class F>
  static int driver_errors(F&& f, std::string& what) {
    try {
      f();
      return 0;
    } catch (const DriverError& e) {
      what = e.what();
      return 1;
    }
  }
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
  template <class F>
  static void error_surfaces_once(Kit& kit, Verdict& v, const char* member, const char* where,
                                  F&& sequence) {
    if (no_fault_hook(v) || no_device(kit, v)) return;
    auto& b = kit.backend();
    if constexpr (has_fault_hook<R>) {
      StreamHandle s = b.stream_create(0, 0);
      std::size_t n = 1 << 20;
      void* a = b.raw_malloc(0, n);
      inject_fault(b.runtime().inner(), member, 1, FaultTiming::in_queued_work);
      std::string what;
      int errors = sequence(b, s, a, n, what);
      v.require(errors == 1, fmt::format("a failure of queued {} surfaced {} time(s) {} (once is "
                                         "the rule)",
                                         member, errors, where));
      if (errors >= 1)
        v.require(what.find(std::string(R::name)) != std::string::npos,
                  fmt::format("the error does not name the backend: {}", what));
      // The device works again.
      std::vector<unsigned char> in = pattern(n, 9), out(n, 0);
      b.memcpy_async(0, a, in.data(), n, CopyKind::host_to_device, s, pageable);
      b.memcpy_async(0, out.data(), a, n, CopyKind::device_to_host, s, pageable);
      b.stream_synchronize(0, s);
      v.require(in == out, "after an asynchronous error, a copy came back wrong");
      b.raw_free(0, a, n);
      b.stream_destroy(0, s);
    }
  }
  static void error_at_synchronize(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "memset_async", "by the call, its stream's synchronize, and a second synchronize",
        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
          int e = driver_errors([&] { b.memset_async(0, a, 1, n, s); }, what);
          e += driver_errors([&] { b.stream_synchronize(0, s); }, what);
          e += driver_errors([&] { b.stream_synchronize(0, s); }, what);
          return e;
        });
  }
  static void error_at_query(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "memset_async", "while its stream was queried until idle",
        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
          int e = driver_errors([&] { b.memset_async(0, a, 2, n, s); }, what);
          auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          bool idle = false;
          while (!idle && std::chrono::steady_clock::now() < deadline)
            e += driver_errors([&] { idle = b.stream_query(0, s); }, what);
          e += driver_errors([&] { idle = b.stream_query(0, s); }, what);
          return idle ? e : -1;
        });
  }
  static void error_at_event(Kit& kit, Verdict& v) {
    error_surfaces_once(
        kit, v, "memcpy_async",
        "by the copy, an event recorded after it, the event's synchronize and its query",
        [](auto& b, StreamHandle s, void* a, std::size_t n, std::string& what) {
          EventHandle ev = b.event_create(0, EventFlags::none);
          void* c = b.raw_malloc(0, n);
          int e = driver_errors(
              [&] { b.memcpy_async(0, c, a, n, CopyKind::device_to_device, s, no_host_side); },
              what);
          e += driver_errors([&] { b.event_record(0, ev, s); }, what);
          e += driver_errors([&] { b.event_synchronize(0, ev); }, what);
          e += driver_errors([&] { (void)b.event_query(0, ev); }, what);
          e += driver_errors([&] { b.device_synchronize(0); }, what);
          b.event_destroy(0, ev);
          b.raw_free(0, c, n);
          return e;
        });
  }
};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// The group's checks, in the order they run, each with the rule it proves.
#define ACCELKIT_CONFORMANCE_ERRORS_CHECKS(X)                                                     \
  X(errors, error_at_synchronize,                                                                 \
    "a failure of queued work surfaces once, as a DriverError naming the backend, at the next "   \
    "synchronize or stream-ordered call; the device then works")                                  \
  X(errors, error_at_query, "a failure of queued work surfaces once while its stream is queried") \
  X(errors, error_at_event,                                                                       \
    "a failure of queued work surfaces once through an event recorded after it")
