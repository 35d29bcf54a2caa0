// accelkit: the backend's graphs as PyTorch's (at::GraphImplInterface, behind
// torch.accelerator.Graph and the device module's Graph/CUDAGraph): capture
// of the current stream into a graph whose allocations come from a private
// pool, replay, reset.
#pragma once

#include <accelkit/torch/capture.hpp>
#include <accelkit/torch/common.hpp>
#include <accelkit/torch/compat.hpp>
#include <accelkit/torch/device_work.hpp>
#include <accelkit/torch/errors.hpp>

#if ACCELKIT_TORCH_GRAPH_IMPL
#include <ATen/core/GraphImplInterface.h>
#endif
#include <ATen/record_function.h>

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Graphs through PyTorch]
// Problem: PyTorch 2.13 reaches a device type's graphs through
// at::GraphImplInterface, created by name from at::GraphImplRegistry under
// c10::DeviceTypeName(type, false) ("SIMDEV"); the graph's memory must come
// from a private pool of the caching allocator (Note [Private pools]) so
// that replays find it where the capture left it, and stays reserved until
// the graph is reset.
// Decision: one GraphImpl for every backend, registered under PrivateUse1's
// name as the module loads (REGISTER_GRAPH_IMPL stringizes its key, which
// is known only once the backend's name is registered, so the registry is
// called directly). As torch.cuda.CUDAGraph does:
//   capture_begin(pool, mode): the current device and its current stream
//     (the default stream refused); pool {0,0} is a new graph pool {n,0};
//     the device's allocator routes the allocations of that stream to the
//     pool (begin_allocate_to_pool, a use of it), then the stream begins
//     capturing (Default and Global: global, ThreadLocal: per_thread,
//     Relaxed: relaxed);
//   capture_end: the capture ends (an invalidated one raises, naming what
//     invalidated it; the route ends and the pool's use is dropped at once),
//     the route ends; instantiated unless keep_graph (the graph is then
//     destroyed, as CUDA's);
//   replay: instantiated first if need be; launched on the current stream
//     of the graph's device, each stream remembered;
//   reset: the streams replays ran on are waited for, then the executable
//     graph and the graph are destroyed and the pool's use dropped (its
//     memory goes back once no graph uses it: ordered after every queued
//     replay), and the pinned storages kept (Note [Captured pinned copies])
//     are let go. The destructor resets.
// A runtime without graph members refuses at capture_begin with the SDK's
// NotSupportedError naming the backend (a RuntimeError in Python).
// Debug mode records the ATen operators the capturing thread calls while it
// captures; debug_dump writes what the SDK knows of the graph as text.
// Limits: one stream per graph (no fork and join: Note [Capture rules]).
// Replays on several streams are ordered by the caller, as on CUDA.
// graph_pool_handle's ids ({n,0}) and user pools' ({0,n}) are the
// process's own counters (next_mempool_id). A PyTorch without
// GraphImplInterface (2.11) gets no GraphImpl (Note [PyTorch versions]); the
// pool operators work there too.

inline MempoolId from_c10(c10::MempoolId_t id) { return MempoolId{id.first, id.second}; }
inline c10::MempoolId_t to_c10(MempoolId id) { return c10::MempoolId_t{id.first, id.second}; }

// A new pool id: {n,0} for graphs (graph_pool_handle, a capture given
// {0,0}), {0,n} for user pools (MemPool), as CUDA numbers them.
inline MempoolId next_mempool_id(bool user_created) {
  static std::atomic<std::uint64_t> graphs{1}, users{1};
  if (user_created) return MempoolId{0, users.fetch_add(1, std::memory_order_relaxed)};
  return MempoolId{graphs.fetch_add(1, std::memory_order_relaxed), 0};
}

#if ACCELKIT_TORCH_GRAPH_IMPL
inline CaptureMode capture_mode(at::GraphCaptureMode m) {
  switch (m) {
    case at::GraphCaptureMode::ThreadLocal: return CaptureMode::per_thread;
    case at::GraphCaptureMode::Relaxed: return CaptureMode::relaxed;
    default: return CaptureMode::global;
  }
}

