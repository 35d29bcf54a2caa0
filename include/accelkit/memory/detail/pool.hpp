// accelkit: the device pool's records: blocks and segments, the live-block
// index entry, the record recycler, and a pool shard (one per stream, or a
// private pool: Note [Private pools]) with its bins, small arena and queue
// of pending frees. The policy that uses
// them is in memory/caching_allocator.hpp.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/assert.hpp>
#include <accelkit/detail/spinlock.hpp>
#include <accelkit/memory/config.hpp>
#include <accelkit/memory/detail/small_parking.hpp>
#include <accelkit/memory/detail/small_arena.hpp>
#include <accelkit/memory/stats.hpp>
#include <accelkit/types.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

struct Pool;
struct Segment;

// Note [Block records]: one cache line per block, for large blocks (and for
// every block while caching is off; small blocks have none otherwise, Note
// [Small arena]). They are kept to 64 bytes, allocated in slabs, and hold
// nothing that is rarely needed (the streams a block was used on live in a
// side table of its pool, flagged by has_uses).
struct alignas(64) Block {
  char* ptr = nullptr;
  std::size_t size = 0;
  Block* prev = nullptr;      // neighbours in the segment, by address
  Block* next = nullptr;
  Block* next_spare = nullptr;  // the pool's spare list
  Segment* segment = nullptr;
  std::size_t requested = 0;
  // Bytes, not bits of one word: the hit path sets allocated, requested and
  // mapped one after another, and bit fields made each a read-modify-write
  // of the word the one before had just written (bench/memory_bench.cpp's
  // 16 MiB hit path).
  bool allocated = false;
  bool cached = false;    // in the pool's bins or large set (mergeable)
  bool has_uses = false;  // used on other streams (Pool::uses), or its private pool released
  bool mapped = false;    // in the device pool's pointer map (Note [Mapped blocks])
  bool hole = false;      // unmapped pages inside an expandable segment (Note [Expandable segments])
};
static_assert(sizeof(Block) == 64, "Note [Block records]");

// The addresses of an expandable segment and the physical pages mapped into
// them (Note [Expandable segments]). Read and written under the device
// pool's release_mutex_ only.
struct VmRange {
  // One page of the range: its physical memory, and whether it is mapped.
  struct Page {
    PhysicalHandle memory;  // null: none (the page may be mapped again)
    bool mapped = false;
  };
  char* base = nullptr;
  std::size_t bytes = 0;        // reserved
  std::size_t page = 0;         // the device's granularity
  std::vector<Page> pages;      // by index from base
  std::size_t held = 0;         // pages with physical memory
  bool orphaned = false;        // its segment is gone: released once held is 0
  bool released = false;
};

struct Segment {
  Pool* pool = nullptr;
  char* ptr = nullptr;
  std::size_t size = 0;        // an expandable segment's: its usable pages
  bool small = false;
  bool oversize = false;
  bool expandable = false;     // Note [Expandable segments]
  Block* head = nullptr;       // the block at ptr; never merged away
  std::size_t index = 0;          // position in its pool's segment list
  std::uint64_t free_tick = 0;    // when it last became wholly free
  std::shared_ptr<VmRange> range;  // an expandable segment's addresses and pages
};

// Whether `b` spans its segment: no neighbour on either side. One test of
// both links, without the branch that `&&` makes.
inline bool whole_segment(const Block* b) noexcept {
  auto link = [](const Block* n) { return reinterpret_cast<std::uintptr_t>(n); };
  return (link(b->prev) | link(b->next)) == 0;
}

