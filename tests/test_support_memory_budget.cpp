// support/memory_budget.hpp: reservations against a budget, given back
// unless kept, never past it from many threads.
#include "catch.hpp"

#include <accelkit/support/memory_budget.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

using accelkit::support::MemoryBudget;

TEST_CASE("support: a memory budget refuses past its total and gives back what is not kept") {
  MemoryBudget b{1000};
  {
    auto r = b.reserve(600);
    REQUIRE(r);
    r.keep();
  }
  CHECK(b.used() == 600);
  CHECK(b.info().free == 400);
  CHECK(b.info().total == 1000);
  CHECK_FALSE(b.reserve(401));
  CHECK(b.used() == 600);                    // a refusal reserves nothing
  CHECK_FALSE(b.reserve(UINT64_MAX));        // no overflow
  {
    auto r = b.reserve(400);                 // exactly the rest
    CHECK(r);
    CHECK(b.info().free == 0);
  }                                          // not kept: given back
  CHECK(b.used() == 600);
  b.release(600);
  CHECK(b.info().free == 1000);
  b.set_total(10);
  CHECK_FALSE(b.reserve(11));
  CHECK(b.reserve(10));
}

TEST_CASE("support: threads reserving at once never take a memory budget past its total") {
  MemoryBudget b{100};
  std::atomic<int> kept{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        if (auto r = b.reserve(7)) {
          CHECK(b.used() <= 100);
          r.keep();
          ++kept;
        }
    });
  for (auto& t : threads) t.join();
  CHECK(kept == 100 / 7);
  CHECK(b.used() == static_cast<std::uint64_t>(kept) * 7);
}
