// The pointer map read without a lock (Note [Reading the pointer map without
// a lock]): readers racing writers that insert, erase and grow.
#include "catch.hpp"

#include <accelkit/detail/pointer_map.hpp>

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

using accelkit::detail::PointerMap;

namespace {
// A value whose two words must belong together: a torn read shows.
struct Pair {
  std::uint64_t a = 0;
  std::uint64_t b = 0;
};
const void* key_of(std::uint64_t i) { return reinterpret_cast<const void*>((i + 1) << 9); }
}  // namespace

TEST_CASE("pointer map: find without a lock sees whole values while writers grow and shift") {
  // Few shards, so that writers and readers meet in each.
  static PointerMap<Pair, 2> map;
  constexpr std::uint64_t kStable = 512, kChurn = 4096;
  for (std::uint64_t i = 0; i < kStable; ++i) map.insert(key_of(i), {i, ~i});
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> wrong{0}, missing{0}, reads{0};
  // The writer starts only once both readers are reading, so that they race
  // it even where the scheduler runs the writer's rounds before the readers
  // get a core (two cores under load).
  std::atomic<int> reading{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t)
    readers.emplace_back([&, t] {
      std::uint64_t n = 0;
      for (std::uint64_t i = static_cast<std::uint64_t>(t); !stop.load(std::memory_order_relaxed); ++i) {
        if (n == 1) ++reading;
        std::uint64_t k = i % kStable;
        Pair v = map.find(key_of(k));
        if (v.a == 0 && v.b == 0) ++missing;
        else if (v.a != k || v.b != ~k) ++wrong;
        // A churning key is absent or whole.
        std::uint64_t c = kStable + i % kChurn;
        Pair w = map.find(key_of(c));
        if ((w.a != 0 || w.b != 0) && (w.a != c || w.b != ~c)) ++wrong;
        ++n;
      }
      reads += n;
    });
  while (reading.load() < 2) std::this_thread::yield();
  // Insert and erase churning keys around the stable ones, so that erases
  // shift stable entries and inserts grow the tables.
  for (int round = 0; round < 20; ++round) {
    for (std::uint64_t i = kStable; i < kStable + kChurn; ++i) map.insert(key_of(i), {i, ~i});
    for (std::uint64_t i = kStable; i < kStable + kChurn; ++i) {
      Pair v = map.erase(key_of(i));
      if (v.a != i || v.b != ~i) ++wrong;
    }
  }
  stop = true;
  for (std::thread& t : readers) t.join();
  CHECK(reads.load() >= 2);
  CHECK(wrong.load() == 0);
  CHECK(missing.load() == 0);
  CHECK(map.size() == kStable);
  CHECK(map.find(key_of(kStable)).a == 0);  // erased
  // update and modify keep the lock-free view whole too.
  CHECK(map.update(key_of(3), [](Pair& p) { p.b = 42; }));
  CHECK(map.find(key_of(3)).b == 42);
  map.modify(key_of(3), [](Pair&) { return false; });  // erases
  CHECK(map.find(key_of(3)).a == 0);
  CHECK(map.size() == kStable - 1);
}
