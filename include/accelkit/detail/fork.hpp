// accelkit: detecting use of a backend in a child created by fork().
//
// Note [Fork safety]
// A device context does not survive fork(): driver threads are gone and
// mapped device memory is shared or invalid, so the first driver call in the
// child typically hangs. Like torch.cuda, a backend that was initialized in
// the parent refuses device use in the child with a clear error, while
// device_count(), answered from what discovery cached, keeps working. The
// check is one relaxed atomic load: a pthread_atfork child handler bumps a
// process-wide generation, and each backend remembers the generation at which
// it initialized.
#pragma once

#include <accelkit/config.hpp>

#include <atomic>

#include <pthread.h>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

inline std::atomic<unsigned>& fork_generation() noexcept {
  static std::atomic<unsigned> generation{0};
  return generation;
}

inline void install_fork_handler() noexcept {
  static const bool installed = [] {
    ::pthread_atfork(nullptr, nullptr,
                     [] { fork_generation().fetch_add(1, std::memory_order_relaxed); });
    return true;
  }();
  (void)installed;
}

}  // namespace detail
ACCELKIT_END_NAMESPACE
