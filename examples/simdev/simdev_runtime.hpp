// simdev: a simulated multi-device accelerator, the reference runtime.
//
// Each device is a slice of host memory with its own capacity, so running out
// of memory is real; device memory comes from mmap, so a raw allocation costs
// microseconds as it does on real drivers. Streams are truly asynchronous:
// each runs its work in order on a worker thread of its own, so ordering bugs
// in the layers above show. Events complete when their stream reaches them
// and carry timestamps. Handles are checked (use after destroy is a driver
// error), and every member can be made to fail on purpose to test error
// paths.
//
// Configuration: simdev_config.hpp (SIMDEV_* variables, error codes).
//
// Note [simdev strictness]
// Problem: a real driver punishes the mistakes of the layers above late and
// at random. Memory freed while queued work still uses it is reused and
// overwritten; a use after free reads another tensor's bytes; a wait tied to
// the wrong record of an event releases early only when timings line up; a
// stale handle names a recycled object; a failure of queued work surfaces at
// a later, unrelated call. On a CPU without such a driver, tests of the SDK
// would pass all of these.
// Decision: simdev turns each into an error at once, every time. free,
// host_free and vm_unmap of memory that queued work on any stream still uses
// are refused (Note [simdev virtual memory]);
// freed memory is made inaccessible and its addresses stay reserved for a
// while (retire), so a use after free faults; queued work whose memory is no
// longer allocated fails (kIllegalAddress); a copy that claims pinned host
// memory which is not host_malloc's is refused; a wait is tied to the
// event's record at the call, and a later record changes nothing for it;
// events and signals serve only their own device's streams; handles are
// minted and never reused (Note [Minted handles]), so a stale one is
// kInvalidHandle. Faults can be injected, in the call or in its queued work
// (:async: the error comes once, at a later call, as CUDA's do), and records
// and waits that fail still complete in order (Work::essential), so a fault
// never hangs a stream. A capturing stream records its work instead of
// queuing it, and refuses (kCaptureUnsupported, the capture invalidated)
// what a capture cannot hold: a record, wait, query or synchronize of it, a
// pageable or peer copy on it, a device_synchronize of its device; ending an
// invalidated capture is kCaptureInvalidated, the stream no longer
// capturing. A launch checks that each range the graph's work touches is
// still the allocation it was at capture, and refuses a graph whose memory
// was freed (kIllegalAddress, naming the work and the address).
// Limits: simdev checks the memory ranges work names, not what a kernel does
// inside them; after kRetiredBytes or kRetiredRanges of freed ranges the
// oldest addresses may be given again; pageable host memory is the caller's
// and is not checked; the calls a capture mode refuses on other threads
// (event queries, synchronous copies) are left to the SDK (Note [Capture
// rules]).
#pragma once

#include <accelkit/accelkit.hpp>
#include <accelkit/support/handle_table.hpp>
#include <accelkit/support/host_signals.hpp>
#include <accelkit/support/range_map.hpp>

#include "copy_engine.hpp"
#include "simdev_config.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <initializer_list>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace simdev {

class SimRuntime : public accelkit::Runtime<SimRuntime> {
 public:
  static constexpr std::string_view name = "simdev";

