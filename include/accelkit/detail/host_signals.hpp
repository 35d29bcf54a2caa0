// accelkit: the SDK's own host signals, for a runtime without the host
// signal members (Note [Host signals] in device/backend.hpp): a stream's
// wait on one is the calling thread's wait.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

class HostSignals {
 public:
  explicit HostSignals(std::string_view backend) : backend_(backend) {}

  SignalHandle create() {
    std::lock_guard<std::mutex> lock(mutex_);
    SignalHandle h{++last_};
    signals_.emplace(h.value, std::make_shared<State>());
    return h;
  }

  // Blocks until the signal is completed; returns its error (0: success).
  int wait(SignalHandle signal) {
    std::shared_ptr<State> s = find(signal, "stream_wait_signal");
    std::unique_lock<std::mutex> lock(s->mutex);
    ++s->waiters;
    s->cv.wait(lock, [&] { return s->done; });
    --s->waiters;
    return s->error;
  }

  void complete(SignalHandle signal, int error) {
    std::shared_ptr<State> s = find(signal, "signal_complete");
    std::lock_guard<std::mutex> lock(s->mutex);
    if (s->done)
      throw ValueError(backend_, fmt::format("signal_complete: signal {:#x} was completed "
                                             "already",
                                             signal.value));
    s->done = true;
    s->error = error;
    s->cv.notify_all();
  }

  // Refused for a signal not completed that a thread waits for, as a
  // runtime's own signals are.
  void destroy(SignalHandle signal) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = signals_.find(signal.value);
    if (it == signals_.end()) throw unknown(signal, "signal_destroy");
    {
      std::lock_guard<std::mutex> state_lock(it->second->mutex);
      if (!it->second->done && it->second->waiters > 0)
        throw ValueError(backend_, fmt::format("signal_destroy: signal {:#x} is not completed "
                                               "and {} thread(s) wait for it",
                                               signal.value, it->second->waiters));
    }
    signals_.erase(it);
  }

 private:
  struct State {
    std::mutex mutex;
    std::condition_variable cv;
    bool done = false;
    int error = 0;
    int waiters = 0;
  };

  std::shared_ptr<State> find(SignalHandle signal, const char* call) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = signals_.find(signal.value);
    if (it == signals_.end()) throw unknown(signal, call);
    return it->second;
  }
  ValueError unknown(SignalHandle signal, const char* call) const {
    return ValueError(backend_, fmt::format("{}: signal {:#x} is not a live signal", call,
                                            signal.value));
  }

  std::string_view backend_;
  std::mutex mutex_;
  std::uintptr_t last_ = 0;
  std::unordered_map<std::uintptr_t, std::shared_ptr<State>> signals_;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
