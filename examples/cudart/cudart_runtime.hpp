// cudart: a backend over the CUDA runtime API (libcudart), written as a
// vendor would write one: over the runtime API only, linked dynamically, so
// that the library loads on a machine without the CUDA driver (libcuda) and
// reports no device there. Its device type is `cudart` ("cuda" is PyTorch's
// own).
//
// How the contract maps onto CUDA:
//   discovery       cudaGetDeviceCount, cudaGetDeviceProperties,
//                   cudaDeviceGetAttribute, cudaDriverGetVersion: no
//                   context. A failure (no driver: cudaErrorInsufficientDriver;
//                   no GPU: cudaErrorNoDevice) is a DriverError carrying
//                   CUDA's code, name and string: the SDK reports 0 devices
//                   and keeps it as the init error (Note [cudart discovery])
//   device memory   cudaMalloc / cudaFree. cudaFree synchronizes the device
//                   (CUDA's rule), which the contract does not need (the SDK
//                   never frees memory that queued work still uses, Note
//                   [Ordered release]) but which costs a device-wide wait per
//                   release: the SDK's caching pool keeps that off the hot path
//   pinned memory   cudaHostAlloc(cudaHostAllocPortable) with the device
//                   current, cudaFreeHost
//   streams         cudaStreamCreateWithPriority(cudaStreamNonBlocking): not
//                   ordered with the legacy default stream, which only the
//                   synchronous memcpy uses
//   events          cudaEventCreateWithFlags (cudaEventDisableTiming unless
//                   timing is asked), cudaEventRecord/Query/Synchronize,
//                   cudaEventElapsedTime; cudaStreamWaitEvent, across devices
//                   too
//   peer access     cudaDeviceCanAccessPeer; cudaDeviceEnablePeerAccess once
//                   per pair, at the first peer copy; cudaMemcpyPeerAsync
//   async errors    CUDA's own: a failure of queued work is returned by the
//                   next synchronizing or querying call (Note [cudart
//                   asynchronous errors])
//   host signals    a host function (cudaLaunchHostFunc) that blocks its
//                   stream until the host completes the signal (Note
//                   [cudart host signals])
//   graphs          stream capture: cudaStreamBeginCapture (the capture
//                   mode mapped to CUDA's: global, thread-local, relaxed),
//                   cudaStreamEndCapture, cudaStreamIsCapturing,
//                   cudaGraphInstantiate, cudaGraphLaunch,
//                   cudaGraphExecDestroy, cudaGraphDestroy; the backend's
//                   kernels, copies and fills on a capturing stream are
//                   CUDA's to record, and CUDA refuses (and invalidates the
//                   capture for) what the SDK would refuse too
//   inter-process   cudaIpcGetMemHandle, cudaIpcOpenMemHandle
//                   (cudaIpcMemLazyEnablePeerAccess), cudaIpcCloseMemHandle;
//                   events made with cudaEventInterprocess |
//                   cudaEventDisableTiming (EventFlags::interprocess),
//                   cudaIpcGetEventHandle, cudaIpcOpenEventHandle. CUDA's
//                   handles are 64 bytes, as the contract's. CUDA refuses a
//                   handle opened in the process that exported it ("invalid
//                   device context"), counts a second open of one handle in
//                   a process, and leaves memory used after its exporter
//                   freed it undefined (the SDK keeps it until every
//                   consumer has released it)
//
// Note [cudart discovery]
// Problem: discovery must not create a context (a context takes device
// memory and makes the process a user of the device), yet one property,
// the stream priority range, CUDA gives only through a context
// (cudaDeviceGetStreamPriorityRange creates the current device's).
// Decision: cudaGetDeviceCount, cudaGetDeviceProperties and
// cudaDeviceGetAttribute initialize the driver without a context.
// properties() asks the priority range only where the device's primary
// context is already active (cuDevicePrimaryCtxGetState, reached through
// cudaGetDriverEntryPointByVersion, so that libcuda is not linked);
// otherwise it reports CUDA's range of current drivers, 0 (least urgent) to
// -5 (most urgent), and says which in the extra
// "cudart.priority_range_source" ("queried" or "assumed").
// Limits: an assumed range may be wider than the device's; a priority
// outside the real range is clamped by cudaStreamCreateWithPriority, as CUDA
// documents, so it degrades to the nearest priority rather than failing. The
// driver's initialization starts threads, so discovery is not fork-safe
// (fork_safe_discovery is false: a child forked after it refuses device use,
// as CUDA itself would fail there).
//
// Note [cudart asynchronous errors]
// Problem: the contract reports a failure of queued work at a later call and
// expects the call after that to work again.
// Decision: CUDA returns such a failure (a kernel's illegal address, a launch
// failure) from the next call that synchronizes or queries, and the runtime
// turns it into a DriverError carrying CUDA's code. Errors of a call itself
// (an invalid argument, out of memory) are not sticky and are reported by
// that call only.
// Limits: most asynchronous errors are sticky in CUDA: the context is
// unusable afterwards and every later call of that device returns the same
// error until the process ends. No runtime over CUDA can give "the next call
// works again" (PyTorch's own CUDA backend has the same limit); the SDK's
// state stays consistent either way.
//
// Note [cudart host signals]
// Problem: a stream must wait for a flag the host sets (Note [Host signals]
// in accelkit's backend.hpp), and the runtime API has no such primitive
// (cuStreamWaitValue32 on a host-mapped word is the driver API, which this
// runtime does not link).
// Decision: the signal is the runtime's own (support/host_signals.hpp); a
// stream waits for it with a host function (cudaLaunchHostFunc) that blocks
// until the signal is completed, so the stream's later work starts after it.
// A host function may not call CUDA, so a signal completed with an error is
// kept by the runtime and thrown, once, by the device's next stream_query,
// stream_synchronize, event_query, event_synchronize or device_synchronize,
// as a DriverError carrying the signal's error. Destroying a signal not
// completed while host functions wait for it is refused; after completion
// the waiting host functions keep its state alive.
// Limits: a waiting host function holds CUDA's host-function thread, which
// the device's other host functions share.
#pragma once

