// accelkit: a small spinlock for critical sections of a few dozen nanoseconds.
#pragma once

#include <accelkit/config.hpp>

#include <atomic>
#include <thread>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Note [Spinlocks on the allocation path]
// The allocator's critical sections (a bin lookup, a few pointer updates) are
// shorter than a std::mutex lock/unlock pair, so the hot path uses a
// test-and-test-and-set spinlock. A waiter spins briefly, then yields, so a
// holder that was preempted (or that is calling the driver on a cache miss)
// does not burn the other core. Limits: no fairness (a waiter may be
// overtaken), and a waiter behind a long hold keeps yielding rather than
// sleeping; sections that may block for long use std::mutex.
class SpinLock {
 public:
  // The uncontended case inline, the wait out of line.
  ACCELKIT_ALWAYS_INLINE void lock() noexcept {
    if (!locked_.exchange(true, std::memory_order_acquire)) return;
    wait();
  }
  bool try_lock() noexcept { return !locked_.exchange(true, std::memory_order_acquire); }
  ACCELKIT_ALWAYS_INLINE void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  ACCELKIT_NOINLINE void wait() noexcept {
    int spins = 0;
    do {
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 128)
          cpu_relax();
        else
          std::this_thread::yield();
      }
    } while (locked_.exchange(true, std::memory_order_acquire));
  }

  std::atomic<bool> locked_{false};
};

// Holds a SpinLock from construction until unlock() or destruction; it can be
// moved from (not assigned) and locked again (std::unique_lock's use on the
// allocation path).
// Written out rather than std::lock_guard/std::unique_lock over SpinLock:
// GCC 12 at -O3 (CMake's Release) called their constructor and unlock() out
// of line from the allocator, whose members here are always inlined.
// Evidence: the hit path's instruction counts, bench/alloc_counts.py.
class SpinGuard {
 public:
  SpinGuard() noexcept = default;
  ACCELKIT_ALWAYS_INLINE explicit SpinGuard(SpinLock& l) noexcept : lock_(&l), owns_(true) {
    l.lock();
  }
  ACCELKIT_ALWAYS_INLINE SpinGuard(SpinGuard&& o) noexcept : lock_(o.lock_), owns_(o.owns_) {
    o.owns_ = false;
  }
  SpinGuard(const SpinGuard&) = delete;
  SpinGuard& operator=(const SpinGuard&) = delete;
  ACCELKIT_ALWAYS_INLINE ~SpinGuard() {
    if (owns_) lock_->unlock();
  }
  ACCELKIT_ALWAYS_INLINE void unlock() noexcept {
    lock_->unlock();
    owns_ = false;
  }
  ACCELKIT_ALWAYS_INLINE void lock() noexcept {
    lock_->lock();
    owns_ = true;
  }

 private:
  SpinLock* lock_ = nullptr;
  bool owns_ = false;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
