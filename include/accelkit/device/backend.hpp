// accelkit: Backend<R>, the SDK's core object for one runtime.
//
// Backend<R> owns the vendor's runtime instance and puts the standard
// behaviour around it: lazy thread-safe initialization, device discovery with
// <NAME>_VISIBLE_DEVICES, the thread-local current device, fork detection,
// validated and cached capability queries, and checked access to the raw
// driver operations (logical indices in, physical indices to the runtime).
// The torch adapters and the memory and stream layers are built on it.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/environment.hpp>
#include <accelkit/detail/fork.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/device/captures.hpp>
#include <accelkit/device/failed_waits.hpp>
#include <accelkit/device/lost_devices.hpp>
#include <accelkit/diagnostics.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/device/visibility.hpp>
#include <accelkit/error.hpp>
#include <accelkit/runtime.hpp>
#include <accelkit/support/host_signals.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unistd.h>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

template <class R>
class Backend {
  // Fires one static_assert per missing or mistyped member of R, here where a
  // backend is instantiated (Note [Contract diagnostics]).
  static_assert(sizeof(detail::check_contract<R>) > 0, "");

 public:
  using runtime_type = R;
  static constexpr std::string_view name = R::name;

  // A backend over a default-constructed runtime, reading the process
  // environment.
  Backend() : Backend(Environment::process()) {}
  // A backend over a runtime constructed from `args`, reading `env`.
  template <class... Args>
  explicit Backend(Environment env, Args&&... args)
      : runtime_(std::forward<Args>(args)...),
        env_(std::move(env)),
        id_(next_backend_id()) {}

  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  // The process-wide backend of R, created on first use and never destroyed
  // (PyTorch may call into it from static destructors of other libraries).
  static Backend& instance() {
    static_assert(std::is_default_constructible_v<R>,
                  "accelkit: Backend<R>::instance() needs a default-constructible runtime");
    static Backend* const backend = new Backend();
    return *backend;
  }

  R& runtime() noexcept { return runtime_; }
  // Where this backend reads its variables (<NAME>_VISIBLE_DEVICES,
  // <NAME>_ALLOC_CONF, ...).
  const Environment& environment() const noexcept { return env_; }

  // ---------------------------------------------------------------- discovery

  // Visible devices. Never throws and never initializes a device context:
  // it runs discovery (the runtime's device_count, and properties only to
  // match UUIDs in the visibility variable) once, and answers 0 when that
  // failed, keeping the reason for init_error(). Still answers in a forked
  // child (Note [Fork safety]).
  int device_count() noexcept {
    discover();
    return discovery_error_ ? 0 : static_cast<int>(visible_.size());
  }

  // Why device_count() is 0, or empty when discovery succeeded.
  std::string init_error() noexcept {
    discover();
    return discovery_message_;
  }

  // Physical ordinals of the visible devices, in logical order.
  std::vector<int> visible_devices() noexcept {
    discover();
    return discovery_error_ ? std::vector<int>{} : visible_;
  }

  bool is_initialized() const noexcept { return initialized_.load(std::memory_order_acquire); }

  // True in a child forked after this backend was initialized (Note [Fork
  // safety]): device use there raises.
  bool in_bad_fork() const noexcept {
    unsigned now = detail::fork_generation().load(std::memory_order_relaxed);
    return (is_initialized() && now != init_generation_) || forked_after_discovery(now);
  }

  // Initializes the backend on first call: discovery, then the runtime's
  // optional initialize(). Throws what discovery threw (on every call: like
  // CUDA, the visibility variable is read once), RuntimeError when no device
  // is visible, what initialize() threw (retried on the next call), and
  // RuntimeError in a child forked after initialization.
  void lazy_init() {
    if (initialized_.load(std::memory_order_acquire)) {
      if (detail::fork_generation().load(std::memory_order_relaxed) != init_generation_)
        throw_forked();
      return;
    }
    std::lock_guard<std::mutex> lock(init_mutex_);
    if (initialized_.load(std::memory_order_relaxed)) return;
    discover();
    if (forked_after_discovery(detail::fork_generation().load(std::memory_order_relaxed)))
      throw RuntimeError(
          name, fmt::format("cannot use {} in a process forked after {}'s device discovery (by "
                            "pid {}): its driver starts threads at discovery, which do not "
                            "survive fork() (fork_safe_discovery is false). Use the 'spawn' or "
                            "'forkserver' multiprocessing start method, or query {} devices only "
                            "in the child processes",
                            name, name, discovery_pid_, name));
    if (discovery_error_) std::rethrow_exception(discovery_error_);
    if (visible_.empty())
      throw RuntimeError(name, fmt::format("no {} device is visible ({}){}", name,
                                           physical_count_ == 0 ? "the driver reports 0 devices"
                                                                : "all are hidden",
                                           visibility_note()));
    if constexpr (detail::has_initialize<R>) runtime_.initialize();
    detail::install_fork_handler();
    init_generation_ = detail::fork_generation().load(std::memory_order_relaxed);
    init_pid_ = ::getpid();
    initialized_.store(true, std::memory_order_release);
  }

  // Throws IndexError unless `device` is a visible device; initializes.
  void check_device(device_index device) {
    lazy_init();
    check_index(device);
  }

  // The same check without initializing (discovery only): for questions
  // that must not create a context, as torch.manual_seed's seeding of every
  // device's generator must not.
  void check_visible(device_index device) {
    discover();
    check_index(device);
  }

  // The physical ordinal of a visible device.
  int physical(device_index device) {
    check_device(device);
    return visible_[static_cast<std::size_t>(device)];
  }

  // ------------------------------------------------------- current device

  // The calling thread's current device (0 until the thread sets one).
  // After a deferred switch that the driver refused, the driver's
  // set_device is tried again here first, and its error thrown (Note
  // [Deferred device switch]).
  device_index current_device() {
    lazy_init();
    if (tls_.owner != id_) return 0;
    if (tls_.stale) {
      runtime_.set_device(physical(tls_.device));
      tls_.stale = false;
    }
    return tls_.device;
  }

  // Makes `device` current for the calling thread; the runtime's set_device
  // is called only when the device changes. If it fails, nothing changes.
  void set_device(device_index device) {
    int phys = physical(device);
    if (tls_.owner == id_ && tls_.device == device && !tls_.stale) return;
    runtime_.set_device(phys);
    tls_.owner = id_;
    tls_.device = device;
    tls_.stale = false;
  }

  // Note [Deferred device switch]
  // Problem: PyTorch switches devices where nothing may throw: a device
  // guard's destructor (uncheckedSetDevice), the autograd engine's device
  // threads at start (where an exception ends the process).
  // Decision: there the switch cannot fail. The thread's current device
  // becomes `device` whatever the driver says; a driver failure is
  // reported (Note [Diagnostics]) and set_device is tried again by the
  // thread's next current_device(), which may throw.
  // Limits: only an invalid index throws here (IndexError, nothing
  // changed); until the retry, a vendor kernel that asks the driver for
  // its current device sees the old one.
  void set_device_deferred(device_index device) {
    int phys = physical(device);
    if (tls_.owner == id_ && tls_.device == device && !tls_.stale) return;
    bool stale = false;
    try {
      runtime_.set_device(phys);
    } catch (const std::exception& e) {
      stale = true;
      report(Severity::warning, name,
             fmt::format("switching this thread to device {} failed in the driver and is "
                         "tried again at its next device use: {}",
                         device, e.what()));
    }
    tls_.owner = id_;
    tls_.device = device;
    tls_.stale = stale;
  }

