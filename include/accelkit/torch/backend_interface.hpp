// accelkit: the backend interface — what the torch adapters call on a
// runtime's core objects (Backend<R>, its streams, events, pools and host
// maps), as one abstract class, so that the adapters are plain code
// compiled once. Includes no PyTorch header.
//
// Note [Backend interface]
// Problem: the torch adapters (guard, allocators, hooks, ATen kernels, host
// kernels, CPU fallback, profiler, the torch.ops.<name> library) take most
// of a backend's compile time, and use the runtime R only through a few core
// objects; as templates on R they would be compiled again for each runtime.
// Decision: the adapters are plain code over BackendInterface, compiled
// once in the SDK's library sources (src/accelkit_torch_adapters.cpp, an
// object library each backend's module links). The members that forward to a core
// object are listed once, in the ACCELKIT_TORCH_*_MEMBERS lists below, one
// line each; the list declares the interface's pure virtual and
// BoundBackend<R> (torch/bound_backend.hpp) defines its override from the
// same line. ACCELKIT_REGISTER_BACKEND(R) (torch/register.hpp), in a unit
// that includes no PyTorch header, binds R: one backend per module, as
// PyTorch has one PrivateUse1 slot. Members whose forwarding is more than a
// call (events, host maps, the contract's constants, the [[noreturn]]
// capture_refuse) are written out in both classes.
// Limits: one indirect call per core member the adapters call (a handful
// per operator), no allocation and no lock. Everything in namespace
// torch_adapter is hidden (ACCELKIT_TORCH_NAMESPACE): two backends' modules
// in one process share no function-local static (GCC makes those
// STB_GNU_UNIQUE, unified across dlopen'ed libraries) and never call each
// other's adapters.
#pragma once

#include <accelkit/accelkit.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#define ACCELKIT_HIDDEN __attribute__((visibility("hidden")))
#else
#define ACCELKIT_HIDDEN
#endif
// Opens the adapters' namespace, hidden (Note [Backend interface]).
#define ACCELKIT_TORCH_NAMESPACE namespace torch_adapter ACCELKIT_HIDDEN

// The members that forward to one core object, one line each:
//   X(return type, interface name, core member, (parameters), (arguments), gil)
// gil: `held`, or `released` for a call that may block (Note [Blocking
// waits release the GIL]). Adding a member the adapters call is one line
// here (and the core member itself).

