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
//
// Discovery must not create a context, but a driver may still start threads
// at its first device query (PoCL does). A runtime whose discovery does so
// declares `fork_safe_discovery = false`, and its backend then remembers the
// generation at discovery too: a child forked after discovery is refused
// device use as one forked after initialization is, while device_count()
// still answers from the cache. Otherwise (the default, as CUDA's device
// count through NVML) a child of a process that only counted devices may
// initialize its own context. Limits: as with CUDA, a child forked after
// initialization cannot use the device at all; worker processes that need it
// are spawned, not forked.
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
