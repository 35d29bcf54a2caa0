// accelkit: stack frames for the caching pool's history
// (torch.<name>.memory._record_memory_history): a context gatherer over
// PyTorch's combined tracebacks, the symbolized frames a snapshot's JSON
// carries, and what the operators of the device module parse.
//
// Note [History frames]
// Problem: a memory snapshot is read by PyTorch's visualizer, which shows
// each allocation with the Python (and C++) frames that made it, as CUDA
// records them. The core pool is torch-free (memory/history.hpp): it calls
// a ContextGatherer on the allocating or freeing thread, outside its locks,
// and writes a snapshot's frames through a FramesWriter.
// Decision: the gatherer is CUDA's: torch::CapturedTraceback::gather(python,
// script, cpp) (torch/csrc/profiler/combined_traceback.h, in libtorch_cpu),
// python and script always, cpp where `stacks` is "all", kept as a
// TracebackContext. Python frames come from the unwinder torch_python
// registers when torch is imported (CapturedTraceback::addPythonUnwinder):
// it takes the GIL on a thread Python knows and gathers none on a thread it
// does not (nor in a process without Python), holding references to the
// code objects only (cheap; released without the GIL). Gathering is
// cheap, symbolizing is not: frames are resolved when a snapshot is
// written, all the snapshot's unique contexts in one torch::symbolize call
// (one addr2line pass for the C++ frames), then written innermost first,
// each {"filename", "line", "name"}, as CUDA's snapshot gives them.
// Taking the GIL where a thread holds a lock that the GIL's holder may
// wait for would deadlock: the pool gathers before its own locks, and the
// torch layer's one lock held across an allocation, a device generator's
// mutex during a CPU fallback (GeneratorLease in fallback.hpp), holds a
// PythonFramesOff for that time, so those allocations record C++ and
// TorchScript frames only.
// Limits: vendor code that allocates while holding a lock that a Python
// thread may wait for with the GIL held must do the same (PythonFramesOff).
// A thread Python does not know (a C++ worker) records no Python frames,
// as on CUDA. An out-of-memory observer is a C function (Python passes a
// ctypes callback, which takes the GIL itself); an out-of-memory inside a
// PythonFramesOff still calls it, so the hazard above remains there for a
// Python observer.
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/python_lock.hpp>
#include <accelkit/memory/history.hpp>

#include <torch/csrc/profiler/combined_traceback.h>
#include <torch/csrc/profiler/unwind/unwind.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// The frames gathered at an allocation or free (Note [History frames]).
struct TracebackContext final : HistoryContext {
  explicit TracebackContext(std::shared_ptr<torch::CapturedTraceback> t)
      : traceback(std::move(t)) {}
  std::shared_ptr<torch::CapturedTraceback> traceback;
};

// The gatherer of `stacks` "python" (cpp false) or "all" (cpp true). Never
// throws: a failure records no context.
inline ContextGatherer traceback_gatherer(bool cpp) {
  if (cpp) torch::unwind::unwind();  // warms the unwinder's caches, as CUDA does
  return [cpp]() -> std::shared_ptr<HistoryContext> {
    try {
      return std::make_shared<TracebackContext>(
          torch::CapturedTraceback::gather(python_frames_off == 0, /*script=*/true, cpp));
    } catch (...) {
      return nullptr;
    }
  };
}

// The symbolized frames of one snapshot's contexts, written as each
// "frames" value of its JSON (snapshot.hpp's FramesWriter).
class SnapshotFrames {
 public:
  explicit SnapshotFrames(const MemorySnapshot& s) {
    std::vector<torch::CapturedTraceback*> unique;
    auto add = [&](const std::shared_ptr<HistoryContext>& c) {
      const auto* t = dynamic_cast<const TracebackContext*>(c.get());
      if (t == nullptr || !t->traceback) return;
      if (index_.emplace(c.get(), unique.size()).second) unique.push_back(t->traceback.get());
    };
    for (const SegmentSnapshot& seg : s.segments) {
      add(seg.context);
      for (const BlockSnapshot& b : seg.blocks) add(b.context);
    }
    for (const TraceEntry& e : s.trace) add(e.context);
    if (!unique.empty()) symbolized_ = torch::symbolize(unique);
  }