  // Sets `device` current and returns the previous current device.
  device_index exchange_device(device_index device) {
    device_index previous = current_device();
    set_device(device);
    return previous;
  }

  // -------------------------------------------------------- capabilities

  // The validated capability schema of a device, queried from the runtime
  // once and cached. A runtime whose properties are inconsistent gets a
  // ValueError listing every inconsistency, on every query.
  const DeviceProperties& properties(device_index device) {
    int phys = physical(device);
    return properties_.get(device, device_count(), [&] {
      auto p = std::make_unique<DeviceProperties>(runtime_.properties(phys));
      fill_unknown(*p, name, phys);
      validate_properties(*p, name, device);
      if constexpr (!detail::has_host_map<R> || !detail::has_host_unmap<R>) {
        if (p->host_access == HostAccessLevel::mapped)
          throw ValueError(name, fmt::format("device {} reports host_access mapped, but the "
                                             "runtime lacks host_map or host_unmap (Note [Host "
                                             "access levels])",
                                             device));
      }
      p->host_visible_memory = p->host_access == HostAccessLevel::direct;
      if constexpr (!detail::has_event_elapsed_time<R>) p->event_timing = false;
      return p;
    });
  }

  bool supports(device_index device, DType dtype) {
    return properties(device).dtypes.contains(dtype);
  }

  // A vendor extra of a device, typed: nullopt when absent; ValueError when
  // the key holds another type.
  template <class T>
  std::optional<T> extra(device_index device, std::string_view key) {
    try {
      return properties(device).template extra<T>(key);
    } catch (const ValueError& e) {
      if (!e.backend().empty()) throw;
      throw ValueError(name, fmt::format("device {}: {}", device, e.message()));
    }
  }

  // Live free and total memory of a device.
  MemoryInfo memory_info(device_index device) {
    int phys = physical(device);
    if constexpr (detail::has_memory_info<R>) {
      return observed(device, "memory_info", [&] { return runtime_.memory_info(phys); });
    } else {
      std::uint64_t total = properties(device).total_memory;
      std::uint64_t held = held_bytes_[static_cast<std::size_t>(device)].load();
      return MemoryInfo{held < total ? total - held : 0, total};
    }
  }

  // Whether `device` can access `peer`'s memory directly (always for itself).
  bool can_access_peer(device_index device, device_index peer) {
    int phys = physical(device);
    int peer_phys = physical(peer);
    if (device == peer) return true;
    if constexpr (detail::has_can_access_peer<R>)
      return runtime_.can_access_peer(phys, peer_phys);
    else
      return false;
  }

  // peer_access_matrix()[i][j] == can_access_peer(i, j).
  std::vector<std::vector<bool>> peer_access_matrix() {
    int n = device_count();
    std::vector<std::vector<bool>> m(static_cast<std::size_t>(n),
                                     std::vector<bool>(static_cast<std::size_t>(n)));
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        m[static_cast<std::size_t>(i)][static_cast<std::size_t>(j)] = can_access_peer(i, j);
    return m;
  }

  // ------------------------------------------------ raw driver operations
  // Checked pass-throughs to the runtime: logical device in, physical device
  // to the runtime, errors named. The caching allocator and the stream and
  // event pools are built on these; most code should use those instead.

  // Note [Memory alignment]
  // Problem: drivers align allocations differently (cudaMalloc: 256 B;
  // OpenCL's PoCL refuses more than 128 B), and the SDK and PyTorch's
  // kernels rely on aligned storage.
  // Decision: a runtime's malloc aligns to at least
  // properties().memory_alignment (256 B unless the runtime says
  // otherwise; any power of two from 128 B up), and the SDK refuses a
  // misaligned pointer loudly. The data of every storage the caching pool
  // hands out is aligned to min(memory_alignment, 512) B.
  // Limits: so at least 128 B on every backend (PyTorch's CPU tensors get
  // 64 B), and a tensor at a storage offset only as far as its offset
  // allows.
  //
  // Note [Refusal and exhaustion]
  // Problem: a driver's malloc answers nullptr both when the device is
  // full and when it refuses the request (an alignment or size it does
  // not serve, a limit of its own), which call for different remedies.
  // Decision: the free memory the device reports (memory_info, or its
  // default) tells them apart: nullptr with at least `bytes` free is a
  // refusal, a RuntimeError naming the backend, size, alignment and free
  // memory; with less free it is exhaustion, torch.OutOfMemoryError,
  // which the caching pool answers by returning its cache and trying
  // again.
  // Limits: as good as the free figure: the default counts only this
  // process's allocations, so another process's memory, or fragmentation,
  // makes exhaustion read as a refusal.

  // `bytes` of device memory straight from the driver. 0 bytes gives nullptr.
  // OutOfMemoryError when the request exceeds the device's maximum single
  // allocation or the driver has no memory left; RuntimeError when the
  // driver refuses with memory free, or gives memory not aligned as the
  // device declares (Note [Refusal and exhaustion], Note [Memory alignment]).
  void* raw_malloc(device_index device, std::size_t bytes) {
    int phys = physical(device);
    if (bytes == 0) return nullptr;
    const DeviceProperties& p = properties(device);
    if (bytes > p.max_allocation)
      throw OutOfMemoryError(
          name, fmt::format("cannot allocate {} bytes on {}:{}: the largest single allocation "
                            "on this device is {} bytes (capacity {} bytes)",
                            bytes, name, device, p.max_allocation, p.total_memory));
    void* ptr = work(device, "malloc", [&] { return runtime_.malloc(phys, bytes); });
    auto& held = held_bytes_[static_cast<std::size_t>(device)];
    if (ptr == nullptr) {
      MemoryInfo info = memory_info(device);
      if (info.free >= bytes)
        throw RuntimeError(
            name, fmt::format("the driver refused to allocate {} bytes aligned to {} B on {}:{} "
                              "although {} bytes are free (capacity {} bytes): a refusal, not "
                              "exhaustion (Note [Refusal and exhaustion])",
                              bytes, p.memory_alignment, name, device, info.free,
                              p.total_memory));
      throw OutOfMemoryError(
          name, fmt::format("out of memory allocating {} bytes on {}:{} (capacity {} bytes, {} "
                            "bytes held from the driver by this process, {} bytes free)",
                            bytes, name, device, p.total_memory, held.load(), info.free));
    }
    if (reinterpret_cast<std::uintptr_t>(ptr) % p.memory_alignment != 0) {
      // The message first: the pointer is not used after it is freed.
      std::string message = fmt::format("malloc({}, {}) returned {}, which is not aligned to the "
                                        "{} B that {}:{} declares (memory_alignment)",
                                        phys, bytes, ptr, p.memory_alignment, name, device);
      try {
        runtime_.free(phys, ptr);
      } catch (...) {
        // The pointer is reported below either way.
      }
      throw RuntimeError(name, message);
    }
    held.fetch_add(bytes);
    return ptr;
  }

  // Returns memory from raw_malloc(device, bytes).
  void raw_free(device_index device, void* ptr, std::size_t bytes) {
    if (ptr == nullptr) return;
    int phys = physical(device);
    release(device, "free", [&] { runtime_.free(phys, ptr); });
    held_bytes_[static_cast<std::size_t>(device)].fetch_sub(bytes);
  }

