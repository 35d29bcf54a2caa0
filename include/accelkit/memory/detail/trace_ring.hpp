// accelkit: the device pool's allocation history: a ring of its last
// entries, and the contexts of its live blocks and segments
// (torch.<name>.memory._record_memory_history).
//
// Note [History contexts]
// CUDA keeps an allocation's context (its stack frames) in the block's
// record. Small blocks here have no record (Note [Small arena]), so every
// context lives in a side table keyed by address, one for blocks and one
// for segments, kept under the ring's mutex and touched only while history
// is recorded: an alloc entry adds its block's context, a free_completed
// entry drops it; segment_alloc and segment_free do the same for segments.
// The gatherer (which may take the GIL) runs before the allocator takes any
// lock: the allocator's recording paths gather first and leave the context
// in a thread-local slot (HistoryScope) that the entries recorded deeper
// in the same call read. Limits: a block whose free never completes (its
// stream uses could not be ordered) keeps its context until recording
// stops; a block allocated before recording began has none.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/history.hpp>
#include <accelkit/memory/snapshot.hpp>
#include <accelkit/types.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

// Note [Trace timestamps]
// Each trace entry needs a time (PyTorch's time_us, since the Unix epoch),
// and reading the system clock costs about 27 ns on a virtual machine's
// TSC clock source: a quarter of what recording adds to an allocation and
// free. So entries keep the processor's time-stamp counter (one
// instruction), as CUDA's allocator does (c10's approximate clock), and
// entries() turns them into clock time from two pairs of (counter, clock)
// readings: one taken when recording starts, one when the entries are read.
// Limits: it assumes an invariant counter that all cores share (every
// x86-64 processor of the last decade); elsewhere the system clock itself
// is read. A time is exact to within the jitter of the two readings
// (well under a microsecond), and the same entry read twice may differ by
// that much.
struct TraceClock {
  static std::int64_t now_ns() noexcept {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  static std::int64_t ticks() noexcept {
#if defined(__x86_64__) || defined(__i386__)
    return static_cast<std::int64_t>(__rdtsc());
#else
    return now_ns();
#endif
  }
};

// The context gathered for the allocator call under way on this thread
// (Note [History contexts]); null outside one.
inline thread_local const std::shared_ptr<HistoryContext>* tls_history_context = nullptr;

// Sets the calling thread's context for the scope of one allocator call.
class HistoryScope {
 public:
  explicit HistoryScope(const std::shared_ptr<HistoryContext>& context) noexcept
      : saved_(tls_history_context) {
    tls_history_context = &context;
  }
  ~HistoryScope() { tls_history_context = saved_; }
  HistoryScope(const HistoryScope&) = delete;
  HistoryScope& operator=(const HistoryScope&) = delete;

 private:
  const std::shared_ptr<HistoryContext>* saved_;
};

// The contexts of live blocks and segments, by address.
using ContextTable = std::unordered_map<std::uintptr_t, std::shared_ptr<HistoryContext>>;

class TraceRing {
 public:
  // Applies record_history's options; HistoryRecord::off stops recording,
  // drops the entries and the contexts.
  void configure(const HistoryOptions& o) {
    auto gather = o.gather ? std::make_shared<const ContextGatherer>(o.gather) : nullptr;
    std::lock_guard<std::mutex> lock(mutex_);
    bool on = o.enabled != HistoryRecord::off;
    std::vector<TraceEntry> kept;
    if (on && !o.clear_history) kept = linear();
    std::size_t capacity = o.enabled == HistoryRecord::all ? o.max_entries : 0;
    if (kept.size() > capacity)
      kept.erase(kept.begin(), kept.end() - static_cast<std::ptrdiff_t>(capacity));
    entries_ = std::move(kept);
    next_ = 0;
    if (on && origin_ticks_ == 0) {
      origin_ns_ = TraceClock::now_ns();
      origin_ticks_ = TraceClock::ticks();
    }
    capacity_ = capacity;
    skip_ = 0;
    for (TraceEntry::Action a : o.skip_actions) skip_ |= bit(a);
    gather_ = on ? std::move(gather) : nullptr;
    HistoryContexts level = on && gather_ ? o.context : HistoryContexts::none;
    level_.store(level, std::memory_order_relaxed);
    if (!on || level == HistoryContexts::none) {
      blocks_.clear();
      segments_.clear();
    }
    on_.store(on, std::memory_order_relaxed);
  }

