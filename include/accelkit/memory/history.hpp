// accelkit: what the caching allocator's history records, and who hears of
// an out-of-memory (torch.cuda.memory._record_memory_history and
// _attach_out_of_memory_observer). Torch-free: the torch layer supplies a
// gatherer that captures stack frames and symbolizes them when a snapshot
// is written (memory/snapshot.hpp's FramesWriter).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/memory/snapshot.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// Frames a gatherer captured; the torch layer derives its own.
struct HistoryContext {
  virtual ~HistoryContext() = default;
};

// Captures the calling thread's context. Called on the thread that
// allocates or frees, never with an allocator lock held (it may take the
// GIL); may return null. Must not call the allocator.
using ContextGatherer = std::function<std::shared_ptr<HistoryContext>()>;

// What is recorded (`enabled` of _record_memory_history): nothing; only the
// contexts of live blocks ("state", no trace); or those and the trace ("all").
enum class HistoryRecord : std::uint8_t { off, state, all };

// Which events carry a gathered context (`context`): none; live blocks
// ("state"); those and the trace's alloc, segment_alloc and oom entries
// ("alloc"); and frees too, gathered at the free ("all"). As in CUDA, a
// free entry without a context of its own carries its block's allocation
// context where the level is alloc or all.
enum class HistoryContexts : std::uint8_t { none, state, alloc, all };

struct HistoryOptions {
  HistoryRecord enabled = HistoryRecord::all;
  HistoryContexts context = HistoryContexts::all;
  // The trace keeps the newest max_entries entries (the oldest are dropped).
  std::size_t max_entries = std::numeric_limits<std::size_t>::max();
  // Drops the entries recorded so far (turning recording off always does).
  bool clear_history = false;
  // Actions not recorded in the trace.
  std::vector<TraceEntry::Action> skip_actions;
  ContextGatherer gather;  // empty: no contexts
};

// The figures an out-of-memory observer receives, before the
// OutOfMemoryError is thrown.
struct OomInfo {
  device_index device;
  std::size_t requested;    // the bytes asked for
  std::size_t allocated;    // bytes this allocator had allocated then
  std::size_t device_free;  // the driver's free memory then
};
// Called outside every allocator lock, in the order attached; an observer
// that throws does not stop the others nor the OutOfMemoryError.
using OomObserver = std::function<void(const OomInfo&)>;

ACCELKIT_END_NAMESPACE
