// accelkit: the compact bookkeeping of small blocks in the caching allocator.
//
// Note [Small arena]
// Requests of up to 1 MiB share 2 MiB segments (Note [Segment sizes]). With
// many of them live, the allocator was bound by cache misses: a 64-byte
// record per block plus a pointer-map slot per live block made 15 MiB of
// heap at 100,000 live blocks, far more than the cache a core gets, and
// each operation read several of those lines at random (measured: 2.6-3.5x
// slower per operation at 100,000 live blocks than at 1,000).
// Small blocks therefore have no records. Each small segment keeps its
// blocks as a sorted array of 64-bit descriptors (offset and size in 512 B
// granules, state, and either the bin position or the requested bytes), a
// few hundred bytes for a typical segment, and a block's neighbours are the
// adjacent descriptors. Free blocks sit in exact-size bins (one per 512 B
// step, with a two-level bitmap, as before) that hold 8-byte (segment,
// offset) entries, not links through the blocks. A pointer is found through
// its segment (a small map of 2 MiB address windows, in the allocator), then
// a binary search of that segment's descriptors. At 100,000 live blocks the
// allocator's heap is 2.6 MiB, and an operation costs 1.5-1.8x what it does
// at 1,000 (memory_bench).
// Everything here runs under the lock of the pool that owns the segment.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/config.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// A small block's descriptor: offset (12 bits) and size (13 bits) in
// granules, state (2 bits), used-on-other-streams flag, and a 36-bit
// payload: the block's position in its bin while it is binned, its
// requested bytes otherwise.
namespace small_block {
using Desc = std::uint64_t;
inline constexpr std::size_t kGranule = memory_constants::kMinBlockSize;
inline constexpr std::size_t kGranules = memory_constants::kSmallBuffer / kGranule;
static_assert(kGranules == 4096, "12 offset bits, 13 size bits");
enum State : unsigned { allocated = 0, binned = 1, parked = 2, pending = 3 };

inline std::uint32_t offset(Desc d) noexcept { return static_cast<std::uint32_t>(d & 0xfff); }
inline std::uint32_t granules(Desc d) noexcept { return static_cast<std::uint32_t>((d >> 12) & 0x1fff); }
inline std::size_t bytes(Desc d) noexcept { return granules(d) * kGranule; }
inline State state(Desc d) noexcept { return static_cast<State>((d >> 25) & 3); }
inline bool has_uses(Desc d) noexcept { return (d >> 27) & 1; }
inline std::uint64_t payload(Desc d) noexcept { return d >> 28; }
inline Desc make(std::uint32_t off, std::uint32_t gran, State s, bool uses,
                 std::uint64_t payload) noexcept {
  return Desc{off} | Desc{gran} << 12 | Desc{s} << 25 | Desc{uses ? 1u : 0u} << 27 | payload << 28;
}
inline Desc with_state(Desc d, State s) noexcept { return (d & ~(Desc{3} << 25)) | Desc{s} << 25; }
inline Desc with_uses(Desc d, bool u) noexcept {
  return (d & ~(Desc{1} << 27)) | Desc{u ? 1u : 0u} << 27;
}
inline Desc with_payload(Desc d, std::uint64_t p) noexcept {
  return (d & ((Desc{1} << 28) - 1)) | p << 28;
}
}  // namespace small_block

// Whole cache lines for arrays that one pool writes on every operation:
// arrays of two pools (two threads) sharing a line would make each write
// wait for the other core.
template <class T>
struct LineAllocator {
  using value_type = T;
  static constexpr std::size_t kLine = 64;
  LineAllocator() noexcept = default;
  template <class U>
  LineAllocator(const LineAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    return static_cast<T*>(::operator new(bytes(n), std::align_val_t{kLine}));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    ::operator delete(p, bytes(n), std::align_val_t{kLine});
  }
  static std::size_t bytes(std::size_t n) noexcept {
    return (n * sizeof(T) + kLine - 1) / kLine * kLine;
  }
  template <class U>
  friend bool operator==(const LineAllocator&, const LineAllocator<U>&) noexcept {
    return true;
  }
  template <class U>
  friend bool operator!=(const LineAllocator&, const LineAllocator<U>&) noexcept {
    return false;
  }
};

struct alignas(64) SmallSegment {
  char* ptr = nullptr;
  std::uint64_t id = 0;         // index in its arena's segment table
  std::uint64_t free_tick = 0;  // when it last became wholly free
  std::vector<small_block::Desc, LineAllocator<small_block::Desc>> blocks;  // by offset; they tile it

