// accelkit: the device pool's snapshot (segments, blocks and the recorded
// allocation history) and its JSON, which torch.<name>.memory_snapshot()
// reads.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// One entry of the allocation history (torch.cuda.memory._record_memory_history).
struct TraceEntry {
  enum class Action { alloc, free_requested, free_completed, segment_alloc, segment_free, oom };
  Action action;
  std::uintptr_t address;
  std::size_t size;
  StreamHandle stream;
  std::int64_t time_ns;  // steady clock
};

constexpr std::string_view to_string(TraceEntry::Action a) noexcept {
  switch (a) {
    case TraceEntry::Action::alloc: return "alloc";
    case TraceEntry::Action::free_requested: return "free_requested";
    case TraceEntry::Action::free_completed: return "free_completed";
    case TraceEntry::Action::segment_alloc: return "segment_alloc";
    case TraceEntry::Action::segment_free: return "segment_free";
    case TraceEntry::Action::oom: return "oom";
  }
  return "unknown";
}

// torch.cuda.memory_snapshot()'s shape: segments with their blocks, and the
// recorded history.
struct BlockSnapshot {
  std::uintptr_t address;
  std::size_t size;
  std::size_t requested_size;
  std::string_view state;  // "active_allocated", "active_pending_free", "inactive"
};
struct SegmentSnapshot {
  device_index device;
  std::uintptr_t address;
  std::size_t total_size;
  std::size_t allocated_size;
  std::size_t active_size;
  std::size_t requested_size;
  StreamHandle stream;
  std::string_view segment_type;  // "small" or "large"
  std::vector<BlockSnapshot> blocks;
  MempoolId pool_id;  // {0, 0}: a stream's pool; else a private pool's id
};
struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<TraceEntry> trace;  // oldest first
};

inline std::string to_json(const MemorySnapshot& s) {
  detail::JsonWriter w;
  w.begin_object().key("segments").begin_array();
  for (const SegmentSnapshot& seg : s.segments) {
    w.begin_object()
        .field("device", seg.device)
        .field("address", seg.address)
        .field("total_size", seg.total_size)
        .field("allocated_size", seg.allocated_size)
        .field("active_size", seg.active_size)
        .field("requested_size", seg.requested_size)
        .field("stream", seg.stream.value)
        .field("segment_type", seg.segment_type)
        .key("segment_pool_id")
        .begin_array()
        .value(seg.pool_id.first)
        .value(seg.pool_id.second)
        .end_array()
        .key("blocks")
        .begin_array();
    for (const BlockSnapshot& b : seg.blocks)
      w.begin_object()
          .field("address", b.address)
          .field("size", b.size)
          .field("requested_size", b.requested_size)
          .field("state", b.state)
          .end_object();
    w.end_array().end_object();
  }
  w.end_array().key("trace").begin_array();
  for (const TraceEntry& t : s.trace)
    w.begin_object()
        .field("action", to_string(t.action))
        .field("addr", t.address)
        .field("size", t.size)
        .field("stream", t.stream.value)
        .field("time_ns", t.time_ns)
        .end_object();
  w.end_array().end_object();
  return w.str();
}

// The caching allocator of one device (Note [Caching device allocator]).
// Thread-safe; allocate/deallocate on different streams do not contend.

ACCELKIT_END_NAMESPACE