// Note [Mapped blocks]
// (Large blocks: small ones are found through their segment, Note [Small
// arena].) free(ptr) finds a block's record through the device pool's
// pointer map. A block stays in the map while it is allocated and while it
// is parked after its free (Note [Recently freed blocks]): a request that
// takes a parked block back then neither inserts nor erases, and a free only
// reads the map, without a lock (Note [Reading the pointer map without a
// lock]). On a large block's hit path the two map writes and their shard
// locks cost as much as the rest of the pair. The record's `mapped` flag
// says whether the map holds the block: it leaves the map when it enters
// the bins (merged, it may stop being a block), when its free waits for
// other streams or caching is off, and a block taken from the bins enters
// it again. Since the map names parked blocks too, a free checks the
// record's allocated flag under the pool's lock: a second free of a parked
// block is refused there.
struct LiveBlock {
  Block* block = nullptr;
  Pool* pool = nullptr;
};

// Recycles the nodes of one std::set so that inserting a free block does not
// call the heap. Every rebound copy shares one free list.
struct NodeFreeList {
  void* head = nullptr;
  std::size_t node_size = 0;
  NodeFreeList() = default;
  NodeFreeList(const NodeFreeList&) = delete;
  NodeFreeList& operator=(const NodeFreeList&) = delete;
  ~NodeFreeList() {
    while (head) {
      void* next = *static_cast<void**>(head);
      ::operator delete(head);
      head = next;
    }
  }
};
template <class T>
struct NodeRecycler {
  using value_type = T;
  NodeFreeList* list;
  explicit NodeRecycler(NodeFreeList* l) noexcept : list(l) {}
  template <class U>
  NodeRecycler(const NodeRecycler<U>& o) noexcept : list(o.list) {}
  T* allocate(std::size_t n) {
    if (n == 1 && list->head && list->node_size == sizeof(T)) {
      void* p = list->head;
      list->head = *static_cast<void**>(p);
      return static_cast<T*>(p);
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if (n == 1 && sizeof(T) >= sizeof(void*) &&
        (list->node_size == 0 || list->node_size == sizeof(T))) {
      list->node_size = sizeof(T);
      *reinterpret_cast<void**>(p) = list->head;
      list->head = p;
      return;
    }
    ::operator delete(p);
  }
  template <class U>
  friend bool operator==(const NodeRecycler& a, const NodeRecycler<U>& b) noexcept {
    return a.list == b.list;
  }
  template <class U>
  friend bool operator!=(const NodeRecycler& a, const NodeRecycler<U>& b) noexcept {
    return a.list != b.list;
  }
};

struct LargeOrder {
  bool operator()(const Block* a, const Block* b) const noexcept {
    return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
  }
};

// A freed block waiting for events on the streams it was used on: a record
// (large blocks), or a small block at `ptr` in `seg`. A free whose events
// could not be recorded yet, because a capture was underway on the device,
// lists the streams in `deferred` instead (Note [Frees during capture]).
struct PendingFree {
  Block* block;
  SmallSegment* seg;
  char* ptr;
  std::vector<std::pair<device_index, EventHandle>> events;  // all of this pool's device
  std::vector<StreamHandle> deferred = {};
  bool quarantined = false;  // its deferred uses could be neither recorded nor waited for
};

// What becomes of a pool's wholly free segments (Note [Private pools]):
// cached until a release (a stream's pool), kept reserved (a private pool
// in use), or returned to the driver as soon as they are wholly free (a
// private pool whose use count dropped to 0).
enum class Keep : std::uint8_t { cache, reserve, give_back };

// Where the small segments overlapping one 2 MiB address window are (Note
// [Small arena]): at most two, as they are 2 MiB each and do not overlap.
struct SmallWindow {
  Pool* pool[2] = {nullptr, nullptr};
  char* base[2] = {nullptr, nullptr};
  std::uint64_t id[2] = {0, 0};
  static SmallWindow without(const SmallWindow& w, int k) noexcept {
    SmallWindow out;
    int keep = 1 - k;
    out.pool[0] = w.pool[keep];
    out.base[0] = w.base[keep];
    out.id[0] = w.id[keep];
    return out;
  }
};

// The cached memory of one stream (Note [Caching device allocator]), or a
// private pool (Note [Private pools]).
struct alignas(64) Pool {
  explicit Pool(StreamHandle s)
      : stream(s), large(LargeOrder{}, NodeRecycler<Block*>(&nodes)) {
    node_probe.size = std::numeric_limits<std::size_t>::max();  // sorts after every block
  }
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() = default;

