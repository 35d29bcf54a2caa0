// accelkit/support: the bookkeeping of a stream over a driver's timeline, a
// counter the device raises as it completes submissions (Vulkan's timeline
// semaphores, D3D12's fences, Metal's shared events).
//
//   struct Stream : Timeline<Stream, VkCommandBuffer> { VkSemaphore semaphore; };
//   std::lock_guard<std::mutex> lock(s.mutex);
//   auto [cb, fresh] = s.open(counter_value(s), [&] { return allocate_command_buffer(); });
//   if (fresh) begin(cb); else barrier(cb);
//   record(cb);
//   if (s.recorded() >= 32) s.submit([&](const VkCommandBuffer* cb, const auto& waits,
//                                        std::uint64_t signal) { queue_submit(...); });
//
// Note [Timeline streams]
// Problem: a driver whose queue completes submissions by raising a counter
// has no stream object; a submission costs more than recording a command,
// and the SDK's streams, events, cross-stream waits and the buffers that
// queued copies read must all be kept in step with that counter.
// Decision: a stream is a timeline: its k-th submission signals value k and
// waits for value k - 1 (so its submissions run in order) and for the
// (timeline, value) pairs queued by wait_for since the last one. Records go
// into one open batch (a command buffer) until submit; an event is (the
// timeline, submitted()) after a submit. Each submission keeps what it
// waited for and what keep() was given alive until the counter passes its
// value, and its batch then returns to the spares that open() hands out
// again. mark_failed() records that the work just queued fails (a test
// hook's injected failure); failed_by(value) reports it, once, to the first
// caller that sees the counter reach it.
// Limits: not thread-safe by itself: every member but the constructor is
// called under `mutex`. Work recorded and not submitted does not run.
//
// An event over timelines is TimelineEvent<Stream>: the (stream, value) its
// last record captured (the value the stream's submit() returned after the
// record); it has completed once that stream's counter reaches the value,
// and a stream waits for it with wait_for(stream, value). Thread-safe.
#pragma once

#include <accelkit/config.hpp>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

template <class Self, class Batch>
class Timeline {
 public:
  struct Wait {
    std::shared_ptr<Self> on;
    std::uint64_t value;
  };

  std::mutex mutex;  // every member below is called under it

  // The batch to record into and whether it was just opened: the open one,
  // else a spare whose submission the counter (`done`) passed, else make()'s.
  template <class Make>
  std::pair<Batch, bool> open(std::uint64_t done, Make&& make) {
    if (open_) return {*open_, false};
    while (!flights_.empty() && flights_.front().value <= done) {
      if (flights_.front().batch) spare_.push_back(*flights_.front().batch);
      flights_.pop_front();
    }
    if (!spare_.empty()) {
      open_ = spare_.back();
      spare_.pop_back();
    } else {
      open_ = make();
    }
    return {*open_, true};
  }
  // Counts a record into the open batch; returns how many it holds.
  int recorded() { return ++records_; }
  // The next submission waits for `on` to reach `value`.
  void wait_for(std::shared_ptr<Self> on, std::uint64_t value) {
    waits_.push_back({std::move(on), value});
  }
  // Kept alive until the next submission has completed (a staging buffer).
  void keep(std::shared_ptr<void> p) { keep_.push_back(std::move(p)); }

  // The value the last submission signals (0: none yet).
  std::uint64_t submitted() const { return submitted_; }

  // Submits the open batch and the pending waits, if there are any:
  // f(const Batch* batch or nullptr, const std::vector<Wait>& waits,
  // std::uint64_t signal) makes the driver's submission, which also waits
  // for submitted() on this timeline. Returns submitted(). If f throws, what
  // was pending is dropped (the batch goes back to the spares) and the
  // stream stays usable.
  template <class F>
  std::uint64_t submit(F&& f) {
    if (!open_ && waits_.empty() && keep_.empty() && !force_) return submitted_;
    Flight flight{submitted_ + 1, std::move(open_), std::move(waits_), std::move(keep_)};
    open_.reset();
    waits_.clear();
    keep_.clear();
    records_ = 0;
    force_ = false;
    try {
      f(flight.batch ? &*flight.batch : nullptr, flight.waits, flight.value);
    } catch (...) {
      if (flight.batch) spare_.push_back(*flight.batch);
      throw;
    }
    submitted_ = flight.value;
    flights_.push_back(std::move(flight));
    return submitted_;
  }

  // The work just queued (in the open batch, else the last submission)
  // fails; with nothing queued ever, an empty submission stands for it.
  void mark_failed(std::string_view call) {
    if (failed_at_) return;
    bool pending = open_ || !waits_.empty();
    force_ = !pending && submitted_ == 0;
    failed_at_ = pending || force_ ? submitted_ + 1 : submitted_;
    failed_call_ = call;
  }
  // The call whose work failed at or before `value` (which the counter has
  // reached), once; nothing otherwise.
  std::optional<std::string> failed_by(std::uint64_t value) {
    if (!failed_at_ || failed_at_ > value) return std::nullopt;
    failed_at_ = 0;
    return std::move(failed_call_);
  }

 private:
  struct Flight {
    std::uint64_t value;
    std::optional<Batch> batch;
    std::vector<Wait> waits;
    std::vector<std::shared_ptr<void>> keep;
  };
  std::optional<Batch> open_;
  int records_ = 0;
  std::uint64_t submitted_ = 0;
  std::vector<Wait> waits_;
  std::vector<std::shared_ptr<void>> keep_;
  std::deque<Flight> flights_;
  std::vector<Batch> spare_;
  std::uint64_t failed_at_ = 0;
  std::string failed_call_;
  bool force_ = false;
};

template <class Stream>
class TimelineEvent {
 public:
  void record(std::shared_ptr<Stream> stream, std::uint64_t value) {
    std::lock_guard<std::mutex> lock(mutex_);
    stream_ = std::move(stream);
    value_ = value;
  }
  // The last record's stream and value; a null stream: never recorded.
  std::pair<std::shared_ptr<Stream>, std::uint64_t> last() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {stream_, value_};
  }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Stream> stream_;
  std::uint64_t value_ = 0;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
