// ocl: a reference backend for any OpenCL 2.0+ device with shared virtual
// memory (SVM), written as a vendor would write one: over the OpenCL API
// only. Tested on PoCL (Debian pocl-opencl-icd).
//
// How the contract maps onto OpenCL:
//   device memory   clSVMAlloc/clSVMFree in the device's context (fine-grained
//                   SVM: the host may touch it directly; coarse-grained:
//                   between host_map and host_unmap, clEnqueueSVMMap and
//                   clEnqueueSVMUnmap)
//   streams         in-order command queues with profiling on (timing is a
//                   property of the queue in OpenCL, not of the event), with
//                   cl_khr_priority_hints' three levels where the device has
//                   them
//   events          re-recordable handles over one-shot cl_events: a record
//                   keeps the queue's last command event (Note [ocl last
//                   command]); a timing event enqueues a marker
//   copies, memset  clEnqueueSVMMemcpy, clEnqueueSVMMemFill
//   async errors    a negative command execution status, reported once as a
//                   DriverError carrying it (Note [ocl asynchronous errors])
//   host signals    user events, waited for by barriers (Note [ocl host
//                   signals])
//   graphs          cl_khr_command_buffer where the device has it: a
//                   capturing stream's copies, fills and kernels recorded
//                   into a command buffer, enqueued again by a launch (Note
//                   [ocl graphs] in opencl_command_buffer.hpp); elsewhere
//                   capturing is a NotSupportedError naming the extension
//
// Configuration, read at the first device_count() (each a clear error when
// malformed):
//   OCL_SVM   fine (default where every device has fine-grained buffers) or
//             coarse: the SVM kind device memory is allocated as
//   OCL_HOST_MAP 1 (default) or 0: coarse-grained memory is reported as
//             reachable by the host through host_map/host_unmap (mapped), or
//             not at all (none: the SDK copies; for comparisons)
//   OCL_COMMAND_BUFFER 1 (default) or 0: graphs through cl_khr_command_buffer
//             where the device has it, or never (capturing is then refused
//             as on a device without the extension)
//
// The backend is named `ocl`: "opencl" is one of PyTorch's device types.
//
// Note [ocl last command]
// Problem: the contract asks whether a stream is idle and records events on
// it, and OpenCL has neither: a queue cannot be queried, and a cl_event
// names one command, once. A marker enqueued to ask would itself be pending,
// so an idle queue would never look idle.
// Decision: an in-order queue completes its commands in order, so it is idle
// exactly when the last command enqueued on it has completed. Each stream
// keeps the event of its last command (every enqueue asks OpenCL for one);
// querying the stream reads that event's status and enqueues nothing. A plain
// event record retains the same event, enqueueing nothing: the record is
// complete when the queue's work up to it is. A timing record enqueues a
// marker, whose profiling counters give its time.
// Limits: work enqueued on a stream's queue behind the runtime's back is not
// seen unless it goes through enqueue_kernel (kernels do) or enqueue_on.
//
// Note [ocl asynchronous errors]
// Problem: OpenCL reports a failed command only as a negative execution
// status of its event (and of every event waiting on it), and the contract
// wants each failure reported once, at a call that lets errors arrive.
// Decision: the runtime reads statuses in stream_query, stream_synchronize,
// event_query, event_synchronize and device_synchronize. The first time a
// failed event is seen it is thrown as a DriverError carrying the status; it
// is kept (retained) in the device's list of reported failures, so that the
// same failure read again through another stream or event record counts as
// complete and is not reported twice.
// Limits: the list of reported failures grows by one retained event per
// failure for the device's life.
//
// Note [ocl host signals]
// Problem: a stream must wait for a flag the host sets (Note [Host signals]
// in accelkit's backend.hpp); OpenCL cannot say whether a queue still waits
// for a user event, and one released before it is set leaves its waiters
// waiting forever.
// Decision: a signal is a user event of the device's context
// (clCreateUserEvent), kept by the runtime's signal table
// (support/host_signals.hpp); a stream waits for it with a barrier whose wait
// list is that event (clEnqueueBarrierWithWaitList), the barrier becoming the
// stream's last command; signal_complete sets the event's status
// (clSetUserEventStatus): CL_COMPLETE, or for an error a negative status (the
// error, negated if it is positive). OpenCL fails the barrier waiting for a
// failed user event, and the stream reports that as its asynchronous error
// (Note [ocl asynchronous errors]). Each queued barrier is counted, and a
// signal that is not completed is not destroyed while any was queued.
// Limits: a barrier's count never ends (OpenCL does not say when it passed),
// so a signal waited for once is destroyable only after its completion.
#pragma once

#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 300
#endif
#include <CL/cl.h>
#include <CL/cl_ext.h>

#include <accelkit/accelkit.hpp>
#include <accelkit/support/driver_info.hpp>
#include <accelkit/support/handle_table.hpp>
#include <accelkit/support/host_signals.hpp>

#include "opencl_command_buffer.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ocl {

inline const char* error_name(cl_int e) {
  switch (e) {
    case CL_SUCCESS: return "CL_SUCCESS";
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_PROFILING_INFO_NOT_AVAILABLE: return "CL_PROFILING_INFO_NOT_AVAILABLE";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST:
      return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_PLATFORM: return "CL_INVALID_PLATFORM";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_QUEUE_PROPERTIES: return "CL_INVALID_QUEUE_PROPERTIES";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_EVENT_WAIT_LIST: return "CL_INVALID_EVENT_WAIT_LIST";
    case CL_PLATFORM_NOT_FOUND_KHR: return "CL_PLATFORM_NOT_FOUND_KHR";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_KERNEL: return "CL_INVALID_KERNEL";
    case CL_MEM_COPY_OVERLAP: return "CL_MEM_COPY_OVERLAP";
    case CL_INVALID_COMMAND_BUFFER_KHR: return "CL_INVALID_COMMAND_BUFFER_KHR";
    case CL_INVALID_SYNC_POINT_WAIT_LIST_KHR: return "CL_INVALID_SYNC_POINT_WAIT_LIST_KHR";
    case CL_INCOMPATIBLE_COMMAND_QUEUE_KHR: return "CL_INCOMPATIBLE_COMMAND_QUEUE_KHR";
    default: return "an OpenCL error";
  }
}

// The SVM kind device memory is allocated as.
enum class Svm { fine, coarse };

struct Config {
  std::optional<Svm> svm;  // unset: fine where every device has it
  bool host_map = true;    // OCL_HOST_MAP: coarse-grained memory reported mapped (else none)
  bool command_buffer = true;  // OCL_COMMAND_BUFFER: graphs where the device can (else never)

  static Config from_environment(const accelkit::Environment& env) {
    Config c;
    if (auto v = env.get("OCL_SVM")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "fine") c.svm = Svm::fine;
      else if (t == "coarse") c.svm = Svm::coarse;
      else throw accelkit::ValueError("ocl", fmt::format("OCL_SVM='{}': expected fine or coarse", *v));
    }
    if (auto v = env.get("OCL_HOST_MAP")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.host_map = true;
      else if (t == "0") c.host_map = false;
      else throw accelkit::ValueError("ocl", fmt::format("OCL_HOST_MAP='{}': expected 0 or 1", *v));
    }
    if (auto v = env.get("OCL_COMMAND_BUFFER")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.command_buffer = true;
      else if (t == "0") c.command_buffer = false;
      else
        throw accelkit::ValueError("ocl",
                                   fmt::format("OCL_COMMAND_BUFFER='{}': expected 0 or 1", *v));
    }
    return c;
  }
};