#include <cuda_runtime_api.h>

#include <accelkit/accelkit.hpp>
#include <accelkit/support/host_signals.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>

namespace cudart {

// "cudaErrorInsufficientDriver (35): CUDA driver version is insufficient for
// CUDA runtime version".
inline std::string describe(cudaError_t e) {
  return fmt::format("{} ({}): {}", cudaGetErrorName(e), static_cast<int>(e),
                     cudaGetErrorString(e));
}

class CudaRuntime : public accelkit::Runtime<CudaRuntime> {
 public:
  static constexpr std::string_view name = "cudart";
  // The driver starts threads at its initialization (Note [cudart discovery]).
  static constexpr bool fork_safe_discovery = false;
  // Device memory is not host-visible, and the backend brings kernels of its
  // own (cudart_kernels.cu): no host kernels.
  static constexpr bool host_kernels = false;

  // ------------------------------------------------------------ contract

  int device_count() {
    int n = 0;
    check(cudaGetDeviceCount(&n), "device_count", "cudaGetDeviceCount");
    return n;
  }

  accelkit::DeviceProperties properties(int device) {
    cudaDeviceProp cp{};
    check(cudaGetDeviceProperties(&cp, device), "properties", "cudaGetDeviceProperties");
    accelkit::DeviceProperties p;
    p.name = cp.name;
    p.vendor = "NVIDIA";
    p.architecture = fmt::format("sm_{}{}", cp.major, cp.minor);
    p.uuid = accelkit::uuid_from_bytes(reinterpret_cast<const unsigned char*>(cp.uuid.bytes));
    p.pci_bus_id = fmt::format("{:04x}:{:02x}:{:02x}.0", cp.pciDomainID, cp.pciBusID,
                               cp.pciDeviceID);
    int driver = 0, runtime = 0;
    check(cudaDriverGetVersion(&driver), "properties", "cudaDriverGetVersion");
    check(cudaRuntimeGetVersion(&runtime), "properties", "cudaRuntimeGetVersion");
    p.driver_version = version_of(driver);
    p.runtime_version = version_of(runtime);
    p.total_memory = cp.totalGlobalMem;
    p.max_allocation = cp.totalGlobalMem;
    p.memory_alignment = 256;  // cudaMalloc's guarantee
    p.compute_units = cp.multiProcessorCount;
    p.subgroup_size = cp.warpSize;
    p.clock_rate_khz = attribute(cudaDevAttrClockRate, device);
    p.l2_cache_bytes = static_cast<std::uint64_t>(cp.l2CacheSize);
    p.dtypes = dtypes_of(cp.major, cp.minor);
    p.unified_memory = false;  // cudaMalloc's memory is not the host's
    p.host_access = accelkit::HostAccessLevel::none;  // the SDK copies around host code
    p.dlpack_device_type = accelkit::DLPackDeviceType::cuda;            // kDLCUDA
    p.dlpack_pinned_device_type = accelkit::DLPackDeviceType::cuda_host;  // cudaHostAlloc's: kDLCUDAHost
    bool queried = false;
    p.stream_priorities = priority_range(device, queried);
    p.async_copy_engines = cp.asyncEngineCount;
    p.extras.push_back({"cudart.compute_capability",
                        std::string(fmt::format("{}.{}", cp.major, cp.minor))});
    p.extras.push_back({"cudart.priority_range_source",
                        std::string(queried ? "queried" : "assumed")});
    p.extras.push_back({"cudart.integrated", cp.integrated != 0});
    p.extras.push_back({"cudart.memory_pools", cp.memoryPoolsSupported != 0});
    return p;
  }