// Backend<R> (BoundBackend's backend_).
#define ACCELKIT_TORCH_BACKEND_MEMBERS(X)                                                      \
  X(int, device_count, device_count, (), (), held)                                            \
  X(bool, is_initialized, is_initialized, (), (), held)                                       \
  X(bool, in_bad_fork, in_bad_fork, (), (), held)                                             \
  X(void, lazy_init, lazy_init, (), (), held)                                                 \
  X(std::string, init_error, init_error, (), (), held)                                        \
  X(const Environment&, environment, environment, (), (), held)                               \
  X(void, check_visible, check_visible, (device_index d), (d), held)                          \
  X(int, physical, physical, (device_index d), (d), held)                                     \
  X(device_index, current_device, current_device, (), (), held)                               \
  X(void, set_device, set_device, (device_index d), (d), held)                                \
  X(void, set_device_deferred, set_device_deferred, (device_index d), (d), held)              \
  X(device_index, exchange_device, exchange_device, (device_index d), (d), held)              \
  X(const DeviceProperties&, properties, properties, (device_index d), (d), held)             \
  X(MemoryInfo, memory_info, memory_info, (device_index d), (d), held)                        \
  X(bool, can_access_peer, can_access_peer, (device_index d, device_index peer), (d, peer),   \
    held)                                                                                      \
  X(void, memset_async, memset_async,                                                         \
    (device_index d, void* ptr, int value, std::size_t bytes, StreamHandle stream),          \
    (d, ptr, value, bytes, stream), held)                                                      \
  X(void, memcpy_peer_async, memcpy_peer_async,                                               \
    (void* dst, device_index dst_device, const void* src, device_index src_device,            \
     std::size_t bytes, StreamHandle stream),                                                 \
    (dst, dst_device, src, src_device, bytes, stream), held)                                   \
  X(void, stream_synchronize, stream_synchronize, (device_index d, StreamHandle s), (d, s),   \
    released)                                                                                  \
  /* Note [Host signals] (device/backend.hpp) */                                              \
  X(SignalHandle, signal_create, signal_create, (device_index d), (d), held)                  \
  X(void, stream_wait_signal, stream_wait_signal,                                             \
    (device_index d, StreamHandle s, SignalHandle g), (d, s, g), held)                        \
  X(void, signal_complete, signal_complete,                                                   \
    (device_index d, SignalHandle g, int error, std::string reason),                          \
    (d, g, error, std::move(reason)), held)                                                   \
  X(void, signal_destroy, signal_destroy, (device_index d, SignalHandle g), (d, g), held)     \
  /* Note [Capture rules] (device/captures.hpp); torch/graph.hpp */                           \
  X(void, stream_begin_capture, stream_begin_capture,                                         \
    (device_index d, StreamHandle s, CaptureMode mode), (d, s, mode), held)                   \
  X(GraphHandle, stream_end_capture, stream_end_capture, (device_index d, StreamHandle s),    \
    (d, s), held)                                                                              \
  X(bool, stream_is_capturing, stream_is_capturing, (device_index d, StreamHandle s), (d, s), \
    held)                                                                                      \
  X(bool, capture_underway, capture_underway, (device_index d), (d), held)                    \
  X(GraphExecHandle, graph_instantiate, graph_instantiate, (device_index d, GraphHandle g),   \
    (d, g), held)                                                                              \
  X(void, graph_launch, graph_launch, (device_index d, GraphExecHandle e, StreamHandle s),    \
    (d, e, s), held)                                                                           \
  X(void, graph_exec_destroy, graph_exec_destroy, (device_index d, GraphExecHandle e), (d, e),\
    held)                                                                                      \
  X(void, graph_destroy, graph_destroy, (device_index d, GraphHandle g), (d, g), held)        \
  /* Note [Sharing device memory between processes] (torch/ipc.hpp) */                        \
  X(IpcMemHandle, ipc_mem_export, ipc_mem_export, (device_index d, void* base), (d, base),    \
    held)                                                                                      \
  X(void*, ipc_mem_open, ipc_mem_open, (device_index d, const IpcMemHandle& h), (d, h), held) \
  X(void, ipc_mem_close, ipc_mem_close, (device_index d, void* base), (d, base), held)        \
  X(IpcEventHandle, ipc_event_export, ipc_event_export, (device_index d, EventHandle e),      \
    (d, e), held)                                                                              \
  X(EventHandle, ipc_event_open, ipc_event_open, (device_index d, const IpcEventHandle& h),   \
    (d, h), held)                                                                              \
  /* driver events themselves, for the inter-process ones (not pooled) */                     \
  X(EventHandle, raw_event_create, event_create, (device_index d, EventFlags f), (d, f), held) \
  X(void, raw_event_destroy, event_destroy, (device_index d, EventHandle e), (d, e), held)     \
  X(void, raw_event_record, event_record, (device_index d, EventHandle e, StreamHandle s),    \
    (d, e, s), held)                                                                           \
  X(bool, raw_event_query, event_query, (device_index d, EventHandle e), (d, e), held)        \
  X(void, raw_event_synchronize, event_synchronize, (device_index d, EventHandle e), (d, e),  \
    released)                                                                                  \
  X(void, raw_stream_wait_event, stream_wait_event,                                           \
    (device_index d, StreamHandle s, EventHandle e), (d, s, e), held)

// Streams<R> (BoundBackend's streams_).
#define ACCELKIT_TORCH_STREAMS_MEMBERS(X)                                                      \
  X(PriorityRange, priority_range, priority_range, (device_index d), (d), held)       \
  X(Stream, default_stream, default_stream, (device_index d), (d), held)                      \
  X(Stream, pool_stream, pool_stream, (device_index d, int priority), (d, priority), held)    \
  X(Stream, create_stream, create_stream, (device_index d, int priority), (d, priority), held)\
  X(Stream, current_stream, current_stream, (device_index d), (d), held)                      \
  X(Stream, exchange_stream, exchange_stream, (const Stream& s), (s), held)                   \
  X(StreamHandle, handle, handle, (const Stream& s), (s), held)                               \
  X(StreamHandle, current_handle, current_handle, (device_index d), (d), held)                \
  X(bool, stream_query, query, (const Stream& s), (s), held)                                  \
  X(void, synchronize, synchronize, (const Stream& s), (s), released)                         \
  X(void, device_synchronize, device_synchronize, (device_index d), (d), released)

