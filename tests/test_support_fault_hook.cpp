// support/fault_hook.hpp on its own: the nth call fires once, at the call or
// in queued work; the variable's list; its errors; and calls from threads.
#include "catch.hpp"

#include <accelkit/support/fault_hook.hpp>

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using accelkit::ValueError;
using accelkit::support::FaultHook;
using accelkit::support::FaultTiming;

TEST_CASE("support: a fault hook fires on the nth call of the armed member from the arming, "
          "once") {
  FaultHook hook{"acme", "ACME_INJECT_FAULT", {"memset_async"}};
  CHECK_FALSE(hook.fire("memset_async"));  // nothing armed
  hook.fire("malloc");
  hook.arm("malloc", 3, false);
  hook.arm("memset_async", 1, true);
  CHECK_FALSE(hook.fire("malloc"));
  CHECK_FALSE(hook.fire("malloc"));
  CHECK(hook.fire("malloc") == FaultTiming::at_call);
  CHECK_FALSE(hook.fire("malloc"));  // once
  CHECK(hook.fire("memset_async") == FaultTiming::in_queued_work);
  CHECK_FALSE(hook.fire("memset_async"));
  hook.arm("free", 1, false);
  hook.clear();
  CHECK_FALSE(hook.fire("free"));
}

TEST_CASE("support: a fault hook arms a variable's list member[@n][:async], and refuses a "
          "malformed one whole, naming the variable and the entry") {
  FaultHook hook{"acme", "ACME_INJECT_FAULT", {"memcpy_async"}};
  hook.arm_from(std::nullopt);
  hook.arm_from(std::string("memcpy_async@2:async, free"));
  CHECK(hook.fire("free") == FaultTiming::at_call);
  CHECK_FALSE(hook.fire("memcpy_async"));
  CHECK(hook.fire("memcpy_async") == FaultTiming::in_queued_work);
  for (const char* bad : {"free@0", "free@x", "free:later", "@2", "Free", "free,malloc@"}) {
    CAPTURE(bad);
    try {
      hook.arm_from(std::string(bad));
      FAIL("accepted");
    } catch (const ValueError& e) {
      std::string what = e.what();
      CHECK(what.find("ACME_INJECT_FAULT") != std::string::npos);
      CHECK(what.find("acme") != std::string::npos);
    }
  }
  CHECK_FALSE(hook.fire("free"));  // "free,malloc@" armed nothing
  // A member that queues no work cannot fail asynchronously.
  CHECK_THROWS_AS(hook.arm("free", 1, true), ValueError);
  CHECK_THROWS_AS(hook.arm_from(std::string("free:async")), ValueError);
  CHECK_THROWS_AS(hook.arm("free", 0, false), ValueError);
}

TEST_CASE("support: a fault hook fires exactly once among calls from several threads") {
  FaultHook hook{"acme", "ACME_INJECT_FAULT", {}};
  hook.arm("memcpy", 500, false);
  std::atomic<int> fired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 250; ++i)
        if (hook.fire("memcpy")) ++fired;
    });
  for (auto& t : threads) t.join();
  CHECK(fired == 1);
}
