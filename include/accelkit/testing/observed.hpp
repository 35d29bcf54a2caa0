// accelkit: a vendor's runtime under observation, for the conformance kit.
//
// Note [Observing a runtime]
// Problem: some rules are about what the SDK and the runtime do to each
// other, not what one call returns: memory must not go back to the driver
// while queued work still uses it (OpenCL's clSVMFree takes it at once),
// and discovery must not start a device context.
// Decision: Observed<R> wraps R (Note [Wrapped runtimes]), counts every
// call by member, and after each queued copy or fill records a marker event
// of its own on that stream, remembering the device and pinned host ranges
// the work touches. A free (or host_free) of a range whose markers have not
// all completed is a violation, kept with the call that broke the rule. A
// driver error that a marker's query raises is thrown from the call that
// made the query, so no asynchronous error is lost to the observer.
// Work queued on a capturing stream is recorded, not run (Note [Capture
// rules]): its ranges are kept with the capture, then with its graph and
// execs, and each graph_launch gets one marker over all of them.
// Limits: an event record per queued operation: the kit is a test, not a
// benchmark. Only work queued through memcpy_async and memset_async (and
// graphs of it) is tracked; a vendor kernel's memory use is not seen.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/contract.hpp>
#include <accelkit/testing/wrap.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace testing {

namespace detail {
// The graph members, for a runtime that has them: each tells Self, which
// keeps the ranges captured work touches (Note [Observing a runtime]).
template <class Self, class R, bool = ::accelkit::detail::has_graphs<R>>
class ObservedGraphs : public Wrap<Self, R> {
 public:
  using Wrap<Self, R>::Wrap;
};
template <class Self, class R>
class ObservedGraphs<Self, R, true> : public Wrap<Self, R> {
 public:
  using Wrap<Self, R>::Wrap;
  void stream_begin_capture(device_index device, StreamHandle stream, CaptureMode mode) {
    self().note(Member::stream_begin_capture);
    this->inner().stream_begin_capture(device, stream, mode);
    self().capture_begun(device, stream);
  }
  GraphHandle stream_end_capture(device_index device, StreamHandle stream) {
    self().note(Member::stream_end_capture);
    GraphHandle g{};
    try {
      g = this->inner().stream_end_capture(device, stream);
    } catch (...) {
      self().capture_ended(device, stream, nullptr);
      throw;
    }
    self().capture_ended(device, stream, &g);
    return g;
  }
  GraphExecHandle graph_instantiate(device_index device, GraphHandle graph) {
    self().note(Member::graph_instantiate);
    GraphExecHandle e = this->inner().graph_instantiate(device, graph);
    self().instantiated(device, graph, e);
    return e;
  }
  void graph_launch(device_index device, GraphExecHandle exec, StreamHandle stream) {
    self().note(Member::graph_launch);
    this->inner().graph_launch(device, exec, stream);
    self().launched(device, exec, stream);
  }
  void graph_exec_destroy(device_index device, GraphExecHandle exec) {
    self().note(Member::graph_exec_destroy);
    this->inner().graph_exec_destroy(device, exec);
    self().exec_destroyed(device, exec);
  }
  void graph_destroy(device_index device, GraphHandle graph) {
    self().note(Member::graph_destroy);
    this->inner().graph_destroy(device, graph);
    self().graph_destroyed(device, graph);
  }

 private:
  Self& self() { return static_cast<Self&>(*this); }
};
}  // namespace detail

// Calls by member, read as a whole.
struct CallCounts {
  std::array<std::uint64_t, member_count> n{};
  std::uint64_t operator[](Member m) const noexcept { return n[static_cast<std::size_t>(m)]; }
  friend CallCounts operator-(CallCounts a, const CallCounts& b) noexcept {
    for (std::size_t i = 0; i < member_count; ++i) a.n[i] -= b.n[i];
    return a;
  }
};

template <class R>
class Observed : public detail::ObservedGraphs<Observed<R>, R> {
  using Base = detail::ObservedGraphs<Observed<R>, R>;
  friend Base;

