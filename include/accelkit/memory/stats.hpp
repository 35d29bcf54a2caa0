// accelkit: memory statistics in PyTorch's DeviceStats shape.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE

// One statistic: its current value, the peak since the last reset, and the
// totals added and removed since the last reset (c10::CachingAllocator::Stat).
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;

  void increase(std::int64_t n) noexcept {
    current += n;
    allocated += n;
    peak = std::max(peak, current);
  }
  void decrease(std::int64_t n) noexcept {
    current -= n;
    freed += n;
  }
  void reset_peak() noexcept { peak = current; }
  void reset_accumulated() noexcept { allocated = freed = 0; }
  // Adds another shard's statistic (Note [Sharded statistics]).
  void merge(const Stat& o) noexcept {
    current += o.current;
    peak += o.peak;
    allocated += o.allocated;
    freed += o.freed;
  }
};

// Index into a StatArray, as c10's StatType.
enum class StatType : std::size_t { aggregate = 0, small_pool = 1, large_pool = 2 };
using StatArray = std::array<Stat, 3>;

// c10::CachingDeviceAllocator::DeviceStats, field for field where accelkit
// has the concept: the device's figures, or one pool's (Note [Private
// pools]).
struct DeviceStats {
  StatArray allocation;            // COUNT: allocations requested by client code
  StatArray segment;               // COUNT: segments obtained from the driver
  StatArray active;                // COUNT: blocks allocated or awaiting stream use
  StatArray inactive_split;        // COUNT: free blocks inside partly used segments
  StatArray allocated_bytes;       // SUM: bytes allocated (rounded sizes)
  StatArray reserved_bytes;        // SUM: bytes held from the driver
  StatArray active_bytes;          // SUM: bytes in active blocks
  StatArray inactive_split_bytes;  // SUM: bytes in inactive split blocks
  StatArray requested_bytes;       // SUM: bytes requested by client code
  std::int64_t num_alloc_retries = 0;     // driver allocations that failed, then retried
  std::int64_t num_ooms = 0;              // out-of-memory errors raised
  Stat oversize_allocations;              // COUNT: blocks >= max_split_size handed out
  Stat oversize_segments;                 // COUNT: segments >= max_split_size
  std::int64_t num_sync_all_streams = 0;  // waits for all pending stream uses
  std::int64_t num_device_alloc = 0;      // driver malloc calls
  std::int64_t num_device_free = 0;       // driver free calls
  std::int64_t max_split_size = 0;

  void merge(const DeviceStats& o) noexcept {
    auto merge_array = [](StatArray& a, const StatArray& b) {
      for (std::size_t i = 0; i < a.size(); ++i) a[i].merge(b[i]);
    };
    merge_array(allocation, o.allocation);
    merge_array(segment, o.segment);
    merge_array(active, o.active);
    merge_array(inactive_split, o.inactive_split);
    merge_array(allocated_bytes, o.allocated_bytes);
    merge_array(reserved_bytes, o.reserved_bytes);
    merge_array(active_bytes, o.active_bytes);
    merge_array(inactive_split_bytes, o.inactive_split_bytes);
    merge_array(requested_bytes, o.requested_bytes);
    num_alloc_retries += o.num_alloc_retries;
    num_ooms += o.num_ooms;
    oversize_allocations.merge(o.oversize_allocations);
    oversize_segments.merge(o.oversize_segments);
    num_sync_all_streams += o.num_sync_all_streams;
    num_device_alloc += o.num_device_alloc;
    num_device_free += o.num_device_free;
  }

  template <class F>
  void for_each_array(F&& f) {
    f("allocation", allocation);
    f("segment", segment);
    f("active", active);
    f("inactive_split", inactive_split);
    f("allocated_bytes", allocated_bytes);
    f("reserved_bytes", reserved_bytes);
    f("active_bytes", active_bytes);
    f("inactive_split_bytes", inactive_split_bytes);
    f("requested_bytes", requested_bytes);
  }
  void reset_peak() noexcept {
    for_each_array([](std::string_view, StatArray& a) {
      for (Stat& s : a) s.reset_peak();
    });
    oversize_allocations.reset_peak();
    oversize_segments.reset_peak();
  }
  void reset_accumulated() noexcept {
    for_each_array([](std::string_view, StatArray& a) {
      for (Stat& s : a) s.reset_accumulated();
    });
    oversize_allocations.reset_accumulated();
    oversize_segments.reset_accumulated();
    num_alloc_retries = num_ooms = num_sync_all_streams = 0;
    num_device_alloc = num_device_free = 0;
  }
};

// Note [Statistics by pool kind]
// The device pool updates its statistics on every allocation and free
// (fourteen of them on a free and reallocation of one size), so each update
// is kept small. A KindStat holds, per pool kind (small, large), only the
// current value, the peak and the total added; the aggregate's current value
// and totals are the kinds' sums, and "freed" is derived: the current value
// at the last reset of the totals, plus what was added since, minus the
// current value. Only the aggregate's peak cannot be derived, so each
// increase also compares it with the sum of the kinds' current values. A
// decrease is one subtraction. The figures are exactly those of a
// StatArray updated in full (stats() converts them).
struct KindStat {
  std::array<std::int64_t, 2> current{};    // small, large
  std::array<std::int64_t, 2> peak{};
  std::array<std::int64_t, 2> allocated{};  // added since the last reset of totals
  std::array<std::int64_t, 2> start{};      // current at the last reset of totals
  std::int64_t all_peak = 0;

