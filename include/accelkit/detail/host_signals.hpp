// accelkit: the SDK's own host signals, for a runtime without the host
// signal members (Note [Host signals] in device/backend.hpp): a stream's
// wait on one is the calling thread's wait. The bookkeeping is the one
// vendor runtimes use (support/host_signals.hpp), with ValueErrors, as no
// driver is involved.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/support/host_signals.hpp>
#include <accelkit/types.hpp>

#include <string_view>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

class HostSignals {
 public:
  explicit HostSignals(std::string_view backend) : table_(backend) {}

  SignalHandle create() { return table_.create(0); }
  // Blocks until the signal is completed; returns its error (0: success).
  int wait(SignalHandle signal) {
    auto g = table_.get(signal, "stream_wait_signal");
    return g->add_waiter() ? g->wait() : 0;
  }
  void complete(SignalHandle signal, int error) { table_.complete(signal, 0, error); }
  // Refused for a signal not completed that a thread waits for, as a
  // runtime's own signals are.
  void destroy(SignalHandle signal) { table_.destroy(signal, 0); }

 private:
  support::HostSignalTable<> table_;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
