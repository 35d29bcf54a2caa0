// simdev's copy engine: how the simulated device moves bytes. Device memory
// is host memory here, so every copy (host<->device, device<->device) is a
// copy between two host addresses; this file decides in which order.
//
// Note [Copy direction and 4K aliasing]
// A forward copy loads from src + i while its recent stores to dst + i - k
// are still in flight. Cores match a load against older stores by the low
// 12 bits of the address first (Intel documents it as 4K aliasing): when dst
// lies a little past src modulo 4 KiB (dst - src = N * 4096 + d, with
// 0 < d < 2 KiB), the loads ahead meet the stores just issued at the same
// page offsets and wait for them. A device-to-host copy into pageable memory
// has exactly that shape: device memory is page-aligned, and a CPU tensor's
// data begins 64 bytes into its page (glibc's posix_memalign(64) of a large
// block), so d = 64. Pinned memory is page-aligned (d = 0), and
// host-to-device copies have d = 4096 - 64: neither is affected.
//
// glibc's memcpy knows the case: below its non-temporal threshold it copies
// backward when d is under 256 bytes, but above it (large copies, whose
// non-temporal stores stay in the store queue longest) it keeps copying
// forward, four pages side by side instead of two, which Intel cores
// tolerate (there it is the fastest of the three shapes). On an AMD EPYC
// machine (issue 14) a 256 MiB device-to-host copy into pageable memory ran
// at 3.5 GB/s, 0.47x of the CPU's own copy, and into pinned memory at
// 11.1 GB/s: one memcpy each (on the calling thread, or on the stream's
// worker for pinned memory), differing in d.
//
// So copies that glibc would store around the caches (from a quarter of
// the last-level cache on, its default since 2.38) with 0 < d <
// kAliasWindow are the engine's, which copies from the end to the start: a
// load then reads a page offset that the copy stored 4096 - d > 2 KiB of
// copying earlier, no longer in flight. Like glibc's large loop it walks
// four pages side by side with non-temporal stores, in 16- or 32-byte
// vectors (SSE2, or AVX2 where the CPU has it). Everything else -- smaller
// copies (where glibc's temporal stores leave the store queue quickly, and
// it copies backward itself when d is under 256 bytes), d = 0, dst behind
// src, overlapping ranges, other architectures -- is the C library's
// memmove (glibc's memcpy is the same routine).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include <unistd.h>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define SIMDEV_COPY_ENGINE_X86 1
#else
#define SIMDEV_COPY_ENGINE_X86 0
#endif