  ACCELKIT_ALWAYS_INLINE void increase(bool small, std::int64_t n) noexcept {
    std::size_t k = small ? 0 : 1;
    current[k] += n;
    allocated[k] += n;
    // Branches, not conditional moves: in a steady state no new peak is
    // reached, so they are predicted and cost a compare each, where a
    // conditional move would chain each pair's updates to the next pair's
    // (bench/memory_bench.cpp's hit path). Where a figure wanders near its
    // peak (the inactive split bytes under random sizes), they mispredict.
    if (current[k] > peak[k]) peak[k] = current[k];
    std::int64_t all = current[0] + current[1];
    if (all > all_peak) all_peak = all;
  }
  ACCELKIT_ALWAYS_INLINE void decrease(bool small, std::int64_t n) noexcept {
    current[small ? 0 : 1] -= n;
  }
  std::int64_t total() const noexcept { return current[0] + current[1]; }
  void reset_peak() noexcept {
    peak = current;
    all_peak = total();
  }
  void reset_accumulated() noexcept {
    allocated = {0, 0};
    start = current;
  }
  // As a StatArray (aggregate, small pool, large pool).
  StatArray array() const noexcept {
    StatArray a;
    for (std::size_t k = 0; k < 2; ++k) {
      Stat& s = a[k + 1];
      s.current = current[k];
      s.peak = peak[k];
      s.allocated = allocated[k];
      s.freed = start[k] + allocated[k] - current[k];
    }
    a[0].current = a[1].current + a[2].current;
    a[0].peak = all_peak;
    a[0].allocated = a[1].allocated + a[2].allocated;
    a[0].freed = a[1].freed + a[2].freed;
    return a;
  }
};

// One device pool's statistics (one per pool, Note [Sharded statistics]),
// each array statistic kept by pool kind (Note [Statistics by pool kind]).
struct PoolStats {
  KindStat allocation, segment, active, inactive_split, allocated_bytes, reserved_bytes,
      active_bytes, inactive_split_bytes, requested_bytes;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  Stat oversize_allocations;
  Stat oversize_segments;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;

  template <class F>
  void for_each_kind_stat(F&& f) {
    for (KindStat* k : {&allocation, &segment, &active, &inactive_split, &allocated_bytes,
                        &reserved_bytes, &active_bytes, &inactive_split_bytes, &requested_bytes})
      f(*k);
  }
  void reset_peak() noexcept {
    for_each_kind_stat([](KindStat& k) { k.reset_peak(); });
    oversize_allocations.reset_peak();
    oversize_segments.reset_peak();
  }
  void reset_accumulated() noexcept {
    for_each_kind_stat([](KindStat& k) { k.reset_accumulated(); });
    oversize_allocations.reset_accumulated();
    oversize_segments.reset_accumulated();
    num_alloc_retries = num_ooms = num_sync_all_streams = 0;
    num_device_alloc = num_device_free = 0;
  }
  // In PyTorch's DeviceStats shape (max_split_size is the allocator's).
  DeviceStats device_stats() const noexcept {
    DeviceStats d;
    d.allocation = allocation.array();
    d.segment = segment.array();
    d.active = active.array();
    d.inactive_split = inactive_split.array();
    d.allocated_bytes = allocated_bytes.array();
    d.reserved_bytes = reserved_bytes.array();
    d.active_bytes = active_bytes.array();
    d.inactive_split_bytes = inactive_split_bytes.array();
    d.requested_bytes = requested_bytes.array();
    d.num_alloc_retries = num_alloc_retries;
    d.num_ooms = num_ooms;
    d.oversize_allocations = oversize_allocations;
    d.oversize_segments = oversize_segments;
    d.num_sync_all_streams = num_sync_all_streams;
    d.num_device_alloc = num_device_alloc;
    d.num_device_free = num_device_free;
    return d;
  }
};

// The flat "<stat>.<pool>.<metric>" dictionary of torch.cuda.memory_stats().
inline std::string to_json(DeviceStats s) {
  detail::JsonWriter w;
  w.begin_object();
  constexpr std::string_view pools[] = {"all", "small_pool", "large_pool"};
  s.for_each_array([&](std::string_view name, const StatArray& a) {
    for (std::size_t p = 0; p < a.size(); ++p) {
      std::string base = std::string(name) + "." + std::string(pools[p]) + ".";
      w.field(base + "current", a[p].current).field(base + "peak", a[p].peak);
      w.field(base + "allocated", a[p].allocated).field(base + "freed", a[p].freed);
    }
  });
  w.field("num_alloc_retries", s.num_alloc_retries).field("num_ooms", s.num_ooms);
  w.field("oversize_allocations.current", s.oversize_allocations.current);
  w.field("oversize_allocations.peak", s.oversize_allocations.peak);
  w.field("oversize_segments.current", s.oversize_segments.current);
  w.field("oversize_segments.peak", s.oversize_segments.peak);
  w.field("num_sync_all_streams", s.num_sync_all_streams);
  w.field("num_device_alloc", s.num_device_alloc).field("num_device_free", s.num_device_free);
  w.field("max_split_size", s.max_split_size);
  w.end_object();
  return w.str();
}

ACCELKIT_END_NAMESPACE