  // A reset block record from the pool's slabs (Note [Block records]).
  Block* new_block() {
    if (!spare) {
      std::size_t n = std::size_t{64} << std::min<std::size_t>(slabs.size(), 6);  // 64..4096
      slabs.push_back(std::make_unique<Block[]>(n));
      Block* slab = slabs.back().get();
      for (std::size_t i = n; i-- > 0;) {
        slab[i].next_spare = spare;
        spare = &slab[i];
      }
    }
    Block* b = spare;
    spare = b->next_spare;
    *b = Block();
    return b;
  }
  void recycle(Block* b) noexcept {
    ACCELKIT_ASSERT(!b->mapped, "a block record leaves the pointer map before it is recycled");
    if (b->has_uses) uses.erase(b->ptr);
    b->next_spare = spare;
    spare = b;
  }

  SpinLock lock;
  StreamHandle stream;
  SmallArena arena;           // small blocks (Note [Small arena])
  SmallParking parked_small;  // Note [Parked small blocks]
  NodeFreeList nodes;  // before `large`: destroyed after it
  using LargeSet = std::set<Block*, LargeOrder, NodeRecycler<Block*>>;
  LargeSet large;
  // A set node kept ready so that evicting a parked large block into the
  // set cannot fail (prepare_evict); node_probe is its placeholder value.
  LargeSet::node_type spare_node;
  Block node_probe;
  std::vector<PendingFree> pending;
  std::vector<Segment*> segments;
  std::vector<std::unique_ptr<Block[]>> slabs;
  Block* spare = nullptr;
  std::unordered_map<const void*, std::vector<StreamHandle>> uses;  // by block address
  PoolStats stats;
  // Private pools (Note [Private pools]), under lock; after the hot
  // members, off their cache lines.
  Keep keep = Keep::cache;  // what its wholly free segments do
  MempoolId id{};           // {0, 0} for a stream's pool
  // Note [Recently freed blocks]
  // A training loop frees a block and soon asks for one of the same size
  // again; merging the freed block and splitting it again pays for a merge
  // and a split. So a block freed on its stream is parked unmerged, and a
  // request of exactly its size takes it back. Records park here, the last
  // kParked freed (a free into full slots evicts the oldest into the large
  // set), their sizes beside them so that a lookup scans one cache line;
  // small blocks park by size in parked_small (Note [Parked small blocks]).
  // Limits: parked blocks merge with their neighbours only when evicted,
  // when a request finds nothing else (before the pool grows) and before
  // memory goes back to the driver; a pool whose sizes do not come back
  // stops parking records (Note [Parking pays for itself]).
  static constexpr std::size_t kParked = 8;
  std::array<Block*, kParked> parked{};
  std::array<std::size_t, kParked> parked_size{};
  std::size_t parked_count = 0;
  std::size_t parked_victim = 0;
  // Whether records are parked now (Note [Parking pays for itself]).
  bool parking = true;
  std::uint64_t frees_counted = 0;  // since parking was last turned on or off
  std::uint64_t parked_hits = 0;    // requests that took a parked block of their size
  // The expandable segment that grows next (Note [Expandable segments]);
  // written under the device pool's release_mutex_ and this lock. Last, off
  // the hot members' lines.
  Segment* growing = nullptr;
  void park(std::size_t i, Block* b, std::size_t size) noexcept {
    parked[i] = b;
    parked_size[i] = size;
  }
  Block* unpark(std::size_t i) noexcept {
    Block* b = parked[i];
    --parked_count;
    // Not onto itself: the hit path takes back the record its free has just
    // parked, and the copy onto itself would be a store the next load waits
    // for (bench/memory_bench.cpp's 16 MiB hit path).
    if (i != parked_count) {
      parked[i] = parked[parked_count];
      parked_size[i] = parked_size[parked_count];
    }
    return b;
  }
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