  // Configured from the process environment at the first device_count().
  SimRuntime() = default;
  // Configured explicitly (tests).
  explicit SimRuntime(Config config) : config_(std::move(config)), configured_(true) {}
  ~SimRuntime() {
    if (discovery_worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(discovery_mutex_);
        discovery_stop_ = true;
      }
      discovery_cv_.notify_all();
      discovery_worker_.join();
    }
    // Ranges still reserved (Note [simdev virtual memory]): unmapped once
    // their devices' queued work is done.
    for (int dev = 0; devices_ && dev < config_.device_count; ++dev) {
      Device& d = devices_[static_cast<std::size_t>(dev)];
      if (!d.exists.load() || d.reservations.empty()) continue;
      for (auto& st : d.streams.objects()) st->synchronize();
      d.reservations.for_each([](std::uintptr_t b, std::size_t n, const Reservation& r) {
        ::munmap(reinterpret_cast<void*>(b), n);
        if (r.shadow) ::munmap(r.shadow, n);
      });
    }
    std::lock_guard<std::mutex> lock(retired_mutex_);
    for (auto& [p, n] : retired_) ::munmap(p, n);
  }

  // ------------------------------------------------------------ contract

  int device_count() {
    configure();
    fault("device_count");
    if (config_.discovery_thread) start_discovery_thread();
    return config_.device_count;
  }

  accelkit::DeviceProperties properties(int device) {
    configure();
    check(device, "properties");
    fault("properties");
    accelkit::DeviceProperties p;
    p.name = "SimDev S1";
    p.vendor = "accelkit";
    p.architecture = "simdev-1";
    p.uuid = fmt::format("5d1dde00-0000-4000-8000-{:012x}", 0x51d0000 + device);
    p.pci_bus_id = fmt::format("0000:{:02x}:00.0", 0x10 + device);
    p.driver_version = {1, 0, 0};
    p.runtime_version = {accelkit::version.major, accelkit::version.minor,
                         accelkit::version.patch};
    p.total_memory = config_.capacity(device);
    p.max_allocation = p.total_memory;
    p.memory_alignment = config_.alignment ? config_.alignment : 256;
    p.compute_units = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p.subgroup_size = 32;
    p.clock_rate_khz = 1'000'000;
    p.l2_cache_bytes = std::min<std::uint64_t>(4u << 20, p.total_memory);  // a 1 MiB device is valid
    p.dtypes = accelkit::DTypeSet::all();
    p.host_access = config_.host_access;
    p.unified_memory = false;
    p.stream_priorities = config_.priority_levels
                              ? accelkit::StreamPriorityRange::from_levels(config_.priority_levels)
                              : accelkit::StreamPriorityRange{0, -2};  // CUDA's: lower is more urgent
    p.event_timing = config_.event_timing;
    p.async_copy_engines = 2;
    if (config_.unknown_properties) {  // what OpenCL or Vulkan drivers cannot tell
      p.uuid.clear();
      p.architecture.clear();
      p.async_copy_engines.reset();
      p.compute_units = 0;
      p.clock_rate_khz = 0;
    }
    p.extras.push_back({"simdev.host_memory_backed", true});
    p.extras.push_back({"simdev.injected_faults",
                        static_cast<std::int64_t>(config_.faults.size())});
    return p;
  }

  void initialize() {
    fault("initialize");
    initialized_ = true;
  }

  int get_device() { return current_device_; }
  void set_device(int device) {
    check(device, "set_device");
    fault("set_device");
    context(device);
    current_device_ = device;
  }

  // Memory aligned to exactly the alignment SIMDEV_ALIGNMENT declares, never
  // to twice it (a page's start plus the alignment); page-aligned when unset.
  void* malloc(int device, std::size_t bytes) {
    check(device, "malloc");
    if (fault("malloc")) return nullptr;  // an injected refusal
    Device& d = context(device);
    std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
    std::uint64_t used = d.used.fetch_add(rounded);
    if (used + rounded > config_.capacity(device)) {
      d.used.fetch_sub(rounded);
      return nullptr;
    }
    std::size_t offset = config_.alignment < kPage ? config_.alignment : 0;  // 0 when unset
    std::size_t mapped = rounded + (offset ? kPage : 0);
    // The pages come from the device's heap (Note [simdev inter-process memory]).
    std::uint64_t at = 0;
    std::shared_ptr<Heap> heap = heap_of(d, device, mapped, at);
    if (heap && ipc_deferred_.load(std::memory_order_relaxed) != 0) retry_deferred(*heap);
    char* view = nullptr;
    void* p = heap ? map_heap(heap->fd, at, mapped, view, heap->region + at) : MAP_FAILED;
    if (p == MAP_FAILED) {
      d.used.fetch_sub(rounded);
      return nullptr;
    }
    char* ptr = static_cast<char*>(p) + offset;
    Allocation a;
    a.offset = offset;
    a.view = view;
    a.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
    a.heap = std::move(heap);
    a.file_offset = at;
    if (view) a.holds.assign(mapped / kPage, 0);
    std::lock_guard<std::mutex> lock(d.mutex);
    d.allocations.insert(ptr, rounded, std::move(a));
    return ptr;
  }

  // Refuses memory that queued work still uses (Note [simdev strictness]).
  void free(int device, void* ptr) {
    check(device, "free");
    fault("free");
    Device& d = context(device);
    Allocation a;
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      auto hit = d.allocations.at(ptr);
      if (!hit)
        driver_error(kInvalidValue, "free",
                     fmt::format("pointer {} was not allocated on device {}", ptr, device));
      a = *hit.value;
      bytes = hit.bytes;
      if (a.opened)
        driver_error(kInvalidValue, "free",
                     fmt::format("memory at {} was opened from process {} (ipc_mem_open): "
                                 "release it with ipc_mem_close",
                                 ptr, a.opened->pid));
      if (std::any_of(a.holds.begin(), a.holds.end(), [](std::uint32_t h) { return h > 0; }))
        driver_error(kInvalidValue, "free",
                     fmt::format("memory at {} is still mapped for the host (host_map without "
                                 "host_unmap)",
                                 ptr));
    }
    refuse_if_queued("free", static_cast<char*>(ptr), bytes);
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.allocations.erase(ptr);
    }
    std::size_t length = bytes + (a.offset ? kPage : 0);
    retire(static_cast<char*>(ptr) - a.offset, length);
    if (a.view) ::munmap(a.view, length);  // mapped mode: the device's view
    release_pages(a, length);
    d.used.fetch_sub(bytes);
  }

  // Pinned memory allocated in one device's context, freed through that
  // device; copies of every device may use it (Note [Pinned memory per
  // device]).
  void* host_malloc(int device, std::size_t bytes) {
    check(device, "host_malloc");
    fault("host_malloc");
    context(device);
    std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_.insert(p, rounded, device);
    return p;
  }
  void host_free(int device, void* ptr) {
    check(device, "host_free");
    fault("host_free");
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      auto hit = pinned_.at(ptr);
      if (!hit)
        driver_error(kInvalidValue, "host_free",
                     fmt::format("pointer {} was not allocated by host_malloc", ptr));
      if (*hit.value != device)
        driver_error(kInvalidValue, "host_free",
                     fmt::format("pointer {} is pinned memory of device {}, freed as device {}'s",
                                 ptr, *hit.value, device));
      bytes = hit.bytes;
    }
    refuse_if_queued("host_free", static_cast<char*>(ptr), bytes);
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      pinned_.erase(ptr);
    }
    retire(ptr, bytes);
  }

  void memcpy(int device, void* dst, const void* src, std::size_t bytes, accelkit::CopyKind kind) {
    check(device, "memcpy");
    fault("memcpy");
    copies_.fetch_add(1, std::memory_order_relaxed);
    Work w = copy_work(device, device, dst, src, bytes, kind);
    if (!w.live(*this))
      driver_error(kIllegalAddress, "memcpy", fmt::format("{} touches memory that is not allocated",
                                                          w.what));
    w.fn();
  }

  // Copies whose host side the SDK says is pinned (`host_pinned`), or that
  // touch only device memory, run on the stream; a copy from or to pageable
  // host memory waits for the stream and runs at once, as CUDA's do. The
  // claim is checked (Note [simdev strictness]): memory claimed pinned that
  // is not from host_malloc, or a claim on a device-to-device copy, is a
  // driver error; memory that is pinned but not claimed is treated as
  // pageable.
  void memcpy_async(int device, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, accelkit::StreamHandle stream, bool host_pinned) {
    auto s = stream_of(device, stream, "memcpy_async");
    bool async_fault = fault("memcpy_async");
    report_async(device, "memcpy_async");
    const void* host = kind == accelkit::CopyKind::host_to_device   ? src
                       : kind == accelkit::CopyKind::device_to_host ? dst
                                                                    : nullptr;
    if (host != nullptr && !host_pinned) refuse_capturing(*s, device, stream, "memcpy_async");
    if (host_pinned && host == nullptr)
      driver_error(kInvalidValue, "memcpy_async",
                   "host_pinned is true for a device_to_device copy, which has no host side");
    if (host_pinned && !is_pinned(host, bytes))
      driver_error(kInvalidValue, "memcpy_async",
                   fmt::format("host memory at {} ({} bytes) is claimed pinned but is not memory "
                               "from host_malloc",
                               host, bytes));
    copies_.fetch_add(1, std::memory_order_relaxed);
    Work w = copy_work(device, device, dst, src, bytes, kind);
    w.fail = async_fault;
    check_live(w, "memcpy_async");
    if (host != nullptr && !host_pinned) {
      s->synchronize();
      run(w);
      return;
    }
    s->enqueue(std::move(w));
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes,
                    accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "memset_async");
    bool async_fault = fault("memset_async");
    report_async(device, "memset_async");
    Work w;
    w.device = device;
    w.what = "memset_async";
    w.touches[0] = {device, static_cast<char*>(ptr), bytes};
    void* at = device_address(device, ptr);
    w.fn = [at, value, bytes] { std::memset(at, value, bytes); };
    w.fail = async_fault;
    check_live(w, "memset_async");
    s->enqueue(std::move(w));
  }

  // Note [simdev mapped memory]
  // Problem: an SDK that touches device memory on the host outside
  // host_map/host_unmap, or at the device pointer rather than at the address
  // host_map returns, works where memory is unified and reads stale data (or
  // faults) on a device with memory of its own, or on a driver that chooses
  // the host address (Vulkan's vkMapMemory).
  // Decision: with SIMDEV_HOST_VISIBLE=mapped each allocation's pages (a
  // range of its device's heap file, Note [simdev inter-process memory]; for
  // virtual memory, the memfds vm_map mapped) are mapped twice: the pointer
  // malloc returns is a view the host may never touch (PROT_NONE), and
  // simdev's streams, copies and kernels work through a second, device-only
  // view of the same pages. host_map maps the pages under the range once
  // more, a new host view of its own (of several files' pages for a range
  // over vm pieces), and returns the address of ptr in it; host_unmap
  // unmaps that view. So a host access at the device pointer faults at once
  // (SIGSEGV), and so does one through a view after its unmap. host_map
  // coexists with queued work on the range (the SDK waits for its streams
  // first; work another thread queues in between runs on the device's view);
  // free, ipc_mem_close and vm_unmap refuse memory still mapped.
  // Limits: a view covers whole pages, so an access outside the mapped bytes
  // but on their pages is not caught; each map is a mapping of its own (the
  // host view of an allocation mapped twice is two views).
  void* host_map(int device, void* ptr, std::size_t bytes) {
    check(device, "host_map");
    fault("host_map");
    if (!mapped_mode())
      driver_error(kNotPermitted, "host_map",
                   "device memory is not mapped for the host in this mode (SIMDEV_HOST_VISIBLE "
                   "is not 'mapped')");
    void* host = open_view(device, static_cast<char*>(ptr), bytes);
    host_maps_.fetch_add(1, std::memory_order_relaxed);
    return host;
  }
  void host_unmap(int device, void* ptr, std::size_t bytes) {
    check(device, "host_unmap");
    fault("host_unmap");
    if (!mapped_mode())
      driver_error(kNotPermitted, "host_unmap",
                   "device memory is not mapped for the host in this mode (SIMDEV_HOST_VISIBLE "
                   "is not 'mapped')");
    close_view(device, static_cast<char*>(ptr), bytes);
  }

  bool can_access_peer(int device, int peer) {
    check(device, "can_access_peer");
    check(peer, "can_access_peer");
    fault("can_access_peer");
    return config_.host_access == accelkit::HostAccessLevel::direct;
  }

  void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                         std::size_t bytes, accelkit::StreamHandle stream) {
    check(dst_device, "memcpy_peer_async");
    auto s = stream_of(src_device, stream, "memcpy_peer_async");
    refuse_capturing(*s, src_device, stream, "memcpy_peer_async");
    bool async_fault = fault("memcpy_peer_async");
    report_async(src_device, "memcpy_peer_async");
    report_async(dst_device, "memcpy_peer_async");
    Work w = copy_work(src_device, dst_device, dst, src, bytes,
                       accelkit::CopyKind::device_to_device);
    w.what = "memcpy_peer_async";
    w.fail = async_fault;
    check_live(w, "memcpy_peer_async");
    s->enqueue(std::move(w));
  }

  accelkit::StreamHandle stream_create(int device, int priority) {
    check(device, "stream_create");
    fault("stream_create");
    int least = 0, most = config_.priority_levels ? config_.priority_levels - 1 : -2;
    if (priority < std::min(least, most) || priority > std::max(least, most))
      driver_error(kInvalidValue, "stream_create",
                   fmt::format("priority {} is outside simdev's range {}..{}", priority, least,
                               most));
    Device& d = context(device);
    return d.streams.add(std::make_shared<Stream>(this, device, priority));
  }

  // Waits for the stream's queued work, then stops its worker.
  void stream_destroy(int device, accelkit::StreamHandle stream) {
    refuse_capturing(*stream_of(device, stream, "stream_destroy"), device, stream,
                     "stream_destroy");
    fault("stream_destroy");
    context(device).streams.remove(stream, "stream_destroy", device)->stop();
  }

  bool stream_query(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_query");
    refuse_capturing(*s, device, stream, "stream_query");
    fault("stream_query");
    // The state first, then the errors: work that failed before the stream
    // went idle has set its error by then, so an idle answer never hides it.
    bool idle = s->idle();
    report_async(device, "stream_query");
    return idle;
  }

  void stream_synchronize(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_synchronize");
    refuse_capturing(*s, device, stream, "stream_synchronize");
    fault("stream_synchronize");
    s->synchronize();
    report_async(device, "stream_synchronize");
  }

  // Later work on `stream` waits for the event's last record at this call
  // (Note [simdev strictness]: a later record changes nothing for it). The
  // event must be of the stream's device: waits across devices are
  // stream_wait_peer_event's, so that an SDK that mixes them up is caught.
  void stream_wait_event(int device, accelkit::StreamHandle stream, accelkit::EventHandle event) {
    auto s = stream_of(device, stream, "stream_wait_event");
    refuse_capturing(*s, device, stream, "stream_wait_event");
    auto e = event_of(event, "stream_wait_event");
    bool async_fault = fault("stream_wait_event");
    report_async(device, "stream_wait_event");
    if (e->device != device)
      driver_error(kInvalidValue, "stream_wait_event",
                   fmt::format("event of device {} waited for on a stream of device {} (a wait "
                               "across devices is stream_wait_peer_event)",
                               e->device, device));
    if (e->remote) return enqueue_remote_wait(*s, device, e->remote, async_fault, "stream_wait_event");
    enqueue_wait(*s, device, e->last(), async_fault, "stream_wait_event");
  }

  // The same for an event of another device, `event_device` (Note
  // [Cross-device waits] in accelkit's backend.hpp): the wait is queued on
  // `stream` and tied to the record seen now, as stream_wait_event's.
  void stream_wait_peer_event(int device, accelkit::StreamHandle stream, int event_device,
                              accelkit::EventHandle event) {
    auto s = stream_of(device, stream, "stream_wait_peer_event");
    refuse_capturing(*s, device, stream, "stream_wait_peer_event");
    check(event_device, "stream_wait_peer_event");
    auto e = event_of(event, "stream_wait_peer_event");
    bool async_fault = fault("stream_wait_peer_event");
    report_async(device, "stream_wait_peer_event");
    if (e->device != event_device || event_device == device)
      driver_error(kInvalidValue, "stream_wait_peer_event",
                   fmt::format("event of device {} named as an event of device {}, waited for "
                               "on a stream of device {} (a peer event is of another device)",
                               e->device, event_device, device));
    if (e->remote)
      return enqueue_remote_wait(*s, device, e->remote, async_fault, "stream_wait_peer_event");
    enqueue_wait(*s, device, e->last(), async_fault, "stream_wait_peer_event");
  }

  accelkit::EventHandle event_create(int device, accelkit::EventFlags flags) {
    check(device, "event_create");
    fault("event_create");
    context(device);
    bool interprocess = accelkit::has_flag(flags, accelkit::EventFlags::interprocess);
    if (interprocess && accelkit::has_flag(flags, accelkit::EventFlags::timing))
      driver_error(kInvalidValue, "event_create",
                   fmt::format("flags {:#x}: an interprocess event cannot be a timing event "
                               "(EventFlags::interprocess with EventFlags::timing)",
                               static_cast<unsigned>(flags)));
    ++events_created_;
    if (config_.event_create_ns > 0) {  // the driver's cost of a new event
      auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(config_.event_create_ns);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    auto e = std::make_shared<Event>();
    e->device = device;
    e->timing = accelkit::has_flag(flags, accelkit::EventFlags::timing);
    if (interprocess) share_slot(*e, device);
    return events_.add(std::move(e));
  }

  void event_destroy(int device, accelkit::EventHandle event) {
    check(device, "event_destroy");
    std::shared_ptr<Event> e = events_.get(event, "event_destroy");
    fault("event_destroy");
    events_.remove(event, "event_destroy");  // queued records keep their state alive
    if (e->slot) {  // opens from now on are refused; queued records still complete
      e->slot->state.store(kSlotDestroyed, std::memory_order_release);
      std::lock_guard<std::mutex> lock(e->mutex);
      if (e->exported) ipc_events_exported_.fetch_sub(1);
    }
    if (e->remote) ipc_events_open_.fetch_sub(1);
  }

  // A new record of the event: the work queued on `stream` so far.
  void event_record(int device, accelkit::EventHandle event, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "event_record");
    refuse_capturing(*s, device, stream, "event_record");
    auto e = event_of(event, "event_record");
    bool async_fault = fault("event_record");
    report_async(device, "event_record");
    if (e->device != device)
      driver_error(kInvalidValue, "event_record",
                   fmt::format("event of device {} recorded on a stream of device {}", e->device,
                               device));
    if (e->remote)
      driver_error(kInvalidValue, "event_record",
                   fmt::format("event {:#x} was opened from process {} (ipc_event_open): only "
                               "its exporter records it",
                               event.value, e->remote->pid));
    auto r = std::make_shared<Record>();
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      e->record = r;
      if (e->slot) {  // the record's number, for other processes (before it may complete)
        r->share(e->file, e->slot, ++e->seq);
        e->slot->recorded.store(e->seq, std::memory_order_release);
      }
    }
    s->record(r, async_fault);
  }

  bool event_query(int, accelkit::EventHandle event) {
    auto e = event_of(event, "event_query");
    fault("event_query");
    if (e->remote) {  // the exporter's last record (Note [simdev inter-process memory])
      const RemoteEvent& r = *e->remote;
      std::uint64_t target = r.slot->recorded.load(std::memory_order_acquire);
      bool done = r.completed(target);
      if (!done && !r.exporter_alive() && !r.completed(target))
        driver_error(kLaunchFailure, "event_query", exited_with_record(r, target));
      report_async(e->device, "event_query");
      return done;
    }
    // The state first, then the errors (as stream_query): a record complete
    // means the failed work it captured has set its error.
    std::shared_ptr<Record> r = e->last();
    bool done = !r || r->done();
    report_async(e->device, "event_query");
    return done;
  }

  void event_synchronize(int, accelkit::EventHandle event) {
    auto e = event_of(event, "event_synchronize");
    fault("event_synchronize");
    if (e->remote) {
      std::uint64_t target = e->remote->slot->recorded.load(std::memory_order_acquire);
      if (!wait_remote(*e->remote, target))
        driver_error(kLaunchFailure, "event_synchronize", exited_with_record(*e->remote, target));
    }
    if (std::shared_ptr<Record> r = e->last()) r->wait();
    report_async(e->device, "event_synchronize");
  }

  float event_elapsed_time(int, accelkit::EventHandle start, accelkit::EventHandle end) {
    auto a = event_of(start, "event_elapsed_time");
    auto b = event_of(end, "event_elapsed_time");
    fault("event_elapsed_time");
    if (!a->timing || !b->timing)
      driver_error(kInvalidHandle, "event_elapsed_time", "both events must be timing events");
    std::shared_ptr<Record> ra = a->last(), rb = b->last();
    if (!ra || !rb)
      driver_error(kInvalidHandle, "event_elapsed_time", "both events must be recorded");
    if (!ra->done() || !rb->done())
      driver_error(kNotReady, "event_elapsed_time", "an event has not completed yet");
    return std::chrono::duration<float, std::milli>(rb->when() - ra->when()).count();
  }

  // Note [simdev host signals]
  // Problem: a host signal (Note [Host signals] in accelkit's backend.hpp)
  // must hold back everything queued after the wait, for as long as the
  // host takes, and a failure must reach the stream as a device's would.
  // Decision: the wait is queued work that blocks the stream's worker until
  // the host completes the signal (support/host_signals.hpp keeps the
  // signals); a signal completed with an error fails the wait: the error
  // (its code, as given) becomes the device's asynchronous error, and the
  // stream goes on. A signal serves only streams of its own device, is
  // completed once, and is not destroyed while it is not completed and a
  // queued wait waits for it (kNotPermitted, the signal left as it was);
  // after completion the queued waits keep its state alive.
  // Limits: each waiting stream holds its worker thread while it waits.
  accelkit::SignalHandle signal_create(int device) {
    check(device, "signal_create");
    fault("signal_create");
    context(device);
    return signals_.create(device);
  }

  void stream_wait_signal(int device, accelkit::StreamHandle stream, accelkit::SignalHandle signal) {
    auto s = stream_of(device, stream, "stream_wait_signal");
    refuse_capturing(*s, device, stream, "stream_wait_signal");
    auto g = signals_.get(signal, "stream_wait_signal");
    bool async_fault = fault("stream_wait_signal");
    report_async(device, "stream_wait_signal");
    signals_.check_stream_device(*g, device);
    bool waits = g->add_waiter();  // false: completed with success, nothing to wait for
    Work w;
    w.device = device;
    w.what = "stream_wait_signal";
    w.fn = [this, g, device, waits] {
      int error = waits ? g->wait() : 0;
      if (error != 0)
        set_async_error(device, error,
                        fmt::format("queued stream_wait_signal: the host signal it waited for "
                                    "was completed with error {}",
                                    error));
    };
    w.essential = true;  // waits even when failing (Note [simdev strictness])
    w.fail = async_fault;
    s->enqueue(std::move(w));
  }

  void signal_complete(int device, accelkit::SignalHandle signal, int error) {
    check(device, "signal_complete");
    signals_.get(signal, "signal_complete");
    fault("signal_complete");
    signals_.complete(signal, device, error);
  }

  void signal_destroy(int device, accelkit::SignalHandle signal) {
    check(device, "signal_destroy");
    fault("signal_destroy");
    signals_.destroy(signal, device);  // queued waits keep its state alive
  }

  void device_synchronize(int device) {
    check(device, "device_synchronize");
    fault("device_synchronize");
    if (captures_underway_.load(std::memory_order_relaxed) != 0) {
      int invalidated = 0;
      for (auto& s : streams_of(device)) invalidated += s->invalidate("device_synchronize");
      if (invalidated)
        driver_error(kCaptureUnsupported, "device_synchronize",
                     fmt::format("device {} has {} stream(s) capturing a graph: not allowed "
                                 "during capture; the captures are invalidated",
                                 device, invalidated));
    }
    for (auto& s : streams_of(device)) s->synchronize();
    report_async(device, "device_synchronize");
  }

  // Note [simdev graphs]
  // Problem: a graph must replay the work captured, reading memory as it is
  // at each replay, and simdev must catch a replay whose memory is gone.
  // Decision: a capturing stream appends its Works (the closures queued work
  // runs, with the addresses they touch) to the capture instead of its
  // queue; the graph keeps them, with the serial of the allocation each
  // touched range lay in at the end of the capture; an exec shares them
  // (immutable), and a launch checks every serial and enqueues copies of the
  // Works in one go, so destroying the exec or graph leaves queued launches
  // whole, and a free of memory they use is refused as for any queued work.
  // Limits: one stream per capture; the capture mode is kept, not enforced
  // (Note [simdev strictness]); a launch runs on the stream's one worker.
  void stream_begin_capture(int device, accelkit::StreamHandle stream,
                            accelkit::CaptureMode mode) {
    auto s = stream_of(device, stream, "stream_begin_capture");
    fault("stream_begin_capture");
    if (!s->begin_capture(mode))
      driver_error(kInvalidValue, "stream_begin_capture",
                   fmt::format("stream {:#x} of device {} is capturing already", stream.value,
                               device));
    captures_underway_.fetch_add(1, std::memory_order_relaxed);
  }

  // The stream stops capturing whatever happens here.
  accelkit::GraphHandle stream_end_capture(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_end_capture");
    std::unique_ptr<Stream::Capture> c = s->end_capture();
    if (!c)
      driver_error(kInvalidValue, "stream_end_capture",
                   fmt::format("stream {:#x} of device {} is not capturing", stream.value,
                               device));
    captures_underway_.fetch_sub(1, std::memory_order_relaxed);
    fault("stream_end_capture");
    if (!c->invalidated.empty())
      driver_error(kCaptureInvalidated, "stream_end_capture",
                   fmt::format("the capture of stream {:#x} of device {} was invalidated by {}",
                               stream.value, device, c->invalidated));
    auto g = std::make_shared<Graph>();
    g->device = device;
    auto nodes = std::make_shared<std::vector<Node>>();
    nodes->reserve(c->works.size());
    for (Work& w : c->works) {
      Node n;
      for (std::size_t i = 0; i < kMaxTouches; ++i) n.serials[i] = serial_of(w.touches[i]);
      n.work = std::move(w);
      nodes->push_back(std::move(n));
    }
    g->nodes = std::move(nodes);
    graphs_captured_.fetch_add(1, std::memory_order_relaxed);
    return graphs_.add(std::move(g));
  }

  bool stream_is_capturing(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_is_capturing");
    fault("stream_is_capturing");
    return s->capturing();
  }

  accelkit::GraphExecHandle graph_instantiate(int device, accelkit::GraphHandle graph) {
    check(device, "graph_instantiate");
    auto g = graphs_.get(graph, "graph_instantiate");
    fault("graph_instantiate");
    if (g->device != device)
      driver_error(kInvalidValue, "graph_instantiate",
                   fmt::format("graph of device {} instantiated on device {}", g->device, device));
    auto e = std::make_shared<Exec>();
    e->device = device;
    e->nodes = g->nodes;
    return execs_.add(std::move(e));
  }

  void graph_launch(int device, accelkit::GraphExecHandle exec, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "graph_launch");
    auto e = execs_.get(exec, "graph_launch");
    refuse_capturing(*s, device, stream, "graph_launch");
    bool async_fault = fault("graph_launch");  // the launch's first work fails when it runs
    report_async(device, "graph_launch");
    if (e->device != device)
      driver_error(kInvalidValue, "graph_launch",
                   fmt::format("graph exec of device {} launched on a stream of device {}",
                               e->device, device));
    for (std::size_t i = 0; i < e->nodes->size(); ++i) {
      const Node& n = (*e->nodes)[i];
      for (std::size_t t = 0; t < kMaxTouches; ++t) {
        const Range& r = n.work.touches[t];
        if (r.ptr != nullptr && serial_of(r) != n.serials[t])
          driver_error(kIllegalAddress, "graph_launch",
                       fmt::format("the graph's {} (work {} of {}) touches {} bytes at {} of {}, "
                                   "freed since the capture",
                                   n.work.what, i + 1, e->nodes->size(), r.bytes,
                                   static_cast<void*>(r.ptr),
                                   r.device < 0 ? std::string("pinned host memory")
                                                : fmt::format("device {}", r.device)));
      }
    }
    s->enqueue_all(*e->nodes, async_fault);
    graph_launches_.fetch_add(1, std::memory_order_relaxed);
  }

  // Launches already queued hold copies of the work: they complete.
  void graph_exec_destroy(int device, accelkit::GraphExecHandle exec) {
    check(device, "graph_exec_destroy");
    execs_.get(exec, "graph_exec_destroy");
    fault("graph_exec_destroy");
    execs_.remove(exec, "graph_exec_destroy");
  }

  void graph_destroy(int device, accelkit::GraphHandle graph) {
    check(device, "graph_destroy");
    graphs_.get(graph, "graph_destroy");
    fault("graph_destroy");
    graphs_.remove(graph, "graph_destroy");
  }

  // Note [simdev virtual memory]
  // Problem: the virtual-memory members (Note [Virtual memory] in accelkit's
  // backend.hpp) let a pool map memory into reserved addresses and unmap it
  // again; an SDK that unmaps pages its queued work still uses, maps over
  // mapped pages, or touches a page after unmapping it works on a lenient
  // driver until the pages are used again.
  // Decision: a reservation is an mmap of PROT_NONE pages aligned to the
  // 2 MiB granularity (a device has kVmAddressFactor times its capacity of
  // addresses to reserve; vm_reserve answers nullptr beyond). Physical
  // memory is a memfd, counted in the device's capacity as malloc's memory
  // is (a null handle when there is no room, or with vm_create:refuse).
  // vm_map maps the memfd over the reservation's pages (MAP_FIXED |
  // MAP_SHARED); it refuses a range outside one reservation or over mapped
  // pages, and memory of another size or device. vm_unmap takes whole
  // mapped pieces only, is refused while queued work on any stream uses the
  // range or the host holds it mapped (host_map), and puts PROT_NONE pages
  // back: a host access faults, and work naming the range fails
  // kIllegalAddress at the call or, queued, when it runs, as for freed
  // memory. Mapped pieces count as allocated memory for every check: a
  // range is live when pieces of one reservation cover it, and a graph
  // keeps their serials, so a replay after an unmap and a new map is
  // refused. vm_release refuses a range with pages still mapped, vm_destroy
  // memory still mapped. SIMDEV_HOST_VISIBLE: with 1 and 0 the pages are
  // mapped read-write (with 0, as for malloc's memory, a host access is not
  // caught); with mapped they stay PROT_NONE for the host after vm_map
  // (host_map maps a view of their memfds: Note [simdev mapped memory]) and
  // simdev's work goes through a second reservation, the device's view,
  // where the same memfds are mapped read-write at the same offsets. Handles
  // are minted (Note [Minted handles]); every member takes
  // SIMDEV_INJECT_FAULT.
  // Limits: pieces of two reservations never join into one live range, even
  // when the addresses are adjacent; a released range's addresses are
  // retired as freed memory's are; one file descriptor per physical memory
  // while it lives; a runtime destroyed with ranges still reserved waits for
  // their devices' queued work, then unmaps them.
  std::size_t vm_granularity(int device) {
    check(device, "vm_granularity");
    fault("vm_granularity");
    return kVmGranularity;
  }

  void* vm_reserve(int device, std::size_t bytes) {
    check(device, "vm_reserve");
    fault("vm_reserve");
    check_vm_size(bytes, "vm_reserve");
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    if (d.reserved_bytes + bytes > kVmAddressFactor * config_.capacity(device)) return nullptr;
    char* base = reserve_pages(bytes, kVmGranularity);
    if (base == nullptr) return nullptr;
    char* shadow = nullptr;
    if (mapped_mode() && (shadow = reserve_pages(bytes, kPage)) == nullptr) {
      ::munmap(base, bytes);
      return nullptr;
    }
    d.reservations.insert(base, bytes, Reservation{shadow, 0, {}});
    d.reserved_bytes += bytes;
    return base;
  }

  void vm_release(int device, void* base, std::size_t bytes) {
    check(device, "vm_release");
    fault("vm_release");
    Device& d = context(device);
    char* shadow = nullptr;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      auto hit = d.reservations.at(base);
      if (!hit)
        driver_error(kInvalidValue, "vm_release",
                     fmt::format("{} is not the start of a range reserved on device {}", base,
                                 device));
      if (hit.bytes != bytes)
        driver_error(kInvalidValue, "vm_release",
                     fmt::format("the range reserved at {} is {} bytes, released as {}", base,
                                 hit.bytes, bytes));
      if (hit.value->pieces != 0)
        driver_error(kInvalidValue, "vm_release",
                     fmt::format("the range reserved at {} has {} mapped piece(s): vm_unmap "
                                 "them first",
                                 base, hit.value->pieces));
      shadow = hit.value->shadow;
      d.reservations.erase(base);
      d.reserved_bytes -= bytes;
    }
    if (shadow) ::munmap(shadow, bytes);
    retire(base, bytes);
  }

  accelkit::PhysicalHandle vm_create(int device, std::size_t bytes) {
    check(device, "vm_create");
    bool refuse = fault("vm_create");  // vm_create:refuse: no room, with memory free
    check_vm_size(bytes, "vm_create");
    Device& d = context(device);
    if (refuse) return {};
    std::uint64_t used = d.used.fetch_add(bytes);
    if (used + bytes > config_.capacity(device)) {
      d.used.fetch_sub(bytes);
      return {};
    }
    int fd = static_cast<int>(::syscall(SYS_memfd_create, "simdev-vm", 1u /* MFD_CLOEXEC */));
    if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
      int error = errno;
      if (fd >= 0) ::close(fd);
      d.used.fetch_sub(bytes);
      driver_error(kInvalidValue, "vm_create",
                   fmt::format("memfd for {} bytes failed: {}", bytes, std::strerror(error)));
    }
    auto m = std::make_shared<Physical>();
    m->device = device;
    m->fd = fd;
    m->bytes = bytes;
    return physicals_.add(std::move(m));
  }

  void vm_destroy(int device, accelkit::PhysicalHandle memory) {
    check(device, "vm_destroy");
    fault("vm_destroy");
    Device& d = context(device);
    std::shared_ptr<Physical> m;
    {
      std::lock_guard<std::mutex> lock(d.mutex);  // maps change under it
      m = physicals_.remove(memory, "vm_destroy", device, [&](const Physical& p) {
        check_physical_device(p, memory, device, "vm_destroy");
        if (p.maps != 0)
          driver_error(kInvalidValue, "vm_destroy",
                       fmt::format("physical memory {:#x} is still mapped ({} mapping(s)): "
                                   "vm_unmap it first",
                                   memory.value, p.maps));
      });
    }
    d.used.fetch_sub(m->bytes);
  }

  void vm_map(int device, void* at, std::size_t bytes, accelkit::PhysicalHandle memory) {
    check(device, "vm_map");
    fault("vm_map");
    check_vm_size(bytes, "vm_map");
    check_vm_address(at, "vm_map");
    Device& d = context(device);
    char* c = static_cast<char*>(at);
    std::lock_guard<std::mutex> lock(d.mutex);
    std::shared_ptr<Physical> m = physicals_.get(memory, "vm_map", device);
    check_physical_device(*m, memory, device, "vm_map");
    if (m->bytes != bytes)
      driver_error(kInvalidValue, "vm_map",
                   fmt::format("physical memory {:#x} is {} bytes, mapped as {} (vm_map maps "
                               "all of it)",
                               memory.value, m->bytes, bytes));
    auto r = d.reservations.find(c, bytes);
    if (!r)
      driver_error(kInvalidValue, "vm_map",
                   fmt::format("{} bytes at {} are not inside one range reserved on device {}",
                               bytes, at, device));
    if (!d.pieces.insert(c, bytes, Piece{m, next_serial_.fetch_add(1)}))
      driver_error(kInvalidValue, "vm_map",
                   fmt::format("{} bytes at {} overlap pages mapped already", bytes, at));
    char* shadow = r.value->shadow ? r.value->shadow + r.offset : nullptr;
    bool mapped = ::mmap(c, bytes, shadow ? PROT_NONE : PROT_READ | PROT_WRITE,
                         MAP_FIXED | MAP_SHARED, m->fd, 0) != MAP_FAILED;
    if (mapped && shadow &&
        ::mmap(shadow, bytes, PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED, m->fd, 0) ==
            MAP_FAILED) {
      unmap_pages(c, bytes);
      mapped = false;
    }
    if (!mapped) {
      int error = errno;
      d.pieces.erase(c);
      driver_error(kInvalidValue, "vm_map",
                   fmt::format("mmap of {} bytes at {} failed: {}", bytes, at,
                               std::strerror(error)));
    }
    ++r.value->pieces;
    ++m->maps;
  }

  void vm_unmap(int device, void* at, std::size_t bytes) {
    check(device, "vm_unmap");
    fault("vm_unmap");
    check_vm_size(bytes, "vm_unmap");
    check_vm_address(at, "vm_unmap");
    Device& d = context(device);
    char* c = static_cast<char*>(at);
    std::lock_guard<std::mutex> lock(d.mutex);  // no map or check of the range meanwhile
    auto r = d.reservations.find(c, bytes);
    if (!r)
      driver_error(kInvalidValue, "vm_unmap",
                   fmt::format("{} bytes at {} are not inside one range reserved on device {}",
                               bytes, at, device));
    std::vector<char*> starts;
    for (char* p = c; p < c + bytes;) {
      auto hit = d.pieces.at(p);
      if (!hit || hit.bytes > static_cast<std::size_t>(c + bytes - p))
        driver_error(kInvalidValue, "vm_unmap",
                     fmt::format("{} bytes at {} are not whole mapped pieces ({} at {})", bytes,
                                 at, hit ? "a piece reaching past the end" : "no piece starts",
                                 static_cast<void*>(p)));
      starts.push_back(p);
      p += hit.bytes;
    }
    std::size_t first = static_cast<std::size_t>(r.offset) / kPage;
    auto held = r.value->holds.lower_bound(first);
    if (held != r.value->holds.end() && held->first < first + bytes / kPage)
      driver_error(kInvalidValue, "vm_unmap",
                   fmt::format("memory at {} is still mapped for the host (host_map without "
                               "host_unmap)",
                               static_cast<void*>(r.pointer() + held->first * kPage)));
    refuse_if_queued("vm_unmap", c, bytes);
    unmap_pages(c, bytes);
    if (r.value->shadow) unmap_pages(r.value->shadow + r.offset, bytes);
    for (char* p : starts) {
      std::optional<Piece> piece = d.pieces.erase(p);
      --piece->physical->maps;
      --r.value->pieces;
    }
  }

  // Note [simdev inter-process memory]
  // Problem: the inter-process members (Note [Inter-process memory] in
  // accelkit's backend.hpp) need device memory another process can map and
  // events it can wait for, with a real driver's errors for every misuse,
  // and never a hang when the exporter dies.
  // Decision: a device's memory is, per process, a sparse memfd (its heap,
  // 8 times the capacity, 16 GiB to 1 TiB; a new one when it is used up),
  // of which each malloc maps a fresh range of offsets (never given twice)
  // MAP_SHARED, at the same offset of a range of addresses reserved with
  // the heap, so that consecutive allocations make one mapping as anonymous
  // memory does; free punches the range's pages out. A handle (64
  // bytes, checksummed) carries the exporter's pid, the heap's descriptor
  // and a random token in the heap's name, and the range; ipc_mem_open
  // reopens the heap through /proc/<pid>/fd/<fd> and checks the name, so a
  // process that exited (or a pid now another process's) is refused.
  // Liveness is kept in OFD byte locks on the heap, which the kernel drops
  // when their holder dies: the exporter read-locks byte offset + 1 from the
  // export until the free; each process that opens the memory read-locks
  // byte offset until it closes it. An open finding no exporter lock is
  // refused (memory freed, or the exporter gone); a free of exported memory
  // that another process holds defers punching its pages
  // (ipc_deferred_releases) to a later malloc or free of the device, once
  // no holder is left, dead holders included. Opened memory is device
  // memory of the opening process for every check (live ranges, frees
  // refused while queued work uses it, host maps in mapped mode); only
  // ipc_mem_close releases it, and a handle is opened once per process at a
  // time. An interprocess event owns a 32-byte slot of its process's event
  // file (a memfd whose byte 0 the process read-locks for life): each
  // record stores its number, and its completion raises the completed
  // number; an opened event maps the slot, and its waits (queued on a
  // stream, or on the host) poll for the number recorded at the call,
  // checking the exporter's lock between polls: gone with the record
  // incomplete, the wait fails with kLaunchFailure. Handles of the same
  // memory or event are identical bytes; an event handle may be opened many
  // times. Every member takes SIMDEV_INJECT_FAULT.
  // Limits: a handle opens on the exporter's physical device index only; an
  // opening process holds a descriptor per open handle or event; pages the
  // exporter freed while opened elsewhere stay until its next malloc or
  // free on that device; a consumer waiting for one record is released by a
  // later record of the same event completing first (two streams); a
  // process forked after allocating shares those pages with its parent (the
  // SDK refuses device use there) and allocates from a heap of its own.
  accelkit::IpcMemHandle ipc_mem_export(int device, void* ptr) {
    check(device, "ipc_mem_export");
    fault("ipc_mem_export");
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    auto hit = d.allocations.at(ptr);
    if (!hit) {
      auto inside = d.allocations.find(ptr);
      driver_error(kInvalidValue, "ipc_mem_export",
                   inside ? fmt::format("{} lies inside the allocation at {} of device {}: a "
                                        "handle names a whole allocation, by its start",
                                        ptr, static_cast<void*>(inside.pointer()), device)
                          : fmt::format("{} is not the start of an allocation from malloc on "
                                        "device {}",
                                        ptr, device));
    }
    Allocation& a = *hit.value;
    if (a.opened)
      driver_error(kInvalidValue, "ipc_mem_export",
                   fmt::format("memory at {} was opened from process {} (ipc_mem_open): only its "
                               "exporter can export it",
                               ptr, a.opened->pid));
    if (a.heap->pid != self_pid())
      driver_error(kNotPermitted, "ipc_mem_export",
                   fmt::format("memory at {} was allocated by process {}, which this one forked "
                               "from",
                               ptr, a.heap->pid));
    std::size_t length = hit.bytes + (a.offset ? kPage : 0);
    if (!a.exported) {
      if (!set_lock(a.heap->fd, a.file_offset + 1, F_RDLCK))
        driver_error(kInvalidValue, "ipc_mem_export",
                     fmt::format("locking the heap at {:#x} failed: {}", a.file_offset + 1,
                                 std::strerror(errno)));
      a.exported = true;
      ipc_exported_.fetch_add(1, std::memory_order_relaxed);
    }
    Wire w{kMemMagic, static_cast<std::uint32_t>(device), a.heap->pid, a.heap->fd,
           a.heap->token, a.file_offset, length, a.offset, hit.bytes, 0};
    return encode<accelkit::IpcMemHandle>(w);
  }

  void* ipc_mem_open(int device, const accelkit::IpcMemHandle& handle) {
    check(device, "ipc_mem_open");
    fault("ipc_mem_open");
    Wire w = decode(handle.bytes, kMemMagic, "ipc_mem_open", "memory");
    std::string what = fmt::format("memory handle {}", hex(handle.bytes));
    if (w.length == 0 || w.length % kPage != 0 || w.start >= kPage || w.bytes == 0 ||
        w.start + w.bytes > w.length || w.offset % kPage != 0)
      driver_error(kInvalidValue, "ipc_mem_open",
                   fmt::format("{} is not a simdev memory handle (its range is malformed)", what));
    check_handle(w, device, "ipc_mem_open", what);
    Device& d = context(device);
    OpenKey key{w.pid, w.token, w.offset};
    {
      std::lock_guard<std::mutex> lock(opened_mutex_);
      auto [it, fresh] = opened_.emplace(key, nullptr);
      if (!fresh)
        driver_error(kInvalidValue, "ipc_mem_open",
                     fmt::format("{} is open in this process already{}: ipc_mem_close it first "
                                 "(a handle is opened once per process)",
                                 what, it->second ? fmt::format(", at {}", it->second) : ""));
    }
    auto forget = [&] {
      std::lock_guard<std::mutex> lock(opened_mutex_);
      opened_.erase(key);
    };
    try {
      auto o = std::make_shared<Opened>();
      o->fd = reopen(w, fmt::format("simdev-heap-{}-{:016x}", w.device, w.token), "ipc_mem_open",
                     what);
      o->pid = w.pid;
      o->key = key;
      o->length = w.length;
      if (!set_lock(o->fd, w.offset, F_RDLCK))
        driver_error(kInvalidValue, "ipc_mem_open",
                     fmt::format("{}: locking the exporter's heap failed: {}", what,
                                 std::strerror(errno)));
      if (!locked(o->fd, w.offset + 1))
        driver_error(kInvalidValue, "ipc_mem_open",
                     fmt::format("{}: the memory was freed by process {} (a handle names memory "
                                 "only while it lives)",
                                 what, w.pid));
      char* view = nullptr;
      void* host = map_heap(o->fd, w.offset, w.length, view);
      if (host == MAP_FAILED)
        driver_error(kInvalidValue, "ipc_mem_open",
                     fmt::format("{}: mapping {} bytes failed: {}", what, w.length,
                                 std::strerror(errno)));
      char* ptr = static_cast<char*>(host) + w.start;
      Allocation a;
      a.offset = w.start;
      a.view = view;
      a.serial = next_serial_.fetch_add(1, std::memory_order_relaxed);
      if (view) a.holds.assign(w.length / kPage, 0);
      a.file_offset = w.offset;
      a.opened = std::move(o);
      {
        std::lock_guard<std::mutex> lock(d.mutex);
        d.allocations.insert(ptr, w.bytes, std::move(a));
      }
      {
        std::lock_guard<std::mutex> lock(opened_mutex_);
        opened_[key] = ptr;
      }
      ipc_open_.fetch_add(1, std::memory_order_relaxed);
      return ptr;
    } catch (...) {
      forget();
      throw;
    }
  }

  void ipc_mem_close(int device, void* ptr) {
    check(device, "ipc_mem_close");
    fault("ipc_mem_close");
    Device& d = context(device);
    Allocation a;
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      auto hit = d.allocations.at(ptr);
      if (!hit || !hit.value->opened)
        driver_error(kInvalidValue, "ipc_mem_close",
                     fmt::format("pointer {} is not memory opened by ipc_mem_open on device {} "
                                 "({})",
                                 ptr, device,
                                 hit ? "it is this process's own allocation: free it"
                                     : "never opened, or closed already"));
      a = *hit.value;
      bytes = hit.bytes;
      if (std::any_of(a.holds.begin(), a.holds.end(), [](std::uint32_t h) { return h > 0; }))
        driver_error(kInvalidValue, "ipc_mem_close",
                     fmt::format("memory at {} is still mapped for the host (host_map without "
                                 "host_unmap)",
                                 ptr));
    }
    refuse_if_queued("ipc_mem_close", static_cast<char*>(ptr), bytes);
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      d.allocations.erase(ptr);
    }
    std::size_t length = a.opened->length;
    retire(static_cast<char*>(ptr) - a.offset, length);  // the exporter's pages no longer mapped
    if (a.view) ::munmap(a.view, length);
    {
      std::lock_guard<std::mutex> lock(opened_mutex_);
      opened_.erase(a.opened->key);
    }
    ipc_open_.fetch_sub(1, std::memory_order_relaxed);
    // The descriptor, and with it the lock on the exporter's heap, goes with `a`.
  }

  accelkit::IpcEventHandle ipc_event_export(int device, accelkit::EventHandle event) {
    check(device, "ipc_event_export");
    auto e = event_of(event, "ipc_event_export");
    fault("ipc_event_export");
    if (e->remote)
      driver_error(kInvalidValue, "ipc_event_export",
                   fmt::format("event {:#x} was opened from process {} (ipc_event_open): only "
                               "its exporter can export it",
                               event.value, e->remote->pid));
    if (!e->slot)
      driver_error(kInvalidValue, "ipc_event_export",
                   fmt::format("event {:#x} was not created with EventFlags::interprocess",
                               event.value));
    if (e->device != device)
      driver_error(kInvalidValue, "ipc_event_export",
                   fmt::format("event {:#x} is of device {}, exported as device {}'s",
                               event.value, e->device, device));
    if (e->file->pid != self_pid())
      driver_error(kNotPermitted, "ipc_event_export",
                   fmt::format("event {:#x} was created by process {}, which this one forked "
                               "from",
                               event.value, e->file->pid));
    {
      std::lock_guard<std::mutex> lock(e->mutex);
      if (!std::exchange(e->exported, true)) ipc_events_exported_.fetch_add(1);
    }
    Wire w{kEventMagic, static_cast<std::uint32_t>(device), e->file->pid, e->file->fd,
           e->file->token, e->index, 0, 0, 0, 0};
    return encode<accelkit::IpcEventHandle>(w);
  }

  accelkit::EventHandle ipc_event_open(int device, const accelkit::IpcEventHandle& handle) {
    check(device, "ipc_event_open");
    fault("ipc_event_open");
    Wire w = decode(handle.bytes, kEventMagic, "ipc_event_open", "event");
    std::string what = fmt::format("event handle {}", hex(handle.bytes));
    if (w.offset == 0 || w.offset >= kEventSlots || w.length != 0 || w.start != 0 || w.bytes != 0)
      driver_error(kInvalidValue, "ipc_event_open",
                   fmt::format("{} is not a simdev event handle (its slot is malformed)", what));
    check_handle(w, device, "ipc_event_open", what);
    context(device);
    auto r = std::make_shared<RemoteEvent>();
    r->fd = reopen(w, fmt::format("simdev-events-{:016x}", w.token), "ipc_event_open", what);
    r->pid = w.pid;
    std::uint64_t byte = w.offset * sizeof(IpcSlot);
    std::uint64_t page = byte / kPage * kPage;
    void* m = ::mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd,
                     static_cast<off_t>(page));
    if (m == MAP_FAILED)
      driver_error(kInvalidValue, "ipc_event_open",
                   fmt::format("{}: mapping its slot failed: {}", what, std::strerror(errno)));
    r->page = static_cast<char*>(m);
    r->slot = reinterpret_cast<IpcSlot*>(r->page + (byte - page));
    if (!r->exporter_alive())
      driver_error(kInvalidValue, "ipc_event_open",
                   fmt::format("{}: the process that exported it (pid {}) has exited", what,
                               w.pid));
    std::uint64_t state = r->slot->state.load(std::memory_order_acquire);
    if (state != kSlotLive)
      driver_error(kInvalidValue, "ipc_event_open",
                   fmt::format("{}: {} of process {}", what,
                               state == kSlotDestroyed ? "the event was destroyed by its exporter"
                                                       : "names no interprocess event",
                               w.pid));
    auto e = std::make_shared<Event>();
    e->device = device;
    e->remote = std::move(r);
    accelkit::EventHandle h = events_.add(std::move(e));
    ipc_events_open_.fetch_add(1);
    return h;
  }

  // Blocks `stream` at this point of its queue until the returned gate opens
  // (tests use it to hold work back and observe ordering).
  class Gate {
   public:
    void open() {
      std::lock_guard<std::mutex> lock(mutex_);
      open_ = true;
      cv_.notify_all();
    }
    // A gate left shut would hang the stream and whoever waits for it:
    // after a minute the process stops, loudly.
    void wait() {
      std::unique_lock<std::mutex> lock(mutex_);
      if (!cv_.wait_for(lock, std::chrono::seconds(60), [this] { return open_; })) {
        std::fprintf(stderr, "simdev: a stream held by a test was not released within 60 s\n");
        std::abort();
      }
    }

   private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool open_ = false;
  };
  std::shared_ptr<Gate> hold(int device, accelkit::StreamHandle stream) {
    auto gate = std::make_shared<Gate>();
    Work w;
    w.device = device;
    w.what = "hold";
    w.fn = [gate] { gate->wait(); };
    auto s = stream_of(device, stream, "hold");
    refuse_capturing(*s, device, stream, "hold");
    s->enqueue(std::move(w));
    return gate;
  }

  // ------------------------------------------------------- kernels

  // simdev's kernel launch (what a vendor's kernels call; examples/simdev/
  // simdev_kernels.cpp): `fn` runs on `stream`'s worker, in order with the
  // stream's other work, as a device kernel would. `uses` names the device
  // memory it reads or writes (at most kMaxTouches ranges), checked as a
  // queued copy's is: memory not allocated is a driver error now, and
  // freeing it while the kernel is queued is refused (Note [simdev
  // strictness]).
  void launch(int device, accelkit::StreamHandle stream, const char* what,
              std::function<void()> fn,
              std::initializer_list<std::pair<const void*, std::size_t>> uses) {
    auto s = stream_of(device, stream, "launch");
    report_async(device, "launch");
    if (uses.size() > kMaxTouches)
      driver_error(kInvalidValue, "launch",
                   fmt::format("{} names {} memory ranges, at most {}", what, uses.size(),
                               kMaxTouches));
    Work w;
    w.device = device;
    w.what = what;
    w.fn = std::move(fn);
    std::size_t i = 0;
    for (auto [p, n] : uses)
      w.touches[i++] = {device, static_cast<char*>(const_cast<void*>(p)), n};
    check_live(w, "launch");
    launches_.fetch_add(1, std::memory_order_relaxed);
    s->enqueue(std::move(w));
  }

  // ------------------------------------------------ simulator inspection

  // Devices whose context exists (set_device, malloc, streams... create one;
  // device_count and properties never do).
  int contexts_created() const { return contexts_.load(); }
  long events_created() const { return events_created_.load(); }
  // memcpy and memcpy_async calls so far (tests tell copying paths apart).
  long copies() const { return copies_.load(); }
  // Kernel launch calls so far (those recorded by a capture included).
  long launches() const { return launches_.load(); }
  // host_map calls so far (Note [simdev mapped memory]).
  long host_maps() const { return host_maps_.load(); }
  // Graphs made by stream_end_capture, and graph_launch calls, so far; graphs
  // and execs alive (Note [simdev graphs]).
  long graphs_captured() const { return graphs_captured_.load(); }
  long graph_launches() const { return graph_launches_.load(); }
  long live_graphs() const { return static_cast<long>(graphs_.size()); }
  long live_graph_execs() const { return static_cast<long>(execs_.size()); }
  // Where simdev's own work addresses device memory at `p` (its device
  // view in mapped mode, `p` itself otherwise): native kernels launched on
  // simdev's streams read and write through it.
  template <class T>
  T* device_address(int device, T* p) {
    if (!mapped_mode() || p == nullptr) return p;
    Device& d = context(device);
    char* c = reinterpret_cast<char*>(const_cast<std::remove_const_t<T>*>(p));
    std::lock_guard<std::mutex> lock(d.mutex);
    auto hit = d.allocations.find(c);
    if (!hit) {  // mapped virtual memory: the device's view of its reservation
      auto r = d.reservations.find(c);
      if (!r || r.value->shadow == nullptr) return p;
      return reinterpret_cast<T*>(r.value->shadow + r.offset);
    }
    if (hit.value->view == nullptr) return p;
    return reinterpret_cast<T*>(hit.value->view + hit.value->offset + hit.offset);
  }
  // Virtual memory (Note [simdev virtual memory]): physical memory alive
  // (all devices), and a device's reserved ranges and mapped pieces.
  long live_physical() const { return static_cast<long>(physicals_.size()); }
  long vm_reservations(int device) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    return static_cast<long>(d.reservations.size());
  }
  long vm_pieces(int device) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    return static_cast<long>(d.pieces.size());
  }
  // Inter-process memory and events (Note [simdev inter-process memory]):
  // allocations of this process exported and not freed; memory of other
  // processes open here; freed allocations whose pages wait for another
  // process to close them; interprocess events exported and not destroyed;
  // events opened from other processes and not destroyed.
  long ipc_exported() const { return ipc_exported_.load(); }
  long ipc_open_count() const { return ipc_open_.load(); }
  long ipc_deferred_releases() const { return ipc_deferred_.load(); }
  long ipc_events_exported() const { return ipc_events_exported_.load(); }
  long ipc_events_open() const { return ipc_events_open_.load(); }
  bool initialized() const { return initialized_; }
  std::uint64_t bytes_in_use(int device) { return context(device).used.load(); }
  long pinned_blocks() {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    return static_cast<long>(pinned_.size());
  }
  // Makes `member` fail once, on its n-th call from now on (n = 1: the
  // next); with `async`, its queued work fails instead (Note [simdev
  // strictness]).
  void inject_fault(const std::string& member, int nth = 1, bool async = false) {
    if (async && !queues_work(member))
      throw accelkit::ValueError(
          name, fmt::format("inject_fault: {} queues no work, so it cannot fail asynchronously "
                            "(memcpy_async, memset_async, memcpy_peer_async, event_record, "
                            "stream_wait_event, stream_wait_peer_event, stream_wait_signal "
                            "and graph_launch can)",
                            member));
    configure();  // so that reading the environment later cannot drop it
    std::lock_guard<std::mutex> lock(fault_mutex_);
    config_.faults[member] = Config::Fault{nth + calls_[member], async};
  }
  // Makes malloc (or vm_create) return nullptr (a null handle) once, on its
  // n-th call from now on, while memory is free: a driver's refusal (Note
  // [Refusal and exhaustion]).
  void inject_refusal(int nth = 1, const std::string& member = "malloc") {
    if (member != "malloc" && member != "vm_create")
      throw accelkit::ValueError(
          name, fmt::format("inject_refusal: {} cannot refuse (malloc and vm_create can)", member));
    configure();
    std::lock_guard<std::mutex> lock(fault_mutex_);
    config_.faults[member] = Config::Fault{nth + calls_[member], false, true};
  }
  // Whether a fault injected for `member` has not fired yet.
  bool fault_pending(const std::string& member) {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    return config_.faults.count(member) != 0;
  }
  void clear_faults() {
    configure();
    std::lock_guard<std::mutex> lock(fault_mutex_);
    config_.faults.clear();
  }
  // Streams alive on every device.
  long live_streams() {
    long n = 0;
    for (int dev = 0; dev < config_.device_count; ++dev)
      if (devices_[static_cast<std::size_t>(dev)].exists.load())
        n += static_cast<long>(streams_of(dev).size());
    return n;
  }
  // The priority a stream was created with, in simdev's numbering.
  int stream_priority(int device, accelkit::StreamHandle stream) {
    return stream_of(device, stream, "stream_priority")->priority();
  }
  // Whether an asynchronous error of `device` waits to be reported.
  bool async_error_pending(int device) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.async_error.has_value();
  }

 private:
  static constexpr std::size_t kPage = 4096;
  // Freed address ranges stay reserved (inaccessible) until this many bytes
  // or ranges of them accumulate (Note [simdev strictness]); the oldest are
  // unmapped then. Bounded so that the process's mappings stay few.
  static constexpr std::size_t kRetiredBytes = std::size_t{256} << 20;
  static constexpr std::size_t kRetiredRanges = 1024;

  // The page size of mapping, and how many times its capacity a device may
  // reserve in addresses (Note [simdev virtual memory]).
  static constexpr std::size_t kVmGranularity = std::size_t{2} << 20;
  static constexpr std::uint64_t kVmAddressFactor = 64;

  static constexpr std::size_t kMaxTouches = 3;  // memory ranges one piece of work uses
  struct Range {
    int device = -1;  // -1: host memory (pinned)
    char* ptr = nullptr;
    std::size_t bytes = 0;
    bool overlaps(const char* p, std::size_t n) const {
      return ptr != nullptr && p < ptr + bytes && ptr < p + n;
    }
  };

  // A unit of queued work: what it does, and the memory it touches (checked
  // when it runs, and against frees while it is queued).
  struct Work {
    int device = 0;               // whose asynchronous error a failure is
    const char* what = "";
    std::function<void()> fn;
    std::array<Range, kMaxTouches> touches{};
    bool fail = false;            // an injected asynchronous fault
    bool essential = false;       // a record or wait: done in order even when failing
    // Run by the stream once it counts this work done, under its lock: an
    // event's completion, so that a stream whose last work is that record
    // is idle (stream_query true) by the time the event is complete.
    std::function<void()> then;
    bool live(SimRuntime& rt) const {
      for (const Range& r : touches)
        if (r.ptr && !rt.is_live(r)) return false;
      return true;
    }
  };

  // One record of an event: complete when its stream reaches it.
  struct EventFile;
  struct IpcSlot;
  class Record {
   public:
    void complete() {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      when_ = std::chrono::steady_clock::now();
      if (slot_) slot_->complete(seq_);
      cv_.notify_all();
    }
    // The record of an interprocess event: its completion is published in
    // the event's slot, as record `seq` (Note [simdev inter-process memory]).
    void share(std::shared_ptr<EventFile> file, IpcSlot* slot, std::uint64_t seq) {
      file_ = std::move(file);
      slot_ = slot;
      seq_ = seq;
    }
    bool done() {
      std::lock_guard<std::mutex> lock(mutex_);
      return done_;
    }
    void wait() {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return done_; });
    }
    std::chrono::steady_clock::time_point when() {
      std::lock_guard<std::mutex> lock(mutex_);
      return when_;
    }

   private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool done_ = false;
    std::chrono::steady_clock::time_point when_{};
    std::shared_ptr<EventFile> file_;  // keeps the slot mapped
    IpcSlot* slot_ = nullptr;
    std::uint64_t seq_ = 0;
  };

  // A stream: a FIFO of work run by a worker thread started on first use.
  class Stream {
   public:
    Stream(SimRuntime* rt, int device, int priority)
        : rt_(rt), device_(device), priority_(priority) {}
    ~Stream() { stop(); }

    // A capture underway (Note [simdev graphs]).
    struct Capture {
      accelkit::CaptureMode mode = accelkit::CaptureMode::global;
      std::vector<Work> works;
      std::string invalidated;  // the call that did, or empty
    };
    bool begin_capture(accelkit::CaptureMode mode) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (capture_) return false;
      capture_ = std::make_unique<Capture>();
      capture_->mode = mode;
      return true;
    }
    std::unique_ptr<Capture> end_capture() {
      std::lock_guard<std::mutex> lock(mutex_);
      return std::move(capture_);
    }
    bool capturing() {
      std::lock_guard<std::mutex> lock(mutex_);
      return capture_ != nullptr;
    }
    // Marks the capture invalidated by `call`; false when not capturing.
    bool invalidate(const char* call) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!capture_) return false;
      if (capture_->invalidated.empty()) capture_->invalidated = call;
      return true;
    }

    // Queues the work, or records it while the stream captures.
    void enqueue(Work work) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (capture_) {
        capture_->works.push_back(std::move(work));
        return;
      }
      queue_.push_back(std::move(work));
      ++enqueued_;
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
      cv_.notify_all();
    }
    // A graph's launch: copies of its work, queued in one go.
    template <class Nodes>
    // `fail`: the first of them fails when it runs (an injected asynchronous
    // fault of the launch).
    void enqueue_all(const Nodes& nodes, bool fail) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const auto& n : nodes) {
        queue_.push_back(n.work);
        if (fail) queue_.back().fail = std::exchange(fail, false);
      }
      enqueued_ += nodes.size();
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
      cv_.notify_all();
    }
    bool idle() {
      std::lock_guard<std::mutex> lock(mutex_);
      return completed_ == enqueued_;
    }
    int priority() const { return priority_; }
    // An event record: on an idle stream it completes at once, as on a
    // device; otherwise it completes when the stream reaches it.
    void record(const std::shared_ptr<Record>& r, bool fail) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (completed_ == enqueued_ && !fail) {
        r->complete();
        return;
      }
      lock.unlock();
      Work w;
      w.device = device_;
      w.what = "event_record";
      w.then = [r] { r->complete(); };
      w.essential = true;
      w.fail = fail;
      enqueue(std::move(w));
    }
    void synchronize() {
      std::unique_lock<std::mutex> lock(mutex_);
      std::uint64_t target = enqueued_;
      cv_.wait(lock, [&] { return completed_ >= target; });
    }
    // Whether queued or running work touches [p, p + n).
    bool uses(const char* p, std::size_t n) {
      std::lock_guard<std::mutex> lock(mutex_);
      for (const Range& r : running_)
        if (r.overlaps(p, n)) return true;
      for (const Work& w : queue_)
        for (const Range& r : w.touches)
          if (r.overlaps(p, n)) return true;
      return false;
    }
    void stop() {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        stopping_ = true;
        cv_.notify_all();
      }
      if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
    }

   private:
    void run() {
      std::unique_lock<std::mutex> lock(mutex_);
      while (true) {
        cv_.wait(lock, [this] { return !queue_.empty() || stopping_; });
        if (queue_.empty()) return;  // stopping, and drained
        Work work = std::move(queue_.front());
        queue_.pop_front();
        running_ = work.touches;
        lock.unlock();
        rt_->run(work);
        lock.lock();
        running_ = {};
        ++completed_;
        if (work.then) work.then();
        cv_.notify_all();
      }
    }

    SimRuntime* rt_;
    int device_;
    int priority_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<Work> queue_;
    std::array<Range, kMaxTouches> running_{};
    std::uint64_t enqueued_ = 0;
    std::uint64_t completed_ = 0;
    std::unique_ptr<Capture> capture_;
    bool stopping_ = false;
    std::thread worker_;
  };

  // An event: its last record (none until recorded).
  struct RemoteEvent;
  struct Event {
    int device = 0;
    bool timing = false;
    std::mutex mutex;
    std::shared_ptr<Record> record;
    // An interprocess event's slot (Note [simdev inter-process memory]),
    // its records so far and whether it was exported (under `mutex`).
    std::shared_ptr<EventFile> file;
    IpcSlot* slot = nullptr;
    std::uint64_t index = 0;
    std::uint64_t seq = 0;
    bool exported = false;
    std::shared_ptr<RemoteEvent> remote;  // opened from another process
    std::shared_ptr<Record> last() {
      std::lock_guard<std::mutex> lock(mutex);
      return record;
    }
  };

  // A graph's work, with the serial of the allocation each touched range lay
  // in at capture (0: none; pinned ranges are checked by address only).
  struct Node {
    Work work;
    std::array<std::uint64_t, kMaxTouches> serials{};
  };
  struct Graph {
    int device = 0;
    std::shared_ptr<const std::vector<Node>> nodes;
  };
  struct Exec {
    int device = 0;
    std::shared_ptr<const std::vector<Node>> nodes;  // shared with the graph
  };

  // A device allocation; its size is the range map's (usable bytes, from
  // the returned pointer).
  struct Heap;
  struct Opened;
  struct Allocation {
    std::size_t offset = 0;  // from the start of the mapping
    char* view = nullptr;    // mapped mode: the device's view of the mapping
    std::vector<std::uint32_t> holds;  // mapped mode: open host maps per page
    std::uint64_t serial = 0;          // which allocation: never the same twice
    // The heap of its pages (null when opened from another process) and the
    // mapping's offset in it (or in the exporter's); whether exported;
    // ipc_mem_open's state (Note [simdev inter-process memory]).
    std::shared_ptr<Heap> heap;
    std::uint64_t file_offset = 0;
    bool exported = false;
    std::shared_ptr<Opened> opened;
  };
  // A device's heap in one process: a sparse memfd whose offsets are given
  // out once each.
  struct Heap {
    int fd = -1;
    pid_t pid = 0;
    std::uint64_t token = 0;  // in the memfd's name
    char* region = nullptr;   // reserved addresses: offset o maps at region + o
    std::uint64_t size = 0;   // of the file and the region
    std::uint64_t next = 0;   // under the device's heap_mutex
    std::mutex mutex;         // deferred
    std::vector<std::pair<std::uint64_t, std::size_t>> deferred;  // freed, open elsewhere
    Heap() = default;
    Heap(const Heap&) = delete;
    Heap& operator=(const Heap&) = delete;
    ~Heap() {  // no allocation of it lives: the addresses never given go back
      if (region && next < size) ::munmap(region + next, size - next);
      if (fd >= 0) ::close(fd);
    }
  };
  using OpenKey = std::tuple<pid_t, std::uint64_t, std::uint64_t>;  // pid, token, offset
  // Another process's memory opened here: its heap's descriptor, holding
  // the lock that says so.
  struct Opened {
    int fd = -1;
    pid_t pid = 0;
    OpenKey key{};
    std::size_t length = 0;  // of the mapping
    Opened() = default;
    Opened(const Opened&) = delete;
    Opened& operator=(const Opened&) = delete;
    ~Opened() {
      if (fd >= 0) ::close(fd);
    }
  };
  // An interprocess event's slot, shared between processes.
  static constexpr std::uint64_t kSlotLive = 1, kSlotDestroyed = 2;
  struct IpcSlot {
    std::atomic<std::uint64_t> state;      // 0 unused, kSlotLive, kSlotDestroyed
    std::atomic<std::uint64_t> recorded;   // the last record's number (0: none)
    std::atomic<std::uint64_t> completed;  // the highest number completed
    std::uint64_t device;
    void complete(std::uint64_t seq) {
      std::uint64_t c = completed.load(std::memory_order_relaxed);
      while (c < seq && !completed.compare_exchange_weak(c, seq, std::memory_order_release)) {
      }
    }
  };
  static_assert(sizeof(std::atomic<std::uint64_t>) == 8 &&
                    std::atomic<std::uint64_t>::is_always_lock_free,
                "a slot's numbers are shared between processes");
  static constexpr std::uint64_t kEventSlots = 32768;  // per process; slot 0 is not used
  // A process's interprocess events: a memfd of slots, byte 0 read-locked
  // by the process for its lifetime.
  struct EventFile {
    int fd = -1;
    pid_t pid = 0;
    std::uint64_t token = 0;
    char* base = nullptr;
    std::uint64_t next = 1;  // under the runtime's ipc_mutex_
    EventFile() = default;
    EventFile(const EventFile&) = delete;
    EventFile& operator=(const EventFile&) = delete;
    ~EventFile() {
      if (base) ::munmap(base, kEventSlots * sizeof(IpcSlot));
      if (fd >= 0) ::close(fd);
    }
  };
  // An event opened from another process: its slot, mapped here.
  struct RemoteEvent {
    int fd = -1;
    pid_t pid = 0;
    char* page = nullptr;
    IpcSlot* slot = nullptr;
    RemoteEvent() = default;
    RemoteEvent(const RemoteEvent&) = delete;
    RemoteEvent& operator=(const RemoteEvent&) = delete;
    ~RemoteEvent() {
      if (page) ::munmap(page, kPage);
      if (fd >= 0) ::close(fd);
    }
    bool completed(std::uint64_t target) const {
      return target == 0 || slot->completed.load(std::memory_order_acquire) >= target;
    }
    bool exporter_alive() const { return locked(fd, 0); }
  };
  // The 64 bytes of a handle.
  static constexpr std::uint32_t kMemMagic = 0x4d564453;    // "SDVM"
  static constexpr std::uint32_t kEventMagic = 0x45564453;  // "SDVE"
  struct Wire {
    std::uint32_t magic;
    std::uint32_t device;
    std::int32_t pid;
    std::int32_t fd;
    std::uint64_t token;
    std::uint64_t offset;  // memory: in the heap; event: the slot
    std::uint64_t length;  // memory: of the mapping
    std::uint64_t start;   // memory: the pointer's offset in the mapping
    std::uint64_t bytes;   // memory: the allocation's
    std::uint64_t check;
  };
  static_assert(sizeof(Wire) == 64, "a handle is 64 bytes");
  // Physical memory from vm_create (Note [simdev virtual memory]).
  struct Physical {
    int device = 0;
    int fd = -1;
    std::size_t bytes = 0;
    long maps = 0;  // live mappings, under the device's mutex
    Physical() = default;
    Physical(const Physical&) = delete;
    Physical& operator=(const Physical&) = delete;
    ~Physical() {
      if (fd >= 0) ::close(fd);
    }
  };
  // A range from vm_reserve, and a piece of it vm_map mapped.
  struct Reservation {
    char* shadow = nullptr;  // mapped mode: the device's view of the range
    long pieces = 0;         // mapped pieces inside
    std::map<std::size_t, std::uint32_t> holds;  // mapped mode: open host maps per kPage
  };
  // A view host_map opened (Note [simdev mapped memory]).
  struct HostView {
    char* base = nullptr;    // the view's first page
    std::size_t length = 0;  // whole pages
    char* host = nullptr;    // what host_map returned
  };
  struct Piece {
    std::shared_ptr<Physical> physical;
    std::uint64_t serial = 0;  // as Allocation::serial
  };
  struct Device {
    std::once_flag created;
    std::atomic<bool> exists{false};
    std::atomic<std::uint64_t> used{0};
    std::mutex mutex;
    accelkit::support::RangeMap<Allocation> allocations;  // under `mutex`
    // Virtual memory, under `mutex` (Note [simdev virtual memory]).
    accelkit::support::RangeMap<Reservation> reservations;
    accelkit::support::RangeMap<Piece> pieces;  // of every reservation
    std::uint64_t reserved_bytes = 0;
    accelkit::support::HandleTable<accelkit::StreamHandle, Stream> streams{name, "stream",
                                                                          kInvalidHandle};
    // Open host views by (pointer, bytes), under `mutex` (Note [simdev mapped memory]).
    std::multimap<std::pair<char*, std::size_t>, HostView> host_views;
    std::mutex heap_mutex;
    std::shared_ptr<Heap> heap;  // under heap_mutex (Note [simdev inter-process memory])
    std::optional<std::pair<int, std::string>> async_error;  // code, message
    std::atomic<bool> has_async_error{false};  // async_error is set (read without the lock)
    // The failure that lost the device, under `mutex` (Note [simdev sticky
    // faults]); is_lost: set (read without the lock).
    std::optional<std::pair<int, std::string>> lost;
    std::atomic<bool> is_lost{false};
  };

  // Queues on `s` a wait for record `r` (none: never recorded, nothing to
  // wait for). A failing wait still waits (Work::essential).
  void enqueue_wait(Stream& s, int device, std::shared_ptr<Record> r, bool async_fault,
                    const char* what) {
    if (!r) return;
    Work w;
    w.device = device;
    w.what = what;
    w.fn = [r] { r->wait(); };
    w.essential = true;
    w.fail = async_fault;
    s.enqueue(std::move(w));
  }

  // Runs queued (or pageable, synchronous) work: an injected fault or memory
  // that is no longer allocated fails it, asynchronously. A failing record
  // or wait still completes in order, so nothing waits forever.
  // On a lost device (Note [simdev sticky faults]) only records and waits
  // still complete, so that nothing waits forever; other work is dropped.
  void run(Work& w) {
    if (w.fail) {
      set_async_error(w.device, kLaunchFailure,
                      fmt::format("queued {} failed: injected asynchronous fault", w.what), true);
      if (w.essential && w.fn) w.fn();
      return;
    }
    if (is_lost(w.device)) {
      if (w.essential && w.fn) w.fn();
      return;
    }
    if (!w.live(*this)) {
      set_async_error(w.device, kIllegalAddress,
                      fmt::format("queued {} touches memory that was freed", w.what), true);
      return;
    }
    if (w.fn) w.fn();
  }

  // `device_fault`: a failure of the device's own work, which loses the
  // device under SIMDEV_STICKY_FAULTS (Note [simdev sticky faults]).
  void set_async_error(int device, int code, std::string message, bool device_fault = false) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    if (device_fault && config_.sticky_faults && !d.lost) {
      d.lost.emplace(code, message);
      d.is_lost.store(true, std::memory_order_release);
    }
    if (!d.async_error) d.async_error.emplace(code, std::move(message));
    d.has_async_error.store(true, std::memory_order_release);
  }
  // Reports (once) the asynchronous error of `device`, if any; on a lost
  // device, fails every call with DeviceLostError.
  void report_async(int device, const char* call) {
    Device& d = context(device);
    if (!d.has_async_error.load(std::memory_order_acquire)) return check_lost(device, call);
    std::optional<std::pair<int, std::string>> e;
    bool lost;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (!d.async_error) return check_lost(device, call);
      e.swap(d.async_error);
      d.has_async_error.store(false, std::memory_order_relaxed);
      lost = d.lost.has_value();
    }
    std::string message = fmt::format("asynchronous error of earlier work: {}", e->second);
    if (lost) device_lost(e->first, call, message);
    driver_error(e->first, call, message);
  }

  // Note [simdev sticky faults]
  // Problem: CUDA's sticky errors and Vulkan's VK_ERROR_DEVICE_LOST end a
  // device: the SDK's handling of a lost device (Note [Lost devices]) needs
  // a runtime that loses one on demand.
  // Decision: with SIMDEV_STICKY_FAULTS=1 a failure of a device's queued
  // work (an injected :async fault, or work on memory that was freed) loses
  // the device: it is reported once as DeviceLostError (code 719 or 700),
  // by the next call of the device that reports asynchronous errors or by
  // any call of the device that would run work; every later such call fails
  // with DeviceLostError naming that failure; queued work is dropped, but
  // records and waits still complete. Releases (free, host_free, the
  // destroys, unmaps, closes) and queries that run nothing (properties,
  // set_device, can_access_peer, vm_granularity) work as before. Other
  // devices are unharmed.
  // Limits: a fault injected at the call (no :async) stays a plain driver
  // error: nothing was queued. A lost device stays lost for the runtime's
  // life.
  bool is_lost(int device) {
    return config_.sticky_faults &&
           devices_[static_cast<std::size_t>(device)].is_lost.load(std::memory_order_acquire);
  }
  void check_lost(int device, const char* call) {
    if (!is_lost(device)) return;
    Device& d = context(device);
    std::optional<std::pair<int, std::string>> e;
    std::pair<int, std::string> first;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      e.swap(d.async_error);  // the loss itself, if not reported yet
      d.has_async_error.store(false, std::memory_order_relaxed);
      first = *d.lost;
    }
    if (e) device_lost(e->first, call, fmt::format("asynchronous error of earlier work: {}", e->second));
    device_lost(first.first, call, fmt::format("the device was lost earlier: {}", first.second));
  }

  bool mapped_mode() const { return config_.host_access == accelkit::HostAccessLevel::mapped; }

  // A heap of `device` of the calling process with room for `bytes`, and
  // `at`, the offset given to them (Note [simdev inter-process memory]). A
  // new heap is made at the first malloc, when one is full, and in a forked
  // child; null when no memfd or addresses can be had. Offset o of a heap
  // is mapped at region + o, so that the mappings of consecutive
  // allocations (consecutive offsets of one file) join into one, as
  // anonymous memory's do.
  std::shared_ptr<Heap> heap_of(Device& d, int device, std::size_t bytes, std::uint64_t& at) {
    pid_t pid = self_pid();
    std::lock_guard<std::mutex> lock(d.heap_mutex);
    Heap* h = d.heap.get();
    if (h == nullptr || h->pid != pid || h->next + bytes > h->size) {
      std::uint64_t size = std::min<std::uint64_t>(
          std::max<std::uint64_t>(8 * config_.capacity(device), std::uint64_t{16} << 30),
          std::uint64_t{1} << 40);
      size = std::max<std::uint64_t>(size, bytes);
      auto fresh = std::make_shared<Heap>();
      fresh->pid = pid;
      fresh->token = random_token();
      std::string file = fmt::format("simdev-heap-{}-{:016x}", device, fresh->token);
      fresh->fd = static_cast<int>(::syscall(SYS_memfd_create, file.c_str(), 1u /* MFD_CLOEXEC */));
      if (fresh->fd < 0 || ::ftruncate(fresh->fd, static_cast<off_t>(size)) != 0) return nullptr;
      void* region = ::mmap(nullptr, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                            -1, 0);
      if (region == MAP_FAILED) return nullptr;
      fresh->region = static_cast<char*>(region);
      fresh->size = size;
      d.heap = std::move(fresh);
      h = d.heap.get();
    }
    at = h->next;
    h->next += bytes;
    return d.heap;
  }
  // Maps `bytes` of a heap at offset `at` (at `where`, reserved addresses,
  // or anywhere when null): read-write; in mapped mode (Note [simdev mapped
  // memory]) PROT_NONE, with `view` set to the device's read-write view.
  // MAP_FAILED on failure.
  void* map_heap(int fd, std::uint64_t at, std::size_t bytes, char*& view, char* where = nullptr) {
    int fixed = where ? MAP_FIXED : 0;
    if (!mapped_mode())
      return ::mmap(where, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | fixed, fd,
                    static_cast<off_t>(at));
    void* host = ::mmap(where, bytes, PROT_NONE, MAP_SHARED | fixed, fd, static_cast<off_t>(at));
    if (host == MAP_FAILED) return MAP_FAILED;
    void* dev = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, static_cast<off_t>(at));
    if (dev == MAP_FAILED) {
      if (where)
        retire(host, bytes);
      else
        ::munmap(host, bytes);
      return MAP_FAILED;
    }
    view = static_cast<char*>(dev);
    return host;
  }
  static void punch(int fd, std::uint64_t at, std::size_t bytes) {
    ::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(at),
                static_cast<off_t>(bytes));
  }
  // The pages of a freed allocation leave its heap, unless another process
  // holds them open: then they wait for a later retry_deferred.
  void release_pages(const Allocation& a, std::size_t length) {
    Heap& h = *a.heap;
    if (h.pid != self_pid()) return;  // a parent's heap, inherited across fork: its pages
    bool held = false;
    if (a.exported) {
      set_lock(h.fd, a.file_offset + 1, F_UNLCK);  // opens from now on are refused
      held = locked(h.fd, a.file_offset);
      ipc_exported_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (held) {
      std::lock_guard<std::mutex> lock(h.mutex);
      h.deferred.emplace_back(a.file_offset, length);
      ipc_deferred_.fetch_add(1);
      return;
    }
    punch(h.fd, a.file_offset, length);
    if (ipc_deferred_.load(std::memory_order_relaxed) != 0) retry_deferred(h);
  }
  // Punches the deferred ranges no process holds any longer.
  void retry_deferred(Heap& h) {
    std::lock_guard<std::mutex> lock(h.mutex);
    for (auto it = h.deferred.begin(); it != h.deferred.end();) {
      if (locked(h.fd, it->first)) {
        ++it;
        continue;
      }
      punch(h.fd, it->first, it->second);
      it = h.deferred.erase(it);
      ipc_deferred_.fetch_sub(1);
    }
  }
  // An OFD lock of one byte (F_RDLCK, or F_UNLCK to drop it).
  static bool set_lock(int fd, std::uint64_t byte, short type) {
    struct flock fl {};
    fl.l_type = type;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(byte);
    fl.l_len = 1;
    return ::fcntl(fd, F_OFD_SETLK, &fl) == 0;
  }
  // Whether another open file description (another process's, or a dead
  // one's until the kernel drops it) locks the byte; true when unknown.
  static bool locked(int fd, std::uint64_t byte) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = static_cast<off_t>(byte);
    fl.l_len = 1;
    if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return true;
    return fl.l_type != F_UNLCK;
  }
  // This process's id, without a system call at each malloc and free:
  // taken again in a forked child.
  static pid_t self_pid() {
    static pid_t pid = [] {
      ::pthread_atfork(nullptr, nullptr, [] { pid = ::getpid(); });
      return ::getpid();
    }();
    return pid;
  }
  static std::uint64_t random_token() {
    std::random_device rd;
    std::uint64_t t = (std::uint64_t{rd()} << 32) ^ rd();
    t ^= static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return t ^ (static_cast<std::uint64_t>(::getpid()) << 40);
  }
  static std::uint64_t checksum(const Wire& w) {
    unsigned char b[sizeof(Wire)];
    std::memcpy(b, &w, sizeof b);
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (std::size_t i = 0; i < offsetof(Wire, check); ++i) h = (h ^ b[i]) * 0x100000001b3ull;
    return h ^ 0x5349'4d44'4556'4950ull;
  }
  template <class H>
  static H encode(Wire w) {
    w.check = checksum(w);
    H h;
    std::memcpy(h.bytes.data(), &w, sizeof w);
    return h;
  }
  static std::string hex(const std::array<std::uint8_t, 64>& bytes) {
    std::string s;
    for (std::uint8_t b : bytes) s += fmt::format("{:02x}", b);
    return s;
  }
  Wire decode(const std::array<std::uint8_t, 64>& bytes, std::uint32_t magic, const char* call,
              const char* kind) {
    Wire w;
    std::memcpy(&w, bytes.data(), sizeof w);
    if (w.magic != magic || w.check != checksum(w) || w.pid <= 0 || w.fd < 0)
      driver_error(kInvalidValue, call,
                   fmt::format("{} handle {} is not a simdev {} handle (garbled or not from "
                               "ipc_{}_export)",
                               kind, hex(bytes), kind, magic == kMemMagic ? "mem" : "event"));
    return w;
  }
  // The checks every open makes before reaching the exporter.
  void check_handle(const Wire& w, int device, const char* call, const std::string& what) {
    if (static_cast<int>(w.device) != device)
      driver_error(kInvalidValue, call,
                   fmt::format("{} is of device {}, opened on device {} (open it on the "
                               "exporter's device)",
                               what, w.device, device));
    if (w.pid == self_pid())
      driver_error(kInvalidValue, call,
                   fmt::format("{} was exported by this process (pid {}): a handle is opened "
                               "in another process; here, use what it names",
                               what, w.pid));
  }
  // The exporter's file, opened anew through /proc (Note [simdev
  // inter-process memory]); its name must carry `file`.
  int reopen(const Wire& w, const std::string& file, const char* call, const std::string& what) {
    std::string path = fmt::format("/proc/{}/fd/{}", w.pid, w.fd);
    auto names = [&](const std::string& link) {
      char buf[256];
      ssize_t n = ::readlink(link.c_str(), buf, sizeof buf - 1);
      return n > 0 && std::string_view(buf, static_cast<std::size_t>(n)).find(file) !=
                          std::string_view::npos;
    };
    auto gone = [&](int error) {
      bool alive = ::access(fmt::format("/proc/{}", w.pid).c_str(), F_OK) == 0;
      driver_error(kInvalidValue, call,
                   error != 0 && error != ENOENT
                       ? fmt::format("{}: {} cannot be opened: {}", what, path,
                                     std::strerror(error))
                       : fmt::format("{}: the process that exported it (pid {}) has exited{}",
                                     what, w.pid,
                                     alive ? " or destroyed its simdev runtime (the pid names "
                                             "another process now, or holds no such memory)"
                                           : ""));
    };
    if (!names(path)) gone(0);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) gone(errno);
    if (!names(fmt::format("/proc/self/fd/{}", fd))) {  // the pid or descriptor changed hands
      ::close(fd);
      gone(0);
    }
    return fd;
  }
  // An interprocess event's slot in this process's event file.
  void share_slot(Event& e, int device) {
    std::lock_guard<std::mutex> lock(ipc_mutex_);
    pid_t pid = self_pid();
    if (!event_file_ || event_file_->pid != pid) {
      auto f = std::make_shared<EventFile>();
      f->pid = pid;
      f->token = random_token();
      std::string file = fmt::format("simdev-events-{:016x}", f->token);
      std::size_t bytes = kEventSlots * sizeof(IpcSlot);
      f->fd = static_cast<int>(::syscall(SYS_memfd_create, file.c_str(), 1u /* MFD_CLOEXEC */));
      void* m = MAP_FAILED;
      if (f->fd >= 0 && ::ftruncate(f->fd, static_cast<off_t>(bytes)) == 0 &&
          set_lock(f->fd, 0, F_RDLCK))
        m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, f->fd, 0);
      if (m == MAP_FAILED)
        driver_error(kInvalidValue, "event_create",
                     fmt::format("the file of interprocess events could not be made: {}",
                                 std::strerror(errno)));
      f->base = static_cast<char*>(m);
      event_file_ = std::move(f);
    }
    if (event_file_->next >= kEventSlots)
      driver_error(kInvalidValue, "event_create",
                   fmt::format("this process has made {} interprocess events, simdev's most",
                               kEventSlots - 1));
    e.file = event_file_;
    e.index = event_file_->next++;
    e.slot = new (event_file_->base + e.index * sizeof(IpcSlot)) IpcSlot{};
    e.slot->device = static_cast<std::uint64_t>(device);
    e.slot->state.store(kSlotLive, std::memory_order_release);
  }
  // Queues on `s` a wait for the exporter's last record of an opened event.
  void enqueue_remote_wait(Stream& s, int device, const std::shared_ptr<RemoteEvent>& r,
                           bool async_fault, const char* what) {
    std::uint64_t target = r->slot->recorded.load(std::memory_order_acquire);
    if (r->completed(target)) return;
    Work w;
    w.device = device;
    w.what = what;
    w.fn = [this, r, target, device, what] {
      if (!wait_remote(*r, target))
        set_async_error(device, kLaunchFailure,
                        fmt::format("queued {}: {}", what, exited_with_record(*r, target)));
    };
    w.essential = true;
    w.fail = async_fault;
    s.enqueue(std::move(w));
  }
  // Polls until record `target` of an opened event has completed (true), or
  // its exporter is gone with it incomplete (false).
  static bool wait_remote(const RemoteEvent& r, std::uint64_t target) {
    for (int i = 0; i < 64; ++i) {
      if (r.completed(target)) return true;
      std::this_thread::yield();
    }
    auto nap = std::chrono::microseconds(20);
    while (!r.completed(target)) {
      if (!r.exporter_alive()) return r.completed(target);
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    return true;
  }
  static std::string exited_with_record(const RemoteEvent& r, std::uint64_t target) {
    return fmt::format("the process that exported the interprocess event (pid {}) exited "
                       "before its record {} completed",
                       r.pid, target);
  }

  // host_map's view of [c, c + bytes) (Note [simdev mapped memory]), which
  // must lie in one allocation or in mapped pieces of one reservation: the
  // pages under it mapped anew, read-write; the address of c in the view.
  // The pages' holds count the view, and it is kept for host_unmap.
  void* open_view(int device, char* c, std::size_t bytes) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    HostView v;
    if (bytes == 0)
      driver_error(kInvalidValue, "host_map",
                   fmt::format("0 bytes at {}: nothing to map", static_cast<void*>(c)));
    auto hit = d.allocations.find(c, bytes);
    if (hit) {
      Allocation& a = *hit.value;
      char* base = hit.pointer() - a.offset;  // the mapping's first page
      std::size_t first = static_cast<std::size_t>(c - base) / kPage;
      std::size_t last = static_cast<std::size_t>(c + bytes - 1 - base) / kPage;
      v.length = (last - first + 1) * kPage;
      int fd = a.heap ? a.heap->fd : a.opened->fd;
      void* m = ::mmap(nullptr, v.length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                       static_cast<off_t>(a.file_offset + first * kPage));
      if (m == MAP_FAILED)
        driver_error(kInvalidValue, "host_map",
                     fmt::format("mapping a host view of {} bytes at {} failed: {}", bytes,
                                 static_cast<void*>(c), std::strerror(errno)));
      v.base = static_cast<char*>(m);
      v.host = v.base + (c - base - first * kPage);
      for (std::size_t i = first; i <= last; ++i) ++a.holds[i];
    } else if (vm_serial(d, c, bytes) != 0) {
      auto r = d.reservations.find(c, bytes);
      char* base = r.pointer();
      std::size_t first = static_cast<std::size_t>(c - base) / kPage;
      std::size_t last = static_cast<std::size_t>(c + bytes - 1 - base) / kPage;
      v.length = (last - first + 1) * kPage;
      v.base = reserve_pages(v.length, kPage);
      if (v.base == nullptr)
        driver_error(kInvalidValue, "host_map",
                     fmt::format("reserving a host view of {} bytes at {} failed", bytes,
                                 static_cast<void*>(c)));
      // Each piece's pages under the range, at their places in the view.
      char* from = base + first * kPage;
      char* end = base + (last + 1) * kPage;
      for (char* p = from; p < end;) {
        auto piece = d.pieces.find(p);
        char* stop = std::min(end, piece.pointer() + piece.bytes);
        if (::mmap(v.base + (p - from), static_cast<std::size_t>(stop - p),
                   PROT_READ | PROT_WRITE, MAP_FIXED | MAP_SHARED | MAP_POPULATE,
                   piece.value->physical->fd,
                   static_cast<off_t>(p - piece.pointer())) == MAP_FAILED) {
          int error = errno;
          ::munmap(v.base, v.length);
          driver_error(kInvalidValue, "host_map",
                       fmt::format("mapping a host view of {} bytes at {} failed: {}", bytes,
                                   static_cast<void*>(c), std::strerror(error)));
        }
        p = stop;
      }
      v.host = v.base + (c - from);
      for (std::size_t i = first; i <= last; ++i) ++r.value->holds[i];
    } else {
      driver_error(kInvalidValue, "host_map",
                   fmt::format("{} bytes at {} are not inside one allocation of device {}", bytes,
                               static_cast<void*>(c), device));
    }
    d.host_views.emplace(std::make_pair(c, bytes), v);
    return v.host;
  }

  // host_unmap: the last view host_map opened for [c, c + bytes) is unmapped
  // and its pages' holds dropped.
  void close_view(int device, char* c, std::size_t bytes) {
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    auto [lo, hi] = d.host_views.equal_range(std::make_pair(c, bytes));
    if (lo == hi)
      driver_error(kInvalidValue, "host_unmap",
                   fmt::format("{} bytes at {} were not mapped for the host", bytes,
                               static_cast<void*>(c)));
    HostView v = std::prev(hi)->second;
    d.host_views.erase(std::prev(hi));
    ::munmap(v.base, v.length);
    if (auto hit = d.allocations.find(c, bytes)) {
      char* base = hit.pointer() - hit.value->offset;
      std::size_t first = static_cast<std::size_t>(c - base) / kPage;
      std::size_t last = static_cast<std::size_t>(c + bytes - 1 - base) / kPage;
      for (std::size_t i = first; i <= last; ++i) --hit.value->holds[i];
    } else if (auto r = d.reservations.find(c, bytes)) {
      std::map<std::size_t, std::uint32_t>& holds = r.value->holds;
      std::size_t first = static_cast<std::size_t>(c - r.pointer()) / kPage;
      std::size_t last = static_cast<std::size_t>(c + bytes - 1 - r.pointer()) / kPage;
      for (std::size_t i = first; i <= last; ++i) {
        auto it = holds.find(i);
        if (it != holds.end() && --it->second == 0) holds.erase(it);
      }
    }
  }

  Work copy_work(int device, int dst_device, void* dst, const void* src, std::size_t bytes,
                 accelkit::CopyKind kind) {
    Work w;
    w.device = device;
    w.what = "memcpy_async";
    auto* d = static_cast<char*>(dst);
    auto* s = const_cast<char*>(static_cast<const char*>(src));
    bool src_dev = kind == accelkit::CopyKind::device_to_host ||
                   kind == accelkit::CopyKind::device_to_device;
    bool dst_dev = kind == accelkit::CopyKind::host_to_device ||
                   kind == accelkit::CopyKind::device_to_device;
    // Host sides are checked only when pinned (pageable memory is the
    // caller's own).
    w.touches[0] = {src_dev ? device : -1, s, bytes};
    w.touches[1] = {dst_dev ? dst_device : -1, d, bytes};
    for (Range& r : w.touches)
      if (r.device < 0 && !is_pinned(r.ptr, bytes)) r = Range{};
    // The device's own view of its memory (Note [simdev mapped memory]).
    if (src_dev) s = device_address(device, s);
    if (dst_dev) d = device_address(dst_device, d);
    w.fn = [d, s, bytes] { copy_bytes(d, s, bytes); };  // copy_engine.hpp
    return w;
  }

  bool is_live(const Range& r) {
    if (r.device < 0) return is_pinned(r.ptr, r.bytes);
    Device& d = context(r.device);
    std::lock_guard<std::mutex> lock(d.mutex);
    return d.allocations.find(r.ptr, r.bytes) || vm_serial(d, r.ptr, r.bytes) != 0;
  }
  // The serial of the allocation [r.ptr, r.ptr + r.bytes) lies in; for
  // pinned memory 1 while it is host_malloc's; 0 when not allocated.
  std::uint64_t serial_of(const Range& r) {
    if (r.ptr == nullptr) return 0;
    if (r.device < 0) return is_pinned(r.ptr, r.bytes) ? 1 : 0;
    Device& d = context(r.device);
    std::lock_guard<std::mutex> lock(d.mutex);
    auto hit = d.allocations.find(r.ptr, r.bytes);
    return hit ? hit.value->serial : vm_serial(d, r.ptr, r.bytes);
  }
  // Under d.mutex: 0 unless mapped pieces of one reservation cover [p, p +
  // n); then a mix of their serials, which an unmap and a new map change.
  static std::uint64_t vm_serial(Device& d, const char* p, std::size_t n) {
    if (d.pieces.empty() || !d.reservations.find(p, n)) return 0;
    std::uint64_t h = 0x9e3779b97f4a7c15ull;
    const char* c = p;
    do {
      auto hit = d.pieces.find(c);
      if (!hit) return 0;
      h = (h ^ hit.value->serial) * 0xff51afd7ed558ccdull;
      h ^= h >> 33;
      c = hit.pointer() + hit.bytes;
    } while (c < p + n);
    return h | 1;
  }

  void check_vm_size(std::size_t bytes, const char* call) {
    if (bytes == 0 || bytes % kVmGranularity != 0)
      driver_error(kInvalidValue, call,
                   fmt::format("{} bytes is not a positive multiple of the granularity ({} "
                               "bytes)",
                               bytes, kVmGranularity));
  }
  void check_vm_address(const void* at, const char* call) {
    if (at == nullptr || reinterpret_cast<std::uintptr_t>(at) % kVmGranularity != 0)
      driver_error(kInvalidValue, call,
                   fmt::format("address {} is not aligned to the granularity ({} bytes)", at,
                               kVmGranularity));
  }
  void check_physical_device(const Physical& m, accelkit::PhysicalHandle memory, int device,
                             const char* call) {
    if (m.device != device)
      driver_error(kInvalidValue, call,
                   fmt::format("physical memory {:#x} is device {}'s, used as device {}'s",
                               memory.value, m.device, device));
  }
  // `bytes` of PROT_NONE addresses aligned to `alignment`, or nullptr.
  static char* reserve_pages(std::size_t bytes, std::size_t alignment) {
    std::size_t extra = alignment > kPage ? alignment : 0;
    void* raw = ::mmap(nullptr, bytes + extra, PROT_NONE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) return nullptr;
    auto a = reinterpret_cast<std::uintptr_t>(raw);
    std::uintptr_t aligned = (a + alignment - 1) / alignment * alignment;
    if (aligned > a) ::munmap(raw, aligned - a);
    if (std::size_t tail = a + extra - aligned) ::munmap(reinterpret_cast<char*>(aligned) + bytes, tail);
    return reinterpret_cast<char*>(aligned);
  }
  // Back to reserved addresses with nothing behind them (PROT_NONE).
  void unmap_pages(char* p, std::size_t bytes) {
    if (::mmap(p, bytes, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1,
               0) == MAP_FAILED)
      driver_error(kInvalidValue, "vm_unmap",
                   fmt::format("mmap of PROT_NONE pages at {} failed: {}",
                               static_cast<void*>(p), std::strerror(errno)));
  }

  // `call` on a capturing stream: the capture invalidated, a driver error
  // (Note [simdev strictness]). One load when nothing captures.
  void refuse_capturing(Stream& s, int device, accelkit::StreamHandle stream, const char* call) {
    if (captures_underway_.load(std::memory_order_relaxed) == 0) return;
    if (s.invalidate(call))
      driver_error(kCaptureUnsupported, call,
                   fmt::format("stream {:#x} of device {} is capturing a graph: not allowed "
                               "during capture; the capture is invalidated",
                               stream.value, device));
  }

  void check_live(const Work& w, const char* call) {
    if (!w.live(*this))
      driver_error(kIllegalAddress, call,
                   fmt::format("{} names memory that is not allocated", w.what));
  }

  // A free of memory that queued work still uses, on any stream of any
  // device (peer copies run on the source's streams), is refused.
  // A lost device's streams drop their work (Note [simdev sticky faults]):
  // waited for instead.
  void refuse_if_queued(const char* call, char* p, std::size_t n) {
    for (int dev = 0; dev < config_.device_count; ++dev)
      if (devices_[static_cast<std::size_t>(dev)].exists.load())
        for (auto& s : streams_of(dev)) {
          if (!s->uses(p, n)) continue;
          if (is_lost(dev)) {
            s->synchronize();
            continue;
          }
          driver_error(kInvalidValue, call,
                       fmt::format("memory at {} ({} bytes) is still used by queued work",
                                   static_cast<void*>(p), n));
        }
  }

  // Freed memory: pages dropped and made inaccessible, the range kept
  // reserved for a while (Note [simdev strictness]).
  // Anonymous PROT_NONE pages replace the mapping, so that no file (a heap,
  // another process's) stays mapped behind them.
  void retire(void* p, std::size_t n) {
    if (::mmap(p, n, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0) ==
        MAP_FAILED) {
      ::madvise(p, n, MADV_DONTNEED);
      ::mprotect(p, n, PROT_NONE);
    }
    std::lock_guard<std::mutex> lock(retired_mutex_);
    retired_.emplace_back(p, n);
    retired_bytes_ += n;
    while (retired_bytes_ > kRetiredBytes || retired_.size() > kRetiredRanges) {
      auto [q, m] = retired_.front();
      retired_.pop_front();
      retired_bytes_ -= m;
      ::munmap(q, m);
    }
  }

  std::vector<std::shared_ptr<Stream>> streams_of(int device) {
    return context(device).streams.objects();
  }

  void configure() {
    std::lock_guard<std::mutex> lock(config_mutex_);
    if (!configured_) {
      config_ = Config::from_environment(accelkit::Environment::process());
      configured_ = true;
    }
    if (!devices_) devices_ = std::make_unique<Device[]>(static_cast<std::size_t>(config_.device_count));
  }

  // A driver thread started at discovery (SIMDEV_DISCOVERY_THREAD), as
  // PoCL's first device query starts its workers; its process is remembered.
  void start_discovery_thread() {
    std::lock_guard<std::mutex> lock(discovery_mutex_);
    if (discovery_pid_ != 0) return;
    discovery_pid_ = ::getpid();
    discovery_worker_ = std::thread([this] {
      std::unique_lock<std::mutex> l(discovery_mutex_);
      discovery_cv_.wait(l, [this] { return discovery_stop_; });
    });
  }
  // In a process forked after the discovery thread started, the thread is
  // gone: a real driver would hang at this call, simdev fails loudly.
  void check_discovery_thread(const char* call) {
    pid_t owner = discovery_pid_.load(std::memory_order_acquire);
    if (owner != 0 && owner != ::getpid())
      driver_error(kNotPermitted, call,
                   fmt::format("the driver thread started at discovery (in pid {}) does not "
                               "exist in this process, forked since: a real driver would hang",
                               owner));
  }

  void check(int device, const char* call) {
    check_discovery_thread(call);
    if (device < 0 || device >= config_.device_count)
      driver_error(kInvalidDevice, call,
                   fmt::format("no device {} (simdev has {})", device, config_.device_count));
    if (config_.sticky_faults && devices_ && runs_work(call)) check_lost(device, call);
  }
  // Whether `call` (a member that checks its device) runs work, which a lost
  // device refuses (Note [simdev sticky faults]).
  static bool runs_work(std::string_view call) {
    for (std::string_view m : {"malloc", "host_malloc", "memcpy", "host_map", "stream_create",
                               "event_create", "signal_create", "device_synchronize",
                               "graph_instantiate", "vm_reserve", "vm_create", "vm_map",
                               "ipc_mem_export", "ipc_mem_open", "ipc_event_export",
                               "ipc_event_open"})
      if (call == m) return true;
    return false;
  }

  Device& context(int device) {
    Device& d = devices_[static_cast<std::size_t>(device)];
    std::call_once(d.created, [&] {
      contexts_.fetch_add(1);
      d.exists.store(true);
    });
    return d;
  }

  std::shared_ptr<Stream> stream_of(int device, accelkit::StreamHandle stream, const char* call) {
    check(device, call);
    return context(device).streams.get(stream, call, device);
  }

  std::shared_ptr<Event> event_of(accelkit::EventHandle event, const char* call) {
    return events_.get(event, call);
  }

  bool is_pinned(const void* p, std::size_t bytes) { return pinned_device(p, bytes) >= 0; }
  // The device whose host_malloc gave [p, p + bytes), or -1.
  int pinned_device(const void* p, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    auto hit = pinned_.find(p, bytes);
    return hit ? *hit.value : -1;
  }

  // Counts a call of `member`; throws when a fault is due at this call, or
  // returns true when its queued work is to fail instead.
  // A refusal (malloc) returns true as well.
  bool fault(const char* member) {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    if (config_.faults.empty()) return false;
    int n = ++calls_[member];
    auto it = config_.faults.find(member);
    if (it == config_.faults.end() || n != it->second.nth) return false;
    bool async = it->second.async || it->second.refuse;
    config_.faults.erase(it);  // one-shot: the next call succeeds again
    if (async) return true;
    driver_error(kInjectedFault, member, "injected fault");
  }

  Config config_;
  std::mutex discovery_mutex_;
  std::condition_variable discovery_cv_;
  bool discovery_stop_ = false;
  std::atomic<pid_t> discovery_pid_{0};
  std::thread discovery_worker_;
  bool configured_ = false;
  std::mutex config_mutex_;
  std::unique_ptr<Device[]> devices_;
  std::atomic<int> contexts_{0};
  std::atomic<long> events_created_{0};
  std::atomic<long> copies_{0};
  std::atomic<long> launches_{0};
  std::atomic<long> host_maps_{0};
  std::atomic<long> graphs_captured_{0};
  std::atomic<long> graph_launches_{0};
  std::atomic<int> captures_underway_{0};  // streams capturing, all devices
  std::atomic<std::uint64_t> next_serial_{1};  // Allocation::serial
  accelkit::support::HandleTable<accelkit::PhysicalHandle, Physical> physicals_{
      name, "physical memory", kInvalidHandle};
  accelkit::support::HandleTable<accelkit::GraphHandle, Graph> graphs_{name, "graph",
                                                                       kInvalidHandle};
  accelkit::support::HandleTable<accelkit::GraphExecHandle, Exec> execs_{name, "graph exec",
                                                                         kInvalidHandle};
  bool initialized_ = false;
  std::mutex pinned_mutex_;
  accelkit::support::RangeMap<int> pinned_;  // host_malloc's memory -> its device
  accelkit::support::HandleTable<accelkit::EventHandle, Event> events_{name, "event",
                                                                       kInvalidHandle};
  // Note [simdev host signals].
  accelkit::support::HostSignalTable<> signals_{
      name, {kInvalidHandle, kInvalidValue, kInvalidValue, kNotPermitted}};
  std::mutex fault_mutex_;
  std::map<std::string, int> calls_;
  // Note [simdev inter-process memory].
  std::mutex ipc_mutex_;
  std::shared_ptr<EventFile> event_file_;  // under ipc_mutex_
  std::mutex opened_mutex_;
  std::map<OpenKey, void*> opened_;  // handles open here -> base (nullptr while opening)
  std::atomic<long> ipc_exported_{0};
  std::atomic<long> ipc_open_{0};
  std::atomic<long> ipc_deferred_{0};
  std::atomic<long> ipc_events_exported_{0};
  std::atomic<long> ipc_events_open_{0};
  std::mutex retired_mutex_;
  std::deque<std::pair<void*, std::size_t>> retired_;
  std::size_t retired_bytes_ = 0;
  static inline thread_local int current_device_ = 0;
};

}  // namespace simdev
