// support/map_count.hpp: the first map maps, the last unmap unmaps, and the
// maps between share the address, from many threads.
#include "catch.hpp"

#include <accelkit/support/map_count.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

using accelkit::support::MapCount;

TEST_CASE("support: a map count maps at the first map and unmaps at the last unmap") {
  MapCount m;
  int storage = 0, maps = 0, unmaps = 0;
  auto map = [&] {
    ++maps;
    return static_cast<void*>(&storage);
  };
  auto unmap = [&](void* p) {
    CHECK(p == &storage);
    ++unmaps;
  };
  CHECK_FALSE(m.unmap(unmap));  // nothing mapped
  CHECK(m.map(map) == &storage);
  CHECK(m.map(map) == &storage);
  CHECK(maps == 1);
  CHECK(m.mapped());
  CHECK(m.unmap(unmap));
  CHECK(unmaps == 0);
  CHECK(m.unmap(unmap));
  CHECK(unmaps == 1);
  CHECK_FALSE(m.mapped());
  CHECK_FALSE(m.unmap(unmap));
  CHECK_THROWS_AS(m.map([]() -> void* { throw std::runtime_error("map failed"); }), std::runtime_error);
  CHECK_FALSE(m.mapped());  // a failed map counts nothing
  CHECK(m.map(map) == &storage);
  CHECK(maps == 2);
}

TEST_CASE("support: threads mapping and unmapping one allocation map it once per mapped period") {
  MapCount m;
  int storage = 0;
  std::atomic<int> live{0}, bad{0}, maps{0}, unmaps{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 6; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 300; ++i) {
        void* p = m.map([&] {
          if (live.exchange(1) != 0) ++bad;  // mapped twice at once
          ++maps;
          return static_cast<void*>(&storage);
        });
        if (p != &storage) ++bad;
        if (!m.unmap([&](void*) {
              live = 0;
              ++unmaps;
            }))
          ++bad;
      }
    });
  for (auto& t : threads) t.join();
  CHECK(bad == 0);
  CHECK(maps == unmaps);
  CHECK_FALSE(m.mapped());
}