  std::size_t size() const noexcept { return memory_constants::kSmallBuffer; }
  bool contains(const void* p) const noexcept {
    return p >= ptr && p < ptr + memory_constants::kSmallBuffer;
  }
  // The index of the block that starts at `p`, or blocks.size(). A
  // branch-free binary search: the probes of a random lookup would mispredict
  // about half the time.
  ACCELKIT_ALWAYS_INLINE std::size_t index_of(const void* p) const noexcept {
    std::size_t diff = static_cast<std::size_t>(static_cast<const char*>(p) - ptr);
    std::size_t n = blocks.size();
    if (diff % small_block::kGranule || n == 0) return n;
    auto off = static_cast<std::uint32_t>(diff / small_block::kGranule);
    const small_block::Desc* base = blocks.data();
    // With many live blocks the array is rarely in cache, and each probe
    // depends on the last: fetch its lines at once (up to 1 KiB) instead.
    const char* bytes = reinterpret_cast<const char*>(base);
    std::size_t span = std::min<std::size_t>(n * sizeof(small_block::Desc), 1024);
    for (std::size_t k = 0; k < span; k += 64) ACCELKIT_PREFETCH(bytes + k);
    while (n > 1) {
      std::size_t half = n / 2;
      base = small_block::offset(base[half]) <= off ? base + half : base;
      n -= half;
    }
    std::size_t i = static_cast<std::size_t>(base - blocks.data());
    return small_block::offset(*base) == off ? i : blocks.size();
  }
  // The same, trying first index `hint` (where the block was when last
  // seen: blocks shift only when their segment splits or merges one before
  // them).
  ACCELKIT_ALWAYS_INLINE std::size_t index_of(const void* p, std::size_t hint) const noexcept {
    std::size_t n = blocks.size();
    std::size_t diff = static_cast<std::size_t>(static_cast<const char*>(p) - ptr);
    if (hint >= n || diff % small_block::kGranule) return index_of(p);
    auto off = static_cast<std::uint32_t>(diff / small_block::kGranule);
    // A few steps from the hint, in the direction it is off by.
    std::uint32_t o = small_block::offset(blocks[hint]);
    if (o == off) return hint;
    if (o < off) {
      for (std::size_t j = hint + 1; j < n && j <= hint + 4; ++j) {
        o = small_block::offset(blocks[j]);
        if (o >= off) return o == off ? j : n;
      }
    } else {
      for (std::size_t j = hint; j-- > 0 && j + 4 >= hint;) {
        o = small_block::offset(blocks[j]);
        if (o <= off) return o == off ? j : n;
      }
    }
    return index_of(p);
  }
  char* address(std::size_t i) const noexcept {
    return ptr + small_block::offset(blocks[i]) * small_block::kGranule;
  }
  bool wholly_free() const noexcept {
    return blocks.size() == 1 && small_block::state(blocks[0]) == small_block::binned;
  }
};

// The small segments of one pool and its free small blocks (Note [Small
// arena]).
class SmallArena {
 public:
  using Desc = small_block::Desc;

  SmallArena() = default;
  SmallArena(const SmallArena&) = delete;
  SmallArena& operator=(const SmallArena&) = delete;

  // A new segment at `ptr`, one block spanning it in state parked (neither
  // binned nor allocated): the caller carves it.
  SmallSegment* add_segment(char* ptr) {
    if (!bins_) bins_ = std::make_unique<Bins>();
    auto seg = std::make_unique<SmallSegment>();
    seg->ptr = ptr;
    seg->blocks.reserve(16);
    seg->blocks.push_back(small_block::make(0, small_block::kGranules, small_block::parked, false, 0));
    free_ids_.reserve(segments_.size() + 1);  // so that remove_segment cannot throw
    if (free_ids_.empty()) {
      segments_.push_back(nullptr);
      seg->id = segments_.size() - 1;
    } else {
      seg->id = free_ids_.back();
      free_ids_.pop_back();
    }
    segments_[seg->id] = seg.get();
    ++count_;
    return seg.release();
  }
  // Removes a segment whose one block is in no bin, and deletes it.
  void discard_segment(SmallSegment* seg) noexcept {
    segments_[seg->id] = nullptr;
    free_ids_.push_back(seg->id);
    --count_;
    delete seg;
  }
  // Removes a wholly free segment and deletes it.
  void remove_segment(SmallSegment* seg) noexcept {
    unbin(*seg, 0);
    discard_segment(seg);
  }
  ~SmallArena() {
    for (SmallSegment* s : segments_) delete s;
  }

