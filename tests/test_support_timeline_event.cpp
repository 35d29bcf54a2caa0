// support/timeline.hpp's TimelineEvent: the (stream, value) of the last
// record, read whole while other threads record.
#include "catch.hpp"

#include <accelkit/support/timeline.hpp>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace {
struct Stream : accelkit::support::Timeline<Stream, int> {
  std::uint64_t id = 0;
};
}  // namespace

TEST_CASE("support: a timeline event answers the stream and value of its last record") {
  accelkit::support::TimelineEvent<Stream> e;
  CHECK(e.last().first == nullptr);  // never recorded
  auto a = std::make_shared<Stream>();
  auto b = std::make_shared<Stream>();
  e.record(a, 3);
  CHECK(e.last() == std::pair{a, std::uint64_t{3}});
  e.record(b, 1);
  CHECK(e.last() == std::pair{b, std::uint64_t{1}});
}

TEST_CASE("support: a timeline event read while threads record is always one record's pair") {
  accelkit::support::TimelineEvent<Stream> e;
  std::vector<std::shared_ptr<Stream>> streams;
  for (std::uint64_t i = 1; i <= 4; ++i) {
    streams.push_back(std::make_shared<Stream>());
    streams.back()->id = i;
  }
  std::vector<std::thread> threads;
  for (std::size_t t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (std::uint64_t i = 0; i < 500; ++i) e.record(streams[t], streams[t]->id * 1000 + i);
    });
  bool torn = false;
  for (int i = 0; i < 2000; ++i) {
    auto [s, v] = e.last();
    if (s && v / 1000 != s->id) torn = true;
  }
  for (auto& t : threads) t.join();
  CHECK_FALSE(torn);
}
