// accelkit: the device pool's snapshot (segments, blocks and the recorded
// allocation history) and its JSON, in the structure of
// torch.cuda.memory._snapshot(), which torch.<name>.memory reads.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// What a context gatherer captured at an allocation or free (stack frames;
// memory/history.hpp defines it).
struct HistoryContext;

// One entry of the allocation history (torch.cuda.memory._record_memory_history).
struct TraceEntry {
  enum class Action : std::uint8_t {
    alloc,           // a block handed out (size: the bytes asked for)
    free_requested,  // a block freed by its user (size: the bytes asked for)
    free_completed,  // the block back in the cache, past its stream uses
    segment_alloc,   // memory from the driver (size: the segment's)
    segment_free,    // memory back to the driver
    segment_map,     // pages mapped into an expandable segment
    segment_unmap,   // pages unmapped from an expandable segment
    oom,             // an allocation that failed (size: the rounded request)
    snapshot,        // a snapshot was taken (size: active bytes then)
  };
  Action action;
  std::uintptr_t address;  // 0 for oom and snapshot
  std::size_t size;
  StreamHandle stream;
  std::int64_t time_ns;  // system clock, since the Unix epoch
  MempoolId pool_id;     // {0, 0}: a stream's pool; else a private pool's id
  // The context gathered for this entry, where the recording's context
  // level keeps one (HistoryContexts: alloc for alloc, segment_alloc and
  // oom; all for frees too). Null otherwise.
  std::shared_ptr<HistoryContext> context;
  std::size_t device_free = 0;  // oom only: the driver's free memory then
};

constexpr std::string_view to_string(TraceEntry::Action a) noexcept {
  switch (a) {
    case TraceEntry::Action::alloc: return "alloc";
    case TraceEntry::Action::free_requested: return "free_requested";
    case TraceEntry::Action::free_completed: return "free_completed";
    case TraceEntry::Action::segment_alloc: return "segment_alloc";
    case TraceEntry::Action::segment_free: return "segment_free";
    case TraceEntry::Action::segment_map: return "segment_map";
    case TraceEntry::Action::segment_unmap: return "segment_unmap";
    case TraceEntry::Action::oom: return "oom";
    case TraceEntry::Action::snapshot: return "snapshot";
  }
  return "unknown";
}

// torch.cuda.memory_snapshot()'s shape: segments with their blocks, and the
// recorded history.
struct BlockSnapshot {
  std::uintptr_t address;
  std::size_t size;
  std::size_t requested_size;
  // "active_allocated"; "active_pending_free" (freed, its stream uses not
  // yet past: the name CUDA's snapshot gives and the visualizer reads;
  // torch/cuda/memory.py's docstring calls it "active_awaiting_free");
  // "inactive".
  std::string_view state;
  // The allocation's context while history is recorded with a context
  // level other than none (null for free blocks and when none was gathered).
  std::shared_ptr<HistoryContext> context = nullptr;
};
struct SegmentSnapshot {
  device_index device;
  std::uintptr_t address;
  std::size_t total_size;  // an expandable segment's: its mapped bytes
  std::size_t allocated_size;
  std::size_t active_size;
  std::size_t requested_size;
  StreamHandle stream;
  std::string_view segment_type;  // "small" or "large"
  std::vector<BlockSnapshot> blocks;
  MempoolId pool_id;  // {0, 0}: a stream's pool; else a private pool's id
  bool expandable = false;
  // The context of the allocation that made the segment, as for blocks.
  std::shared_ptr<HistoryContext> context = nullptr;
};
struct MemorySnapshot {
  std::vector<SegmentSnapshot> segments;
  std::vector<TraceEntry> trace;  // oldest first
};

// Writes the "frames" value of a context (a JSON array, innermost frame
// first); called with null where there is none. The torch layer
// symbolizes contexts with it; without one every "frames" is [].
using FramesWriter = std::function<void(detail::JsonWriter&, const HistoryContext*)>;

// The snapshot as JSON: {"segments": [...], "trace": [...]}, every field
// always present (the form torch.<name>.memory turns into CUDA's snapshot).
inline std::string to_json(const MemorySnapshot& s, const FramesWriter& frames = {}) {
  detail::JsonWriter w;
  auto write_frames = [&](const std::shared_ptr<HistoryContext>& c) {
    w.key("frames");
    if (frames) {
      frames(w, c.get());
    } else {
      w.begin_array().end_array();
    }
  };
  auto write_pool = [&](std::string_view key, MempoolId id) {
    w.key(key).begin_array().value(id.first).value(id.second).end_array();
  };
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
        .field("segment_type", seg.segment_type);
    write_pool("segment_pool_id", seg.pool_id);
    w.field("expandable", seg.expandable);
    write_frames(seg.context);
    w.key("blocks").begin_array();
    for (const BlockSnapshot& b : seg.blocks) {
      w.begin_object()
          .field("address", b.address)
          .field("size", b.size)
          .field("requested_size", b.requested_size)
          .field("state", b.state);
      write_frames(b.context);
      w.end_object();
    }
    w.end_array().end_object();
  }
  w.end_array().key("trace").begin_array();
  for (const TraceEntry& t : s.trace) {
    w.begin_object()
        .field("action", to_string(t.action))
        .field("addr", t.address)
        .field("size", t.size)
        .field("stream", t.stream.value)
        .field("time_us", t.time_ns / 1000);
    write_pool("pool_id", t.pool_id);
    write_frames(t.context);
    if (t.action == TraceEntry::Action::oom) w.field("device_free", t.device_free);
    w.end_object();
  }
  w.end_array().end_object();
  return w.str();
}

ACCELKIT_END_NAMESPACE