class OpenCLRuntime : public accelkit::Runtime<OpenCLRuntime> {
 public:
  static constexpr std::string_view name = "ocl";
  // PoCL starts its worker threads at the first platform query, and an
  // OpenCL driver may: a child forked after discovery refuses device use.
  static constexpr bool fork_safe_discovery = false;

  OpenCLRuntime() = default;
  explicit OpenCLRuntime(Config config) : config_(std::move(config)), configured_(true) {}
  OpenCLRuntime(const OpenCLRuntime&) = delete;
  OpenCLRuntime& operator=(const OpenCLRuntime&) = delete;
  ~OpenCLRuntime() {
    execs_.clear();  // graphs go with their last queued launch (Note [ocl graphs])
    graphs_.clear();
    for (auto& d : devices_) {
      d->streams.clear();  // each queue goes with its stream's last reference
      std::lock_guard<std::mutex> lock(d->mutex);
      for (cl_event e : d->failed) clReleaseEvent(e);
      if (d->sync_queue) clReleaseCommandQueue(d->sync_queue);
      if (d->context) clReleaseContext(d->context);
    }
  }

  // ------------------------------------------------------------ contract

  // Lists platforms and devices only: no context is created. (PoCL starts
  // its worker threads at the first platform query nonetheless, which is why
  // fork_safe_discovery is false.)
  int device_count() {
    discover();
    return static_cast<int>(devices_.size());
  }

