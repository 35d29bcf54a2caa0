// accelkit: the conformance kit (C++): the contract's semantics, checked on
// any runtime, at the runtime level and through the SDK.
//
//   #include <accelkit/testing/conformance.hpp>
//   ACCELKIT_CONFORMANCE_SUITE(acme::AcmeRuntime)
//
// in one translation unit of a Catch2 test program (v2 or v3, linked with
// Catch2's main) registers every check as a test case named
// "conformance/<group>/<check>" and tagged [conformance][<group>]: Catch2's
// tag expressions select or skip groups ("[memory]", "~[threads]"), and so
// does ACCELKIT_CONFORMANCE_SKIP=group,group. The runtime is constructed
// with no arguments; ACCELKIT_CONFORMANCE_SUITE_WITH(R, expr) takes an
// expression that makes one (a prvalue R). Each check records a result in
// the report (Note [Conformance report]) written when the program ends to
// $ACCELKIT_CONFORMANCE_REPORT (default accelkit_conformance_<name>.json);
// a failing check also fails its Catch2 test case with the broken rule. A
// report path that cannot be written stops the program before the first
// check (exit 2), and a write that fails at the end makes it exit 1, each
// naming the file and the reason.
//
// Note [What the kit checks]
// Problem: the compiler checks a runtime's signatures; what a real driver
// gets wrong is silent: semantics (stream order, event records, errors of
// queued work, discovery without a context) that hold on one machine and
// not on the next.
// Decision: the kit checks semantics, on each device the runtime reports
// (physical ordinals; <NAME>_VISIBLE_DEVICES applies as for the SDK), with
// the runtime wrapped so that the calls it receives are counted and a free
// of memory that queued work still uses is caught (Note [Observing a
// runtime]). A runtime with no device (no driver, no hardware) passes every
// check as skipped, "no device", and the discovery checks still run.
// Limits: the fork check runs first, before anything else of the runtime
// has started, so the kit relies on Catch2's declaration order (do not pass
// --order rand). Checks that need a test hook (the errors group:
// has_fault_hook) are skipped on a runtime without it.
//
// The kit's files: testing/conformance/kit.hpp runs a check and keeps the
// report (Conformance<R>, Verdict, CheckTools<R>); each group's checks and
// their rules are in testing/conformance/<group>.hpp, in the order they run:
// discovery, properties, memory, copies, streams, events, device, threads,
// errors, ordering, graphs, virtual_memory, interprocess (whose checks
// start the program again as a second process: Note [The kit's second
// process] in testing/conformance/peer.hpp).
#pragma once

#include <accelkit/testing/conformance/discovery.hpp>
#include <accelkit/testing/conformance/properties.hpp>
#include <accelkit/testing/conformance/memory.hpp>
#include <accelkit/testing/conformance/copies.hpp>
#include <accelkit/testing/conformance/streams.hpp>
#include <accelkit/testing/conformance/events.hpp>
#include <accelkit/testing/conformance/device.hpp>
#include <accelkit/testing/conformance/threads.hpp>
#include <accelkit/testing/conformance/errors.hpp>
#include <accelkit/testing/conformance/ordering.hpp>
#include <accelkit/testing/conformance/graphs.hpp>
#include <accelkit/testing/conformance/virtual_memory.hpp>
#include <accelkit/testing/conformance/ipc.hpp>
#include <accelkit/testing/conformance/kit.hpp>

#include <memory>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

// Every check of every group, by name: Checks<R>::<check>.
template <class R>
struct Checks : DiscoveryChecks<R>,
                PropertiesChecks<R>,
                MemoryChecks<R>,
                CopyChecks<R>,
                StreamChecks<R>,
                EventChecks<R>,
                DeviceChecks<R>,
                ThreadChecks<R>,
                ErrorChecks<R>,
                OrderingChecks<R>,
                GraphChecks<R>,
                VirtualMemoryChecks<R>,
                InterprocessChecks<R> {};

}  // namespace testing
ACCELKIT_END_NAMESPACE

// One test case per check (group, check, the rule it proves), group by group.
#define ACCELKIT_CONFORMANCE_CHECKS(X)            \
  ACCELKIT_CONFORMANCE_DISCOVERY_CHECKS(X)        \
  ACCELKIT_CONFORMANCE_PROPERTIES_CHECKS(X)       \
  ACCELKIT_CONFORMANCE_MEMORY_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_COPIES_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_STREAMS_CHECKS(X)          \
  ACCELKIT_CONFORMANCE_EVENTS_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_DEVICE_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_THREADS_CHECKS(X)          \
  ACCELKIT_CONFORMANCE_ERRORS_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_ORDERING_CHECKS(X)         \
  ACCELKIT_CONFORMANCE_GRAPHS_CHECKS(X)           \
  ACCELKIT_CONFORMANCE_VIRTUAL_MEMORY_CHECKS(X)   \
  ACCELKIT_CONFORMANCE_INTERPROCESS_CHECKS(X)

// Runs check `check` of the kit for runtime R outside the suite (not in the
// report): for tests of the kit itself.
#define ACCELKIT_CONFORMANCE_EVALUATE(R, group_, check_)                                        \
  [] {                                                                                         \
    const char* rule_ = "";                                                                    \
    const char* check_name_ = #check_;                                                         \
    ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_RULE_)                              \
    return ::accelkit::testing::Conformance<R>::instance().evaluate(                           \
        #group_, #check_, rule_, &::accelkit::testing::Checks<R>::check_);                     \
  }()
#define ACCELKIT_DETAIL_CONFORMANCE_RULE_(group, check, rule) \
  if (std::string_view(#check) == std::string_view(check_name_)) rule_ = rule;

#define ACCELKIT_DETAIL_CONFORMANCE_CASE_(group, check, rule)                                    \
  TEST_CASE("conformance/" #group "/" #check, "[conformance][" #group "]") {                     \
    using kit_ = ::accelkit::testing::Conformance<accelkit_conformance_runtime_>;                 \
    accelkit_conformance_setup_();                                                                \
    kit_::instance().run(#group, #check, rule,                                                    \
                         &::accelkit::testing::Checks<accelkit_conformance_runtime_>::check);    \
  }

// The whole suite for runtime R, made by R's default constructor.
#define ACCELKIT_CONFORMANCE_SUITE(R)                                 \
  namespace {                                                         \
  using accelkit_conformance_runtime_ = R;                            \
  void accelkit_conformance_setup_() {}                               \
  }                                                                   \
  ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_CASE_)

// The whole suite for runtime R, made from the constructor arguments that
// follow (evaluated once per runtime the kit makes).
#define ACCELKIT_CONFORMANCE_SUITE_WITH(R, ...)                                                \
  namespace {                                                                                  \
  using accelkit_conformance_runtime_ = R;                                                     \
  void accelkit_conformance_setup_() {                                                         \
    using kit_ = ::accelkit::testing::Conformance<R>;                                          \
    static bool done = [] {                                                                    \
      kit_::instance().set_factory([] {                                                        \
        return std::make_unique<kit_::SdkBackend>(::accelkit::Environment::process(),          \
                                                  __VA_ARGS__);                                \
      });                                                                                      \
      return true;                                                                             \
    }();                                                                                       \
    (void)done;                                                                                \
  }                                                                                            \
  }                                                                                            \
  ACCELKIT_CONFORMANCE_CHECKS(ACCELKIT_DETAIL_CONFORMANCE_CASE_)
