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
// that segment's chunk index (Note [Chunk index]). At 100,000 live blocks the
// allocator's heap is 2.6 MiB, and an operation costs 1.4-1.5x what it does
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

// Note [Chunk index]
// A small segment's 4096 granules fall into 32 chunks of 128 (64 KiB), and
// the segment counts, per chunk, the blocks that start before it. The block
// that starts at a given offset is then among the few that start in its
// chunk: an address is found with two loads and a short scan (a binary
// search within the chunk when it holds more than eight), where a binary
// search of all the descriptors took about 100 instructions at 60 blocks per
// segment, and fetched up to 16 of their lines at once. The 32 counts of
// 16 bits fill one cache line. A split or a merge adds or subtracts one in
// the counts after the block, four to a 64-bit word; the descriptors move
// then anyway.
struct alignas(64) SmallSegment {
  static constexpr std::size_t kChunkGranules = 128;
  static constexpr std::size_t kChunks = small_block::kGranules / kChunkGranules;
  static_assert(kChunks % 4 == 0 && small_block::kGranules <= 0xffff,
                "counts of 16 bits, four to a word");

  char* ptr = nullptr;
  std::uint64_t id = 0;         // index in its arena's segment table
  std::uint64_t free_tick = 0;  // when it last became wholly free
  // By offset; they tile the segment. Read freely; their number changes only
  // through insert_block and erase_block, which keep the chunk index.
  std::vector<small_block::Desc, LineAllocator<small_block::Desc>> blocks;
  // The blocks that start before each chunk (Note [Chunk index]), four
  // 16-bit counts to a word.
  std::array<std::uint64_t, kChunks / 4> before{};

  std::size_t blocks_before(std::size_t chunk) const noexcept {
    return static_cast<std::size_t>((before[chunk / 4] >> (chunk % 4 * 16)) & 0xffff);
  }

  std::size_t size() const noexcept { return memory_constants::kSmallBuffer; }
  bool contains(const void* p) const noexcept {
    return p >= ptr && p < ptr + memory_constants::kSmallBuffer;
  }
  // Inserts descriptor `d` at index `i` (its place by offset). May throw
  // bad_alloc: nothing changed then.
  void insert_block(std::size_t i, small_block::Desc d) {
    blocks.insert(blocks.begin() + static_cast<std::ptrdiff_t>(i), d);
    count_from(small_block::offset(d), 1);
  }
  // Removes the descriptor at index `i`.
  void erase_block(std::size_t i) noexcept {
    std::uint32_t off = small_block::offset(blocks[i]);
    blocks.erase(blocks.begin() + static_cast<std::ptrdiff_t>(i));
    count_from(off, -1);
  }
  // Replaces the descriptor at index `i` with `d`, which may start elsewhere
  // between its neighbours.
  void move_block(std::size_t i, small_block::Desc d) noexcept {
    count_from(small_block::offset(blocks[i]), -1);
    count_from(small_block::offset(d), 1);
    blocks[i] = d;
  }
  // The index of the block that starts at `p`, or blocks.size().
  ACCELKIT_ALWAYS_INLINE std::size_t index_of(const void* p) const noexcept {
    std::size_t diff = static_cast<std::size_t>(static_cast<const char*>(p) - ptr);
    std::size_t n = blocks.size();
    if (diff % small_block::kGranule || diff >= memory_constants::kSmallBuffer) return n;
    auto off = static_cast<std::uint32_t>(diff / small_block::kGranule);
    std::size_t k = off / kChunkGranules;
    std::size_t lo = blocks_before(k);
    std::size_t hi = k + 1 < kChunks ? blocks_before(k + 1) : n;
    const small_block::Desc* d = blocks.data();
    if (hi - lo > 8) {  // a chunk of many tiny blocks
      while (hi - lo > 1) {
        std::size_t mid = lo + (hi - lo) / 2;
        (small_block::offset(d[mid]) <= off ? lo : hi) = mid;
      }
      hi = lo + 1;
    }
    for (; lo < hi; ++lo) {
      std::uint32_t o = small_block::offset(d[lo]);
      if (o >= off) return o == off ? lo : n;
    }
    return n;
  }
  // The same, trying first index `hint` (where the block was when last
  // seen: blocks shift only when their segment splits or merges one before
  // them).
  ACCELKIT_ALWAYS_INLINE std::size_t index_of(const void* p, std::size_t hint) const noexcept {
    std::size_t diff = static_cast<std::size_t>(static_cast<const char*>(p) - ptr);
    if (hint < blocks.size() && diff % small_block::kGranule == 0 &&
        small_block::offset(blocks[hint]) == diff / small_block::kGranule)
      return hint;
    return index_of(p);
  }
  // Whether the chunk index agrees with the descriptors (for assertions).
  bool chunks_agree() const noexcept {
    std::size_t i = 0;
    for (std::size_t k = 0; k < kChunks; ++k) {
      while (i < blocks.size() && small_block::offset(blocks[i]) < k * kChunkGranules) ++i;
      if (blocks_before(k) != i) return false;
    }
    return true;
  }
  char* address(std::size_t i) const noexcept {
    return ptr + small_block::offset(blocks[i]) * small_block::kGranule;
  }
  bool wholly_free() const noexcept {
    return blocks.size() == 1 && small_block::state(blocks[0]) == small_block::binned;
  }

 private:
  // Adds `delta` (1 or -1) to the count of every chunk after the one
  // holding `off`: to whole words at a time, four counts each, which never
  // carry into each other (a count is at most 4096 and never below 0).
  void count_from(std::uint32_t off, int delta) noexcept {
    constexpr std::uint64_t kOnes = 0x0001000100010001u;
    std::size_t first = off / kChunkGranules + 1;
    if (first == kChunks) return;
    std::size_t w = first / 4;
    std::uint64_t part = kOnes << (first % 4 * 16);
    if (delta > 0) {
      before[w] += part;
      for (++w; w < before.size(); ++w) before[w] += kOnes;
    } else {
      before[w] -= part;
      for (++w; w < before.size(); ++w) before[w] -= kOnes;
    }
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
    seg->insert_block(0, small_block::make(0, small_block::kGranules, small_block::parked, false, 0));
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