  // Whether history is recorded (the pool's hot paths ask first: one
  // relaxed load).
  bool on() const noexcept { return on_.load(std::memory_order_relaxed); }

  // The calling thread's context where the recording keeps contexts at
  // `level` or above; null otherwise. Call with no allocator lock held.
  std::shared_ptr<HistoryContext> gather(HistoryContexts level) const {
    if (level_.load(std::memory_order_relaxed) < level) return nullptr;
    std::shared_ptr<const ContextGatherer> g;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      g = gather_;
    }
    return g ? (*g)() : nullptr;
  }

  // Records an entry, and keeps or drops the context of the block or
  // segment at `ptr` (Note [History contexts]). `context` is the one
  // gathered for the call under way (null if none). Never throws: an entry
  // that finds no memory is lost.
  void record(TraceEntry::Action action, const void* ptr, std::size_t size, StreamHandle stream,
              MempoolId pool, const std::shared_ptr<HistoryContext>& context,
              std::size_t device_free = 0) noexcept {
    using A = TraceEntry::Action;
    std::int64_t now = TraceClock::ticks();  // Note [Trace timestamps]
    auto addr = reinterpret_cast<std::uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mutex_);
    if (!on_.load(std::memory_order_relaxed)) return;
    HistoryContexts level = level_.load(std::memory_order_relaxed);
    std::shared_ptr<HistoryContext> c = context;
    try {
      switch (action) {
        case A::alloc:
          if (context) blocks_[addr] = context;
          else if (!blocks_.empty()) blocks_.erase(addr);
          break;
        case A::segment_alloc:
          if (context) segments_[addr] = context;
          else if (!segments_.empty()) segments_.erase(addr);
          break;
        case A::free_requested:
        case A::free_completed:
        case A::segment_free: {
          ContextTable& table = action == A::segment_free ? segments_ : blocks_;
          auto it = table.find(addr);
          if (it != table.end()) {
            if (!c) c = it->second;
            if (action != A::free_requested) table.erase(it);
          }
          break;
        }
        default: break;
      }
      if (capacity_ == 0 || (skip_ & bit(action))) return;
      if (level < HistoryContexts::alloc || action == A::snapshot) c = nullptr;
      TraceEntry e{action, addr, size, stream, now, pool, std::move(c), device_free};
      if (entries_.size() < capacity_) {
        entries_.push_back(std::move(e));
      } else {
        entries_[next_] = std::move(e);
        next_ = (next_ + 1) % capacity_;
      }
    } catch (...) {
    }
  }

  // The entries, oldest first, with their times (Note [Trace timestamps]).
  std::vector<TraceEntry> entries() const {
    std::int64_t ns = TraceClock::now_ns(), ticks = TraceClock::ticks();
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<TraceEntry> out = linear();
    double per_tick = ticks > origin_ticks_ ? static_cast<double>(ns - origin_ns_) /
                                                  static_cast<double>(ticks - origin_ticks_)
                                            : 1.0;
    for (TraceEntry& e : out)
      e.time_ns = origin_ns_ + static_cast<std::int64_t>(
                                   static_cast<double>(e.time_ns - origin_ticks_) * per_tick);
    return out;
  }

  // The contexts of live blocks and of segments (empty unless recording
  // with contexts).
  std::pair<ContextTable, ContextTable> contexts() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return {blocks_, segments_};
  }

 private:
  static std::uint32_t bit(TraceEntry::Action a) noexcept {
    return std::uint32_t{1} << static_cast<unsigned>(a);
  }
  std::vector<TraceEntry> linear() const {
    if (next_ == 0) return entries_;
    std::vector<TraceEntry> out(entries_.begin() + static_cast<std::ptrdiff_t>(next_),
                                entries_.end());
    out.insert(out.end(), entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(next_));
    return out;
  }

  std::atomic<bool> on_{false};
  std::atomic<HistoryContexts> level_{HistoryContexts::none};
  mutable std::mutex mutex_;
  std::vector<TraceEntry> entries_;
  std::size_t capacity_ = 0;
  std::size_t next_ = 0;  // the oldest entry once the ring is full
  std::uint32_t skip_ = 0;
  // Where the entries' counter readings start (Note [Trace timestamps]).
  std::int64_t origin_ns_ = 0;
  std::int64_t origin_ticks_ = 0;
  std::shared_ptr<const ContextGatherer> gather_;
  ContextTable blocks_;
  ContextTable segments_;
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