 public:
  using Base::Base;
  ~Observed() {
    for (const Marker& m : markers_) {
      try {
        this->inner().event_destroy(m.device, m.event);
      } catch (...) {
        // Teardown: nothing to report to.
      }
    }
  }

  CallCounts calls() const noexcept {
    CallCounts c;
    for (std::size_t i = 0; i < member_count; ++i) c.n[i] = calls_[i].load();
    return c;
  }
  // The rules broken so far, one sentence each; taken (cleared) by the call.
  std::vector<std::string> take_violations() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(violations_, {});
  }

  // Counts a call (Note [Wrapped runtimes]: every forwarded member says
  // which it is; the members below, which do more, say it themselves).
  void note(Member m) noexcept { calls_[static_cast<std::size_t>(m)].fetch_add(1); }

  // ------------------------------------------------- the observed members
  void* malloc(device_index device, std::size_t bytes) {
    note(Member::malloc);
    void* p = this->inner().malloc(device, bytes);
    if (p) {
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[{device, p}] = bytes;
    }
    return p;
  }
  void free(device_index device, void* ptr) {
    note(Member::free);
    check_release(device, ptr, Side::device);
    this->inner().free(device, ptr);
  }
  void* host_malloc(device_index device, std::size_t bytes) {
    note(Member::host_malloc);
    void* p = this->inner().host_malloc(device, bytes);
    if (p) {
      std::lock_guard<std::mutex> lock(mutex_);
      host_sizes_[p] = bytes;
    }
    return p;
  }
  void host_free(device_index device, void* ptr) {
    note(Member::host_free);
    check_release(device, ptr, Side::host);
    this->inner().host_free(device, ptr);
  }
  void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                    CopyKind kind, StreamHandle stream, bool host_pinned) {
    note(Member::memcpy_async);
    this->inner().memcpy_async(device, dst, src, bytes, kind, stream, host_pinned);
    auto addr = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p); };
    Marker m{device, {}, stream, "memcpy_async", {}};
    switch (kind) {
      case CopyKind::host_to_device:
        m.ranges.push_back({addr(dst), bytes, Side::device});
        if (host_pinned) m.ranges.push_back({addr(src), bytes, Side::host});
        break;
      case CopyKind::device_to_host:
        m.ranges.push_back({addr(src), bytes, Side::device});
        if (host_pinned) m.ranges.push_back({addr(dst), bytes, Side::host});
        break;
      case CopyKind::device_to_device:
        m.ranges.push_back({addr(dst), bytes, Side::device});
        m.ranges.push_back({addr(src), bytes, Side::device});
        break;
    }
    mark(std::move(m));
  }
  void memset_async(device_index device, void* ptr, int value, std::size_t bytes,
                    StreamHandle stream) {
    note(Member::memset_async);
    this->inner().memset_async(device, ptr, value, bytes, stream);
    mark({device, {}, stream, "memset_async",
          {{reinterpret_cast<std::uintptr_t>(ptr), bytes, Side::device}}});
  }

 private:
  // Whose memory a range is: the device's, or pinned host memory.
  enum class Side { device, host };
  struct Range {
    std::uintptr_t begin;
    std::size_t bytes;
    Side side;
  };
  struct Marker {
    device_index device;
    EventHandle event;
    StreamHandle stream;
    const char* what;
    std::vector<Range> ranges;
  };

  // After queued work: a marker on its stream, and the completed markers
  // forgotten.
  void mark(Marker m) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto c = captures_.find({m.device, m.stream.value});
      if (c != captures_.end()) {  // recorded, not run: no event on a capturing stream
        c->second.insert(c->second.end(), m.ranges.begin(), m.ranges.end());
        return;
      }
    }
    m.event = this->inner().event_create(m.device, EventFlags::none);
    try {
      this->inner().event_record(m.device, m.event, m.stream);
    } catch (...) {
      this->inner().event_destroy(m.device, m.event);
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex_);
    markers_.push_back(std::move(m));
    if (markers_.size() >= 64) forget_completed();
  }
  // Under mutex_: drops the markers whose work completed.
  // A query that throws (an asynchronous error) keeps its marker and every
  // one not yet looked at, and is rethrown.
  void forget_completed() {
    std::size_t kept = 0, i = 0;
    try {
      for (; i < markers_.size(); ++i) {
        Marker& m = markers_[i];
        if (this->inner().event_query(m.device, m.event)) {
          this->inner().event_destroy(m.device, m.event);
          continue;
        }
        if (kept != i) markers_[kept] = std::move(m);
        ++kept;
      }
    } catch (...) {
      for (; i < markers_.size(); ++i, ++kept)
        if (kept != i) markers_[kept] = std::move(markers_[i]);
      markers_.resize(kept);
      throw;
    }
    markers_.resize(kept);
  }
  // Before a free: every marker over the range must have completed.
  void check_release(device_index device, void* ptr, Side side) {
    const bool host = side == Side::host;
    std::lock_guard<std::mutex> lock(mutex_);
    auto begin = reinterpret_cast<std::uintptr_t>(ptr);
    std::size_t bytes = 1;
    if (host) {
      auto it = host_sizes_.find(ptr);
      if (it != host_sizes_.end()) {
        bytes = it->second;
        host_sizes_.erase(it);
      }
    } else {
      auto it = sizes_.find({device, ptr});
      if (it != sizes_.end()) {
        bytes = it->second;
        sizes_.erase(it);
      }
    }
    for (const Marker& m : markers_) {
      if (!host && m.device != device) continue;
      for (const Range& r : m.ranges) {
        if (r.side != side || r.begin >= begin + bytes || begin >= r.begin + r.bytes) continue;
        try {
          if (this->inner().event_query(m.device, m.event)) continue;
        } catch (const DeviceLostError&) {
          continue;  // a lost device runs no more work (Note [Lost devices])
        }
        violations_.push_back(fmt::format(
            "{}({}, {}) ({} bytes) while queued work that uses that memory (a {} on stream "
            "{:#x} of device {}) had not completed",
            host ? "host_free" : "free", device, ptr, bytes, m.what, m.stream.value, m.device));
        return;
      }
    }
  }

  // The ranges of captured work (Note [Observing a runtime]), told by
  // detail::ObservedGraphs.
  void capture_begun(device_index device, StreamHandle stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    captures_[{device, stream.value}].clear();
  }
  void capture_ended(device_index device, StreamHandle stream, const GraphHandle* graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto c = captures_.find({device, stream.value});
    if (c == captures_.end()) return;
    if (graph) graphs_[{device, graph->value}] = std::move(c->second);
    captures_.erase(c);
  }
  void instantiated(device_index device, GraphHandle graph, GraphExecHandle exec) {
    std::lock_guard<std::mutex> lock(mutex_);
    execs_[{device, exec.value}] = graphs_[{device, graph.value}];
  }
  void launched(device_index device, GraphExecHandle exec, StreamHandle stream) {
    std::vector<Range> ranges;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ranges = execs_[{device, exec.value}];
    }
    mark({device, {}, stream, "graph_launch", std::move(ranges)});
  }
  void exec_destroyed(device_index device, GraphExecHandle exec) {
    std::lock_guard<std::mutex> lock(mutex_);
    execs_.erase({device, exec.value});
  }
  void graph_destroyed(device_index device, GraphHandle graph) {
    std::lock_guard<std::mutex> lock(mutex_);
    graphs_.erase({device, graph.value});
  }

  std::array<std::atomic<std::uint64_t>, member_count> calls_{};
  using Key = std::pair<device_index, std::uintptr_t>;
  std::map<Key, std::vector<Range>> captures_;  // by stream
  std::map<Key, std::vector<Range>> graphs_;
  std::map<Key, std::vector<Range>> execs_;
  std::mutex mutex_;
  std::vector<Marker> markers_;
  std::map<std::pair<device_index, void*>, std::size_t> sizes_;
  std::map<void*, std::size_t> host_sizes_;
  std::vector<std::string> violations_;
};

}  // namespace testing
ACCELKIT_END_NAMESPACE