// CachingAllocator<R> (BoundBackend's device_memory()).
#define ACCELKIT_TORCH_POOL_MEMBERS(X)                                                         \
  X(void*, device_allocate, allocate, (device_index d, std::size_t bytes, StreamHandle s),    \
    (d, bytes, s), held)                                                                       \
  X(void*, device_try_allocate, try_allocate,                                                 \
    (device_index d, std::size_t bytes, StreamHandle s), (d, bytes, s), held)                 \
  X(void, device_record_stream, record_stream, (device_index d, void* ptr, StreamHandle s),   \
    (d, ptr, s), held)                                                                         \
  /* waits for the work that used cached blocks */                                            \
  X(void, device_empty_cache, empty_cache, (), (), released)

// DeviceCachingAllocator<R> of device d (device_memory().device(d)): the
// parameters start with `device_index d`, the arguments leave it out.
#define ACCELKIT_TORCH_DEVICE_POOL_MEMBERS(X)                                                  \
  X(void, device_deallocate, deallocate, (device_index d, void* ptr), (ptr), held)            \
  X(bool, device_contains, contains, (device_index d, const void* ptr), (ptr), held)          \
  X(DeviceStats, device_stats, stats, (device_index d), (), held)                             \
  X(MemorySnapshot, device_snapshot, snapshot, (device_index d), (), held)                    \
  /* history and out-of-memory observers (memory/history.hpp, Note [History frames]) */      \
  X(void, device_record_history, record_history, (device_index d, const HistoryOptions& o),   \
    (o), held)                                                                                 \
  X(void, device_attach_oom_observer, attach_oom_observer, (device_index d, OomObserver o),   \
    (std::move(o)), held)                                                                      \
  /* Note [Sharing device memory between processes] (torch/ipc.hpp) */                        \
  X(SegmentSpan, device_segment_of, segment_of, (device_index d, const void* p), (p), held)    \
  X(void, device_attach_reclaimer, attach_reclaimer,                                          \
    (device_index d, std::function<void()> f), (std::move(f)), held)                           \
  X(double, memory_fraction, memory_fraction, (device_index d), (), held)                     \
  X(void, set_memory_fraction, set_memory_fraction, (device_index d, double f), (f), held)    \
  X(void, device_reset_peak_stats, reset_peak_stats, (device_index d), (), held)              \
  X(void, device_reset_accumulated_stats, reset_accumulated_stats, (device_index d), (), held) \
  /* private pools (Note [Private pools], memory/caching_allocator.hpp) */                    \
  X(void, device_create_pool, create_pool, (device_index d, MempoolId id), (id), held)        \
  /* the last use's release waits for the pool's stream */                                    \
  X(void, device_release_pool, release_pool, (device_index d, MempoolId id), (id), released)  \
  X(int, device_pool_use_count, pool_use_count, (device_index d, MempoolId id), (id), held)   \
  X(std::vector<MempoolId>, device_pool_ids, pool_ids, (device_index d), (), held)             \
  X(void, device_begin_allocate_to_pool, begin_allocate_to_pool,                              \
    (device_index d, MempoolId id, std::function<bool(StreamHandle)> filter),                 \
    (id, std::move(filter)), held)                                                             \
  X(void, device_end_allocate_to_pool, end_allocate_to_pool, (device_index d, MempoolId id),  \
    (id), held)                                                                                \
  X(void, device_empty_cache_pool, empty_cache, (device_index d, MempoolId id), (id),         \
    released)                                                                                  \
  X(DeviceStats, device_pool_stats, stats, (device_index d, MempoolId id), (id), held)

// HostAllocator<R> (BoundBackend's host_memory()).
#define ACCELKIT_TORCH_HOST_POOL_MEMBERS(X)                                                    \
  X(void*, host_allocate, allocate, (device_index d, std::size_t bytes), (d, bytes), held)    \
  X(void, host_deallocate, deallocate, (void* ptr), (ptr), held)                              \
  X(bool, host_is_allocation, is_allocation, (const void* ptr), (ptr), held)                  \
  X(void, host_record_stream, record_stream, (void* ptr, device_index d, StreamHandle s),     \
    (ptr, d, s), held)                                                                         \
  X(void, host_empty_cache, empty_cache, (), (), released)                                    \
  X(HostStats, host_stats, stats, (), (), held)                                               \
  X(void, host_reset_peak_stats, reset_peak_stats, (), (), held)                              \
  X(void, host_reset_accumulated_stats, reset_accumulated_stats, (), (), held)

// Every list, for what treats them alike (the interface's declarations).
#define ACCELKIT_TORCH_ALL_MEMBERS(X) \
  ACCELKIT_TORCH_BACKEND_MEMBERS(X)   \
  ACCELKIT_TORCH_STREAMS_MEMBERS(X)   \
  ACCELKIT_TORCH_POOL_MEMBERS(X)      \
  ACCELKIT_TORCH_DEVICE_POOL_MEMBERS(X) \
  ACCELKIT_TORCH_HOST_POOL_MEMBERS(X)

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// A device's stream priorities, least and greatest (Streams<R>::priority_range).
using PriorityRange = std::pair<int, int>;

