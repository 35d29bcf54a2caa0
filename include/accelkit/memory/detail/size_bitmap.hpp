// accelkit: a two-level bitmap of the sizes that have free blocks, for best
// fit in constant time (the small arena's bins, the parked small blocks).
#pragma once

#include <accelkit/config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Bit c of word c / 64 says that size class c is not empty; bit w of the
// summary that word w is not zero.
template <std::size_t Words>
class SizeBitmap {
  static_assert(Words >= 1 && Words <= 64, "the summary is one 64-bit word");

 public:
  static constexpr std::size_t kNone = Words * 64;

  ACCELKIT_ALWAYS_INLINE void set(std::size_t c) noexcept {
    words_[c >> 6] |= std::uint64_t{1} << (c & 63);
    summary_ |= std::uint64_t{1} << (c >> 6);
  }
  // Clears class c where `empty`, without a branch: whether a class has
  // just emptied is as good as random when sizes vary.
  ACCELKIT_ALWAYS_INLINE void clear_if(std::size_t c, bool empty) noexcept {
    std::uint64_t& word = words_[c >> 6];
    word &= ~(std::uint64_t{empty} << (c & 63));
    summary_ &= ~(std::uint64_t{word == 0} << (c >> 6));
  }
  bool any() const noexcept { return summary_ != 0; }
  // The lowest non-empty class at or above c, or kNone.
  ACCELKIT_ALWAYS_INLINE std::size_t first_from(std::size_t c) const noexcept {
    std::size_t w = c >> 6;
    std::uint64_t bits = words_[w] & (~std::uint64_t{0} << (c & 63));
    if (!bits) {
      if (w + 1 == Words) return kNone;
      std::uint64_t rest = summary_ & (~std::uint64_t{0} << (w + 1));
      if (!rest) return kNone;
      w = static_cast<std::size_t>(__builtin_ctzll(rest));
      bits = words_[w];
    }
    return (w << 6) + static_cast<std::size_t>(__builtin_ctzll(bits));
  }

 private:
  std::array<std::uint64_t, Words> words_{};
  std::uint64_t summary_ = 0;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
