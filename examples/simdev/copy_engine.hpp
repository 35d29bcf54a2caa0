// simdev's copy engine: how the simulated device moves bytes. Device memory
// is host memory here, so every copy (host<->device, device<->device) is a
// copy between two host addresses; this file decides in which order.
//
// Note [Copy direction and 4K aliasing]
// Problem: a forward copy loads from src + i while its recent stores to
// dst + i - k are still in flight, and cores match a load against older
// stores by the low 12 bits of the address first (Intel calls it 4K
// aliasing). When dst lies a little past src modulo 4 KiB (dst - src =
// N * 4096 + d, 0 < d < 2 KiB), the loads meet the stores just issued at the
// same page offsets and wait for them. A device-to-host copy into pageable
// memory has exactly that shape: device memory is page-aligned, and a CPU
// tensor's data begins 64 bytes into its page (glibc's posix_memalign(64) of
// a large block), so d = 64. glibc's memcpy copies backward for small d only
// below its non-temporal threshold; above it, it copies forward, and an AMD
// EPYC then runs at about a third of the speed of the same copy with d = 0.
// Pinned memory (d = 0) and host-to-device copies (d = 4096 - 64) are not
// affected.
// Decision: copies from the engine's threshold on (a quarter of the
// last-level cache, where glibc turns to non-temporal stores) with
// 0 < d < kAliasWindow are the engine's. Where the CPU has AVX2 and d < kLag
// (the device-to-host copy's d = 64 among them), it copies in one forward
// pass with its loads a block of kLag bytes ahead of its stores, both in
// registers, so the newest stores a load is matched against end short of it.
// Otherwise it copies forward in stages of kStage bytes through a per-thread
// buffer that stays in the first-level cache, placed kAliasWindow past dst
// modulo a page: loads from src meet only the buffer's stores, and loads
// from the buffer meet only dst's; each stage stores to dst with
// non-temporal stores while the next part of src is prefetched. Everything
// else (smaller copies, d = 0, dst behind src, overlapping ranges, other
// architectures) is the C library's memmove.
// Limits: tuned on x86-64 (SSE2, or AVX2 where the CPU has it); the staged
// path passes every byte through the first-level cache twice, so it stays
// a little below a copy with d = 0.
// Evidence: bench/copy_bench.cpp (d = 64 through glibc and the engine, against d = 0).
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

// dst - src modulo a page below which the engine copies in one pipelined
// pass, where the CPU has AVX2 (Note [Copy direction and 4K aliasing]).
inline constexpr std::size_t kLag = 256;

// How the engine copies: the C library's memmove, staged through its
// buffer, or in one pass with its loads kLag bytes ahead of its stores.
enum class CopyPath { library, staged, pipelined };

namespace detail {
#if SIMDEV_COPY_ENGINE_X86 && defined(__GNUC__)
inline bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}
#else
inline bool has_avx2() { return false; }
#endif
}  // namespace detail

// How a copy of `bytes` from src to dst goes (Note [Copy direction and 4K
// aliasing]); `avx2` says whether the CPU has it.
inline CopyPath copy_path(std::uintptr_t dst, std::uintptr_t src, std::size_t bytes,
                          std::size_t from = engine_threshold(), bool avx2 = detail::has_avx2()) {
  bool apart = dst >= src + bytes || src >= dst + bytes;
  std::size_t d = (dst - src) & (kCopyPage - 1);
  if (!SIMDEV_COPY_ENGINE_X86 || !apart || bytes < from || d == 0 || d >= kAliasWindow)
    return CopyPath::library;
  return avx2 && d < kLag ? CopyPath::pipelined : CopyPath::staged;
}