// The ATen operators the capturing thread calls, while a graph in debug
// mode captures (Note [Graphs through PyTorch]).
class OperatorRecorder {
 public:
  explicit OperatorRecorder(std::vector<std::string>& into) {
    {
      std::lock_guard<std::mutex> lock(mutex());
      into_ = &into;
      owner_ = std::this_thread::get_id();
    }
    handle_ = at::addGlobalCallback(
        at::RecordFunctionCallback(&OperatorRecorder::start).scopes({at::RecordScope::FUNCTION}));
  }
  ~OperatorRecorder() {
    at::removeCallback(handle_);
    std::lock_guard<std::mutex> lock(mutex());
    into_ = nullptr;
  }
  OperatorRecorder(const OperatorRecorder&) = delete;
  OperatorRecorder& operator=(const OperatorRecorder&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::unique_ptr<at::ObserverContext> start(const at::RecordFunction& fn) {
    std::lock_guard<std::mutex> lock(mutex());
    if (into_ && std::this_thread::get_id() == owner_) into_->emplace_back(fn.name());
    return nullptr;
  }
  // One recording at a time (debug aid): the latest graph's.
  static inline std::vector<std::string>* into_ = nullptr;
  static inline std::thread::id owner_{};
  at::CallbackHandle handle_;
};

struct GraphImpl final : at::GraphImplInterface {
  explicit GraphImpl(const at::GraphImplArgs& args) : keep_graph_(args.keep_graph) {}
  ~GraphImpl() override { reporting_failures([&] { reset_now(); }); }
  GraphImpl(const GraphImpl&) = delete;
  GraphImpl& operator=(const GraphImpl&) = delete;

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    translated([&] {
      TORCH_CHECK(state_ == State::empty, backend_name(),
                  ": capture_begin on a graph that holds a capture; reset() it first");
      BackendInterface& b = backend();
      device_index d = b.current_device();
      Stream s = b.current_stream(d);
      TORCH_CHECK(s.id != b.default_stream(d).id, backend_name(),
                  ": graphs cannot be captured on the default stream of device ", d,
                  "; capture on another stream (with torch.Stream(): ...)");
      if (!b.has_graphs()) {
        // The SDK's NotSupportedError, naming the backend, before any pool
        // is touched.
        b.stream_begin_capture(d, b.handle(s), capture_mode(mode));
      }
      StreamHandle h = b.handle(s);
      MempoolId id = pool.first == 0 && pool.second == 0 ? next_mempool_id(false) : from_c10(pool);
      b.device_begin_allocate_to_pool(d, id, [h](StreamHandle x) { return x == h; });
      try {
        b.stream_begin_capture(d, h, capture_mode(mode));
      } catch (...) {
        reporting_failures([&] { b.device_end_allocate_to_pool(d, id); });
        reporting_failures([&] { b.device_release_pool(d, id); });
        throw;
      }
      device_ = d;
      stream_ = s;
      handle_ = h;
      pool_ = id;
      mode_ = capture_mode(mode);
      state_ = State::capturing;
      CaptureKeeps::get().watch(d, h, &kept_);
      if (debug_) {
        operators_.clear();
        recorder_.emplace(operators_);
      }
    });
  }

  void capture_end() override {
    translated([&] {
      TORCH_CHECK(state_ == State::capturing, backend_name(),
                  ": capture_end without a capture_begin on this graph");
      BackendInterface& b = backend();
      recorder_.reset();
      CaptureKeeps::get().forget(device_, handle_);
      GraphHandle g{};
      try {
        g = b.stream_end_capture(device_, handle_);
      } catch (...) {
        // No graph: the pool's use is dropped now, the graph is empty again.
        reporting_failures([&] { b.device_end_allocate_to_pool(device_, pool_); });
        reporting_failures([&] { b.device_release_pool(device_, pool_); });
        kept_.clear();
        state_ = State::empty;
        throw;
      }
      graph_ = g;
      state_ = State::captured;
      b.device_end_allocate_to_pool(device_, pool_);
      if (!keep_graph_) instantiate_now();
    });
  }

  void instantiate() override {
    translated([&] { instantiate_now(); });
  }

  void replay() override {
    translated([&] {
      TORCH_CHECK(state_ == State::captured, backend_name(),
                  ": replay of a graph without a finished capture");
      if (!exec_) instantiate_now();
      BackendInterface& b = backend();
      Stream s = b.current_stream(device_);
      b.graph_launch(device_, *exec_, b.handle(s));
      note_device_work();
      bool known = false;
      for (const Stream& r : replay_streams_) known = known || r.id == s.id;
      if (!known) replay_streams_.push_back(s);
      ++replays_;
    });
  }

  void reset() override {
    translated([&] { reset_now(); });
  }

  c10::MempoolId_t pool() const override { return to_c10(pool_); }

  void enable_debug_mode() override { debug_ = true; }

  void debug_dump(const std::string& path) override {
    if (!debug_) {
      TORCH_WARN(backend_name(), ": graph debug_dump needs enable_debug_mode() before the "
                                 "capture; nothing written");
      return;
    }
    std::ofstream out(path);
    TORCH_CHECK(out, backend_name(), ": debug_dump cannot write ", path);
    out << dump();
    TORCH_CHECK(out.good(), backend_name(), ": debug_dump failed writing ", path);
  }