  // Whether `device` is lost (Note [Lost devices] in error.hpp): its first
  // DeviceLostError was kept, and work on it is refused.
  bool is_lost(device_index device) const { return lost_.lost(device); }
  // The loss of `device` (naming the device), if it is lost.
  std::optional<DeviceLostError> lost_error(device_index device) const {
    return lost_.first(device);
  }
  // Throws DeviceLostError refusing `call` when `device` is lost: for work
  // the SDK's callers start on the runtime directly (vendor kernels).
  void check_not_lost(device_index device, std::string_view call) const {
    lost_.check(device, call);
  }
  // Keeps `e`, a loss that a call of the runtime made outside Backend<R>
  // reported for `device`, and throws it (or the refusal naming the first
  // loss), as the SDK's own calls do.
  [[noreturn]] void device_lost(device_index device, const DeviceLostError& e,
                                std::string_view call) {
    lost_.report(device, e, call);
  }

  // Bytes currently held from the driver through raw_malloc and vm_create on
  // a device.
  std::uint64_t raw_bytes_held(device_index device) {
    check_device(device);
    return held_bytes_[static_cast<std::size_t>(device)].load();
  }

  // Note [Pinned copies]
  // Problem: an asynchronous copy may leave its host side in flight only
  // if that memory stays alive and untouched until the copy runs, and a
  // runtime cannot tell pinned from pageable memory without a record of
  // its host_malloc ranges.
  // Decision: memcpy_async's `host_pinned` says the host side is
  // host_malloc memory (the pinned pool's) that the SDK keeps alive and
  // untouched until the stream has passed the copy (Note [Pinned host
  // allocator]): the runtime may leave the copy in flight. Without it the
  // memory is pageable, and the copy must be done with it before
  // memcpy_async returns.
  // Limits: the claim is the SDK's word, which the runtime may trust;
  // simdev checks every claim and refuses a false one.
  // Note [Pinned memory per device]
  // Problem: pinned memory is allocated in a device's context (clSVMAlloc
  // needs one), yet CUDA programs pass one pinned buffer between copies
  // of different devices (a staging buffer), where a pageable copy would
  // wait on the host for work queued after it.
  // Decision: host_malloc and host_free name the device, and
  // HostAllocator caches per device and frees each block through its
  // device; a block serves async copies of every device, as CUDA's
  // portable pinned memory. pin_memory() naming no device pins for the
  // calling thread's current device, as CUDA does.
  // Limits: a runtime with one context per device must make its pinned
  // memory usable by the others (OpenCL: one context for the platform's
  // devices).

  // `bytes` of pinned host memory for `device` straight from the driver.
  void* raw_host_malloc(device_index device, std::size_t bytes) {
    int phys = physical(device);
    if (bytes == 0) return nullptr;
    void* ptr = work(device, "host_malloc", [&] { return runtime_.host_malloc(phys, bytes); });
    if (ptr == nullptr)
      throw OutOfMemoryError(name, fmt::format("out of pinned host memory allocating {} bytes "
                                               "for {}:{}",
                                               bytes, name, device));
    return ptr;
  }
  // Returns memory from raw_host_malloc(device, ·).
  void raw_host_free(device_index device, void* ptr) {
    if (ptr == nullptr) return;
    int phys = physical(device);
    release(device, "host_free", [&] { runtime_.host_free(phys, ptr); });
  }

  // Copies between two devices, ordered on `stream` of `src_device`; staged
  // through pinned host memory when the runtime has no memcpy_peer_async.
  void memcpy_peer_async(void* dst, device_index dst_device, const void* src,
                         device_index src_device, std::size_t bytes, StreamHandle stream) {
    int dst_phys = physical(dst_device);
    int src_phys = physical(src_device);
    if (bytes == 0) return;
    if constexpr (has_graphs) captures_.check_stream(src_device, stream, "memcpy_peer_async");
    lost_.check(dst_device, "memcpy_peer_async");
    work(src_device, "memcpy_peer_async", [&] {
      if constexpr (detail::has_memcpy_peer_async<R>) {
        runtime_.memcpy_peer_async(dst, dst_phys, src, src_phys, bytes, stream);
      } else {
        std::unique_ptr<void, HostDeleter> staging(raw_host_malloc(src_device, bytes),
                                                   HostDeleter{this, src_device});
        runtime_.stream_synchronize(src_phys, stream);
        runtime_.memcpy(src_phys, staging.get(), src, bytes, CopyKind::device_to_host);
        runtime_.memcpy(dst_phys, dst, staging.get(), bytes, CopyKind::host_to_device);
      }
    });
  }

  // Note [Cross-device waits]
  // Problem: as on CUDA, a stream may wait for an event recorded on
  // another device; not every driver can wait across devices.
  // Decision: the optional stream_wait_peer_event waits on the device,
  // tied to the record seen at the call. Without it the SDK waits on the
  // host, in event_synchronize(event_device, event): work the caller
  // queues afterwards, on any stream, starts after the captured work, and
  // an asynchronous error of that work is thrown to the caller of the
  // wait.
  // Limits: the host wait costs the calling thread's time, and never
  // returns in a program that means to release the captured work itself
  // after the wait (a host callback the awaited stream waits for).
  void stream_wait_peer_event(device_index device, StreamHandle stream, device_index event_device,
                              EventHandle event) {
    int phys = physical(device);
    int event_phys = physical(event_device);
    if (device == event_device)
      throw ValueError(name, fmt::format("stream_wait_peer_event: the event is of {}:{}, the "
                                         "waiting stream's own device (stream_wait_event waits "
                                         "for it)",
                                         name, device));
    if constexpr (has_graphs) captures_.check_stream(device, stream, "stream_wait_peer_event");
    lost_.check(event_device, "stream_wait_peer_event");
    work(device, "stream_wait_peer_event", [&] {
      if constexpr (detail::has_stream_wait_peer_event<R>)
        runtime_.stream_wait_peer_event(phys, stream, event_phys, event);
      else
        runtime_.event_synchronize(event_phys, event);
    });
  }

  // Note [Host signals]
  // Problem: a stream must be able to wait for work on host threads (a
  // collective on gloo's threads, a vendor library's own thread), as
  // CUDA's cuStreamWaitValue32 or OpenCL's user events allow.
  // Decision: four optional members, all or none: signal_create (not
  // completed); stream_wait_signal (later work on the stream waits, on
  // the device; returns at once); signal_complete (once, from any thread;
  // a nonzero error fails every waiting stream, as its asynchronous
  // error); signal_destroy (refuses, with a DriverError, a signal not
  // completed that a stream waits for). Through Backend<R> a failure is
  // the SDK's to report (Note [Failed waits]).
  // Limits: without the members the SDK's own signals (a
  // support::HostSignalTable) make the wait the calling thread's,
  // blocking until completion, so a caller that would complete the signal
  // itself must not wait so; has_stream_signals says which. The members'
  // full rules: docs/design/kit.md.
  static constexpr bool has_stream_signals = detail::has_stream_signals<R>;