namespace detail {

#if SIMDEV_COPY_ENGINE_X86
inline constexpr std::size_t kLine = 64;
inline constexpr std::size_t kStage = 2048;  // bytes per stage

// One stage: kStage bytes from s into the buffer b (ordinary stores: the
// buffer stays in the first-level cache), then from b to d (non-temporal
// stores) while `next`, the following stage's source, is prefetched. d and b
// are 64-byte aligned.
using StageCopy = void (*)(char* d, const char* s, char* b, const char* next);

inline __m128i load16(const char* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline void store16(char* p, __m128i v) { _mm_store_si128(reinterpret_cast<__m128i*>(p), v); }
inline void stream16(char* p, __m128i v) { _mm_stream_si128(reinterpret_cast<__m128i*>(p), v); }

// (Named vectors, not arrays: GCC keeps an array of vectors in a function
// with its own target attribute on the stack, and the copy ran 20% slower.)
inline void stage_sse2(char* d, const char* s, char* b, const char* next) {
  for (std::size_t o = 0; o < kStage; o += kLine) {
    __m128i v0 = load16(s + o), v1 = load16(s + o + 16), v2 = load16(s + o + 32),
            v3 = load16(s + o + 48);
    store16(b + o, v0), store16(b + o + 16, v1), store16(b + o + 32, v2), store16(b + o + 48, v3);
  }
  for (std::size_t o = 0; o < kStage; o += kLine) {
    _mm_prefetch(next + o, _MM_HINT_T0);
    __m128i v0 = load16(b + o), v1 = load16(b + o + 16), v2 = load16(b + o + 32),
            v3 = load16(b + o + 48);
    stream16(d + o, v0), stream16(d + o + 16, v1), stream16(d + o + 32, v2), stream16(d + o + 48, v3);
  }
}

#if defined(__GNUC__)  // GCC and Clang: the same with AVX2, where the CPU has it
__attribute__((target("avx2"))) inline void stage_avx2(char* d, const char* s, char* b,
                                                      const char* next) {
  for (std::size_t o = 0; o < kStage; o += 2 * kLine) {
    __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o));
    __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o + 32));
    __m256i v2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o + 64));
    __m256i v3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + o + 96));
    _mm256_store_si256(reinterpret_cast<__m256i*>(b + o), v0);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b + o + 32), v1);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b + o + 64), v2);
    _mm256_store_si256(reinterpret_cast<__m256i*>(b + o + 96), v3);
  }
  for (std::size_t o = 0; o < kStage; o += 2 * kLine) {
    _mm_prefetch(next + o, _MM_HINT_T0);
    _mm_prefetch(next + o + kLine, _MM_HINT_T0);
    __m256i v0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + o));
    __m256i v1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + o + 32));
    __m256i v2 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + o + 64));
    __m256i v3 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + o + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o), v0);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o + 32), v1);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o + 64), v2);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + o + 96), v3);
  }
}

