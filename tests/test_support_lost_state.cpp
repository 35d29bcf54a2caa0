// support/lost_state.hpp: a device's first failure, kept once and read by
// every later call, from many threads.
#include "catch.hpp"

#include <accelkit/support/lost_state.hpp>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

TEST_CASE("support: a lost state keeps the first failure and answers it ever after") {
  accelkit::support::LostState s;
  CHECK_FALSE(s.lost());
  CHECK_FALSE(s.first().has_value());
  CHECK(s.lose("vkQueueSubmit failed in memcpy") == "vkQueueSubmit failed in memcpy");
  CHECK(s.lost());
  CHECK(s.lose("a later failure") == "vkQueueSubmit failed in memcpy");
  REQUIRE(s.first().has_value());
  CHECK(*s.first() == "vkQueueSubmit failed in memcpy");
}

TEST_CASE("support: threads losing a device at once all see the same first failure") {
  accelkit::support::LostState s;
  std::vector<std::string> kept(8);
  std::atomic<int> seen_lost_without_first{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i)
        if (s.lost() && !s.first()) ++seen_lost_without_first;
      kept[static_cast<std::size_t>(t)] = s.lose("failure " + std::to_string(t));
    });
  for (auto& t : threads) t.join();
  for (auto& k : kept) CHECK(k == kept[0]);
  CHECK(*s.first() == kept[0]);
  CHECK(seen_lost_without_first == 0);
}