  SignalHandle signal_create(device_index device) {
    int phys = physical(device);
    if constexpr (has_stream_signals) {
      return work(device, "signal_create", [&] { return runtime_.signal_create(phys); });
    } else {
      static_cast<void>(phys);
      return host_signals_.create(0);
    }
  }
  void stream_wait_signal(device_index device, StreamHandle stream, SignalHandle signal) {
    int phys = physical(device);
    if constexpr (has_graphs) captures_.check_stream(device, stream, "stream_wait_signal");
    if constexpr (has_stream_signals) {
      work(device, "stream_wait_signal", [&] { runtime_.stream_wait_signal(phys, stream, signal); });
      failed_waits_.waited(device, stream, signal);
    } else {
      static_cast<void>(phys), static_cast<void>(stream);
      auto g = host_signals_.get(signal, "stream_wait_signal");
      if (int error = g->add_waiter() ? g->wait() : 0)
        throw RuntimeError(name, fmt::format("stream_wait_signal: the signal was completed with "
                                             "error {} ({} waits for signals on the host: its "
                                             "runtime has no stream_wait_signal)",
                                             error, name));
    }
  }
  // `reason`: what failed, when `error` is not 0, for the streams that stay
  // failed (Note [Failed waits]).
  void signal_complete(device_index device, SignalHandle signal, int error,
                       std::string reason = {}) {
    int phys = physical(device);
    if constexpr (has_stream_signals) {
      // A failure is the SDK's to report, for as long as the signal lives
      // (Note [Failed waits]): marked before the runtime releases the
      // streams, so that no synchronize of them returns in between, and
      // the runtime's signal completed as a success, so that the runtime
      // reports nothing of it to another call, once.
      if (error != 0) failed_waits_.failed(device, signal, error, std::move(reason));
      release(device, "signal_complete", [&] { runtime_.signal_complete(phys, signal, 0); });
    } else {
      static_cast<void>(phys);
      host_signals_.complete(signal, 0, error);
    }
  }
  void signal_destroy(device_index device, SignalHandle signal) {
    int phys = physical(device);
    if constexpr (has_stream_signals) {
      // Forgotten before the runtime may hand the handle out again; kept
      // if the runtime refuses.
      auto kept = failed_waits_.take(device, signal);
      try {
        release(device, "signal_destroy", [&] { runtime_.signal_destroy(phys, signal); });
      } catch (...) {
        failed_waits_.restore(device, signal, std::move(kept));
        throw;
      }
    } else {
      static_cast<void>(phys);
      host_signals_.destroy(signal, 0);
    }
  }

  // ------------------------------------------------------------- graphs
  // Capture of a stream's work into a graph, and its replay, with the rules
  // of Note [Capture rules]: the SDK's registry of captures decides what is
  // refused during a capture, whatever the driver notices. Without the
  // seven graph members each call raises NotSupportedError naming the
  // backend, and no stream is ever capturing.
  static constexpr bool has_graphs = detail::has_graphs<R>;

