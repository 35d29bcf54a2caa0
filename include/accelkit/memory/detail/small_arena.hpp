// accelkit: the compact bookkeeping of small blocks in the caching allocator.
//
// Note [Small arena]
// Requests of up to 1 MiB share 2 MiB segments (Note [Segment sizes]). With
// many of them live, a 64-byte record per block plus a pointer-map slot per
// live block make 15 MiB of heap at 100,000 live blocks, far more than the
// cache a core gets, and each operation reads several of those lines at
// random: the allocator is bound by cache misses.
// Small blocks therefore have no records. Each small segment keeps its
// blocks as a sorted array of 64-bit descriptors (offset and size in 512 B
// granules, state, and either the bin position or the requested bytes), a
// few hundred bytes for a typical segment, and a block's neighbours are the
// adjacent descriptors. Free blocks sit in exact-size bins (one per 512 B
// step, with a two-level bitmap) that hold 8-byte (segment, offset)
// entries, not links through the blocks. A pointer is found through its
// segment (a small map of 2 MiB address windows, in the allocator), then
// that segment's chunk index (Note [Chunk index]). Limits: a block's
// neighbours and its descriptor's place are found by search, not by link;
// a split or merge moves the descriptors after it (Note [Moving descriptors]).
// Evidence: bench/memory_bench.cpp at N = 1e5 (1.8 MiB of heap at 100,000 live blocks).
// Everything here runs under the lock of the pool that owns the segment.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/detail/size_bitmap.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

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
// Whether stream uses are recorded for a block (record_stream).
enum class Uses : bool { none, recorded };
inline std::uint64_t payload(Desc d) noexcept { return d >> 28; }
inline Desc make(std::uint32_t off, std::uint32_t gran, State s, Uses uses,
                 std::uint64_t payload) noexcept {
  return Desc{off} | Desc{gran} << 12 | Desc{s} << 25 | Desc{uses == Uses::recorded ? 1u : 0u} << 27 |
         payload << 28;
}
inline Desc with_state(Desc d, State s) noexcept { return (d & ~(Desc{3} << 25)) | Desc{s} << 25; }
inline Desc with_uses(Desc d, Uses u) noexcept {
  return (d & ~(Desc{1} << 27)) | Desc{u == Uses::recorded ? 1u : 0u} << 27;
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
  void deallocate(T* p, std::size_t) noexcept {
    // Unsized: the sized aligned form is declared only with sized
    // deallocation, which Clang before 17 leaves off by default.
    ::operator delete(p, std::align_val_t{kLine});
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
// A small segment's 4096 granules fall into 16 chunks of 256 (128 KiB), and
// the segment counts, per chunk, the blocks that start before it. The block
// that starts at a given offset is among those that start in its chunk: the
// eight descriptors from the chunk's first are compared with the offset at
// once (SSE2: four compares of two), without a branch, reading past the
// chunk where it holds fewer (those start after the offset; past the last
// descriptor, DescArray keeps descriptors that start at the last granule);
// a chunk of more than eight blocks (small blocks) is searched by
// bisection. The 16 counts of 16 bits share the segment's first cache line
// with what a lookup reads besides (the segment's address and id, its
// descriptor array), so that with many segments a lookup reads that line and
// one or two of descriptors. A split or a merge adds or subtracts one in the
// counts after the block: two vectors of eight, without a branch. A free
// and an allocation make about three lookups and two updates, none of which
// has a loop exit to mispredict. Limits: a chunk of more than eight blocks
// is bisected; the compares need SSE2 (elsewhere, a plain loop).
// Evidence: bench/memory_bench.cpp, random sizes up to 64 KiB (docs/design/memory.md).

// How many of the eight descriptors at `d` start before granule `off`.
ACCELKIT_ALWAYS_INLINE std::size_t starting_before(const small_block::Desc* d,
                                                  std::uint32_t off) noexcept {
#if defined(__SSE2__)
  // Two descriptors to a vector: their low 32-bit halves masked to the
  // offset, compared with `off`; the high halves to 0, which compares false.
  const __m128i o = _mm_set_epi32(0, static_cast<int>(off), 0, static_cast<int>(off));
  const __m128i mask = _mm_set_epi32(0, 0xfff, 0, 0xfff);
  // Written out: GCC at -O2 keeps a four-pass loop, nine instructions a pass.
  auto less = [&](int j) {  // -1 in each half that starts before
    __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(d + j));
    return _mm_cmpgt_epi32(o, _mm_and_si128(x, mask));
  };
  __m128i sum = _mm_add_epi32(_mm_add_epi32(less(0), less(2)), _mm_add_epi32(less(4), less(6)));
  sum = _mm_add_epi32(sum, _mm_shuffle_epi32(sum, 0x4e));
  return static_cast<std::size_t>(-_mm_cvtsi128_si32(sum));
#else
  std::size_t n = 0;
  for (int j = 0; j < 8; ++j) n += small_block::offset(d[j]) < off;
  return n;
#endif
}

// Note [Moving descriptors]
// A split inserts a descriptor into its segment's array and a merge erases
// one or two, moving the descriptors after them: about 30 on average at 60
// blocks a segment. glibc's memmove chooses among its size classes with
// branches, which mispredict about twice a call when the sizes vary. The
// array therefore keeps room for eight descriptors past its last, and moves
// them eight at a time (64 bytes through registers), reading and writing
// past the last where the count is not a multiple of eight: one branch, the
// loop's, decides; a merge with both neighbours erases their two
// descriptors in one move. Limits: each array holds eight descriptors more
// than it needs, and a move copies up to seven it did not have to; fewer
// mispredicted branches cost more instructions.
// Evidence: bench/memory_bench.cpp, random sizes up to 64 KiB (docs/design/memory.md).
class DescArray {
 public:
  using Desc = small_block::Desc;
  static constexpr std::size_t kBlock = 8;
  // What the room past the last holds: a descriptor that starts at the
  // segment's last granule (Note [Chunk index]).
  static constexpr Desc kPast = small_block::kGranules - 1;

  DescArray() = default;
  DescArray(const DescArray&) = delete;
  DescArray& operator=(const DescArray&) = delete;
  ~DescArray() { release(data_); }

  std::size_t size() const noexcept { return size_; }
  const Desc* data() const noexcept { return data_; }
  Desc& operator[](std::size_t i) noexcept { return data_[i]; }
  const Desc& operator[](std::size_t i) const noexcept { return data_[i]; }

  // Room for `n` descriptors (and the eight past them). May throw bad_alloc.
  void reserve(std::size_t n) {
    std::size_t want = n + kBlock;
    if (want <= capacity_) return;
    std::size_t cap = std::max<std::size_t>(want, 2 * std::size_t{capacity_});
    cap = (cap + kBlock - 1) / kBlock * kBlock;  // whole lines
    Desc* d = static_cast<Desc*>(::operator new(cap * sizeof(Desc), std::align_val_t{64}));
    std::fill(d, d + cap, kPast);  // what index_of and a move read past the last
    if (size_) std::copy(data_, data_ + size_, d);
    release(data_);
    data_ = d;
    capacity_ = static_cast<std::uint32_t>(cap);
  }
  // Inserts `d` at index `i` <= size(). May throw bad_alloc: nothing changed then.
  void insert(std::size_t i, Desc d) {
    reserve(size_ + 1);
    // [i, size) up by one, the highest eight first: each eight is read
    // before its place is written, and above the next eight's reads.
    std::size_t blocks = (size_ - i + kBlock - 1) / kBlock;
    Desc* first = data_ + i;
    for (std::size_t k = blocks; k-- > 0;) move8(first + k * kBlock + 1, first + k * kBlock);
    data_[i] = d;
    ++size_;
  }
  // Removes the `n` (1 or 2) descriptors from index `i` on.
  void erase(std::size_t i, std::size_t n) noexcept {
    // [i + n, size) down by n, the lowest eight first.
    std::size_t blocks = (size_ - i - n + kBlock - 1) / kBlock;
    Desc* first = data_ + i;
    for (std::size_t k = 0; k < blocks; ++k) move8(first + k * kBlock, first + k * kBlock + n);
    // What no move covered (a count that is a multiple of eight) is past the last now.
    size_ -= static_cast<std::uint32_t>(n);
    data_[size_] = kPast;
    data_[size_ + n - 1] = kPast;
  }

 private:
  // Copies the eight descriptors at `from` to `to` (they may overlap): all
  // are read before any is written, in registers (GCC takes a 64-byte
  // struct copied with memcpy through the stack).
  static ACCELKIT_ALWAYS_INLINE void move8(Desc* to, const Desc* from) noexcept {
#if defined(__SSE2__)
    auto src = reinterpret_cast<const __m128i*>(from);
    __m128i a = _mm_loadu_si128(src), b = _mm_loadu_si128(src + 1);
    __m128i c = _mm_loadu_si128(src + 2), e = _mm_loadu_si128(src + 3);
    auto dst = reinterpret_cast<__m128i*>(to);
    _mm_storeu_si128(dst, a);
    _mm_storeu_si128(dst + 1, b);
    _mm_storeu_si128(dst + 2, c);
    _mm_storeu_si128(dst + 3, e);
#else
    Desc e[kBlock];
    std::memcpy(e, from, sizeof e);
    std::memcpy(to, e, sizeof e);
#endif
  }
  static void release(Desc* d) noexcept {
    if (d) ::operator delete(d, std::align_val_t{64});  // unsized: see LineAllocator
  }
  Desc* data_ = nullptr;
  std::uint32_t size_ = 0;
  std::uint32_t capacity_ = 0;  // kBlock past the most it holds
};

struct alignas(64) SmallSegment {
  static constexpr std::size_t kChunkGranules = 256;
  static constexpr std::size_t kChunks = small_block::kGranules / kChunkGranules;
  using Lanes = std::uint16_t __attribute__((vector_size(16)));
  static constexpr std::size_t kLanes = 8;
  static_assert(kChunks % kLanes == 0 && small_block::kGranules <= 0xffff,
                "counts of 16 bits, eight to a vector");

  // The first cache line holds what finding a block reads (Note [Chunk index]).
  char* ptr = nullptr;
  std::uint64_t id = 0;  // index in its arena's segment table
  // By offset; they tile the segment. Read freely; their number changes only
  // through insert_block and erase_blocks, which keep the chunk index.
  DescArray blocks;
  // The blocks that start before each chunk, eight to a vector.
  Lanes counts[kChunks / kLanes] = {};
  std::uint64_t free_tick = 0;  // when it last became wholly free

  std::size_t blocks_before(std::size_t chunk) const noexcept {
    return counts[chunk / kLanes][chunk % kLanes];
  }

  std::size_t size() const noexcept { return memory_constants::kSmallBuffer; }
  bool contains(const void* p) const noexcept {
    return p >= ptr && p < ptr + memory_constants::kSmallBuffer;
  }
  // Inserts descriptor `d` at index `i` (its place by offset). May throw
  // bad_alloc: nothing changed then.
  void insert_block(std::size_t i, small_block::Desc d) {
    blocks.insert(i, d);
    mark(small_block::offset(d), 1);
  }
  // Removes the `n` (1 or 2) descriptors from index `i` on.
  void erase_blocks(std::size_t i, std::size_t n) noexcept {
    std::uint32_t first = small_block::offset(blocks[i]);
    std::uint32_t last = small_block::offset(blocks[i + n - 1]);
    blocks.erase(i, n);
    mark(first, -1);
    if (n == 2) mark(last, -1);
  }
  // Replaces the descriptor at index `i` with `d`, which may start elsewhere
  // between its neighbours.
  void move_block(std::size_t i, small_block::Desc d) noexcept {
    mark(small_block::offset(blocks[i]), -1);
    mark(small_block::offset(d), 1);
    blocks[i] = d;
  }
  // The index of the block that starts at `p`, or blocks.size().
  ACCELKIT_ALWAYS_INLINE std::size_t index_of(const void* p) const noexcept {
    std::size_t diff = static_cast<std::size_t>(static_cast<const char*>(p) - ptr);
    std::size_t n = blocks.size();
    if (diff % small_block::kGranule || diff >= memory_constants::kSmallBuffer) return n;
    auto off = static_cast<std::uint32_t>(diff / small_block::kGranule);
    std::size_t k = off / kChunkGranules;
    std::size_t lo = blocks_before(k), hi = k + 1 < kChunks ? blocks_before(k + 1) : n;
    const small_block::Desc* d = blocks.data();
    if (hi - lo > DescArray::kBlock) {  // a chunk of many tiny blocks
      while (hi - lo > 1) {
        std::size_t mid = lo + (hi - lo) / 2;
        (small_block::offset(d[mid]) <= off ? lo : hi) = mid;
      }
    } else {
      lo += starting_before(d + lo, off);  // the eight from lo on, past the chunk too
    }
    return lo < n && small_block::offset(d[lo]) == off ? lo : n;
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
  // A block starts (delta 1) or no longer starts (-1) at `off`: one more or
  // fewer in the count of every chunk after the one holding it.
  void mark(std::uint32_t off, int delta) noexcept {
    // Without a branch on where the block lies: eight counts at a time, the
    // lanes after the block's chunk by one (a compare gives -1 there).
    Lanes chunk = static_cast<std::uint16_t>(off / kChunkGranules) - Lanes{};
    Lanes lane = {0, 1, 2, 3, 4, 5, 6, 7};
    constexpr Lanes kStep = {8, 8, 8, 8, 8, 8, 8, 8};
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC unroll 8
#endif
    for (std::size_t v = 0; v < kChunks / kLanes; ++v, lane += kStep) {
      auto after = reinterpret_cast<Lanes>(lane > chunk);
      counts[v] = delta > 0 ? counts[v] - after : counts[v] + after;
    }
  }
};

static_assert(offsetof(SmallSegment, counts) + sizeof(SmallSegment::counts) <= 64,
              "what a lookup reads in the segment's first cache line (Note [Chunk index])");

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
    seg->insert_block(
        0, small_block::make(0, small_block::kGranules, small_block::parked, small_block::Uses::none, 0));
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
  ACCELKIT_ALWAYS_INLINE void bin(SmallSegment& seg, std::size_t i) {
    Desc& d = seg.blocks[i];
    std::size_t c = small_block::granules(d) - 1;
    auto& v = (*bins_)[c];
    v.push_back(entry(seg, small_block::offset(d)));  // may throw: nothing changed yet
    d = small_block::with_payload(small_block::with_state(d, small_block::binned), v.size() - 1);
    sizes_.set(c);
  }
  // Takes binned block `i` of `seg` out of its bin; its state becomes
  // parked and its payload 0.
  ACCELKIT_ALWAYS_INLINE void unbin(SmallSegment& seg, std::size_t i) noexcept {
    Desc& d = seg.blocks[i];
    std::size_t c = small_block::granules(d) - 1;
    auto& v = (*bins_)[c];
    auto pos = static_cast<std::size_t>(small_block::payload(d));
    std::uint64_t last = v.back();
    v.pop_back();
    if (pos != v.size()) {  // the last entry fills the hole
      v[pos] = last;
      SmallSegment& other = *segments_[last >> 12];
      std::size_t j = other.index_of(other.ptr + (last & 0xfff) * small_block::kGranule);
      other.blocks[j] = small_block::with_payload(other.blocks[j], pos);
    }
    sizes_.clear_if(c, v.empty());
    d = small_block::with_payload(small_block::with_state(d, small_block::parked), 0);
  }

  // The smallest size of at least `gran` granules with a binned block, in
  // granules, or 0 (the bitmap alone).
  ACCELKIT_ALWAYS_INLINE std::size_t best_fit_size(std::size_t gran) const noexcept {
    std::size_t bin = sizes_.first_from(gran - 1);
    return bin == Sizes::kNone ? 0 : bin + 1;
  }
  // The binned block of the smallest size of at least `gran` granules (the
  // most recently binned of that size), or false.
  ACCELKIT_ALWAYS_INLINE bool best_fit(std::size_t gran, SmallSegment*& seg,
                                       std::size_t& i) const noexcept {
    std::size_t size = best_fit_size(gran);
    if (size) i = last_binned(size, seg);
    return size != 0;
  }
  // The most recently binned block of `gran` granules (a bin that is not
  // empty): its segment and index.
  ACCELKIT_ALWAYS_INLINE std::size_t last_binned(std::size_t gran, SmallSegment*& seg) const noexcept {
    std::uint64_t e = (*bins_)[gran - 1].back();
    seg = segments_[e >> 12];
    return seg->index_of(seg->ptr + (e & 0xfff) * small_block::kGranule);
  }

 private:
  // A bin entry: the block's segment id and offset (its descriptor is found
  // as Note [Chunk index] says).
  static std::uint64_t entry(const SmallSegment& seg, std::uint32_t off) noexcept {
    return seg.id << 12 | off;
  }

  // 96 KiB, made with the first segment: a pool (a stream) that only ever
  // holds large blocks does without.
  using Bins = std::array<std::vector<std::uint64_t, LineAllocator<std::uint64_t>>, small_block::kGranules>;
  std::unique_ptr<Bins> bins_;
  using Sizes = SizeBitmap<small_block::kGranules / 64>;
  Sizes sizes_;  // the bins that are not empty
  std::vector<SmallSegment*> segments_;  // by id; nullptr where removed
  std::vector<std::uint64_t> free_ids_;
  std::size_t count_ = 0;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