  int get_device() {
    int d = 0;
    check(cudaGetDevice(&d), "get_device", "cudaGetDevice");
    return d;
  }
  // Makes the device's primary context (CUDA 12 and later create it here).
  void set_device(int device) { check(cudaSetDevice(device), "set_device", "cudaSetDevice"); }

  // nullptr when CUDA is out of memory (the error is not sticky; the SDK
  // tells exhaustion from refusal by the free memory).
  void* malloc(int device, std::size_t bytes) {
    Guard g(device, "malloc");
    void* p = nullptr;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // clears the last error this left
      return nullptr;
    }
    check(e, "malloc", "cudaMalloc");
    return p;
  }

  // cudaFree waits for all work of the device first (CUDA's rule): more than
  // the contract needs (Note [Ordered release]), and the reason the SDK's
  // caching pool matters here.
  void free(int device, void* ptr) {
    Guard g(device, "free");
    check(cudaFree(ptr), "free", "cudaFree");
  }

  // Portable pinned memory, allocated with `device` current.
  void* host_malloc(int device, std::size_t bytes) {
    Guard g(device, "host_malloc");
    void* p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    check(e, "host_malloc", "cudaHostAlloc");
    return p;
  }
  void host_free(int device, void* ptr) {
    Guard g(device, "host_free");
    check(cudaFreeHost(ptr), "host_free", "cudaFreeHost");
  }

  // cudaMemcpy runs on the legacy default stream, which the backend's
  // streams (non-blocking) are not ordered with: as the contract says.
  void memcpy(int device, void* dst, const void* src, std::size_t bytes,
              accelkit::CopyKind kind) {
    Guard g(device, "memcpy");
    check(cudaMemcpy(dst, src, bytes, kind_of(kind)), "memcpy", "cudaMemcpy");
  }