// One open host map (HostMaps<R>::Ticket, whose type differs per R).
struct HostMapTicket {
  device_index device = 0;
  char* base = nullptr;
  std::uint64_t id = 0;
};

// What the torch adapters call on the module's backend (Note [Backend
// interface]).
class BackendInterface {
 public:
  virtual ~BackendInterface() = default;

#define ACCELKIT_TORCH_DECLARE_(ret, name, member, params, args, gil) \
  virtual ret name params = 0;
  ACCELKIT_TORCH_ALL_MEMBERS(ACCELKIT_TORCH_DECLARE_)
#undef ACCELKIT_TORCH_DECLARE_

  // Backend<R>, more than a call.
  virtual void memcpy_async(device_index d, void* dst, const void* src, std::size_t bytes,
                            CopyKind kind, StreamHandle stream, bool host_pinned) = 0;
  virtual bool has_stream_signals() = 0;  // Backend<R>::has_stream_signals
  virtual bool has_graphs() = 0;          // Backend<R>::has_graphs
  virtual bool has_ipc_memory() = 0;      // Backend<R>::has_ipc_memory
  virtual bool has_ipc_events() = 0;      // Backend<R>::has_ipc_events
  // Backend<R>::capture_refuse: invalidates the capture of stream s, if it
  // is capturing, and throws RuntimeError "<what> cannot be captured ...".
  [[noreturn]] virtual void capture_refuse(device_index d, StreamHandle s,
                                           std::string_view what) = 0;
  virtual std::string report_json() = 0;
  virtual std::string report_text() = 0;
  // The contract members the runtime implements (torch.ops.<name>.runtime_members).
  virtual std::vector<std::string> runtime_members() = 0;

  // Event<R>, as an opaque object the interface creates and deletes.
  virtual void* event_create(EventFlags flags) = 0;
  virtual void event_delete(void* event) noexcept = 0;
  virtual void event_record(void* event, const Stream& s) = 0;
  virtual void event_block(void* event, const Stream& s) = 0;
  virtual bool event_query(void* event) = 0;
  virtual void event_synchronize(void* event) = 0;
  virtual float event_elapsed_time(void* start, void* end) = 0;

  // HostMaps<R>
  virtual HostMapTicket maps_acquire(device_index d, void* ptr, std::size_t bytes) = 0;
  virtual void maps_acquire_all(device_index d, std::vector<std::pair<void*, std::size_t>> ranges,
                                std::vector<HostMapTicket>& tickets) = 0;
  virtual void maps_release(const HostMapTicket& t) = 0;
  virtual void maps_forget(device_index d, void* ptr) = 0;
  virtual void* maps_host_ptr(device_index d, const void* p) = 0;
};

// The module's backend, defined by ACCELKIT_REGISTER_BACKEND(R): created on
// first use, never destroyed (PyTorch calls into it from static destructors).
BackendInterface& backend();
// R::name, a literal, without creating anything (the library registers the
// device name while the module loads).
std::string_view backend_name() noexcept;
// R::host_kernels (the contract's optional constant, default true), as the
// module loads.
bool backend_host_kernels() noexcept;

// An event of the backend's pools (Event<R>), owned.
class DeviceEvent {
 public:
  explicit DeviceEvent(EventFlags flags = EventFlags::none) : e_(backend().event_create(flags)) {}
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;
  ~DeviceEvent() { backend().event_delete(e_); }
  void record(const Stream& s) { backend().event_record(e_, s); }
  bool query() { return backend().event_query(e_); }
  void synchronize() { backend().event_synchronize(e_); }
  float elapsed_time(const DeviceEvent& end) { return backend().event_elapsed_time(e_, end.e_); }

 private:
  void* e_;
};

// Device d current on this thread for the guard's lifetime (DeviceGuard<R>).
class DeviceSwitch {
 public:
  explicit DeviceSwitch(device_index d) : previous_(backend().exchange_device(d)) {}
  DeviceSwitch(const DeviceSwitch&) = delete;
  DeviceSwitch& operator=(const DeviceSwitch&) = delete;
  ~DeviceSwitch() {
    try {
      backend().set_device_deferred(previous_);
    } catch (...) {
      // Only an invalid index throws; the previous device was valid.
    }
  }

 private:
  device_index previous_;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