  // Begins capturing `stream` in `mode`. RuntimeError if it is capturing
  // already (that capture goes on unharmed).
  void stream_begin_capture(device_index device, StreamHandle stream, CaptureMode mode) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      lost_.check(device, "stream_begin_capture");
      captures_.begin(device, stream, mode);
      try {
        work(device, "stream_begin_capture",
             [&] { runtime_.stream_begin_capture(phys, stream, mode); });
      } catch (...) {
        captures_.end(device, stream);
        throw;
      }
    } else {
      static_cast<void>(phys), static_cast<void>(stream), static_cast<void>(mode);
      throw_no_graphs("stream_begin_capture", device);
    }
  }

  // Ends the capture of `stream` and returns its graph. RuntimeError if the
  // stream is not capturing, or if the capture was invalidated (naming the
  // call that did it; the runtime's graph is destroyed). Either way the
  // stream is not capturing afterwards.
  GraphHandle stream_end_capture(device_index device, StreamHandle stream) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      if (!captures_.is_capturing(device, stream))
        throw RuntimeError(name, fmt::format("stream_end_capture: stream {:#x} of device {} is "
                                             "not capturing",
                                             stream.value, device));
      GraphHandle graph{};
      std::exception_ptr failed;
      try {
        graph = release(device, "stream_end_capture",
                        [&] { return runtime_.stream_end_capture(phys, stream); });
      } catch (...) {
        failed = std::current_exception();
      }
      // Forgotten after the runtime's end, so that the stream's calls stay
      // refused until the driver has ended its capture.
      std::optional<detail::Captures::Capture> c = captures_.end(device, stream);
      if (c && !c->invalidated.empty()) {
        if (!failed) {
          try {
            runtime_.graph_destroy(phys, graph);
          } catch (...) {
            // The invalidation is the error to report.
          }
        }
        throw RuntimeError(name, fmt::format("stream_end_capture: the capture of stream {:#x} "
                                             "of device {} (mode {}) was invalidated by {}; no "
                                             "graph was made, and the stream is no longer "
                                             "capturing",
                                             stream.value, device, to_string(c->mode),
                                             c->invalidated));
      }
      if (failed) std::rethrow_exception(failed);
      return graph;
    } else {
      static_cast<void>(phys), static_cast<void>(stream);
      throw_no_graphs("stream_end_capture", device);
    }
  }

  // Whether `stream` of `device` is capturing, as the SDK's registry says;
  // one relaxed load when no capture is underway. False without graphs.
  bool stream_is_capturing(device_index device, StreamHandle stream) const {
    if constexpr (has_graphs)
      return captures_.is_capturing(device, stream);
    else
      return static_cast<void>(device), static_cast<void>(stream), false;
  }

  // Whether any stream of `device` is capturing.
  bool capture_underway(device_index device) const noexcept {
    if constexpr (has_graphs)
      return captures_.underway(device);
    else
      return static_cast<void>(device), false;
  }

  GraphExecHandle graph_instantiate(device_index device, GraphHandle graph) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      return work(device, "graph_instantiate",
                  [&] { return runtime_.graph_instantiate(phys, graph); });
    } else {
      static_cast<void>(phys), static_cast<void>(graph);
      throw_no_graphs("graph_instantiate", device);
    }
  }

  // Enqueues the graph's work on `stream`; refused on a capturing stream
  // (that capture invalidated).
  void graph_launch(device_index device, GraphExecHandle exec, StreamHandle stream) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      captures_.check_stream(device, stream, "graph_launch");
      work(device, "graph_launch", [&] { runtime_.graph_launch(phys, exec, stream); });
    } else {
      static_cast<void>(phys), static_cast<void>(exec), static_cast<void>(stream);
      throw_no_graphs("graph_launch", device);
    }
  }

  // Launches already queued still complete.
  void graph_exec_destroy(device_index device, GraphExecHandle exec) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      release(device, "graph_exec_destroy", [&] { runtime_.graph_exec_destroy(phys, exec); });
    } else {
      static_cast<void>(phys), static_cast<void>(exec);
      throw_no_graphs("graph_exec_destroy", device);
    }
  }

  void graph_destroy(device_index device, GraphHandle graph) {
    int phys = physical(device);
    if constexpr (has_graphs) {
      release(device, "graph_destroy", [&] { runtime_.graph_destroy(phys, graph); });
    } else {
      static_cast<void>(phys), static_cast<void>(graph);
      throw_no_graphs("graph_destroy", device);
    }
  }

  // What the caller cannot capture (a host kernel, the CPU fallback, a copy
  // of pageable memory), met on `stream`: invalidates its capture, if it is
  // capturing, and throws RuntimeError "<what> cannot be captured into a
  // graph ...".
  [[noreturn]] void capture_refuse(device_index device, StreamHandle stream,
                                   std::string_view what) {
    captures_.refuse(device, stream, what);
  }

  // ------------------------------------------------------- virtual memory

  // Note [Virtual memory]
  // Problem: a pool that grows by whole allocations fragments: a request
  // larger than each free block of every segment needs a new segment, even
  // with enough memory free in all of them together. CUDA
  // (cuMemAddressReserve, cuMemCreate, cuMemMap) and Level Zero
  // (zeVirtualMemReserve, zePhysicalMemCreate, zeVirtualMemMap) let a pool
  // reserve addresses first and map memory into them page by page, so a
  // segment grows in place and gives whole pages back.
  // Decision: seven optional members, all or none (a runtime with some
  // but not all fails to compile): vm_granularity (the page size),
  // vm_reserve / vm_release (addresses only), vm_create / vm_destroy
  // (physical memory, counted in the device's capacity; a null handle
  // when there is no room, as malloc's nullptr), vm_map / vm_unmap (whole
  // pieces, inside a reservation; unmapping is refused while queued work
  // uses the range, as free is). These wrappers check what needs no
  // record of the driver's: the device index (IndexError), sizes and
  // addresses (nonzero, multiples of the granularity: ValueError naming
  // the backend and the value), that a handle is live physical memory this
  // backend created on that device and that vm_map maps all of it
  // (ValueError). They count created bytes with raw_malloc's (memory_info's
  // default, raw_bytes_held). Reservations, mapped pages and queued work
  // are the runtime's to check (DriverError).
  // Limits: the SDK waits for queued work before unmapping only in the
  // caching allocator (Note [Ordered release]); a caller of these wrappers
  // does its own waiting. Physical memory made by calling the runtime
  // directly is unknown here. has_virtual_memory() false: every wrapper
  // raises NotSupportedError naming the backend and the members.
  static constexpr bool has_virtual_memory() noexcept { return detail::has_virtual_memory<R>; }

  // The granularity of `device`'s virtual memory, queried once: RuntimeError
  // when the runtime's is not a power of two that is a multiple of the
  // device's memory_alignment.
  std::size_t vm_granularity(device_index device) {
    return vm_state(device, "vm_granularity").granularity;
  }

  // A range of `bytes` (a nonzero multiple of the granularity) of addresses
  // with no memory behind them; nullptr when the runtime has none left.
  void* vm_reserve(device_index device, std::size_t bytes) {
    VmState& vm = vm_state(device, "vm_reserve");
    check_vm_size(device, vm, bytes, "vm_reserve");
    if constexpr (has_virtual_memory()) {
      void* base =
          work(device, "vm_reserve", [&] { return runtime_.vm_reserve(physical(device), bytes); });
      if (base != nullptr && reinterpret_cast<std::uintptr_t>(base) % vm.granularity != 0) {
        std::string message = fmt::format("vm_reserve({}, {}) returned {}, which is not "
                                          "aligned to {}:{}'s granularity ({} bytes)",
                                          physical(device), bytes, base, name, device,
                                          vm.granularity);
        try {
          runtime_.vm_release(physical(device), base, bytes);
        } catch (...) {
          // The range is reported below either way.
        }
        throw RuntimeError(name, message);
      }
      return base;
    } else {
      return nullptr;
    }
  }

  // Gives back a whole range from vm_reserve, every page unmapped.
  void vm_release(device_index device, void* base, std::size_t bytes) {
    VmState& vm = vm_state(device, "vm_release");
    check_vm_address(device, vm, base, "vm_release");
    check_vm_size(device, vm, bytes, "vm_release");
    if constexpr (has_virtual_memory())
      release(device, "vm_release", [&] { runtime_.vm_release(physical(device), base, bytes); });
  }

  // `bytes` (a nonzero multiple of the granularity) of physical memory; a
  // null handle when the device has no room.
  PhysicalHandle vm_create(device_index device, std::size_t bytes) {
    VmState& vm = vm_state(device, "vm_create");
    check_vm_size(device, vm, bytes, "vm_create");
    if constexpr (has_virtual_memory()) {
      PhysicalHandle memory =
          work(device, "vm_create", [&] { return runtime_.vm_create(physical(device), bytes); });
      if (!memory) return memory;
      bool fresh;
      {
        std::lock_guard<std::mutex> lock(vm.mutex);
        fresh = vm.sizes.emplace(memory.value, bytes).second;
      }
      if (!fresh)
        throw RuntimeError(name, fmt::format("vm_create({}, {}) returned handle {:#x}, which is "
                                             "live physical memory of {}:{} already",
                                             physical(device), bytes, memory.value, name,
                                             device));
      held_bytes_[static_cast<std::size_t>(device)].fetch_add(bytes);
      return memory;
    } else {
      return PhysicalHandle{};
    }
  }

  // Frees physical memory from vm_create(device, ·) that is mapped nowhere;
  // ValueError for a handle that is not live physical memory of `device`.
  void vm_destroy(device_index device, PhysicalHandle memory) {
    VmState& vm = vm_state(device, "vm_destroy");
    std::size_t bytes = take_physical(device, vm, memory, "vm_destroy");
    if constexpr (has_virtual_memory()) {
      try {
        release(device, "vm_destroy", [&] { runtime_.vm_destroy(physical(device), memory); });
      } catch (...) {
        std::lock_guard<std::mutex> lock(vm.mutex);
        vm.sizes.emplace(memory.value, bytes);
        throw;
      }
    }
    held_bytes_[static_cast<std::size_t>(device)].fetch_sub(bytes);
  }

  // Maps all of `memory` (`bytes`, its size at vm_create) at `at`, inside a
  // reserved range, on pages not mapped yet.
  void vm_map(device_index device, void* at, std::size_t bytes, PhysicalHandle memory) {
    VmState& vm = vm_state(device, "vm_map");
    check_vm_address(device, vm, at, "vm_map");
    check_vm_size(device, vm, bytes, "vm_map");
    std::size_t size = physical_size(device, vm, memory, "vm_map");
    if (size != bytes)
      throw ValueError(name, fmt::format("vm_map: {} bytes at {} on {}:{}, but physical memory "
                                         "{:#x} is {} bytes long (vm_map maps all of it)",
                                         bytes, at, name, device, memory.value, size));
    if constexpr (has_virtual_memory())
      work(device, "vm_map", [&] { runtime_.vm_map(physical(device), at, bytes, memory); });
  }

  // Unmaps whole mapped pieces; refused while queued work uses them.
  void vm_unmap(device_index device, void* at, std::size_t bytes) {
    VmState& vm = vm_state(device, "vm_unmap");
    check_vm_address(device, vm, at, "vm_unmap");
    check_vm_size(device, vm, bytes, "vm_unmap");
    if constexpr (has_virtual_memory())
      release(device, "vm_unmap", [&] { runtime_.vm_unmap(physical(device), at, bytes); });
  }

  // ------------------------------------------------- inter-process memory

  // Note [Inter-process memory]
  // Problem: processes hand tensors to each other (torch.multiprocessing
  // queues, a trainer's weights to a rollout engine) and must not copy them
  // through the host: CUDA (cudaIpcGetMemHandle, cudaIpcOpenMemHandle,
  // cudaIpcCloseMemHandle, cudaIpcGetEventHandle, cudaIpcOpenEventHandle)
  // and Level Zero (zeMemGetIpcHandle, zeMemOpenIpcHandle) name an
  // allocation, or an event, to another process in a few opaque bytes.
  // Decision: two optional groups, each all or none (some but not all fails
  // to compile). Memory: ipc_mem_export names the whole allocation starting
  // at a malloc pointer in an IpcMemHandle (64 bytes, the runtime's to
  // fill); ipc_mem_open, in another process, maps it and returns its base
  // there; ipc_mem_close unmaps it, the exporter's memory untouched. What
  // opened memory holds once the exporter freed it or exited is the
  // runtime's (CUDA leaves it undefined; simdev keeps the pages until the
  // last close): the layer above frees no memory another process holds.
  // Events, which need the memory group: ipc_event_export names an event
  // created with EventFlags::interprocess; ipc_event_open gives an event of
  // this process standing for it, which stream_wait_event, event_query and
  // event_synchronize follow (the exporter's last record as of the call),
  // never recorded here; an exporter that exits with that record
  // incomplete makes them fail with DriverError, never hang. These wrappers
  // check the device index (IndexError), null pointers and events given
  // (ValueError), and what the runtime returns (RuntimeError for a null or
  // misaligned base, a null event); what a handle names, whether it is
  // open, and an event's flags are the runtime's to check (DriverError,
  // passed on). Without a group each of its wrappers raises
  // NotSupportedError naming the backend and the missing members.
  // Limits: a handle is opened at most once per process at a time (the
  // layer above keeps one mapping per handle); the wrappers keep no record
  // of what was exported or opened, nor count opened memory in
  // raw_bytes_held (it is the exporter's). Without the event group the
  // producer's stream is synchronized before a handle is sent.
  static constexpr bool has_ipc_memory = detail::has_ipc_memory<R>;
  static constexpr bool has_ipc_events = detail::has_ipc_events<R>;

  // A handle naming the whole allocation that starts at `base`, from
  // raw_malloc(device, ·).
  IpcMemHandle ipc_mem_export(device_index device, void* base) {
    int phys = physical(device);
    if constexpr (has_ipc_memory) {
      if (base == nullptr)
        throw ValueError(name, fmt::format("ipc_mem_export: a null pointer on {}:{} names no "
                                           "allocation",
                                           name, device));
      return work(device, "ipc_mem_export", [&] { return runtime_.ipc_mem_export(phys, base); });
    } else {
      static_cast<void>(phys), static_cast<void>(base);
      throw_no_ipc_memory("ipc_mem_export", device);
    }
  }

  // Maps the allocation `handle` names, exported by another process, and
  // returns its base in this process.
  void* ipc_mem_open(device_index device, const IpcMemHandle& handle) {
    int phys = physical(device);
    if constexpr (has_ipc_memory) {
      void* base = work(device, "ipc_mem_open", [&] { return runtime_.ipc_mem_open(phys, handle); });
      std::size_t alignment = properties(device).memory_alignment;
      if (base == nullptr || reinterpret_cast<std::uintptr_t>(base) % alignment != 0) {
        std::string message = fmt::format("ipc_mem_open({}, ·) returned {}, which is {} the {} B "
                                          "that {}:{} declares (memory_alignment)",
                                          phys, base, base ? "not aligned to" : "null, not",
                                          alignment, name, device);
        if (base != nullptr) {
          try {
            runtime_.ipc_mem_close(phys, base);
          } catch (...) {
            // The pointer is reported below either way.
          }
        }
        throw RuntimeError(name, message);
      }
      return base;
    } else {
      static_cast<void>(phys), static_cast<void>(handle);
      throw_no_ipc_memory("ipc_mem_open", device);
    }
  }

  // Unmaps what ipc_mem_open(device, ·) returned.
  void ipc_mem_close(device_index device, void* base) {
    int phys = physical(device);
    if constexpr (has_ipc_memory) {
      if (base == nullptr)
        throw ValueError(name, fmt::format("ipc_mem_close: a null pointer on {}:{} was not "
                                           "opened by ipc_mem_open",
                                           name, device));
      release(device, "ipc_mem_close", [&] { runtime_.ipc_mem_close(phys, base); });
    } else {
      static_cast<void>(phys), static_cast<void>(base);
      throw_no_ipc_memory("ipc_mem_close", device);
    }
  }

  // A handle naming `event`, created with EventFlags::interprocess.
  IpcEventHandle ipc_event_export(device_index device, EventHandle event) {
    int phys = physical(device);
    if constexpr (has_ipc_events) {
      if (!event)
        throw ValueError(name, fmt::format("ipc_event_export: the null event handle on {}:{} "
                                           "names no event",
                                           name, device));
      return work(device, "ipc_event_export",
                  [&] { return runtime_.ipc_event_export(phys, event); });
    } else {
      static_cast<void>(phys), static_cast<void>(event);
      throw_no_ipc_events("ipc_event_export", device);
    }
  }

  // An event of this process standing for the exporter's (released by
  // event_destroy; never recorded).
  EventHandle ipc_event_open(device_index device, const IpcEventHandle& handle) {
    int phys = physical(device);
    if constexpr (has_ipc_events) {
      EventHandle event =
          work(device, "ipc_event_open", [&] { return runtime_.ipc_event_open(phys, handle); });
      if (!event)
        throw RuntimeError(name, fmt::format("ipc_event_open({}, ·) returned the null event "
                                             "handle",
                                             phys));
      return event;
    } else {
      static_cast<void>(phys), static_cast<void>(handle);
      throw_no_ipc_events("ipc_event_open", device);
    }
  }

  // The pass-throughs, generated from the contract table (Note [The
  // contract table]): one function per member marked `forward`, with the
  // member's own signature, calling the runtime with the device's physical
  // ordinal; `forward_nonempty` ones call nothing for 0 bytes. Which members
  // they are is said once, by the `forward` entries of the table
  // (memcpy_async, stream_query, event_record, ...).