  // The segment with table index `id`, or nullptr.
  SmallSegment* segment(std::uint64_t id) const noexcept {
    return id < segments_.size() ? segments_[id] : nullptr;
  }
  // Calls f(SmallSegment&) on every segment.
  template <class F>
  void for_each_segment(F&& f) const {
    for (SmallSegment* s : segments_)
      if (s) f(*s);
  }
  std::size_t segment_count() const noexcept { return count_; }

  // Room for one more block of `gran` granules in its bin, so that the bin()
  // that follows cannot throw.
  void reserve_bin(std::size_t gran) {
    auto& v = (*bins_)[gran - 1];
    if (v.size() == v.capacity()) v.reserve(std::max<std::size_t>(8, 2 * v.size()));
  }
  // Puts block `i` of `seg` into its bin.
  void bin(SmallSegment& seg, std::size_t i) {
    Desc& d = seg.blocks[i];
    std::size_t c = small_block::granules(d) - 1;
    auto& v = (*bins_)[c];
    v.push_back(entry(seg, i, small_block::offset(d)));  // may throw: nothing changed yet
    d = small_block::with_payload(small_block::with_state(d, small_block::binned), v.size() - 1);
    words_[c >> 6] |= std::uint64_t{1} << (c & 63);
    summary_ |= std::uint64_t{1} << (c >> 6);
  }
  // Takes binned block `i` of `seg` out of its bin; its state becomes
  // parked and its payload 0.
  void unbin(SmallSegment& seg, std::size_t i) noexcept {
    Desc& d = seg.blocks[i];
    std::size_t c = small_block::granules(d) - 1;
    auto& v = (*bins_)[c];
    auto pos = static_cast<std::size_t>(small_block::payload(d));
    std::uint64_t last = v.back();
    v.pop_back();
    if (pos != v.size()) {  // the last entry fills the hole
      v[pos] = last;
      SmallSegment& other = *segments_[last >> 24];
      std::size_t j = other.index_of(other.ptr + (last & 0xfff) * small_block::kGranule,
                                     (last >> 12) & 0xfff);
      other.blocks[j] = small_block::with_payload(other.blocks[j], pos);
    }
    if (v.empty()) {
      words_[c >> 6] &= ~(std::uint64_t{1} << (c & 63));
      if (!words_[c >> 6]) summary_ &= ~(std::uint64_t{1} << (c >> 6));
    }
    d = small_block::with_payload(small_block::with_state(d, small_block::parked), 0);
  }

  // The binned block of the smallest size of at least `gran` granules (the
  // most recently binned of that size), or false.
  bool best_fit(std::size_t gran, SmallSegment*& seg, std::size_t& i) const noexcept {
    std::size_t c = gran - 1;
    std::size_t w = c >> 6;
    std::uint64_t bits = words_[w] & (~std::uint64_t{0} << (c & 63));
    if (!bits) {
      if (w == 63) return false;
      std::uint64_t rest = summary_ & (~std::uint64_t{0} << (w + 1));
      if (!rest) return false;
      w = static_cast<std::size_t>(__builtin_ctzll(rest));
      bits = words_[w];
    }
    std::size_t bin = (w << 6) + static_cast<std::size_t>(__builtin_ctzll(bits));
    std::uint64_t e = (*bins_)[bin].back();
    seg = segments_[e >> 24];
    i = seg->index_of(seg->ptr + (e & 0xfff) * small_block::kGranule, (e >> 12) & 0xfff);
    return true;
  }

 private:
  // A bin entry: segment id, the block's index when binned (a hint, see
  // index_of), its offset.
  static std::uint64_t entry(const SmallSegment& seg, std::size_t i, std::uint32_t off) noexcept {
    return seg.id << 24 | (i & 0xfff) << 12 | off;
  }

  // 96 KiB, made with the first segment: a pool (a stream) that only ever
  // holds large blocks does without.
  using Bins = std::array<std::vector<std::uint64_t, LineAllocator<std::uint64_t>>, small_block::kGranules>;
  std::unique_ptr<Bins> bins_;
  std::array<std::uint64_t, 64> words_{};
  std::uint64_t summary_ = 0;
  std::vector<SmallSegment*> segments_;  // by id; nullptr where removed
  std::vector<std::uint64_t> free_ids_;
  std::size_t count_ = 0;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
