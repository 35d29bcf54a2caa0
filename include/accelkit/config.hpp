// accelkit: version and namespace macros shared by every header.
#pragma once

#define ACCELKIT_VERSION_MAJOR 0
#define ACCELKIT_VERSION_MINOR 1
#define ACCELKIT_VERSION_PATCH 0
#define ACCELKIT_VERSION \
  (ACCELKIT_VERSION_MAJOR * 10000 + ACCELKIT_VERSION_MINOR * 100 + ACCELKIT_VERSION_PATCH)

// Note [Versioned inline namespace]
// accelkit is header-only and made of templates, so its types are compiled
// into every vendor binary. Two vendor plugins built against different SDK
// versions and loaded into one Python process must not merge incompatible
// definitions of, say, accelkit::Backend<R>. Everything lives in an inline
// namespace named after the ABI version: code spells `accelkit::X`, the
// linker sees `accelkit::v0::X`. Limits: the guard is only as good as its
// upkeep: ACCELKIT_ABI_NAMESPACE must be bumped on any change to a type's
// layout or to the Runtime contract.
#ifndef ACCELKIT_ABI_NAMESPACE
#define ACCELKIT_ABI_NAMESPACE v0
#endif

#define ACCELKIT_BEGIN_NAMESPACE \
  namespace accelkit {           \
  inline namespace ACCELKIT_ABI_NAMESPACE {
#define ACCELKIT_END_NAMESPACE \
  }                            \
  }

#if defined(__cpp_concepts) && __cpp_concepts >= 201907L && __has_include(<concepts>)
#define ACCELKIT_HAS_CONCEPTS 1
#else
#define ACCELKIT_HAS_CONCEPTS 0
#endif

// For the few tiny helpers on the allocation hot path that GCC declines to
// inline on its own.
#if defined(__GNUC__)
#define ACCELKIT_ALWAYS_INLINE inline __attribute__((always_inline))
#define ACCELKIT_NOINLINE __attribute__((noinline))
#else
#define ACCELKIT_ALWAYS_INLINE inline
#define ACCELKIT_NOINLINE
#endif

// A hint to start loading the cache line at `p` (never faults).
#if defined(__GNUC__)
#define ACCELKIT_PREFETCH(p) __builtin_prefetch(p)
#else
#define ACCELKIT_PREFETCH(p) ((void)(p))
#endif

ACCELKIT_BEGIN_NAMESPACE
struct version_info {
  int major, minor, patch;
};
inline constexpr version_info version{ACCELKIT_VERSION_MAJOR, ACCELKIT_VERSION_MINOR,
                                      ACCELKIT_VERSION_PATCH};
ACCELKIT_END_NAMESPACE
