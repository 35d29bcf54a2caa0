// accelkit: small blocks parked by size in a device pool.
//
// Note [Parked small blocks]
// In a training loop most small requests come back at a size just freed;
// merging each freed block into the bins and splitting it again for the next
// request pays for a merge, a split and descriptor moves every time.
// So a small block freed on its stream is parked (Note [Recently freed
// blocks]) in a stack for its size, unmerged, up to kDepth blocks a size, and
// a request of exactly that size takes the most recently parked one back:
// neither the free nor the allocation splits, merges or moves a descriptor.
// A request that finds none of its size takes the smallest block that fits,
// parked or binned, and splits it; but a parked block at most a sixteenth
// larger (kWholeReuse in the allocator; below 16 granules, 8 KiB, only the
// exact size) is taken whole where no binned block fits better. A block is
// parked only while the parked blocks hold at most half of the pool's free
// small memory, that block's included; beyond that a free merges at once, as
// CUDA's allocator does, and the merged half keeps room for larger requests.
// The parked blocks merge into the bins when a request finds no block that
// fits, before the pool grows, and before memory goes back to the driver
// (unpark_all), so a pool grows only when its free memory, merged, has no
// room either.
// Limits: placement. A block taken whole holds up to a sixteenth more than
// its rounded request, and parked blocks stay unmerged until needed, so peak
// reserved memory runs a few percent above what merging every free needs.
// Evidence: bench/memory_bench.cpp, random sizes up to 64 KiB (docs/design/memory.md).
// Everything here runs under the lock of the pool that owns the blocks.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/detail/size_bitmap.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

struct SmallSegment;

class SmallParking {
 public:
  static constexpr std::size_t kDepth = 4;
  static constexpr std::size_t kGranule = memory_constants::kMinBlockSize;
  static constexpr std::size_t kSizes = memory_constants::kSmallSize / kGranule;
  static_assert(kSizes % 64 == 0, "whole words of the size bitmap");

  // A parked block: its segment, its address, and its index among the
  // segment's descriptors when parked (a hint: SmallSegment::index_of).
  struct Entry {
    SmallSegment* seg;
    char* ptr;
    std::size_t hint;
  };

  // The stacks (192 KiB), made with a pool's first small segment. May
  // throw bad_alloc.
  void reserve() {
    if (!entries_) entries_ = std::make_unique<Entry[]>(kSizes * kDepth);
  }
  // Whether a block of `gran` granules may be parked while the parked
  // blocks may hold `room` bytes in all.
  ACCELKIT_ALWAYS_INLINE bool may_park(std::size_t gran, std::size_t room) const noexcept {
    return entries_ && depth_[gran - 1] < kDepth && bytes_ + gran * kGranule <= room;
  }
  // Parks a block of `gran` granules (after may_park).
  ACCELKIT_ALWAYS_INLINE void park(std::size_t gran, const Entry& e) noexcept {
    std::size_t c = gran - 1;
    entries_[c * kDepth + depth_[c]++] = e;
    sizes_.set(c);
    bytes_ += gran * kGranule;
  }
  ACCELKIT_ALWAYS_INLINE bool has(std::size_t gran) const noexcept { return depth_[gran - 1] != 0; }
  // The most recently parked block of `gran` granules (after has).
  const Entry& top(std::size_t gran) const noexcept {
    std::size_t c = gran - 1;
    return entries_[c * kDepth + depth_[c] - 1];
  }
  // Takes the most recently parked block of `gran` granules (after has).
  // The entry stays readable until the next park() of its size. (Not a
  // copy: the hit path takes back the entry its free has just written, and
  // its fields are read as they were written, eight bytes each, so that the
  // loads can take their data from stores still in the core's store buffer;
  // a copy may use wider loads, which cannot.)
  ACCELKIT_ALWAYS_INLINE const Entry& take(std::size_t gran) noexcept {
    std::size_t c = gran - 1;
    const Entry& e = entries_[c * kDepth + --depth_[c]];
    sizes_.clear_if(c, depth_[c] == 0);
    bytes_ -= gran * kGranule;
    return e;
  }
  // The smallest size of at least `gran` granules with a parked block, in
  // granules, or 0.
  ACCELKIT_ALWAYS_INLINE std::size_t best_fit(std::size_t gran) const noexcept {
    std::size_t c = sizes_.first_from(gran - 1);
    return c == Sizes::kNone ? 0 : c + 1;
  }
  // Whether any block is parked.
  bool any() const noexcept { return sizes_.any(); }

 private:
  using Sizes = SizeBitmap<kSizes / 64>;
  std::unique_ptr<Entry[]> entries_;  // kDepth a size, by size
  std::array<std::uint8_t, kSizes> depth_{};
  Sizes sizes_;  // the sizes with a parked block
  // Only the bytes (whether any block is parked, the size bitmap says):
  // Clang -O3 updated a count kept beside them together with them, with one
  // 16-byte load and store.
  std::size_t bytes_ = 0;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