namespace simdev {

inline constexpr std::size_t kCopyPage = 4096;
// dst - src modulo a page, below which a forward copy's loads meet its own
// stores (Note [Copy direction and 4K aliasing]).
inline constexpr std::size_t kAliasWindow = 2048;

// The size from which the engine takes copies: a quarter of the last-level
// cache (32 MiB of it assumed when not known), at least 4 MiB.
inline std::size_t engine_threshold() {
  static const std::size_t threshold = [] {
    long llc = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
    llc = ::sysconf(_SC_LEVEL3_CACHE_SIZE);
#endif
    std::size_t cache = llc > 0 ? static_cast<std::size_t>(llc) : std::size_t{32} << 20;
    return std::max(std::size_t{4} << 20, cache / 4);
  }();
  return threshold;
}

// Whether a copy of `bytes` from src to dst is the engine's, from the end
// to the start (Note [Copy direction and 4K aliasing]).
inline bool copies_backward(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes,
                            std::size_t from = engine_threshold()) {
  bool apart = dst >= src + bytes || src >= dst + bytes;
  std::size_t d = (dst - src) & (kCopyPage - 1);
  return SIMDEV_COPY_ENGINE_X86 && apart && bytes >= from && d != 0 && d < kAliasWindow;
}

namespace detail {

#if SIMDEV_COPY_ENGINE_X86
inline constexpr std::size_t kLine = 64;
inline constexpr std::size_t kGroupPages = 4;  // pages copied side by side
inline constexpr std::size_t kGroup = kGroupPages * kCopyPage;

inline __m128i load16(const char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void stream16(char* p, __m128i v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); }

// One 64-byte line, loaded whole before it is stored; d is 64-byte aligned.
inline void copy_line(char* d, const char* s) {
  __m128i v0 = load16(s + 48), v1 = load16(s + 32), v2 = load16(s + 16), v3 = load16(s);
  stream16(d + 48, v0), stream16(d + 32, v1), stream16(d + 16, v2), stream16(d, v3);
}

// One group: kGroupPages pages side by side, each from its end to its start
// (several pages at once keep several of the prefetchers' streams, which
// stop at page boundaries, going); at each offset the lines of all the pages
// are loaded before any is stored. d is 64-byte aligned.
inline void copy_group_sse2(char* d, const char* s) {
  for (std::size_t o = kCopyPage; o != 0;) {
    o -= kLine;
    __m128i v[kGroupPages][4];
    for (std::size_t p = 0; p < kGroupPages; ++p)
      for (std::size_t k = 0; k < 4; ++k) v[p][k] = load16(s + p * kCopyPage + o + 48 - 16 * k);
    for (std::size_t p = 0; p < kGroupPages; ++p)
      for (std::size_t k = 0; k < 4; ++k) stream16(d + p * kCopyPage + o + 48 - 16 * k, v[p][k]);
  }
}

#if defined(__GNUC__)  // GCC and Clang: the same with AVX2, where the CPU has it
__attribute__((target("avx2"))) inline void copy_group_avx2(char* d, const char* s) {
  constexpr std::size_t kStep = 2 * kLine;
  for (std::size_t o = kCopyPage; o != 0;) {
    o -= kStep;
    __m256i v[kGroupPages][4];
    for (std::size_t p = 0; p < kGroupPages; ++p)
      for (std::size_t k = 0; k < 4; ++k)
        v[p][k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + p * kCopyPage + o + 96 - 32 * k));
    for (std::size_t p = 0; p < kGroupPages; ++p)
      for (std::size_t k = 0; k < 4; ++k)
        _mm256_stream_si256(reinterpret_cast<__m256i*>(d + p * kCopyPage + o + 96 - 32 * k), v[p][k]);
  }
}
inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#endif

// Copies [src, src + n) to [dst, dst + n) from the end to the start, with
// non-temporal stores: the bytes after dst's last 64-byte boundary, then
// groups of pages, then lines, then the bytes before dst's first boundary.
// The ranges must not overlap. `group` copies one group (tests choose it).
using GroupCopy = void (*)(char*, const char*);
inline void copy_backward(char* dst, const char* src, std::size_t n, GroupCopy group = nullptr) {
  if (group == nullptr) {
    group = copy_group_sse2;
#if defined(__GNUC__)
    if (has_avx2()) group = copy_group_avx2;
#endif
  }
  char* d = dst + n;
  const char* s = src + n;
  std::size_t tail = std::min(n, static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(d) & (kLine - 1)));
  d -= tail, s -= tail, n -= tail;
  std::memcpy(d, s, tail);
  for (; n >= kGroup; n -= kGroup) {
    d -= kGroup, s -= kGroup;
    group(d, s);
  }
  for (; n >= kLine; n -= kLine) {
    d -= kLine, s -= kLine;
    copy_line(d, s);
  }
  _mm_sfence();              // the stores ordered before whatever signals completion
  std::memcpy(dst, src, n);  // under a line, at the start
}
#endif

}  // namespace detail

// The engine: every simdev copy goes through here.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
#if SIMDEV_COPY_ENGINE_X86
  if (copies_backward(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes)) {
    detail::copy_backward(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
    return;
  }
#endif
  if (bytes != 0) std::memmove(dst, src, bytes);
}

}  // namespace simdev