  // A pageable host side is consumed before cudaMemcpyAsync returns (CUDA's
  // documented behaviour: staged for host-to-device, synchronous for
  // device-to-host), as the contract asks; a pinned one may be read later.
  void memcpy_async(int device, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, accelkit::StreamHandle stream, bool host_pinned) {
    (void)device;
    (void)host_pinned;
    check(cudaMemcpyAsync(dst, src, bytes, kind_of(kind), cuda(stream)), "memcpy_async",
          "cudaMemcpyAsync");
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes,
                    accelkit::StreamHandle stream) {
    (void)device;
    check(cudaMemsetAsync(ptr, static_cast<unsigned char>(value), bytes, cuda(stream)),
          "memset_async", "cudaMemsetAsync");
  }

  accelkit::StreamHandle stream_create(int device, int priority) {
    Guard g(device, "stream_create");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, priority), "stream_create",
          "cudaStreamCreateWithPriority");
    return accelkit::StreamHandle::from_pointer(s);
  }
  // CUDA releases the stream once its work has completed.
  void stream_destroy(int device, accelkit::StreamHandle stream) {
    (void)device;
    check(cudaStreamDestroy(cuda(stream)), "stream_destroy", "cudaStreamDestroy");
  }
  bool stream_query(int device, accelkit::StreamHandle stream) {
    bool done = ready(cudaStreamQuery(cuda(stream)), "stream_query", "cudaStreamQuery");
    report_signal_error(device, "stream_query");
    return done;
  }
  void stream_synchronize(int device, accelkit::StreamHandle stream) {
    check(cudaStreamSynchronize(cuda(stream)), "stream_synchronize", "cudaStreamSynchronize");
    report_signal_error(device, "stream_synchronize");
  }
  // A never-recorded event is complete for CUDA: no wait, as the contract says.
  void stream_wait_event(int device, accelkit::StreamHandle stream, accelkit::EventHandle event) {
    (void)device;
    check(cudaStreamWaitEvent(cuda(stream), cuda(event), 0), "stream_wait_event",
          "cudaStreamWaitEvent");
  }

  accelkit::EventHandle event_create(int device, accelkit::EventFlags flags) {
    Guard g(device, "event_create");
    unsigned f = cudaEventDefault;
    if (!accelkit::has_flag(flags, accelkit::EventFlags::timing)) f |= cudaEventDisableTiming;
    if (accelkit::has_flag(flags, accelkit::EventFlags::blocking_sync)) f |= cudaEventBlockingSync;
    // CUDA requires cudaEventDisableTiming with it (the SDK never asks both).
    if (accelkit::has_flag(flags, accelkit::EventFlags::interprocess))
      f |= cudaEventInterprocess | cudaEventDisableTiming;
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, f), "event_create", "cudaEventCreateWithFlags");
    return accelkit::EventHandle::from_pointer(e);
  }
  void event_destroy(int device, accelkit::EventHandle event) {
    (void)device;
    check(cudaEventDestroy(cuda(event)), "event_destroy", "cudaEventDestroy");
  }
  void event_record(int device, accelkit::EventHandle event, accelkit::StreamHandle stream) {
    (void)device;
    check(cudaEventRecord(cuda(event), cuda(stream)), "event_record", "cudaEventRecord");
  }
  // True for a never-recorded event (CUDA's answer too).
  bool event_query(int device, accelkit::EventHandle event) {
    bool done = ready(cudaEventQuery(cuda(event)), "event_query", "cudaEventQuery");
    report_signal_error(device, "event_query");
    return done;
  }
  void event_synchronize(int device, accelkit::EventHandle event) {
    check(cudaEventSynchronize(cuda(event)), "event_synchronize", "cudaEventSynchronize");
    report_signal_error(device, "event_synchronize");
  }
  void device_synchronize(int device) {
    Guard g(device, "device_synchronize");
    check(cudaDeviceSynchronize(), "device_synchronize", "cudaDeviceSynchronize");
    report_signal_error(device, "device_synchronize");
  }

  // ------------------------------------------------------------ optional

  // Host signals (Note [cudart host signals]).
  accelkit::SignalHandle signal_create(int device) { return signals_.create(device); }
  void stream_wait_signal(int device, accelkit::StreamHandle stream, accelkit::SignalHandle signal) {
    std::shared_ptr<Signal> g = signals_.get(signal, "stream_wait_signal");
    signals_.check_stream_device(*g, device);
    if (!g->add_waiter()) return;  // completed with success: nothing to wait for
    auto* wait = new Wait{this, g};
    cudaError_t e = cudaLaunchHostFunc(cuda(stream), &Wait::run, wait);
    if (e != cudaSuccess) {
      delete wait;
      g->cancel_waiter();
    }
    check(e, "stream_wait_signal", "cudaLaunchHostFunc");
  }
  void signal_complete(int device, accelkit::SignalHandle signal, int error) {
    signals_.complete(signal, device, error);
  }
  // The waiting host functions keep a destroyed signal's state alive.
  void signal_destroy(int device, accelkit::SignalHandle signal) {
    signals_.destroy(signal, device);
  }

  accelkit::MemoryInfo memory_info(int device) {
    Guard g(device, "memory_info");
    std::size_t free = 0, total = 0;
    check(cudaMemGetInfo(&free, &total), "memory_info", "cudaMemGetInfo");
    return {free, total};
  }

  bool can_access_peer(int device, int peer) {
    int can = 0;
    check(cudaDeviceCanAccessPeer(&can, device, peer), "can_access_peer",
          "cudaDeviceCanAccessPeer");
    return can != 0;
  }

  // Peer access is enabled for the pair (both ways) at its first copy.
  void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                         std::size_t bytes, accelkit::StreamHandle stream) {
    enable_peer(src_device, dst_device);
    check(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, cuda(stream)),
          "memcpy_peer_async", "cudaMemcpyPeerAsync");
  }

  float event_elapsed_time(int device, accelkit::EventHandle start, accelkit::EventHandle end) {
    (void)device;
    float ms = 0;
    check(cudaEventElapsedTime(&ms, cuda(start), cuda(end)), "event_elapsed_time",
          "cudaEventElapsedTime");
    return ms;
  }

  // cudaStreamWaitEvent takes an event of another device and waits on the
  // device.
  void stream_wait_peer_event(int device, accelkit::StreamHandle stream, int event_device,
                              accelkit::EventHandle event) {
    (void)device;
    (void)event_device;
    check(cudaStreamWaitEvent(cuda(stream), cuda(event), 0), "stream_wait_peer_event",
          "cudaStreamWaitEvent");
  }

  // ------------------------------------------------------------- graphs
  // CUDA's stream capture, member for member. CUDA enforces the mode
  // itself as well as the SDK (Note [Capture rules]).

  void stream_begin_capture(int device, accelkit::StreamHandle stream,
                            accelkit::CaptureMode mode) {
    (void)device;
    check(cudaStreamBeginCapture(cuda(stream), capture_mode(mode)), "stream_begin_capture",
          "cudaStreamBeginCapture");
  }
  // An invalidated capture: cudaStreamEndCapture ends it and returns
  // cudaErrorStreamCaptureInvalidated with no graph (a DriverError here).
  accelkit::GraphHandle stream_end_capture(int device, accelkit::StreamHandle stream) {
    (void)device;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(cuda(stream), &graph);
    if (e != cudaSuccess && graph != nullptr) (void)cudaGraphDestroy(graph);
    check(e, "stream_end_capture", "cudaStreamEndCapture");
    return accelkit::GraphHandle::from_pointer(graph);
  }
  // An invalidated capture still counts as capturing until its end, as in
  // CUDA (cudaStreamCaptureStatusInvalidated).
  bool stream_is_capturing(int device, accelkit::StreamHandle stream) {
    (void)device;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    check(cudaStreamIsCapturing(cuda(stream), &status), "stream_is_capturing",
          "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }
  accelkit::GraphExecHandle graph_instantiate(int device, accelkit::GraphHandle graph) {
    Guard g(device, "graph_instantiate");
    cudaGraphExec_t exec = nullptr;
    check(cudaGraphInstantiate(&exec, cuda(graph), 0), "graph_instantiate",
          "cudaGraphInstantiate");
    return accelkit::GraphExecHandle::from_pointer(exec);
  }
  void graph_launch(int device, accelkit::GraphExecHandle exec, accelkit::StreamHandle stream) {
    (void)device;
    check(cudaGraphLaunch(cuda(exec), cuda(stream)), "graph_launch", "cudaGraphLaunch");
  }
  // CUDA lets queued launches of a destroyed exec complete.
  void graph_exec_destroy(int device, accelkit::GraphExecHandle exec) {
    (void)device;
    check(cudaGraphExecDestroy(cuda(exec)), "graph_exec_destroy", "cudaGraphExecDestroy");
  }
  void graph_destroy(int device, accelkit::GraphHandle graph) {
    (void)device;
    check(cudaGraphDestroy(cuda(graph)), "graph_destroy", "cudaGraphDestroy");
  }

  // ------------------------------------------------- inter-process memory
  // CUDA's legacy IPC, member for member (Note [Inter-process memory] in
  // accelkit's backend.hpp). cudaMalloc's memory only: the SDK exports the
  // base of a segment it got from malloc.

  accelkit::IpcMemHandle ipc_mem_export(int device, void* ptr) {
    Guard g(device, "ipc_mem_export");
    cudaIpcMemHandle_t h{};
    check(cudaIpcGetMemHandle(&h, ptr), "ipc_mem_export", "cudaIpcGetMemHandle");
    return bytes_of<accelkit::IpcMemHandle>(h);
  }
  // Peer access to another device's memory is enabled as needed
  // (cudaIpcMemLazyEnablePeerAccess).
  void* ipc_mem_open(int device, const accelkit::IpcMemHandle& handle) {
    Guard g(device, "ipc_mem_open");
    void* p = nullptr;
    check(cudaIpcOpenMemHandle(&p, cuda_of<cudaIpcMemHandle_t>(handle),
                               cudaIpcMemLazyEnablePeerAccess),
          "ipc_mem_open", "cudaIpcOpenMemHandle");
    return p;
  }
  void ipc_mem_close(int device, void* ptr) {
    Guard g(device, "ipc_mem_close");
    check(cudaIpcCloseMemHandle(ptr), "ipc_mem_close", "cudaIpcCloseMemHandle");
  }
  accelkit::IpcEventHandle ipc_event_export(int device, accelkit::EventHandle event) {
    Guard g(device, "ipc_event_export");
    cudaIpcEventHandle_t h{};
    check(cudaIpcGetEventHandle(&h, cuda(event)), "ipc_event_export", "cudaIpcGetEventHandle");
    return bytes_of<accelkit::IpcEventHandle>(h);
  }
  // An event of this process that CUDA keeps following the exporter's;
  // event_destroy (cudaEventDestroy) releases it.
  accelkit::EventHandle ipc_event_open(int device, const accelkit::IpcEventHandle& handle) {
    Guard g(device, "ipc_event_open");
    cudaEvent_t e = nullptr;
    check(cudaIpcOpenEventHandle(&e, cuda_of<cudaIpcEventHandle_t>(handle)), "ipc_event_open",
          "cudaIpcOpenEventHandle");
    return accelkit::EventHandle::from_pointer(e);
  }

  // CUDA's capture mode for the contract's.
  static cudaStreamCaptureMode capture_mode(accelkit::CaptureMode mode) noexcept {
    switch (mode) {
      case accelkit::CaptureMode::global: return cudaStreamCaptureModeGlobal;
      case accelkit::CaptureMode::per_thread: return cudaStreamCaptureModeThreadLocal;
      case accelkit::CaptureMode::relaxed: return cudaStreamCaptureModeRelaxed;
    }
    return cudaStreamCaptureModeGlobal;
  }

  // ------------------------------------------------ for kernels and tests

  static cudaStream_t cuda(accelkit::StreamHandle s) noexcept {
    return s.as_pointer<CUstream_st>();
  }
  static cudaEvent_t cuda(accelkit::EventHandle e) noexcept { return e.as_pointer<CUevent_st>(); }
  static cudaGraph_t cuda(accelkit::GraphHandle g) noexcept { return g.as_pointer<CUgraph_st>(); }
  static cudaGraphExec_t cuda(accelkit::GraphExecHandle x) noexcept {
    return x.as_pointer<CUgraphExec_st>();
  }
  // Throws a DriverError for a failed CUDA call (a kernel launch's status).
  static void check(cudaError_t e, const char* call, const char* fn) {
    if (e != cudaSuccess) driver_error(e, call, fmt::format("{} failed: {}", fn, describe(e)));
  }

  // Makes `device` current for the scope, as CUDA's allocation and creation
  // calls and kernel launches act on the current device (which another
  // library, PyTorch's CUDA backend among them, may have changed); restores
  // the caller's.
  struct Guard {
    int previous = -1;
    Guard(int device, const char* call) {
      check(cudaGetDevice(&previous), call, "cudaGetDevice");
      if (previous == device) previous = -1;
      else check(cudaSetDevice(device), call, "cudaSetDevice");
    }
    ~Guard() {
      if (previous >= 0) (void)cudaSetDevice(previous);
    }
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;
  };

 private:
  // cudaSuccess: true; cudaErrorNotReady (not an error, not recorded as
  // one): false; anything else: a DriverError.
  static bool ready(cudaError_t e, const char* call, const char* fn) {
    if (e == cudaErrorNotReady) return false;
    check(e, call, fn);
    return true;
  }

  // CUDA's IPC handles as the contract's 64 bytes, and back.
  template <class Handle, class Cuda>
  static Handle bytes_of(const Cuda& h) noexcept {
    static_assert(sizeof(Cuda) == sizeof(Handle{}.bytes), "CUDA's IPC handles are 64 bytes");
    Handle out;
    std::memcpy(out.bytes.data(), &h, sizeof h);
    return out;
  }
  template <class Cuda, class Handle>
  static Cuda cuda_of(const Handle& h) noexcept {
    static_assert(sizeof(Cuda) == sizeof(h.bytes), "CUDA's IPC handles are 64 bytes");
    Cuda out;
    std::memcpy(&out, h.bytes.data(), sizeof out);
    return out;
  }

  static cudaMemcpyKind kind_of(accelkit::CopyKind k) noexcept {
    switch (k) {
      case accelkit::CopyKind::host_to_device: return cudaMemcpyHostToDevice;
      case accelkit::CopyKind::device_to_host: return cudaMemcpyDeviceToHost;
      case accelkit::CopyKind::device_to_device: return cudaMemcpyDeviceToDevice;
    }
    return cudaMemcpyDefault;
  }

  static int attribute(cudaDeviceAttr a, int device) {
    int v = 0;
    check(cudaDeviceGetAttribute(&v, a, device), "properties", "cudaDeviceGetAttribute");
    return v;
  }

  // CUDA's versions are 1000 * major + 10 * minor (13000 is 13.0).
  static accelkit::Version version_of(int v) { return {v / 1000, (v % 1000) / 10, 0}; }


  // The element types the device computes natively, by compute capability:
  // half precision from 5.3, bfloat16 from 8.0, the OCP float8 formats from
  // 8.9, float8_e8m0fnu from 10.0. The fnuz float8 formats are AMD's.
  static accelkit::DTypeSet dtypes_of(int major, int minor) {
    using accelkit::DType;
    int cc = major * 10 + minor;
    accelkit::DTypeSet s{DType::float64, DType::float32,   DType::complex64, DType::complex128,
                         DType::int8,    DType::int16,     DType::int32,     DType::int64,
                         DType::uint8,   DType::uint16,    DType::uint32,    DType::uint64,
                         DType::bool_};
    if (cc >= 53) s.add(DType::float16).add(DType::complex32);
    if (cc >= 80) s.add(DType::bfloat16);
    if (cc >= 89) s.add(DType::float8_e4m3fn).add(DType::float8_e5m2);
    if (cc >= 100) s.add(DType::float8_e8m0fnu);
    return s;
  }

  // The range of the device's context when it is already active, CUDA's
  // usual range otherwise (Note [cudart discovery]).
  static accelkit::StreamPriorityRange priority_range(int device, bool& queried) {
    using GetState = int (*)(int, unsigned*, int*);  // cuDevicePrimaryCtxGetState
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    int active = 0;
    unsigned flags = 0;
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000,
                                         cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess && fn != nullptr &&
        reinterpret_cast<GetState>(fn)(device, &flags, &active) == 0 && active) {
      int previous = 0;
      int least = 0, greatest = 0;
      if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(device) == cudaSuccess) {
        cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
        (void)cudaSetDevice(previous);
        if (e == cudaSuccess) {
          queried = true;
          return {least, greatest};
        }
      }
    }
    (void)cudaGetLastError();
    queried = false;
    return {0, -5};
  }

  void enable_peer(int from, int to) {
    std::lock_guard<std::mutex> lock(peer_mutex_);
    for (auto [a, b] : {std::pair<int, int>{from, to}, std::pair<int, int>{to, from}}) {
      if (peer_enabled_.count({a, b})) continue;
      int can = 0;
      check(cudaDeviceCanAccessPeer(&can, a, b), "memcpy_peer_async", "cudaDeviceCanAccessPeer");
      if (can) {
        Guard g(a, "memcpy_peer_async");
        cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else check(e, "memcpy_peer_async", "cudaDeviceEnablePeerAccess");
      }
      peer_enabled_.insert({a, b});  // asked once: CUDA stages the copy where it cannot
    }
  }

  std::mutex peer_mutex_;
  std::set<std::pair<int, int>> peer_enabled_;

  // Host signals (Note [cudart host signals]).
  using Signal = accelkit::support::HostSignal<>;
  struct Wait {
    CudaRuntime* rt;
    std::shared_ptr<Signal> signal;
    // On CUDA's host-function thread: no CUDA call here.
    static void CUDART_CB run(void* p) {
      std::unique_ptr<Wait> w(static_cast<Wait*>(p));
      if (int error = w->signal->wait()) {
        std::lock_guard<std::mutex> lock(w->rt->signal_errors_mutex_);
        w->rt->signal_errors_.emplace(w->signal->device(), error);  // the first one is kept
      }
    }
  };
  // Throws, once, the error of a failed signal a stream of `device` waited for.
  void report_signal_error(int device, const char* call) {
    int error = 0;
    {
      std::lock_guard<std::mutex> lock(signal_errors_mutex_);
      auto it = signal_errors_.find(device);
      if (it == signal_errors_.end()) return;
      error = it->second;
      signal_errors_.erase(it);
    }
    driver_error(error, call,
                 fmt::format("asynchronous error of earlier work: a host signal a stream "
                             "waited for (stream_wait_signal) was completed with error {}",
                             error));
  }
  accelkit::support::HostSignalTable<> signals_{
      name, {cudaErrorInvalidResourceHandle, cudaErrorInvalidValue, cudaErrorInvalidValue,
             cudaErrorNotPermitted}};
  std::mutex signal_errors_mutex_;
  std::map<int, int> signal_errors_;  // device -> the error of a failed signal
};

}  // namespace cudart