// One pass (Note [Copy direction and 4K aliasing]): blocks of kLag bytes,
// each loaded into eight registers before the block before it is stored
// from the other eight, with non-temporal stores. d is 64-byte aligned; n is
// a multiple of kLag, at least two blocks.
__attribute__((target("avx2"))) inline __m256i load32(const char* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
__attribute__((target("avx2"))) inline void stream32(char* p, __m256i v) {
  _mm256_stream_si256(reinterpret_cast<__m256i*>(p), v);
}
__attribute__((target("avx2"))) inline void blocks_pipelined(char* d, const char* s,
                                                             std::size_t n) {
  __m256i a0 = load32(s), a1 = load32(s + 32), a2 = load32(s + 64), a3 = load32(s + 96),
          a4 = load32(s + 128), a5 = load32(s + 160), a6 = load32(s + 192), a7 = load32(s + 224);
  std::size_t o = 0;
  for (; o + 2 * kLag <= n; o += kLag) {
    const char* p = s + o + kLag;
    __m256i b0 = load32(p), b1 = load32(p + 32), b2 = load32(p + 64), b3 = load32(p + 96),
            b4 = load32(p + 128), b5 = load32(p + 160), b6 = load32(p + 192), b7 = load32(p + 224);
    char* q = d + o;
    stream32(q, a0), stream32(q + 32, a1), stream32(q + 64, a2), stream32(q + 96, a3);
    stream32(q + 128, a4), stream32(q + 160, a5), stream32(q + 192, a6), stream32(q + 224, a7);
    a0 = b0, a1 = b1, a2 = b2, a3 = b3, a4 = b4, a5 = b5, a6 = b6, a7 = b7;
  }
  char* q = d + o;
  stream32(q, a0), stream32(q + 32, a1), stream32(q + 64, a2), stream32(q + 96, a3);
  stream32(q + 128, a4), stream32(q + 160, a5), stream32(q + 192, a6), stream32(q + 224, a7);
}
#endif

// Copies the bytes before dst's first 64-byte boundary (all n if fewer) and
// advances the three past them: the head of both engine copies.
inline void copy_to_line(char*& dst, const char*& src, std::size_t& n) {
  std::size_t head = std::min(n, (kLine - (reinterpret_cast<std::uintptr_t>(dst) & (kLine - 1))) & (kLine - 1));
  std::memcpy(dst, src, head);
  dst += head, src += head, n -= head;
}

// Copies [src, src + n) to [dst, dst + n) forward in one pass, loads kLag
// bytes ahead of stores (Note [Copy direction and 4K aliasing]): the bytes
// before dst's first 64-byte boundary, then whole blocks, then the rest. The
// ranges must not overlap; the CPU must have AVX2.
inline void copy_pipelined(char* dst, const char* src, std::size_t n) {
  copy_to_line(dst, src, n);
#if defined(__GNUC__)
  if (n >= 2 * kLag) {
    std::size_t body = n / kLag * kLag;
    blocks_pipelined(dst, src, body);
    _mm_sfence();  // the stores ordered before whatever signals completion
    dst += body, src += body, n -= body;
  }
#endif
  std::memcpy(dst, src, n);
}

// Copies [src, src + n) to [dst, dst + n) forward through the calling
// thread's buffer (Note [Copy direction and 4K aliasing]): the bytes before
// dst's first 64-byte boundary, then stages, then the rest. The ranges must
// not overlap. `stage` copies one stage (tests choose it).
inline void copy_staged(char* dst, const char* src, std::size_t n, StageCopy stage = nullptr) {
  if (stage == nullptr) {
    stage = stage_sse2;
#if defined(__GNUC__)
    if (has_avx2()) stage = stage_avx2;
#endif
  }
  copy_to_line(dst, src, n);
  if (n >= kStage) {
    // A page and a stage: the stage starts anywhere in the first page.
    alignas(kCopyPage) static thread_local char buffer[kCopyPage + kStage];
    char* b = buffer + ((reinterpret_cast<std::uintptr_t>(dst) + kAliasWindow) & (kCopyPage - 1));
    for (; n >= kStage; n -= kStage, dst += kStage, src += kStage)
      stage(dst, src, b, n >= 2 * kStage ? src + kStage : src);  // the last prefetches itself
    _mm_sfence();  // the stores ordered before whatever signals completion
  }
  std::memcpy(dst, src, n);
}
#endif

}  // namespace detail

// The engine: every simdev copy goes through here.
inline void copy_bytes(void* dst, const void* src, std::size_t bytes) {
#if SIMDEV_COPY_ENGINE_X86
  switch (copy_path(reinterpret_cast<std::uintptr_t>(dst), reinterpret_cast<std::uintptr_t>(src), bytes)) {
    case CopyPath::pipelined:
      detail::copy_pipelined(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
      return;
    case CopyPath::staged:
      detail::copy_staged(static_cast<char*>(dst), static_cast<const char*>(src), bytes);
      return;
    case CopyPath::library:
      break;
  }
#endif
  if (bytes != 0) std::memmove(dst, src, bytes);
}

}  // namespace simdev