  // The frames of `c` (an array, innermost first; [] for none).
  void write(detail::JsonWriter& w, const HistoryContext* c) const {
    w.begin_array();
    auto it = index_.find(c);
    if (it != index_.end()) {
      for (std::uint64_t f : symbolized_.tracebacks.at(it->second)) {
        const torch::unwind::Frame& frame = symbolized_.all_frames.at(f);
        w.begin_object()
            .field("filename", std::string_view(frame.filename))
            .field("line", frame.lineno)
            .field("name", std::string_view(frame.funcname))
            .end_object();
      }
    }
    w.end_array();
  }

  FramesWriter writer() const {
    return [this](detail::JsonWriter& w, const HistoryContext* c) { write(w, c); };
  }

 private:
  std::unordered_map<const HistoryContext*, std::size_t> index_;
  torch::SymbolizedTracebacks symbolized_;
};

// _record_memory_history's arguments as the core's HistoryOptions:
// ValueError naming the argument, the value and the choices.
struct HistoryArguments {
  template <class T, std::size_t N>
  static T choice(std::string_view argument, const std::optional<std::string>& value,
                  const std::pair<std::string_view, T> (&choices)[N], T none,
                  std::string_view listed) {
    if (!value) return none;
    for (const auto& c : choices)
      if (c.first == *value) return c.second;
    TORCH_CHECK_VALUE(false, backend_name(), ": _record_memory_history: ", argument, " must be ",
                      listed, ", got '", *value, "'");
    return none;
  }

  static TraceEntry::Action action(const std::string& name) {
    using A = TraceEntry::Action;
    for (A a : {A::alloc, A::free_requested, A::free_completed, A::segment_alloc,
                A::segment_free, A::segment_map, A::segment_unmap, A::oom, A::snapshot})
      if (to_string(a) == name) return a;
    TORCH_CHECK_VALUE(false, backend_name(),
                      ": _record_memory_history: skip_actions names an action that is not "
                      "recorded: '", name, "' (the actions: 'alloc', 'free_requested', "
                      "'free_completed', 'segment_alloc', 'segment_free', 'segment_map', "
                      "'segment_unmap', 'oom', 'snapshot')");
    return A::alloc;
  }

  static HistoryOptions parse(const std::optional<std::string>& enabled,
                              const std::optional<std::string>& context,
                              const std::string& stacks, int64_t max_entries,
                              bool clear_history, const std::vector<std::string>& skip_actions) {
    static constexpr std::pair<std::string_view, HistoryRecord> kEnabled[] = {
        {"state", HistoryRecord::state}, {"all", HistoryRecord::all}};
    static constexpr std::pair<std::string_view, HistoryContexts> kContexts[] = {
        {"state", HistoryContexts::state},
        {"alloc", HistoryContexts::alloc},
        {"all", HistoryContexts::all}};
    static constexpr std::pair<std::string_view, bool> kStacks[] = {{"python", false},
                                                                   {"all", true}};
    HistoryOptions o;
    o.enabled = choice("enabled", enabled, kEnabled, HistoryRecord::off, "None, 'state' or 'all'");
    o.context = choice("context", context, kContexts, HistoryContexts::none,
                       "None, 'state', 'alloc' or 'all'");
    bool cpp = choice("stacks", std::optional<std::string>(stacks), kStacks, false,
                      "'python' or 'all'");
    TORCH_CHECK_VALUE(max_entries >= 0, backend_name(),
                      ": _record_memory_history: max_entries must be 0 or more, got ",
                      max_entries);
    o.max_entries = static_cast<std::size_t>(max_entries);
    o.clear_history = clear_history;
    for (const std::string& name : skip_actions) o.skip_actions.push_back(action(name));
    if (o.enabled != HistoryRecord::off && o.context != HistoryContexts::none)
      o.gather = traceback_gatherer(cpp);
    return o;
  }
};

// An out-of-memory observer that Python passes as the address of a C
// function void(int64 device, int64 requested, int64 allocated, int64
// device_free) (a ctypes callback it keeps alive).
inline OomObserver oom_observer_at(int64_t address) {
  TORCH_CHECK_VALUE(address != 0, backend_name(),
                    ": attach_oom_observer: the observer's address is 0");
  using Fn = void (*)(int64_t, int64_t, int64_t, int64_t);
  auto fn = reinterpret_cast<Fn>(static_cast<std::uintptr_t>(address));
  return [fn](const OomInfo& i) {
    fn(static_cast<int64_t>(i.device), static_cast<int64_t>(i.requested),
       static_cast<int64_t>(i.allocated), static_cast<int64_t>(i.device_free));
  };
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