#define ACCELKIT_DETAIL_FORWARD_sdk(member, Ret, params, args)
#define ACCELKIT_DETAIL_FORWARD_forward(member, Ret, params, args)              \
  Ret member params {                                                           \
    return forward(detail::call_##member{}, ACCELKIT_DETAIL_UNPAREN_ args);      \
  }
#define ACCELKIT_DETAIL_FORWARD_forward_nonempty(member, Ret, params, args)     \
  Ret member params {                                                           \
    if (bytes == 0) return static_cast<void>(physical(device));                 \
    return forward(detail::call_##member{}, ACCELKIT_DETAIL_UNPAREN_ args);      \
  }
#define ACCELKIT_DETAIL_FORWARD_(member, Ret, params, how, args) \
  ACCELKIT_DETAIL_FORWARD_##how(member, Ret, params, args)
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_FORWARD_)
#undef ACCELKIT_DETAIL_FORWARD_
#undef ACCELKIT_DETAIL_FORWARD_sdk
#undef ACCELKIT_DETAIL_FORWARD_forward
#undef ACCELKIT_DETAIL_FORWARD_forward_nonempty

  // Opens and ends the host's access to device memory of a device whose
  // host_access is mapped (Note [Host access levels]); HostMaps<R>
  // (device/host_maps.hpp) counts the maps, so most code uses that.
  // host_map returns the host address of the byte at ptr (the runtime's
  // nullptr is a RuntimeError naming the range). NotSupportedError for a
  // runtime without the members.
  void* host_map(device_index device, void* ptr, std::size_t bytes) {
    int phys = physical(device);
    if constexpr (detail::has_host_map<R>) {
      void* host = runtime_.host_map(phys, ptr, bytes);
      if (host == nullptr)
        throw RuntimeError(name, fmt::format("device {}: host_map of {} bytes at {} returned no "
                                             "host address",
                                             device, bytes, ptr));
      return host;
    } else {
      static_cast<void>(phys), static_cast<void>(ptr), static_cast<void>(bytes);
      throw NotSupportedError(name, fmt::format("{}:{} has no host_map", name, device));
    }
  }
  void host_unmap(device_index device, void* ptr, std::size_t bytes) {
    int phys = physical(device);
    if constexpr (detail::has_host_unmap<R>) {
      runtime_.host_unmap(phys, ptr, bytes);
    } else {
      static_cast<void>(phys), static_cast<void>(ptr), static_cast<void>(bytes);
      throw NotSupportedError(name, fmt::format("{}:{} has no host_unmap", name, device));
    }
  }

  // Milliseconds between two recorded timing events. NotSupportedError when
  // the backend or device has no event timing.
  float event_elapsed_time(device_index device, EventHandle start, EventHandle end) {
    int phys = physical(device);
    if constexpr (detail::has_event_elapsed_time<R>) {
      if (properties(device).event_timing)
        return work(device, "event_elapsed_time",
                    [&] { return runtime_.event_elapsed_time(phys, start, end); });
    }
    throw NotSupportedError(
        name, fmt::format("{}:{} does not support event timing (event_elapsed_time); check "
                          "properties().event_timing",
                          name, device));
  }

 private:
  // Calls a member of the runtime with `device` mapped to its physical
  // ordinal (validated first).
  // Synchronizing and querying a stream, or synchronizing its device, then
  // throw a failure that stays (Note [Failed waits]); a destroyed stream is
  // forgotten.
  // Releases are called on a lost device too; everything else forwarded is
  // work (Note [Lost devices]).
  template <class Caller, class... A>
  decltype(auto) forward(Caller call, device_index device, A&&... a) {
    if constexpr (std::is_same_v<Caller, detail::call_stream_destroy> ||
                  std::is_same_v<Caller, detail::call_event_destroy>)
      return release(device, Caller::name, [&]() -> decltype(auto) {
        return forward_checked(call, device, std::forward<A>(a)...);
      });
    else
      return work(device, Caller::name, [&]() -> decltype(auto) {
        return forward_checked(call, device, std::forward<A>(a)...);
      });
  }

  template <class Caller, class... A>
  decltype(auto) forward_checked(Caller call, device_index device, A&&... a) {
    int phys = physical(device);
    if constexpr (has_graphs) check_capture(call, device, a...);
    if constexpr (std::is_same_v<Caller, detail::call_stream_destroy>) {
      if constexpr (has_stream_signals) failed_waits_.forget_stream(device, a...);
    }
    if constexpr (has_stream_signals && (std::is_same_v<Caller, detail::call_stream_synchronize> ||
                                         std::is_same_v<Caller, detail::call_stream_query> ||
                                         std::is_same_v<Caller, detail::call_device_synchronize>)) {
      // Checked after the call: a failure may come while it waits.
      using Ret = decltype(call(runtime_, phys, std::forward<A>(a)...));
      if constexpr (std::is_void_v<Ret>) {
        call(runtime_, phys, a...);
        failed_waits_.check(device, a..., Caller::name);
        return;
      } else {
        Ret r = call(runtime_, phys, a...);
        failed_waits_.check(device, a..., Caller::name);
        return r;
      }
    } else {
      return call(runtime_, phys, std::forward<A>(a)...);
    }
  }

  // Runs f, a call of the runtime that runs work on `device` (Note [Lost
  // devices]): refused when the device is lost; a loss that f reports is
  // kept, and thrown once naming the device.
  template <class F>
  decltype(auto) work(device_index device, std::string_view call, F&& f) {
    lost_.check(device, call);
    try {
      return f();
    } catch (const DeviceLostError& e) {
      lost_.report(device, e, call);
    }
  }
  // Runs f, a release or a query, also on a lost device; a loss it reports
  // is kept.
  template <class F>
  decltype(auto) release(device_index device, std::string_view call, F&& f) {
    try {
      return f();
    } catch (const DeviceLostError& e) {
      lost_.report(device, e, call, true);
    }
  }
  template <class F>
  decltype(auto) observed(device_index device, std::string_view call, F&& f) {
    return release(device, call, std::forward<F>(f));
  }

  // The checks of Note [Capture rules] for the forwarded members, before
  // the runtime is called; one relaxed load when no capture is underway.
  template <class Caller, class... A>
  void check_capture(Caller, device_index device, const A&... a) {
    if (!captures_.any()) return;
    auto args = std::forward_as_tuple(a...);
    if constexpr (std::is_same_v<Caller, detail::call_stream_synchronize> ||
                  std::is_same_v<Caller, detail::call_stream_query> ||
                  std::is_same_v<Caller, detail::call_stream_wait_event> ||
                  std::is_same_v<Caller, detail::call_stream_destroy>) {
      captures_.check_stream(device, std::get<0>(args), Caller::name);
    } else if constexpr (std::is_same_v<Caller, detail::call_event_record>) {
      captures_.check_stream(device, std::get<1>(args), Caller::name);
    } else if constexpr (std::is_same_v<Caller, detail::call_memcpy_async>) {
      // (dst, src, bytes, kind, stream, host_pinned)
      if (!std::get<5>(args) && std::get<3>(args) != CopyKind::device_to_device)
        captures_.check_stream(device, std::get<4>(args), "memcpy_async of pageable host memory");
    } else if constexpr (std::is_same_v<Caller, detail::call_device_synchronize>) {
      captures_.check_device(device, Caller::name);
    } else if constexpr (std::is_same_v<Caller, detail::call_event_query> ||
                         std::is_same_v<Caller, detail::call_event_synchronize> ||
                         std::is_same_v<Caller, detail::call_memcpy>) {
      captures_.check_blocking(device, Caller::name);
    }
    static_cast<void>(args);
  }

  // A device's virtual memory: its granularity and the sizes of its live
  // physical memory (Note [Virtual memory]).
  struct VmState {
    std::size_t granularity = 0;
    std::mutex mutex;
    std::unordered_map<std::uintptr_t, std::size_t> sizes;  // handle value -> bytes
  };

  // Device `device`'s VmState (validating the index); NotSupportedError
  // without the members.
  VmState& vm_state(device_index device, std::string_view call) {
    int phys = physical(device);
    if constexpr (!has_virtual_memory()) {
      static_cast<void>(phys);
      throw NotSupportedError(
          name, fmt::format("{} on device {}: its runtime has no virtual memory (vm_granularity, "
                            "vm_reserve, vm_release, vm_create, vm_destroy, vm_map and "
                            "vm_unmap)",
                            call, device));
    } else {
      return vm_.get(device, device_count(), [&] {
        auto vm = std::make_unique<VmState>();
        std::size_t g =
            observed(device, "vm_granularity", [&] { return runtime_.vm_granularity(phys); });
        std::size_t alignment = properties(device).memory_alignment;
        if (g == 0 || (g & (g - 1)) != 0 || g % alignment != 0)
          throw RuntimeError(name, fmt::format("vm_granularity({}) returned {}, which is not a "
                                               "power of two that is a multiple of {}:{}'s "
                                               "memory_alignment ({} B)",
                                               phys, g, name, device, alignment));
        vm->granularity = g;
        return vm;
      });
    }
  }

  void check_vm_size(device_index device, const VmState& vm, std::size_t bytes,
                     std::string_view call) const {
    if (bytes != 0 && bytes % vm.granularity == 0) return;
    throw ValueError(name, fmt::format("{}: {} bytes is not a positive multiple of {}:{}'s "
                                       "virtual memory granularity ({} bytes)",
                                       call, bytes, name, device, vm.granularity));
  }

  void check_vm_address(device_index device, const VmState& vm, const void* at,
                        std::string_view call) const {
    if (at != nullptr && reinterpret_cast<std::uintptr_t>(at) % vm.granularity == 0) return;
    throw ValueError(name, fmt::format("{}: address {} is {} {}:{}'s virtual memory granularity "
                                       "({} bytes)",
                                       call, at, at == nullptr ? "null, not a multiple of" :
                                                                 "not aligned to",
                                       name, device, vm.granularity));
  }

  [[noreturn]] void throw_unknown_physical(device_index device, PhysicalHandle memory,
                                           std::string_view call) const {
    throw ValueError(name, fmt::format("{}: handle {:#x} is not live physical memory of {}:{} "
                                       "(not from vm_create on this device, or destroyed)",
                                       call, memory.value, name, device));
  }

  std::size_t physical_size(device_index device, VmState& vm, PhysicalHandle memory,
                            std::string_view call) const {
    std::lock_guard<std::mutex> lock(vm.mutex);
    auto it = vm.sizes.find(memory.value);
    if (it == vm.sizes.end()) throw_unknown_physical(device, memory, call);
    return it->second;
  }

  // Removes `memory` from the live physical memory, returning its size.
  std::size_t take_physical(device_index device, VmState& vm, PhysicalHandle memory,
                            std::string_view call) const {
    std::lock_guard<std::mutex> lock(vm.mutex);
    auto it = vm.sizes.find(memory.value);
    if (it == vm.sizes.end()) throw_unknown_physical(device, memory, call);
    std::size_t bytes = it->second;
    vm.sizes.erase(it);
    return bytes;
  }

  [[noreturn]] void throw_no_ipc_memory(std::string_view call, device_index device) const {
    throw NotSupportedError(
        name, fmt::format("cannot share device memory with other processes: its runtime has no "
                          "ipc_mem_export, ipc_mem_open and ipc_mem_close ({} on device {})",
                          call, device));
  }
  [[noreturn]] void throw_no_ipc_events(std::string_view call, device_index device) const {
    throw NotSupportedError(
        name, fmt::format("cannot share events with other processes: its runtime has no {}"
                          "ipc_event_export and ipc_event_open ({} on device {})",
                          has_ipc_memory ? "" : "ipc_mem_export, ipc_mem_open, ipc_mem_close, ",
                          call, device));
  }

  [[noreturn]] void throw_no_graphs(std::string_view call, device_index device) const {
    throw NotSupportedError(
        name, fmt::format("cannot capture graphs: its runtime has no stream_begin_capture, "
                          "stream_end_capture, stream_is_capturing, graph_instantiate, "
                          "graph_launch, graph_exec_destroy and graph_destroy ({} on device {})",
                          call, device));
  }

  struct HostDeleter {
    Backend* backend;
    device_index device;
    void operator()(void* p) const { backend->raw_host_free(device, p); }
  };

  // The thread's current device, tagged with the backend it belongs to so that
  // several Backend<R> objects (tests) do not share it.
  struct CurrentDevice {
    std::uint64_t owner = 0;
    device_index device = 0;
    bool stale = false;  // the driver's set_device of `device` failed (deferred)
  };
  static inline thread_local CurrentDevice tls_{};

  static std::uint64_t next_backend_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  // Whether this is a child forked after a discovery that started driver
  // threads (Note [Fork safety]).
  bool forked_after_discovery(unsigned generation) const noexcept {
    if constexpr (detail::constant_fork_safe_discovery<R>) {
      static_cast<void>(generation);
      return false;
    } else {
      return discovered_.load(std::memory_order_acquire) && discovery_pid_ != 0 &&
             generation != discovery_generation_;
    }
  }

  void discover() noexcept {
    if (discovered_.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(discover_mutex_);
    if (discovered_.load(std::memory_order_relaxed)) return;
    if constexpr (!detail::constant_fork_safe_discovery<R>) {
      detail::install_fork_handler();  // before the driver may start its threads
      discovery_generation_ = detail::fork_generation().load(std::memory_order_relaxed);
      discovery_pid_ = ::getpid();
    }
    try {
      physical_count_ = runtime_.device_count();
      if (physical_count_ < 0)
        throw DriverError(name, physical_count_, "device_count",
                          "the runtime returned a negative device count");
      std::string variable = visible_devices_variable(name);
      if (auto value = env_.get(variable)) {
        visible_variable_value_ = *value;
        visible_ = parse_visible_devices(name, variable, *value, physical_count_,
                                         [this](int i) {
                                           DeviceProperties p = runtime_.properties(i);
                                           fill_unknown(p, name, i);
                                           return p.uuid;
                                         });
      } else {
        visible_.resize(static_cast<std::size_t>(physical_count_));
        for (int i = 0; i < physical_count_; ++i) visible_[static_cast<std::size_t>(i)] = i;
      }
      held_bytes_ = std::make_unique<std::atomic<std::uint64_t>[]>(visible_.size());
    } catch (const std::exception& e) {
      discovery_error_ = std::current_exception();
      discovery_message_ = e.what();
      visible_.clear();
    } catch (...) {
      discovery_error_ = std::current_exception();
      discovery_message_ = fmt::format("{}: device discovery failed with an unknown exception", name);
      visible_.clear();
    }
    discovered_.store(true, std::memory_order_release);
  }

  void check_index(device_index device) const {
    auto n = static_cast<int>(visible_.size());
    if (device >= 0 && device < n) return;
    throw IndexError(
        name, fmt::format("invalid device index {}: {} has {} visible device{} (valid: {}){}",
                          device, name, n, n == 1 ? "" : "s",
                          n == 1 ? std::string("0") : fmt::format("0..{}", n - 1),
                          visibility_note()));
  }

  std::string visibility_note() const {
    if (!visible_variable_value_) return {};
    return fmt::format("; {}='{}'", visible_devices_variable(name), *visible_variable_value_);
  }

  [[noreturn]] void throw_forked() const {
    throw RuntimeError(
        name, fmt::format("cannot use {} in a process forked after {} was initialized (by pid "
                          "{}); device contexts do not survive fork(). Use the 'spawn' or "
                          "'forkserver' multiprocessing start method, or initialize {} only in "
                          "the child processes",
                          name, name, init_pid_, name));
  }

  R runtime_;
  Environment env_;
  std::uint64_t id_;

  std::mutex discover_mutex_;
  std::atomic<bool> discovered_{false};
  int physical_count_ = 0;
  std::vector<int> visible_;
  std::optional<std::string> visible_variable_value_;
  std::exception_ptr discovery_error_;
  std::string discovery_message_;
  detail::PerDevice<DeviceProperties> properties_;  // the schema, queried once
  // The SDK's own signals, for a runtime without the members (Note [Host
  // signals]): all of them device 0's, as any device may complete or destroy
  // them; misuse is a ValueError.
  support::HostSignalTable<> host_signals_{R::name};
  detail::FailedWaits failed_waits_{R::name};  // Note [Failed waits]
  detail::Captures captures_{R::name};  // Note [Capture rules]
  detail::LostDevices lost_;  // Note [Lost devices]
  std::unique_ptr<std::atomic<std::uint64_t>[]> held_bytes_;  // raw_malloc's and vm_create's
  detail::PerDevice<VmState> vm_;  // Note [Virtual memory]

  unsigned discovery_generation_ = 0;  // (fork_safe_discovery false) at discovery
  pid_t discovery_pid_ = 0;

  std::mutex init_mutex_;
  std::atomic<bool> initialized_{false};
  unsigned init_generation_ = 0;
  pid_t init_pid_ = 0;
};

// Makes a device current for a scope and restores the previous one on exit,
// also when the scope is left by an exception.
template <class R>
class DeviceGuard {
 public:
  DeviceGuard(Backend<R>& backend, device_index device)
      : backend_(backend), previous_(backend.exchange_device(device)) {}
  // Restores the previous device even if the driver refuses (Note
  // [Deferred device switch]).
  ~DeviceGuard() {
    try {
      backend_.set_device_deferred(previous_);
    } catch (...) {
      // Only an invalid index throws; the previous device was valid.
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  device_index previous() const noexcept { return previous_; }

 private:
  Backend<R>& backend_;
  device_index previous_;
};

ACCELKIT_END_NAMESPACE