  // What the SDK knows of the graph, as text (debug_dump).
  std::string dump() const {
    static constexpr const char* states[] = {"empty", "capturing", "captured"};
    std::string s = fmt::format(
        "backend: {}\nstate: {}\ndevice: {}\nstream: {} (handle {:#x})\npool: ({}, {})\n"
        "mode: {}\nkeep_graph: {}\ngraph: {}\nexecutable: {}\nreplays: {}\n",
        backend_name(), states[static_cast<int>(state_)], device_, stream_.id, handle_.value,
        pool_.first, pool_.second, to_string(mode_), keep_graph_,
        graph_ ? fmt::format("{:#x}", graph_->value) : std::string("none"),
        exec_ ? fmt::format("{:#x}", exec_->value) : std::string("none"), replays_);
    s += "replay streams:";
    for (const Stream& r : replay_streams_) s += fmt::format(" {}", r.id);
    s += fmt::format("\npinned storages kept: {}\noperators captured: {}\n", kept_.size(),
                     operators_.size());
    for (const std::string& op : operators_) s += fmt::format("  {}\n", op);
    return s;
  }

 private:
  enum class State { empty, capturing, captured };

  void instantiate_now() {
    TORCH_CHECK(state_ == State::captured, backend_name(),
                ": instantiate of a graph without a finished capture");
    BackendInterface& b = backend();
    if (exec_) {
      b.graph_exec_destroy(device_, *exec_);
      exec_.reset();
    }
    TORCH_CHECK(graph_, backend_name(),
                ": instantiate of a graph whose captured graph was destroyed (keep_graph=False "
                "instantiates at capture_end)");
    exec_ = b.graph_instantiate(device_, *graph_);
    if (!keep_graph_) {
      GraphHandle g = *graph_;
      graph_.reset();
      b.graph_destroy(device_, g);
    }
  }

  // Waits for the replays, destroys what the runtime gave, drops the pool's
  // use and the kept storages; the graph is empty after, whatever failed
  // (the first failure is thrown).
  void reset_now() {
    if (state_ == State::empty) return;
    BackendInterface& b = backend();
    std::exception_ptr first;
    auto step = [&](auto&& f) {
      try {
        f();
      } catch (...) {
        if (!first) first = std::current_exception();
      }
    };
    if (state_ == State::capturing) {  // a capture abandoned: ended, its graph dropped
      recorder_.reset();
      CaptureKeeps::get().forget(device_, handle_);
      step([&] { graph_ = b.stream_end_capture(device_, handle_); });
      step([&] { b.device_end_allocate_to_pool(device_, pool_); });
    }
    for (const Stream& s : replay_streams_)
      step([&] { b.stream_synchronize(device_, b.handle(s)); });
    if (exec_) step([&] { b.graph_exec_destroy(device_, *exec_); });
    if (graph_) step([&] { b.graph_destroy(device_, *graph_); });
    step([&] { b.device_release_pool(device_, pool_); });
    exec_.reset();
    graph_.reset();
    replay_streams_.clear();
    kept_.clear();
    replays_ = 0;
    pool_ = MempoolId{};
    state_ = State::empty;
    if (first) std::rethrow_exception(first);
  }

  bool keep_graph_;
  bool debug_ = false;
  State state_ = State::empty;
  device_index device_ = 0;
  Stream stream_{};
  StreamHandle handle_{};
  MempoolId pool_{};
  CaptureMode mode_ = CaptureMode::global;
  std::optional<GraphHandle> graph_;
  std::optional<GraphExecHandle> exec_;
  std::vector<Stream> replay_streams_;
  std::vector<c10::Storage> kept_;  // Note [Captured pinned copies]
  std::uint64_t replays_ = 0;
  std::vector<std::string> operators_;
  std::optional<OperatorRecorder> recorder_;
};

#endif  // ACCELKIT_TORCH_GRAPH_IMPL

// Registers GraphImpl for the device type (Note [Graphs through PyTorch]);
// after the backend's name is registered.
inline void register_graph_impl() {
#if ACCELKIT_TORCH_GRAPH_IMPL
  std::string key = c10::DeviceTypeName(kDeviceType, /*lower_case=*/false);
  at::GraphImplRegistry()->Register(
      key, [](at::GraphImplArgs args) -> std::unique_ptr<at::GraphImplInterface> {
        return std::make_unique<GraphImpl>(args);
      });
#endif
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
