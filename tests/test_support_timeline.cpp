// support/timeline.hpp on its own, over a fake driver whose counter the test
// raises: submissions signal 1, 2, ...; batches come back once passed; waits
// and kept objects live until then; a marked failure is reported once.
#include "catch.hpp"

#include <accelkit/support/timeline.hpp>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace {
struct Stream : accelkit::support::Timeline<Stream, int> {};
struct Submitted {
  int batch;  // -1: none
  std::size_t waits;
  std::uint64_t signal;
};
Submitted submit(Stream& s) {
  Submitted out{-2, 0, 0};
  s.submit([&](const int* b, const auto& waits, std::uint64_t signal) {
    out = {b ? *b : -1, waits.size(), signal};
  });
  return out;
}
}  // namespace

TEST_CASE("support: a timeline batches records, signals 1, 2, ... and hands a batch out again "
          "only once the counter passed its submission") {
  Stream s;
  int made = 0;
  auto make = [&] { return ++made; };
  std::lock_guard<std::mutex> lock(s.mutex);
  CHECK(s.submit([](auto...) { FAIL("nothing to submit"); }) == 0);
  auto [b1, fresh1] = s.open(0, make);
  CHECK((b1 == 1 && fresh1));
  CHECK(s.recorded() == 1);
  auto [again, fresh] = s.open(0, make);  // still open: the same batch
  CHECK((again == 1 && !fresh && s.recorded() == 2));
  Submitted x = submit(s);
  CHECK((x.batch == 1 && x.signal == 1 && s.submitted() == 1));
  CHECK(s.open(0, make).first == 2);  // batch 1 not passed yet: a new one
  CHECK(submit(s).signal == 2);
  int spare = s.open(2, make).first;  // both passed: a spare, nothing made
  CHECK(((spare == 1 || spare == 2) && made == 2));
}

TEST_CASE("support: a timeline's waits and kept objects ride the next submission and live until "
          "the counter passes it") {
  Stream s;
  auto other = std::make_shared<Stream>();
  auto kept = std::make_shared<int>(7);
  std::weak_ptr<int> watch = kept;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.wait_for(other, 5);
  s.keep(std::move(kept));
  Submitted x = submit(s);  // no batch: the waits alone are submitted
  CHECK((x.batch == -1 && x.waits == 1 && x.signal == 1));
  CHECK(!watch.expired());
  s.open(1, [] { return 9; });  // the counter passed 1: the flight goes
  CHECK(watch.expired());
  CHECK(other.use_count() == 1);
}

TEST_CASE("support: a timeline drops what a failed submission held and stays usable") {
  Stream s;
  std::lock_guard<std::mutex> lock(s.mutex);
  s.open(0, [] { return 4; });
  CHECK_THROWS_AS(s.submit([](auto...) { throw std::runtime_error("refused"); }),
                  std::runtime_error);
  CHECK(s.submitted() == 0);
  auto [b, fresh] = s.open(0, [] { return 5; });
  CHECK((b == 4 && fresh));  // the batch came back
  CHECK(submit(s).signal == 1);
}

TEST_CASE("support: a timeline reports a failure marked on queued work once, when the counter "
          "reaches its submission") {
  Stream s;
  std::lock_guard<std::mutex> lock(s.mutex);
  // Nothing ever queued: an empty submission stands for the failed work.
  s.mark_failed("memset_async");
  CHECK(submit(s).signal == 1);
  CHECK_FALSE(s.failed_by(0));
  CHECK(s.failed_by(1) == std::string("memset_async"));
  CHECK_FALSE(s.failed_by(1));
  // Work in the open batch fails with its submission.
  s.open(1, [] { return 1; });
  s.mark_failed("memcpy_async");
  s.mark_failed("event_record");  // one failure at a time
  CHECK(submit(s).signal == 2);
  CHECK_FALSE(s.failed_by(1));
  CHECK(s.failed_by(2) == std::string("memcpy_async"));
  // Nothing pending: the last submission stands for it.
  s.mark_failed("stream_wait_event");
  CHECK(s.submit([](auto...) { FAIL("nothing to submit"); }) == 2);
  CHECK(s.failed_by(2) == std::string("stream_wait_event"));
}