  accelkit::DeviceProperties properties(int device) {
    discover();
    Device& d = dev(device, "properties");
    cl_device_id id = d.id;
    accelkit::DeviceProperties p;
    p.name = info_string(id, CL_DEVICE_NAME);
    p.vendor = info_string(id, CL_DEVICE_VENDOR);
    std::string version = info_string(id, CL_DEVICE_VERSION);
    std::string driver = info_string(id, CL_DRIVER_VERSION);
    // OpenCL has no architecture (unknown: empty); the device's version
    // string, which names what PoCL builds for, is an extra. The UUID is
    // cl_khr_device_uuid's where the device has it, else unknown: the SDK
    // derives a stable one.
    p.uuid = uuid_of(d);
    p.pci_bus_id = pci_bus_id_of(d);
    p.driver_version = accelkit::support::parse_version(driver);
    if (p.driver_version == accelkit::Version{}) p.driver_version = {0, 0, 1};
    p.runtime_version =
        accelkit::support::parse_version(platform_string(d.platform, CL_PLATFORM_VERSION));
    p.total_memory = info<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
    p.max_allocation = std::min<std::uint64_t>(info<cl_ulong>(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE),
                                               p.total_memory);
    p.compute_units = static_cast<int>(info<cl_uint>(id, CL_DEVICE_MAX_COMPUTE_UNITS));
    // A subgroup's width depends on the kernel in OpenCL; the device's
    // preferred work-group multiple stands in.
    std::size_t multiple = 0;
    if (clGetDeviceInfo(id, CL_DEVICE_PREFERRED_WORK_GROUP_SIZE_MULTIPLE, sizeof multiple,
                        &multiple, nullptr) != CL_SUCCESS || multiple == 0 ||
        (multiple & (multiple - 1)) != 0)
      multiple = 1;
    p.subgroup_size = static_cast<int>(multiple);
    p.clock_rate_khz =
        static_cast<int>(std::max<cl_uint>(1, info<cl_uint>(id, CL_DEVICE_MAX_CLOCK_FREQUENCY)) * 1000);
    p.l2_cache_bytes = std::min<std::uint64_t>(info<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_CACHE_SIZE),
                                               p.total_memory);
    p.dtypes = accelkit::DTypeSet::all();  // every dtype through the SDK's fallback
    // Coarse-grained SVM: the host touches it between clEnqueueSVMMap and
    // clEnqueueSVMUnmap (host_map, host_unmap).
    // OCL_HOST_MAP=0 reports it out of the host's reach (none), so the SDK
    // copies around host kernels (a comparison for the benchmarks).
    p.host_access = svm_ == Svm::fine  ? accelkit::HostAccessLevel::direct
                    : config_.host_map ? accelkit::HostAccessLevel::mapped
                                       : accelkit::HostAccessLevel::none;
    p.unified_memory = false;
    // cl_khr_priority_hints: normal (MED) and HIGH; one level without it.
    p.stream_priorities = accelkit::StreamPriorityRange::from_levels(d.priority_hints ? 2 : 1);
    p.memory_alignment = kSvmAlign;
    p.event_timing = true;
    // DLPack's OpenCL type; the data of its tensors are SVM pointers, where
    // DLPack's text has cl_mem handles in mind (docs/dlpack.md).
    p.dlpack_device_type = accelkit::DLPackDeviceType::opencl;
    // OpenCL does not say how many copy engines a device has: unknown.
    p.extras.push_back({"ocl.svm", std::string(svm_ == Svm::fine ? "fine" : "coarse")});
    p.extras.push_back({"ocl.platform", platform_string(d.platform, CL_PLATFORM_NAME)});
    p.extras.push_back({"ocl.device_version", version});  // PoCL: its target
    p.extras.push_back({"ocl.driver_version", driver});
    // Graphs: cl_khr_command_buffer's revision, or why there are none.
    p.extras.push_back({"ocl.command_buffer",
                        d.no_command_buffer.empty() ? d.command_buffer_version
                                                    : "none: " + d.no_command_buffer});
    return p;
  }

  int get_device() { return current_device_; }
  void set_device(int device) {
    context(device, "set_device");
    current_device_ = device;
  }

  // PoCL refuses SVM alignments above 128 bytes, so 128 is the alignment
  // declared (properties().memory_alignment) and asked for. A NULL from
  // clSVMAlloc is exhaustion or refusal alike; the SDK tells them apart.
  void* malloc(int device, std::size_t bytes) {
    Device& d = context(device, "malloc");
    if (bytes > d.max_alloc) return nullptr;
    void* p = clSVMAlloc(d.context, svm_flags(), bytes, kSvmAlign);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(d.mutex);
    d.blocks.emplace(p, bytes);
    return p;
  }

  // No synchronize: the SDK never frees memory that queued work still uses.
  void free(int device, void* ptr) {
    Device& d = context(device, "free");
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (d.blocks.erase(ptr) == 0)
        driver_error(CL_INVALID_VALUE, "free",
                     fmt::format("pointer {} was not allocated on device {}", ptr, device));
    }
    clSVMFree(d.context, ptr);
  }

  // Pinned memory in the device's context: fine-grained SVM where the device
  // has it (host memory the device reaches directly), page-aligned host
  // memory otherwise (clEnqueueSVMMemcpy takes any host pointer).
  void* host_malloc(int device, std::size_t bytes) {
    Device& d = context(device, "host_malloc");
    void* p = d.fine_grain
                  ? clSVMAlloc(d.context, CL_MEM_READ_WRITE | CL_MEM_SVM_FINE_GRAIN_BUFFER, bytes, 0)
                  : std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
    if (p == nullptr) return nullptr;
    std::lock_guard<std::mutex> lock(d.mutex);
    d.pinned.emplace(p, bytes);
    return p;
  }
  void host_free(int device, void* ptr) {
    Device& d = context(device, "host_free");
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (d.pinned.erase(ptr) == 0)
        driver_error(CL_INVALID_VALUE, "host_free",
                     fmt::format("pointer {} was not allocated by host_malloc({}, ·)", ptr, device));
    }
    if (d.fine_grain) clSVMFree(d.context, ptr);
    else std::free(ptr);
  }

  void memcpy(int device, void* dst, const void* src, std::size_t bytes, accelkit::CopyKind) {
    Device& d = context(device, "memcpy");
    check(clEnqueueSVMMemcpy(d.sync_queue, CL_TRUE, dst, src, bytes, 0, nullptr, nullptr),
          "memcpy", "clEnqueueSVMMemcpy");
  }

  // Coarse-grained SVM (host_access mapped): the host's access to a range,
  // blocking on the device's synchronous queue; SVM maps in place, so the
  // host address is ptr. The unmap is waited for, so what the host wrote is
  // the device's on return.
  void* host_map(int device, void* ptr, std::size_t bytes) {
    Device& d = context(device, "host_map");
    check(clEnqueueSVMMap(d.sync_queue, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, ptr, bytes, 0,
                          nullptr, nullptr),
          "host_map", "clEnqueueSVMMap");
    return ptr;
  }
  void host_unmap(int device, void* ptr, std::size_t) {
    Device& d = context(device, "host_unmap");
    cl_event e = nullptr;
    check(clEnqueueSVMUnmap(d.sync_queue, ptr, 0, nullptr, &e), "host_unmap", "clEnqueueSVMUnmap");
    cl_int err = clWaitForEvents(1, &e);
    clReleaseEvent(e);
    check(err, "host_unmap", "clWaitForEvents");
  }

  // Waited for when a host side is pageable (the contract: consumed before
  // return), asynchronous otherwise. On a capturing stream, recorded (Note
  // [ocl graphs]); a pageable one is refused there.
  void memcpy_async(int device, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, accelkit::StreamHandle stream, bool host_pinned) {
    auto sp = stream_ptr(device, stream, "memcpy_async");
    Stream& s = *sp;
    bool pageable = kind != accelkit::CopyKind::device_to_device && !host_pinned;
    if (s.try_record("memcpy_async", [&](Capture& c) {
          if (pageable)
            driver_error(CL_INVALID_OPERATION, "memcpy_async",
                         "a copy of pageable host memory cannot be recorded into a command "
                         "buffer (the stream is capturing): its capture is invalidated");
          record_copy(dev(device, "memcpy_async"), c, dst, src, bytes);
        }))
      return;
    s.enqueue("memcpy_async", "clEnqueueSVMMemcpy", pageable, [&](cl_event* e) {
      return clEnqueueSVMMemcpy(s.queue, CL_FALSE, dst, src, bytes, 0, nullptr, e);
    });
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes,
                    accelkit::StreamHandle stream) {
    auto sp = stream_ptr(device, stream, "memset_async");
    Stream& s = *sp;
    auto pattern = static_cast<unsigned char>(value);
    if (s.try_record("memset_async", [&](Capture& c) {
          record_fill(dev(device, "memset_async"), c, ptr, pattern, bytes);
        }))
      return;
    s.enqueue("memset_async", "clEnqueueSVMMemFill", false, [&](cl_event* e) {
      return clEnqueueSVMMemFill(s.queue, ptr, &pattern, 1, bytes, 0, nullptr, e);
    });
  }

  // 0 is the normal priority, -1 high (cl_khr_priority_hints' HIGH); a device
  // without the extension has the one level 0.
  accelkit::StreamHandle stream_create(int device, int priority) {
    Device& d = context(device, "stream_create");
    int highest = d.priority_hints ? 1 : 0;
    if (priority < 0 || priority > highest)
      driver_error(CL_INVALID_VALUE, "stream_create",
                   fmt::format("priority {} is outside this device's range 0..{}", priority,
                               highest));
    return d.streams.add(std::make_shared<Stream>(this, device, create_queue(d, priority)));
  }

  // Releasing a queue lets its commands finish first (OpenCL's rule).
  void stream_destroy(int device, accelkit::StreamHandle stream) {
    Device& d = context(device, "stream_destroy");
    std::shared_ptr<Stream> s = d.streams.remove(stream, "stream_destroy", device);
    clFlush(s->queue);
    // The queue goes with the last reference: another thread that found
    // the stream before it was erased may still use it (stream_ptr).
  }

  bool stream_query(int device, accelkit::StreamHandle stream) {
    auto sp = stream_ptr(device, stream, "stream_query");
    Stream& s = *sp;
    s.refuse_if_capturing("stream_query");
    EventRef last(s.last());
    if (last.e == nullptr) return true;
    bool done = completed(device, last.e, "stream_query");
    if (done) s.forget(last.e);
    return done;
  }

  void stream_synchronize(int device, accelkit::StreamHandle stream) {
    auto sp = stream_ptr(device, stream, "stream_synchronize");
    Stream& s = *sp;
    s.refuse_if_capturing("stream_synchronize");
    check(clFinish(s.queue), "stream_synchronize", "clFinish");
    EventRef last(s.last());  // may be a command enqueued since clFinish
    if (last.e == nullptr) return;
    if (completed(device, last.e, "stream_synchronize")) s.forget(last.e);
  }

  void stream_wait_event(int device, accelkit::StreamHandle stream, accelkit::EventHandle event) {
    auto sp = stream_ptr(device, stream, "stream_wait_event");
    Stream& s = *sp;
    s.refuse_if_capturing("stream_wait_event");
    auto ep = event_ptr(event, "stream_wait_event");
    Event& e = *ep;
    if (e.device != device)
      driver_error(CL_INVALID_EVENT, "stream_wait_event",
                   fmt::format("event of device {} waited for on a stream of device {}", e.device,
                               device));
    EventRef r(e.last());
    if (r.e == nullptr) return;
    cl_int status = CL_COMPLETE;
    clGetEventInfo(r.e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr);
    // Only a record still to run is waited for: a failed one would make the
    // barrier fail too, and report its error a second time (Note [ocl
    // asynchronous errors]).
    if (status > CL_COMPLETE)
      s.enqueue("stream_wait_event", "clEnqueueBarrierWithWaitList", false, [&](cl_event* out) {
        return clEnqueueBarrierWithWaitList(s.queue, 1, &r.e, out);
      });
  }

  // Host signals (Note [ocl host signals]).
  accelkit::SignalHandle signal_create(int device) {
    Device& d = context(device, "signal_create");
    cl_int err = CL_SUCCESS;
    UserEvent user(clCreateUserEvent(d.context, &err));
    check(err, "signal_create", "clCreateUserEvent");
    return signals_.create(device, std::move(user));
  }

  void stream_wait_signal(int device, accelkit::StreamHandle stream, accelkit::SignalHandle signal) {
    auto sp = stream_ptr(device, stream, "stream_wait_signal");
    Stream& s = *sp;
    s.refuse_if_capturing("stream_wait_signal");
    auto g = signals_.get(signal, "stream_wait_signal");
    signals_.check_stream_device(*g, device);
    // Counted before the barrier is queued, never ended: OpenCL cannot say
    // when a barrier has passed (Note [ocl host signals]).
    if (!g->add_waiter()) return;  // completed with success: nothing to wait for
    try {
      s.enqueue("stream_wait_signal", "clEnqueueBarrierWithWaitList", false, [&](cl_event* out) {
        return clEnqueueBarrierWithWaitList(s.queue, 1, &g->payload().event, out);
      });
    } catch (...) {
      g->cancel_waiter();
      throw;
    }
  }

  void signal_complete(int device, accelkit::SignalHandle signal, int error) {
    cl_int status = error == 0 ? CL_COMPLETE : error < 0 ? error : -error;
    signals_.complete(signal, device, error, [&](Signal& g) {
      check(clSetUserEventStatus(g.payload().event, status), "signal_complete",
            "clSetUserEventStatus");
    });
  }

  // The user event goes with the signal's last reference; queued barriers
  // hold their own (OpenCL retains the events of a wait list).
  void signal_destroy(int device, accelkit::SignalHandle signal) {
    signals_.destroy(signal, device);
  }

  accelkit::EventHandle event_create(int device, accelkit::EventFlags flags) {
    context(device, "event_create");
    auto e = std::make_shared<Event>();
    e->device = device;
    e->timing = accelkit::has_flag(flags, accelkit::EventFlags::timing);
    return events_.add(std::move(e));
  }

  void event_destroy(int, accelkit::EventHandle event) {
    events_.remove(event, "event_destroy")->set(nullptr);
  }

  // A plain record retains the queue's last command event; a timing record
  // enqueues a marker (Note [ocl last command]).
  void event_record(int device, accelkit::EventHandle event, accelkit::StreamHandle stream) {
    auto sp = stream_ptr(device, stream, "event_record");
    Stream& s = *sp;
    s.refuse_if_capturing("event_record");
    auto ep = event_ptr(event, "event_record");
    Event& e = *ep;
    if (e.device != device)
      driver_error(CL_INVALID_EVENT, "event_record",
                   fmt::format("event of device {} recorded on a stream of device {}", e.device,
                               device));
    if (!e.timing) {
      e.set(s.last());  // nullptr: the queue is idle, the record complete
      return;
    }
    cl_event marker = nullptr;  // the marker itself, not a command enqueued after it
    s.enqueue("event_record", "clEnqueueMarkerWithWaitList", false, [&](cl_event* out) {
      return clEnqueueMarkerWithWaitList(s.queue, 0, nullptr, out);
    }, &marker);
    e.set(marker);
  }

  bool event_query(int, accelkit::EventHandle event) {
    auto ep = event_ptr(event, "event_query");
    Event& e = *ep;
    EventRef r(e.last());
    if (r.e == nullptr) return true;
    return completed(e.device, r.e, "event_query");
  }

  void event_synchronize(int, accelkit::EventHandle event) {
    auto ep = event_ptr(event, "event_synchronize");
    Event& e = *ep;
    EventRef r(e.last());
    if (r.e == nullptr) return;
    clWaitForEvents(1, &r.e);  // a failed event returns an error here; its status says which
    completed(e.device, r.e, "event_synchronize");
  }

  float event_elapsed_time(int, accelkit::EventHandle start, accelkit::EventHandle end) {
    auto ap = event_ptr(start, "event_elapsed_time");
    Event& a = *ap;
    auto bp = event_ptr(end, "event_elapsed_time");
    Event& b = *bp;
    if (!a.timing || !b.timing)
      driver_error(CL_INVALID_EVENT, "event_elapsed_time", "both events must be timing events");
    cl_event ra = a.last(), rb = b.last();
    auto release = [&] {
      if (ra) clReleaseEvent(ra);
      if (rb) clReleaseEvent(rb);
    };
    if (ra == nullptr || rb == nullptr) {
      release();
      driver_error(CL_INVALID_EVENT, "event_elapsed_time", "both events must be recorded");
    }
    cl_ulong ta = 0, tb = 0;
    cl_int ea = clGetEventProfilingInfo(ra, CL_PROFILING_COMMAND_END, sizeof ta, &ta, nullptr);
    cl_int eb = clGetEventProfilingInfo(rb, CL_PROFILING_COMMAND_END, sizeof tb, &tb, nullptr);
    release();
    if (ea == CL_PROFILING_INFO_NOT_AVAILABLE || eb == CL_PROFILING_INFO_NOT_AVAILABLE)
      driver_error(CL_PROFILING_INFO_NOT_AVAILABLE, "event_elapsed_time",
                   "an event has not completed yet");
    check(ea, "event_elapsed_time", "clGetEventProfilingInfo");
    check(eb, "event_elapsed_time", "clGetEventProfilingInfo");
    return static_cast<float>((static_cast<double>(tb) - static_cast<double>(ta)) / 1e6);
  }

  void device_synchronize(int device) {
    Device& d = context(device, "device_synchronize");
    std::vector<std::shared_ptr<Stream>> streams = d.streams.objects();
    for (auto& s : streams) check(clFinish(s->queue), "device_synchronize", "clFinish");
    for (auto& s : streams) {
      EventRef last(s->last());  // may be a command enqueued since clFinish
      if (last.e == nullptr) continue;
      if (completed(device, last.e, "device_synchronize")) s->forget(last.e);
    }
  }

  // ------------------------------------------------------------ graphs
  // Through cl_khr_command_buffer (Note [ocl graphs]). Where the device
  // cannot record (no_command_buffer), each member but stream_is_capturing
  // throws NotSupportedError naming the reason.

  // The mode is the SDK's to enforce (OpenCL has none).
  void stream_begin_capture(int device, accelkit::StreamHandle stream,
                            accelkit::CaptureMode mode) {
    Device& d = graphs_device(device, "stream_begin_capture");
    auto sp = stream_ptr(device, stream, "stream_begin_capture");
    Stream& s = *sp;
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.capture)
      driver_error(CL_INVALID_OPERATION, "stream_begin_capture",
                   fmt::format("stream {:#x} of device {} is capturing already (mode {})",
                               stream.value, device, accelkit::to_string(s.capture->mode)));
    auto g = std::make_shared<Graph>();
    g->device = device;
    g->recording = std::make_shared<Recording>();
    g->recording->api = d.command_buffer;
    cl_command_buffer_properties_khr simultaneous[] = {
        CL_COMMAND_BUFFER_FLAGS_KHR, CL_COMMAND_BUFFER_SIMULTANEOUS_USE_KHR, 0};
    cl_int err = CL_SUCCESS;
    g->recording->buffer = d.command_buffer.create(
        1, &s.queue, d.simultaneous_use ? simultaneous : nullptr, &err);
    check(err, "stream_begin_capture", "clCreateCommandBufferKHR");
    s.capture = std::make_unique<Capture>(capturing_, mode, std::move(g));
  }

  // The stream is not capturing afterwards, also when this throws (an
  // invalidated capture: DriverError naming the call that invalidated it).
  accelkit::GraphHandle stream_end_capture(int device, accelkit::StreamHandle stream) {
    graphs_device(device, "stream_end_capture");
    auto sp = stream_ptr(device, stream, "stream_end_capture");
    Stream& s = *sp;
    std::unique_ptr<Capture> c;
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      c = std::move(s.capture);
    }
    if (!c)
      driver_error(CL_INVALID_OPERATION, "stream_end_capture",
                   fmt::format("stream {:#x} of device {} is not capturing", stream.value, device));
    if (!c->invalidated.empty())
      driver_error(CL_INVALID_OPERATION, "stream_end_capture",
                   fmt::format("the capture of stream {:#x} of device {} was invalidated by {}: "
                               "no graph was made",
                               stream.value, device, c->invalidated));
    Recording& r = *c->graph->recording;
    check(r.api.finalize(r.buffer), "stream_end_capture", "clFinalizeCommandBufferKHR");
    return graphs_.add(c->graph);
  }

  bool stream_is_capturing(int device, accelkit::StreamHandle stream) {
    auto sp = stream_ptr(device, stream, "stream_is_capturing");
    std::lock_guard<std::mutex> lock(sp->mutex);
    return sp->capture != nullptr;
  }

  // The finalized command buffer is executable: the exec shares the graph's.
  accelkit::GraphExecHandle graph_instantiate(int device, accelkit::GraphHandle graph) {
    graphs_device(device, "graph_instantiate");
    auto g = graph_ptr(device, graph, "graph_instantiate");
    return execs_.add(std::make_shared<GraphExec>(GraphExec{std::move(g)}));
  }

  // The launch is the stream's last command (Note [ocl last command]).
  // Refused on a capturing stream, and for a graph whose memory was freed.
  void graph_launch(int device, accelkit::GraphExecHandle exec, accelkit::StreamHandle stream) {
    Device& d = graphs_device(device, "graph_launch");
    auto x = execs_.get(exec, "graph_launch");
    Graph& g = *x->graph;
    if (g.device != device)
      driver_error(CL_INVALID_DEVICE, "graph_launch",
                   fmt::format("graph exec of device {} launched on device {}", g.device, device));
    auto sp = stream_ptr(device, stream, "graph_launch");
    Stream& s = *sp;
    s.refuse_if_capturing("graph_launch");
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      for (const Touch& t : g.touches) {
        const auto& live = t.pinned ? d.pinned : d.blocks;
        auto it = live.find(t.base);
        if (it == live.end() || it->second != t.bytes)
          driver_error(CL_INVALID_MEM_OBJECT, "graph_launch",
                       fmt::format("the graph uses the {} memory at {} ({} bytes), freed since "
                                   "its capture: a launch would reach freed memory",
                                   t.pinned ? "pinned host" : "device", t.base, t.bytes));
      }
    }
    if (!d.simultaneous_use) g.wait_pending();
    Recording& r = *g.recording;
    cl_event launched = nullptr;
    s.enqueue("graph_launch", "clEnqueueCommandBufferKHR", false, [&](cl_event* e) {
      return r.api.enqueue(1, &s.queue, r.buffer, 0, nullptr, e);
    }, &launched);
    g.launched(launched);
  }

  // Queued launches complete; the command buffer goes with the last of
  // them (Note [ocl graphs]).
  void graph_exec_destroy(int device, accelkit::GraphExecHandle exec) {
    graphs_device(device, "graph_exec_destroy");
    execs_.remove(exec, "graph_exec_destroy", -1, [&](const GraphExec& x) {
      if (x.graph->device != device)
        driver_error(CL_INVALID_DEVICE, "graph_exec_destroy",
                     fmt::format("graph exec of device {} destroyed on device {}",
                                 x.graph->device, device));
    });
  }

  // Execs instantiated from the graph keep what they need.
  void graph_destroy(int device, accelkit::GraphHandle graph) {
    graphs_device(device, "graph_destroy");
    graphs_.remove(graph, "graph_destroy", -1, [&](const Graph& g) {
      if (g.device != device)
        driver_error(CL_INVALID_DEVICE, "graph_destroy",
                     fmt::format("graph of device {} destroyed on device {}", g.device, device));
    });
  }

  // ------------------------------------------------ for tests and kernels

  // The queue behind a stream, and the context and device of a device.
  cl_command_queue queue(int device, accelkit::StreamHandle stream) {
    return stream_ptr(device, stream, "queue")->queue;
  }
  cl_context cl_context_of(int device) { return context(device, "cl_context_of").context; }
  cl_device_id cl_device_of(int device) { return dev(device, "cl_device_of").id; }
  Svm svm() {
    discover();
    return svm_;
  }
  // Makes the command that `enqueue` puts on `stream` the stream's last one
  // (Note [ocl last command]); for work enqueued outside the runtime, such
  // as kernels and tests' failing commands.
  // Refused on a capturing stream (what `enqueue` does cannot be recorded),
  // invalidating its capture.
  template <class Enqueue>
  void enqueue_on(int device, accelkit::StreamHandle stream, const char* call, Enqueue&& enqueue) {
    auto sp = stream_ptr(device, stream, call);
    Stream& s = *sp;
    s.refuse_if_capturing(call);
    s.enqueue(call, call, false, [&](cl_event* e) { return enqueue(s.queue, e); });
  }
  // Enqueues `kernel` with its arguments as set now on `stream`, as the
  // stream's last command, or on a capturing stream records it (a clone
  // of it: Note [ocl graphs]). `global` and `local` (null: the driver's
  // choice) have `dims` sizes each.
  void enqueue_kernel(int device, accelkit::StreamHandle stream, const char* call,
                      cl_kernel kernel, cl_uint dims, const std::size_t* global,
                      const std::size_t* local) {
    auto sp = stream_ptr(device, stream, call);
    Stream& s = *sp;
    if (s.try_record(call, [&](Capture& c) { record_kernel(c, kernel, dims, global, local, call); }))
      return;
    s.enqueue(call, "clEnqueueNDRangeKernel", false, [&](cl_event* e) {
      return clEnqueueNDRangeKernel(s.queue, kernel, dims, nullptr, global, local, 0, nullptr, e);
    });
  }

 private:
  static constexpr std::size_t kPage = 4096;
  static constexpr std::size_t kSvmAlign = 128;

  // One retain of a cl_event, released however the scope ends (a status
  // reported as a DriverError included).
  struct EventRef {
    cl_event e;
    explicit EventRef(cl_event x) noexcept : e(x) {}
    EventRef(const EventRef&) = delete;
    EventRef& operator=(const EventRef&) = delete;
    ~EventRef() {
      if (e) clReleaseEvent(e);
    }
  };

  void check(cl_int err, const char* call, const char* fn) {
    if (err != CL_SUCCESS)
      driver_error(err, call, fmt::format("{} failed: {} ({})", fn, error_name(err), err));
  }

  // A stream's capture underway (Note [ocl graphs]): the graph being
  // recorded, and the call that invalidated it, if one did. Counted in the
  // runtime's capturing_ while it lives.
  struct Capture {
    std::atomic<int>& count;
    accelkit::CaptureMode mode;
    std::shared_ptr<Graph> graph;
    std::string invalidated;
    Capture(std::atomic<int>& c, accelkit::CaptureMode m, std::shared_ptr<Graph> g)
        : count(c), mode(m), graph(std::move(g)) {
      count.fetch_add(1, std::memory_order_relaxed);
    }
    Capture(const Capture&) = delete;
    Capture& operator=(const Capture&) = delete;
    ~Capture() { count.fetch_sub(1, std::memory_order_relaxed); }
  };

  struct Stream {
    OpenCLRuntime* rt;
    int device;
    cl_command_queue queue;
    std::mutex mutex;
    cl_event last_ = nullptr;  // the last command's event (Note [ocl last command])
    std::unique_ptr<Capture> capture;  // under mutex

    Stream(OpenCLRuntime* r, int d, cl_command_queue q) : rt(r), device(d), queue(q) {}
    // The last command's event, retained for the caller (nullptr: idle).
    cl_event last() {
      std::lock_guard<std::mutex> lock(mutex);
      if (last_) clRetainEvent(last_);
      return last_;
    }
    // Drops `e` as the last command once it is known complete.
    void forget(cl_event e) {
      std::lock_guard<std::mutex> lock(mutex);
      if (last_ == e) {
        clReleaseEvent(last_);
        last_ = nullptr;
      }
    }
    // Enqueues without blocking under the lock (so that the last event
    // follows the queue's order), then, for `wait`, waits outside it: a
    // query from another thread never waits for a copy.
    // With `keep`, the new command's event is also retained into *keep.
    template <class F>
    void enqueue(const char* call, const char* fn, bool wait, F&& f, cl_event* keep = nullptr) {
      cl_event e = nullptr;
      {
        std::lock_guard<std::mutex> lock(mutex);
        rt->check(f(&e), call, fn);
        if (last_) clReleaseEvent(last_);
        last_ = e;
        if (keep) {
          clRetainEvent(e);
          *keep = e;
        }
        clFlush(queue);  // so that the queue runs without a later wait
        if (wait) clRetainEvent(e);
      }
      if (!wait) return;
      clWaitForEvents(1, &e);  // a failed command: its status says which, below
      struct Release {
        cl_event e;
        ~Release() { clReleaseEvent(e); }
      } release{e};
      rt->completed(device, e, call);
    }
    // On a capturing stream, runs record(capture) under the stream's lock
    // and returns true (a failure invalidates the capture); false when the
    // stream is not capturing (one relaxed load when no stream is).
    template <class F>
    bool try_record(const char* call, F&& record) {
      if (rt->capturing_.load(std::memory_order_relaxed) == 0) return false;
      std::lock_guard<std::mutex> lock(mutex);
      if (!capture) return false;
      if (!capture->invalidated.empty())
        rt->driver_error(CL_INVALID_OPERATION, call,
                         fmt::format("stream is capturing, and its capture was invalidated by "
                                     "{}: nothing more is recorded (stream_end_capture ends it)",
                                     capture->invalidated));
      try {
        record(*capture);
      } catch (...) {
        capture->invalidated = call;
        throw;
      }
      return true;
    }
    // Refuses `call` on a capturing stream, invalidating the capture: what
    // a command buffer cannot record (Note [ocl graphs]).
    void refuse_if_capturing(const char* call) {
      if (rt->capturing_.load(std::memory_order_relaxed) == 0) return;
      std::lock_guard<std::mutex> lock(mutex);
      if (!capture) return;
      if (capture->invalidated.empty()) capture->invalidated = call;
      rt->driver_error(CL_INVALID_OPERATION, call,
                       fmt::format("{} cannot be recorded into a command buffer, and the stream "
                                   "is capturing (mode {}): its capture is invalidated",
                                   call, accelkit::to_string(capture->mode)));
    }
    Stream(const Stream&) = delete;
    Stream& operator=(const Stream&) = delete;
    ~Stream() {
      capture.reset();
      if (last_) clReleaseEvent(last_);
      clReleaseCommandQueue(queue);
    }
  };

  struct Event {
    int device = 0;
    bool timing = false;
    std::mutex mutex;
    cl_event record = nullptr;  // the last record (nullptr: none, or complete when taken)
    cl_event last() {
      std::lock_guard<std::mutex> lock(mutex);
      if (record) clRetainEvent(record);
      return record;
    }
    // Takes ownership of `r` (already retained for it).
    void set(cl_event r) {
      std::lock_guard<std::mutex> lock(mutex);
      if (record) clReleaseEvent(record);
      record = r;
    }
    ~Event() {
      if (record) clReleaseEvent(record);
    }
  };

  // A host signal's user event (Note [ocl host signals]), released with the
  // signal's state.
  struct UserEvent {
    cl_event event = nullptr;
    UserEvent() = default;
    explicit UserEvent(cl_event e) noexcept : event(e) {}
    UserEvent(UserEvent&& o) noexcept : event(o.event) { o.event = nullptr; }
    UserEvent& operator=(UserEvent&&) = delete;
    ~UserEvent() {
      if (event) clReleaseEvent(event);
    }
  };
  using Signal = accelkit::support::HostSignal<UserEvent>;

  struct Device {
    cl_platform_id platform = nullptr;
    cl_device_id id = nullptr;
    bool priority_hints = false;
    std::uint64_t max_alloc = 0;
    std::once_flag created;
    cl_context context = nullptr;
    cl_command_queue sync_queue = nullptr;  // memcpy's: not ordered with streams
    std::mutex mutex;
    bool fine_grain = false;  // the device has fine-grained SVM buffers
    std::map<const void*, std::size_t> blocks;  // from malloc: base -> bytes
    std::map<const void*, std::size_t> pinned;  // from host_malloc: base -> bytes
    // Graphs (Note [ocl graphs]): cl_khr_command_buffer's entry points, or
    // why the device cannot capture (empty: it can).
    CommandBufferApi command_buffer;
    std::string no_command_buffer;
    std::string command_buffer_version;  // "0.9.0"
    bool simultaneous_use = false;
    accelkit::support::HandleTable<accelkit::StreamHandle, Stream> streams{
        name, "stream", CL_INVALID_COMMAND_QUEUE};
    std::vector<cl_event> failed;  // failures already reported (Note [ocl asynchronous errors])
  };

  // Whether `e` has completed; a negative status not reported before is
  // thrown now, once (Note [ocl asynchronous errors]).
  bool completed(int device, cl_event e, const char* call) {
    cl_int status = CL_COMPLETE;
    check(clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof status, &status, nullptr),
          call, "clGetEventInfo");
    if (status >= 0) return status == CL_COMPLETE;
    Device& d = *devices_[static_cast<std::size_t>(device)];
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      if (std::find(d.failed.begin(), d.failed.end(), e) != d.failed.end()) return true;
      clRetainEvent(e);
      d.failed.push_back(e);
    }
    driver_error(status, call,
                 fmt::format("asynchronous error of earlier work: a queued command failed with "
                             "status {} ({})",
                             status, error_name(status)));
  }

  static std::string info_string(cl_device_id id, cl_device_info what) {
    std::size_t n = 0;
    if (clGetDeviceInfo(id, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
    std::string s(n, '\0');
    clGetDeviceInfo(id, what, n, s.data(), nullptr);
    while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
    return s;
  }
  static std::string platform_string(cl_platform_id id, cl_platform_info what) {
    std::size_t n = 0;
    if (clGetPlatformInfo(id, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) return {};
    std::string s(n, '\0');
    clGetPlatformInfo(id, what, n, s.data(), nullptr);
    while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
    return s;
  }
  template <class T>
  static T info(cl_device_id id, cl_device_info what) {
    T v{};
    if (clGetDeviceInfo(id, what, sizeof v, &v, nullptr) != CL_SUCCESS) return T{};
    return v;
  }
  static bool has_extension(cl_device_id id, std::string_view ext) {
    std::string all = " " + info_string(id, CL_DEVICE_EXTENSIONS) + " ";
    return all.find(" " + std::string(ext) + " ") != std::string::npos;
  }
  static std::string uuid_of(const Device& d) {
#ifdef CL_DEVICE_UUID_KHR
    if (has_extension(d.id, "cl_khr_device_uuid")) {
      unsigned char u[CL_UUID_SIZE_KHR] = {};
      if (clGetDeviceInfo(d.id, CL_DEVICE_UUID_KHR, sizeof u, u, nullptr) == CL_SUCCESS)
        return accelkit::uuid_from_bytes(u);
    }
#endif
    return {};
  }
  static std::string pci_bus_id_of(const Device& d) {
#ifdef CL_DEVICE_PCI_BUS_INFO_KHR
    if (has_extension(d.id, "cl_khr_pci_bus_info")) {
      cl_device_pci_bus_info_khr b{};
      if (clGetDeviceInfo(d.id, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof b, &b, nullptr) == CL_SUCCESS)
        return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", b.pci_domain, b.pci_bus, b.pci_device,
                           b.pci_function);
    }
#endif
    return {};
  }

  // Whether the device can record graphs (Note [ocl graphs]): sets the
  // entry points, or the reason it cannot (no_command_buffer).
  void find_command_buffer(Device& d) {
    if (!config_.command_buffer) {
      d.no_command_buffer = "cl_khr_command_buffer is turned off (OCL_COMMAND_BUFFER=0)";
      return;
    }
    if (!has_extension(d.id, "cl_khr_command_buffer")) {
      d.no_command_buffer = "the device does not list cl_khr_command_buffer (CL_DEVICE_EXTENSIONS)";
      return;
    }
    std::size_t n = 0;
    std::vector<cl_name_version> exts;
    if (clGetDeviceInfo(d.id, CL_DEVICE_EXTENSIONS_WITH_VERSION, 0, nullptr, &n) == CL_SUCCESS &&
        n >= sizeof(cl_name_version)) {
      exts.resize(n / sizeof(cl_name_version));
      if (clGetDeviceInfo(d.id, CL_DEVICE_EXTENSIONS_WITH_VERSION, n, exts.data(), nullptr) !=
          CL_SUCCESS)
        exts.clear();
    }
    auto it = std::find_if(exts.begin(), exts.end(), [](const cl_name_version& e) {
      return std::string_view(e.name) == "cl_khr_command_buffer";
    });
    if (it == exts.end()) {
      d.no_command_buffer = "the device does not say which revision of cl_khr_command_buffer it "
                            "has (CL_DEVICE_EXTENSIONS_WITH_VERSION)";
      return;
    }
    cl_version v = it->version;
    d.command_buffer_version = fmt::format("{}.{}.{}", CL_VERSION_MAJOR(v), CL_VERSION_MINOR(v),
                                           CL_VERSION_PATCH(v));
    // 0.9.5 added a properties argument to every command: other signatures.
    if (CL_VERSION_MAJOR(v) != 0 || CL_VERSION_MINOR(v) != 9 || CL_VERSION_PATCH(v) > 4) {
      d.no_command_buffer = fmt::format("the device's cl_khr_command_buffer is revision {}, and "
                                        "this backend records with revisions 0.9.0 to 0.9.4",
                                        d.command_buffer_version);
      return;
    }
    cl_command_queue_properties required = 0;
    clGetDeviceInfo(d.id, CL_DEVICE_COMMAND_BUFFER_REQUIRED_QUEUE_PROPERTIES_KHR,
                    sizeof required, &required, nullptr);
    if ((required & ~cl_command_queue_properties{CL_QUEUE_PROFILING_ENABLE}) != 0) {
      d.no_command_buffer = fmt::format("the device's cl_khr_command_buffer needs queue "
                                        "properties {:#x}, and the backend's queues are in-order "
                                        "with profiling",
                                        required);
      return;
    }
    if (!d.command_buffer.resolve(d.platform)) {
      d.no_command_buffer = "the platform lists cl_khr_command_buffer but not all its entry "
                            "points (clGetExtensionFunctionAddressForPlatform)";
      return;
    }
    auto caps = info<cl_device_command_buffer_capabilities_khr>(
        d.id, CL_DEVICE_COMMAND_BUFFER_CAPABILITIES_KHR);
    d.simultaneous_use = (caps & CL_COMMAND_BUFFER_CAPABILITY_SIMULTANEOUS_USE_KHR) != 0;
  }

  cl_mem_flags svm_flags() const {
    return CL_MEM_READ_WRITE | (svm_ == Svm::fine ? CL_MEM_SVM_FINE_GRAIN_BUFFER : 0);
  }

  // Platforms and devices with OpenCL 2.0+ and SVM, in platform order; no
  // context. A failure to list is a DriverError (the SDK reports 0 devices
  // and keeps the reason).
  void discover() {
    std::call_once(discovered_, [&] {
      if (!configured_) config_ = Config::from_environment(accelkit::Environment::process());
      cl_uint np = 0;
      cl_int err = clGetPlatformIDs(0, nullptr, &np);
      if (err == CL_PLATFORM_NOT_FOUND_KHR || np == 0) return;  // no OpenCL: no devices
      check(err, "device_count", "clGetPlatformIDs");
      std::vector<cl_platform_id> platforms(np);
      check(clGetPlatformIDs(np, platforms.data(), nullptr), "device_count", "clGetPlatformIDs");
      bool all_fine = true;
      std::vector<std::unique_ptr<Device>> found;  // kept only when discovery succeeds
      for (cl_platform_id pl : platforms) {
        cl_uint nd = 0;
        if (clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS || nd == 0)
          continue;
        std::vector<cl_device_id> ids(nd);
        check(clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, nd, ids.data(), nullptr), "device_count",
              "clGetDeviceIDs");
        for (cl_device_id id : ids) {
          accelkit::Version v =
              accelkit::support::parse_version(info_string(id, CL_DEVICE_VERSION));
          if (v.major < 2) continue;
          auto caps = info<cl_device_svm_capabilities>(id, CL_DEVICE_SVM_CAPABILITIES);
          if (!(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) continue;
          all_fine = all_fine && (caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER);
          auto d = std::make_unique<Device>();
          d->platform = pl;
          d->id = id;
          d->priority_hints = has_extension(id, "cl_khr_priority_hints");
          d->fine_grain = (caps & CL_DEVICE_SVM_FINE_GRAIN_BUFFER) != 0;
          d->max_alloc = info<cl_ulong>(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
          find_command_buffer(*d);
          found.push_back(std::move(d));
        }
      }
      if (config_.svm == Svm::fine && !all_fine)
        throw accelkit::ValueError("ocl", "OCL_SVM='fine': a device has no fine-grained SVM "
                                          "buffers (use OCL_SVM=coarse)");
      devices_ = std::move(found);
      svm_ = config_.svm.value_or(all_fine ? Svm::fine : Svm::coarse);
    });
  }

  Device& dev(int device, const char* call) {
    discover();
    if (device < 0 || device >= static_cast<int>(devices_.size()))
      driver_error(CL_INVALID_DEVICE, call,
                   fmt::format("no device {} (ocl has {})", device, devices_.size()));
    return *devices_[static_cast<std::size_t>(device)];
  }

  // The device with its context and memcpy's queue, created at first use.
  Device& context(int device, const char* call) {
    Device& d = dev(device, call);
    std::call_once(d.created, [&] {
      cl_int err = CL_SUCCESS;
      cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                       reinterpret_cast<cl_context_properties>(d.platform), 0};
      cl_context ctx = clCreateContext(props, 1, &d.id, nullptr, nullptr, &err);
      check(err, call, "clCreateContext");
      d.context = ctx;
      cl_command_queue q = clCreateCommandQueueWithProperties(ctx, d.id, nullptr, &err);
      check(err, call, "clCreateCommandQueueWithProperties");
      d.sync_queue = q;
    });
    return d;
  }

  cl_command_queue create_queue(Device& d, int priority) {
    std::vector<cl_queue_properties> props = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE};
#ifdef CL_QUEUE_PRIORITY_KHR
    if (d.priority_hints) {
      props.push_back(CL_QUEUE_PRIORITY_KHR);
      props.push_back(priority > 0 ? CL_QUEUE_PRIORITY_HIGH_KHR : CL_QUEUE_PRIORITY_MED_KHR);
    }
#else
    (void)priority;
#endif
    props.push_back(0);
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueueWithProperties(d.context, d.id, props.data(), &err);
    check(err, "stream_create", "clCreateCommandQueueWithProperties");
    return q;
  }

  // Shared: a stream or event destroyed by another thread stays alive, its
  // queue or cl_event included, for a call that found it.
  std::shared_ptr<Stream> stream_ptr(int device, accelkit::StreamHandle stream, const char* call) {
    return context(device, call).streams.get(stream, call, device);
  }

  std::shared_ptr<Event> event_ptr(accelkit::EventHandle event, const char* call) {
    return events_.get(event, call);
  }

  // ------------------------------------------------ graphs (private part)

  // The device, with its context, where it can record graphs; otherwise
  // NotSupportedError naming why (Note [ocl graphs]).
  Device& graphs_device(int device, const char* call) {
    Device& d = context(device, call);
    if (!d.no_command_buffer.empty())
      throw accelkit::NotSupportedError(
          name, fmt::format("cannot capture graphs on device {} ({}): {} ({})", device,
                            info_string(d.id, CL_DEVICE_NAME), d.no_command_buffer, call));
    return d;
  }

  std::shared_ptr<Graph> graph_ptr(int device, accelkit::GraphHandle graph, const char* call) {
    auto g = graphs_.get(graph, call);
    if (g->device != device)
      driver_error(CL_INVALID_DEVICE, call,
                   fmt::format("graph of device {} used on device {}", g->device, device));
    return g;
  }

  // The allocation of `d` (device memory, else pinned) holding
  // [p, p + bytes); a DriverError when there is none.
  Touch allocation_of(Device& d, const void* p, std::size_t bytes, const char* call) {
    std::lock_guard<std::mutex> lock(d.mutex);
    for (bool pinned : {false, true}) {
      const auto& m = pinned ? d.pinned : d.blocks;
      auto it = m.upper_bound(p);
      if (it == m.begin()) continue;
      --it;
      auto base = reinterpret_cast<std::uintptr_t>(it->first);
      auto at = reinterpret_cast<std::uintptr_t>(p);
      if (at - base <= it->second && bytes <= it->second - (at - base))
        return {it->first, it->second, pinned};
    }
    driver_error(CL_INVALID_VALUE, call,
                 fmt::format("{} bytes at {} are in no allocation of this device (malloc or "
                             "host_malloc): only those can be recorded into a command buffer",
                             bytes, p));
  }

  // The buffer over allocation `t` that the capture's commands use (Note
  // [ocl graphs]), created at its first use in the capture.
  cl_mem mem_of(Device& d, Capture& c, const Touch& t, const char* call) {
    Recording& r = *c.graph->recording;
    auto it = r.mems.find(t.base);
    if (it != r.mems.end()) return it->second;
    cl_int err = CL_SUCCESS;
    cl_mem m = clCreateBuffer(d.context, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, t.bytes,
                              const_cast<void*>(t.base), &err);
    check(err, call, "clCreateBuffer");
    r.mems.emplace(t.base, m);
    c.graph->touches.push_back(t);
    return m;
  }

  static std::size_t offset(const void* p, const Touch& t) {
    return static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(p) -
                                    reinterpret_cast<std::uintptr_t>(t.base));
  }

  void record_copy(Device& d, Capture& c, void* dst, const void* src, std::size_t bytes) {
    if (bytes == 0) return;
    Touch ts = allocation_of(d, src, bytes, "memcpy_async");
    Touch td = allocation_of(d, dst, bytes, "memcpy_async");
    cl_mem ms = mem_of(d, c, ts, "memcpy_async");
    cl_mem md = mem_of(d, c, td, "memcpy_async");
    Recording& r = *c.graph->recording;
    cl_sync_point_khr point = 0;
    check(r.api.copy(r.buffer, nullptr, ms, md, offset(src, ts), offset(dst, td), bytes,
                      r.waits(), r.wait_list(), &point, nullptr),
          "memcpy_async", "clCommandCopyBufferKHR");
    r.recorded(point);
  }

  void record_fill(Device& d, Capture& c, void* ptr, unsigned char pattern, std::size_t bytes) {
    if (bytes == 0) return;
    Touch t = allocation_of(d, ptr, bytes, "memset_async");
    cl_mem m = mem_of(d, c, t, "memset_async");
    Recording& r = *c.graph->recording;
    cl_sync_point_khr point = 0;
    check(r.api.fill(r.buffer, nullptr, m, &pattern, 1, offset(ptr, t), bytes, r.waits(),
                      r.wait_list(), &point, nullptr),
          "memset_async", "clCommandFillBufferKHR");
    r.recorded(point);
  }

  void record_kernel(Capture& c, cl_kernel kernel, cl_uint dims, const std::size_t* global,
                     const std::size_t* local, const char* call) {
    Recording& r = *c.graph->recording;
    cl_int err = CL_SUCCESS;
    cl_kernel clone = clCloneKernel(kernel, &err);
    check(err, call, "clCloneKernel");
    r.kernels.push_back(clone);
    cl_sync_point_khr point = 0;
    check(r.api.kernel(r.buffer, nullptr, nullptr, clone, dims, nullptr, global, local,
                        r.waits(), r.wait_list(), &point, nullptr),
          call, "clCommandNDRangeKernelKHR");
    r.recorded(point);
  }

  Config config_;
  bool configured_ = false;
  std::once_flag discovered_;
  Svm svm_ = Svm::fine;
  std::vector<std::unique_ptr<Device>> devices_;
  accelkit::support::HandleTable<accelkit::EventHandle, Event> events_{name, "event",
                                                                       CL_INVALID_EVENT};
  accelkit::support::HandleTable<accelkit::GraphHandle, Graph> graphs_{name, "graph",
                                                                       CL_INVALID_VALUE};
  accelkit::support::HandleTable<accelkit::GraphExecHandle, GraphExec> execs_{
      name, "graph exec", CL_INVALID_VALUE};
  std::atomic<int> capturing_{0};  // captures underway, on all devices
  accelkit::support::HostSignalTable<UserEvent> signals_{
      name, {CL_INVALID_EVENT, CL_INVALID_EVENT, CL_INVALID_OPERATION, CL_INVALID_OPERATION}};
  static inline thread_local int current_device_ = 0;
};

}  // namespace ocl
