// accelkit: ACCELKIT_ASSERT, the SDK's checks of its own invariants.
//
// Note [Invariant checks]
// ACCELKIT_ASSERT(condition, invariant) states an invariant of the SDK's
// own structures (blocks tile their segment, statistics never go below
// zero, a pool holds no event it did not create). The checks are on in
// debug builds (NDEBUG not defined) and wherever ACCELKIT_ENABLE_ASSERTS is
// defined (the core tests and their sanitizer builds), and compiled out
// otherwise. A broken invariant is a bug in accelkit, not a user's error: it
// throws std::logic_error naming the invariant, the condition and the place
// (PyTorch shows it as a RuntimeError) instead of going on with corrupt
// state. So that the throw is not a crash, the checks are placed where an
// exception may leave (never in a noexcept function). Limits: compiled out
// of release builds, where a broken invariant goes unnoticed until it does
// harm; the core tests and sanitizer builds are where they catch bugs.
#pragma once

#include <accelkit/config.hpp>

#include <fmt/format.h>

#include <stdexcept>

#if defined(ACCELKIT_ENABLE_ASSERTS) || !defined(NDEBUG)
#define ACCELKIT_ASSERTS_ON 1
#define ACCELKIT_ASSERT(condition, invariant)                                                   \
  ((condition) ? void()                                                                        \
               : ::accelkit::detail::invariant_broken(invariant, #condition, __FILE__, __LINE__))
#else
#define ACCELKIT_ASSERTS_ON 0
#define ACCELKIT_ASSERT(condition, invariant) static_cast<void>(0)
#endif

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

[[noreturn]] inline void invariant_broken(const char* invariant, const char* condition,
                                          const char* file, int line) {
  throw std::logic_error(fmt::format("accelkit: internal invariant broken: {} ({}, at {}:{}); "
                                     "this is a bug in accelkit, please report it",
                                     invariant, condition, file, line));
}

}  // namespace detail
ACCELKIT_END_NAMESPACE
