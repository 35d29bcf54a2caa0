// accelkit: the Runtime contract, the one class a vendor writes.
//
// A vendor derives its runtime from accelkit::Runtime<Self> (CRTP) and
// implements the members below over its driver. Device indices passed to
// every member are physical ordinals (Note [Logical and physical indices]
// in types.hpp); the SDK validates them before calling. Members report
// driver failures by throwing DriverError, most simply through the provided
// driver_error(code, call, message). Every member may be called from many
// threads at once.
//
// Asynchronous errors: work queued by memcpy_async, memset_async,
// memcpy_peer_async, event_record, stream_wait_event, stream_wait_peer_event,
// stream_wait_signal and graph_launch may fail after the call returned. The
// driver then reports the failure later, once, as a DriverError carrying its
// own code, from stream_synchronize, stream_query, event_synchronize,
// event_query, device_synchronize or a later stream-ordered call of that
// device (as CUDA's sticky errors arrive); synchronizing members wait for the
// work first. The SDK guarantees, when one arrives: its state stays consistent (nothing
// half-done in the allocators, pools or streams; a block whose free could not
// be ordered is kept out of the cache, memory whose release could not be
// ordered stays reserved and is returned by a later empty_cache); the error
// reaches the caller once, thrown with the driver's code (in Python a
// torch.AcceleratorError, a RuntimeError: Note [Driver errors in PyTorch]),
// or, where nothing can throw (a tensor's deleter, a device guard's
// destructor), through the diagnostics hook (Note [Diagnostics]); and the
// next call works again, or fails with its own clear error.
//
// A failure after which the device can run no more work (Vulkan's
// VK_ERROR_DEVICE_LOST, CUDA's sticky errors: an illegal address, a launch
// failure) is reported instead as a DeviceLostError, most simply through
// device_lost(code, call, message), from whichever member sees it, once;
// the runtime then runs no work on that device, every later call failing
// with a DriverError. The SDK keeps the first loss of each device and
// refuses all later work on it, naming that failure, without calling the
// runtime; releases (free, host_free, the destroys, vm_unmap, vm_release,
// ipc_mem_close, host_unmap) are still called and must return or throw,
// never hang (Note [Lost devices] in error.hpp). Other devices work on.
//
// A driver whose queued work reports failure only as a status of its events
// (OpenCL: a negative execution status of a command's cl_event, the error
// code itself) maps it here: event_query and event_synchronize of an event
// whose captured work failed, and stream_query and stream_synchronize of a
// stream whose work failed, throw DriverError with that status as the code,
// once; an error seen only on a runtime-internal event (a marker behind a
// copy) is kept and thrown by the next of those members, or the next
// stream-ordered call, of its device. A failed status never reads as "not
// complete yet" (a query answering false forever) nor as success.
//
// BEGIN GENERATED contract table (scripts/contract_docs.py, from the lists in
// detail/contract.hpp: edit them there).
//
// Required members:
//   static constexpr std::string_view name
//       The backend's name: the device type ("simdev:0"), the prefix of its
//       variables (SIMDEV_*) and its Python module (torch.simdev); a lowercase
//       identifier that is not a PyTorch device type.
//   int device_count()
//       The number of physical devices. Must not create a device context; may
//       start driver threads only if fork_safe_discovery is false
//       (Note [Fork safety]). A DriverError makes the SDK report 0 devices and
//       keep the reason.
//   DeviceProperties properties(device_index device)
//       The device's capabilities, in the schema of properties.hpp. Must not
//       create a context; called once per device, then validated and cached.
//   device_index get_device()
//       The driver's current device of the calling thread.
//   void set_device(device_index device)
//       Makes `device` current for the calling thread; may create its context.
//   void* malloc(device_index device, std::size_t bytes)
//       `bytes` (> 0) of device memory, aligned to at least
//       properties().memory_alignment (Note [Memory alignment]). nullptr when
//       out of memory or when the driver refuses the request (the SDK tells
//       them apart by the free memory: Note [Refusal and exhaustion]);
//       DriverError for other failures.
//   void free(device_index device, void* ptr)
//       Releases memory from malloc(device, ·), at once if the driver likes:
//       the SDK never frees memory that queued work still uses
//       (Note [Ordered release]).
//   void* host_malloc(device_index device, std::size_t bytes)
//       `bytes` (> 0) of page-locked host memory, allocated in `device`'s
//       context and usable by the async copies of every device, as CUDA's
//       portable pinned memory (Note [Pinned memory per device]); nullptr when
//       out of memory.
//   void host_free(device_index device, void* ptr)
//       Releases memory from host_malloc(device, ·); as for free, never while
//       queued work uses it.
//   void memcpy(device_index device, void* dst, const void* src,
//               std::size_t bytes, CopyKind kind)
//       Copies `bytes` (> 0) synchronously: complete on return. Not ordered
//       with streams (the SDK synchronizes first where order matters). `kind`
//       says which side is host memory; device_to_device stays within `device`.
//   void memcpy_async(device_index device, void* dst, const void* src,
//                     std::size_t bytes, CopyKind kind, StreamHandle stream,
//                     bool host_pinned)
//       Enqueues the copy of `bytes` (> 0) on `stream`. host_pinned true: the
//       host side is host_malloc memory (of any device), which the SDK keeps
//       alive and untouched until the stream has passed the copy, so the copy
//       may run later; false: pageable host memory, done with before the call
//       returns. Always false for device_to_device. A runtime whose driver
//       copies from any host pointer (CUDA, OpenCL SVM) needs no record of its
//       host_malloc ranges; one whose driver copies only its own buffers
//       (Vulkan's mapped VkBuffer) keeps that record to find the buffer behind
//       a pinned pointer: host_pinned says whether to look
//       (Note [Pinned copies]).
//   void memset_async(device_index device, void* ptr, int value,
//                     std::size_t bytes, StreamHandle stream)
//       Enqueues on `stream` the fill of `bytes` (> 0) bytes of device memory
//       at `ptr` (anywhere inside an allocation from malloc(device, ·), or
//       inside pages vm_map mapped) with the low byte of `value`, as
//       std::memset does.
//   StreamHandle stream_create(device_index device, int priority)
//       A new stream; `priority` in the driver's numbering, within
//       properties().stream_priorities (with
//       StreamPriorityRange::from_levels(n): a level, 0 = default .. n-1 = most
//       urgent).
//   void stream_destroy(device_index device, StreamHandle stream)
//       Releases the stream; its queued work still completes (the call may
//       return before).
//   bool stream_query(device_index device, StreamHandle stream)
//       True iff all work queued on the stream so far has completed; never
//       blocks.
//   void stream_synchronize(device_index device, StreamHandle stream)
//       Blocks until all work queued on the stream so far has completed.
//   void stream_wait_event(device_index device, StreamHandle stream,
//                          EventHandle event)
//       Work queued on `stream` later waits for the event's last record as of
//       this call (recording the event again does not change it); no wait if
//       the event was never recorded.
//   EventHandle event_create(device_index device, EventFlags flags)
//       A new event; EventFlags::timing asks for timestamps,
//       EventFlags::blocking_sync lets event_synchronize yield the CPU,
//       EventFlags::interprocess (never with timing) lets ipc_event_export name
//       it to another process.
//   void event_destroy(device_index device, EventHandle event)
//       Releases the event; pending records may still complete.
//   void event_record(device_index device, EventHandle event,
//                     StreamHandle stream)
//       Captures the work queued on `stream` so far; a new record replaces the
//       last (the SDK does not record a pooled event again before its last
//       record has completed: Note [Pooled event reuse]).
//   bool event_query(device_index device, EventHandle event)
//       True iff the captured work has completed; true for an event never
//       recorded.
//   void event_synchronize(device_index device, EventHandle event)
//       Blocks until the captured work has completed; returns at once for an
//       event never recorded.
//   void device_synchronize(device_index device)
//       Blocks until the work of every stream of `device`, the SDK's included,
//       has completed.
//
// Optional members (after "Absent:", what the SDK does without one):
//   void initialize()
//       Called once, at the first device use (never for device_count or
//       properties). Absent: nothing.
//   MemoryInfo memory_info(device_index device)
//       Live free and total bytes of `device`. Absent: total =
//       properties().total_memory, free = total minus the bytes the SDK holds
//       from malloc on the device.
//   bool can_access_peer(device_index device, device_index peer)
//       Whether `device` may read and write `peer`'s memory directly. Absent:
//       false; copies between devices are staged through pinned host memory.
//   void memcpy_peer_async(void* dst, device_index dst_device, const void* src,
//                          device_index src_device, std::size_t bytes,
//                          StreamHandle stream)
//       Enqueues the copy of `bytes` (> 0) from `src` on src_device to `dst` on
//       dst_device on `stream`, a stream of src_device. Absent: the SDK
//       synchronizes `stream` and copies through a host_malloc buffer,
//       synchronously.
//   float event_elapsed_time(device_index device, EventHandle start,
//                            EventHandle end)
//       Milliseconds between two completed records of timing events. Absent:
//       properties().event_timing is false, and asking raises NotSupportedError
//       naming the backend.
//   void stream_wait_peer_event(device_index device, StreamHandle stream,
//                               device_index event_device, EventHandle event)
//       Work queued on `stream` (of `device`) later waits, on the device, for
//       the last record as of this call of `event`, an event of event_device
//       (never `device`); no wait if never recorded
//       (Note [Cross-device waits]). Absent: the SDK waits on the host, in
//       event_synchronize(event_device, event), before the call returns.
//   void* host_map(device_index device, void* ptr, std::size_t bytes)
//       Makes [ptr, ptr + bytes), inside one allocation from malloc(device, ·)
//       (or mapped pages of one vm_reserve range), readable and writable by the
//       host until the matching host_unmap, and returns the host address of the
//       byte at ptr: the host reaches the range at [ret, ret + bytes), never at
//       ptr unless ret is ptr (a runtime that maps in place returns ptr).
//       Called only for a device whose host_access is mapped, from any thread,
//       after the SDK waited for the device's work on the range; work another
//       thread queued on the range since (a read) may still be pending, and the
//       map coexists with it, neither refusing nor waiting for it. The SDK
//       never maps a range twice at once and writes nothing to it on the device
//       until it unmaps (Note [Map scopes]). nullptr is a failure: a
//       RuntimeError naming the backend and the range. Absent: a device
//       reporting host_access mapped without both members is refused at its
//       first properties query.
//   void host_unmap(device_index device, void* ptr, std::size_t bytes)
//       Ends the host's access to a range given to host_map with the same
//       arguments (the device address, not the returned one): what the host
//       wrote is the device's when it returns; a host access after it, at
//       either address, may fault. Absent: as host_map.
//   SignalHandle signal_create(device_index device)
//       A new host signal of `device`, not completed; the four signal members
//       go together (Note [Host signals]). Absent: the SDK's own signal, which
//       a stream waits for on the calling thread.
//   void stream_wait_signal(device_index device, StreamHandle stream,
//                           SignalHandle signal)
//       Work queued on `stream` later waits, on the device, until the signal is
//       completed; returns at once; no wait if it is completed already. Absent:
//       the calling thread blocks until the signal is completed (RuntimeError
//       if it failed).
//   void signal_complete(device_index device, SignalHandle signal, int error)
//       Completes the signal, once, from any thread: `error` 0 is success;
//       otherwise every stream waiting for it reports an asynchronous error
//       (with `error` as the code where the driver carries one) and goes on.
//       Absent: as signal_create.
//   void signal_destroy(device_index device, SignalHandle signal)
//       Releases the signal; waits queued on it still pass after
//       signal_complete. A signal not completed that a stream waits for is
//       refused with DriverError and stays usable. Absent: as signal_create.
//   void stream_begin_capture(device_index device, StreamHandle stream,
//                             CaptureMode mode)
//       Begins capturing `stream` (not capturing, not the default stream): work
//       queued on it until stream_end_capture is recorded into a graph, not
//       run. Only device-to-device and pinned memcpy_async, memset_async and
//       the runtime's own kernel launches are queued on a capturing stream; the
//       SDK refuses the rest (Note [Capture rules]). `mode` says what the SDK
//       refuses on other threads meanwhile; the runtime may pass it to its
//       driver. The seven graph members go together. Absent: capturing raises
//       NotSupportedError naming the backend, and no stream is ever capturing.
//   GraphHandle stream_end_capture(device_index device, StreamHandle stream)
//       Ends the capture of `stream` and returns the graph of the work
//       recorded, which reads and writes device memory when launched, at the
//       addresses queued (never contents copied at capture). The stream is not
//       capturing afterwards, also when the call throws (a capture the driver
//       invalidated: DriverError). Absent: as stream_begin_capture.
//   bool stream_is_capturing(device_index device, StreamHandle stream)
//       Whether `stream` is capturing, as the driver sees it. Absent: as
//       stream_begin_capture (false).
//   GraphExecHandle graph_instantiate(device_index device, GraphHandle graph)
//       An executable form of `graph`, launchable many times; the graph may be
//       destroyed after. Absent: as stream_begin_capture.
//   void graph_launch(device_index device, GraphExecHandle exec,
//                     StreamHandle stream)
//       Enqueues the graph's work on `stream` (not capturing), in the order it
//       was captured, reading device memory when it runs; launches of one exec
//       may be queued many times, on any streams of `device`, each running
//       whole, in its stream's order. Absent: as stream_begin_capture.
//   void graph_exec_destroy(device_index device, GraphExecHandle exec)
//       Releases the exec; launches of it already queued still complete (the
//       call may return before). Absent: as stream_begin_capture.
//   void graph_destroy(device_index device, GraphHandle graph)
//       Releases the graph; execs instantiated from it, and their queued
//       launches, are not affected. Absent: as stream_begin_capture.
//   std::size_t vm_granularity(device_index device)
//       The page size of virtual memory on `device`: a power of two, a multiple
//       of properties().memory_alignment; every size and address of the other
//       vm members is a multiple of it. The seven vm members go together
//       (Note [Virtual memory]). Absent: the caching allocator refuses
//       expandable_segments with NotSupportedError naming the backend and the
//       missing members.
//   void* vm_reserve(device_index device, std::size_t bytes)
//       A range of `bytes` device addresses, aligned to the granularity, with
//       no memory behind it (an access faults); nullptr where no such range is
//       left. Absent: as vm_granularity.
//   void vm_release(device_index device, void* base, std::size_t bytes)
//       Gives back a whole range from vm_reserve (the same base and bytes).
//       Every page of it must be unmapped first (DriverError otherwise, the
//       range unchanged). Absent: as vm_granularity.
//   PhysicalHandle vm_create(device_index device, std::size_t bytes)
//       `bytes` of physical memory, not mapped anywhere, counted against the
//       device's capacity as malloc's memory is; a null handle (!h) where the
//       device has no room. Absent: as vm_granularity.
//   void vm_destroy(device_index device, PhysicalHandle memory)
//       Frees physical memory from vm_create that is mapped nowhere
//       (DriverError otherwise). Absent: as vm_granularity.
//   void vm_map(device_index device, void* at, std::size_t bytes,
//               PhysicalHandle memory)
//       Maps all of `memory` (`bytes` long, its size at vm_create) at `at`,
//       inside one reserved range, on pages not mapped yet (DriverError
//       otherwise, nothing mapped). The pages are then device memory as
//       malloc's is: work of every stream may read and write them, and the host
//       too where the device's memory is host-visible. Absent: as
//       vm_granularity.
//   void vm_unmap(device_index device, void* at, std::size_t bytes)
//       Unmaps whole mapped pieces: [at, at + bytes) is one range given to
//       vm_map or a run of adjacent ones. Refused (DriverError, nothing
//       unmapped) while work queued on any stream still uses the range, as free
//       is (the SDK waits first: Note [Ordered release]); work queued later
//       naming it fails as for freed memory. Absent: as vm_granularity.
//   IpcMemHandle ipc_mem_export(device_index device, void* ptr)
//       A handle naming the whole allocation that starts at `ptr` (from
//       malloc(device, ·), never vm memory) to another process, valid while the
//       allocation lives; the same memory may be exported again. The three
//       memory members go together (Note [Inter-process memory]). Absent:
//       sharing a tensor with another process raises RuntimeError naming the
//       backend.
//   void* ipc_mem_open(device_index device, const IpcMemHandle& handle)
//       In another process: maps the whole allocation the handle names and
//       returns its base here, device memory of `device` for every stream and
//       copy of this process until ipc_mem_close. What it holds once the
//       exporter freed the memory or exited is the runtime's (CUDA: undefined);
//       the SDK frees no memory a process still holds open. DriverError for a
//       handle of this process, one open here already, of memory freed, of a
//       process that has exited, or not a handle. Absent: as ipc_mem_export.
//   void ipc_mem_close(device_index device, void* ptr)
//       Unmaps what ipc_mem_open returned (DriverError for any other pointer);
//       the exporter's memory is not affected. Refused while queued work uses
//       it, as free is. Absent: as ipc_mem_export.
//   IpcEventHandle ipc_event_export(device_index device, EventHandle event)
//       A handle naming `event` (made with EventFlags::interprocess) to another
//       process; the two event members go together and need the memory members.
//       Absent: the SDK synchronizes the producer's stream before a handle is
//       sent.
//   EventHandle ipc_event_open(device_index device,
//                              const IpcEventHandle& handle)
//       In another process: an event of `device` standing for the exporter's,
//       which stream_wait_event, event_query and event_synchronize follow (its
//       last record as of the call; none: no wait) and event_destroy releases;
//       never recorded here. An exporter that exits with that record incomplete
//       makes them fail with DriverError, never hang. Absent: as
//       ipc_event_export.
//   static constexpr bool host_kernels
//       Whether PyTorch's CPU kernels of the hottest operators run in place on
//       device memory the host can reach (host_access mapped or direct); false
//       for a runtime that brings kernels of its own. Absent: `true`
//   static constexpr bool fork_safe_discovery
//       Whether discovery (device_count, properties) leaves nothing that fork()
//       breaks; false for a driver that starts threads at its first device
//       query (PoCL): a child forked after discovery then refuses device use,
//       as after initialization (Note [Fork safety]). Absent: `true`
// END GENERATED contract table
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/contract.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/error.hpp>
#include <accelkit/types.hpp>

#include <cstdint>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE

template <class Derived>
class Runtime {
 public:
  // The one way a runtime reports a driver failure: throws DriverError
  // carrying the backend's name, the driver's code and message, and the
  // contract member that failed.
  [[noreturn]] static void driver_error(std::int64_t code, std::string_view call,
                                        std::string_view message) {
    throw DriverError(Derived::name, code, call, message);
  }
  // The same for a failure that ends the device (Note [Lost devices]):
  // throws DeviceLostError. The runtime runs no more work on that device.
  [[noreturn]] static void device_lost(std::int64_t code, std::string_view call,
                                       std::string_view message) {
    throw DeviceLostError(Derived::name, code, call, message);
  }

 protected:
  Runtime() = default;
  ~Runtime() = default;
};

// True when R implements the whole required contract with the expected
// signatures. Use it to constrain your own templates over runtimes.
template <class R>
inline constexpr bool is_runtime_v = detail::satisfies_contract<R>;

#if ACCELKIT_HAS_CONCEPTS
// The same test as a concept made of one named concept per member, so that a
// failed constraint names the member (detail::has_malloc, ...).
#define ACCELKIT_DETAIL_AND_HAS_(member, ...) &&detail::has_##member<R>
template <class R>
concept runtime = std::is_base_of_v<Runtime<R>, R> && detail::has_valid_name<R>()
    ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_AND_HAS_)
        ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_AND_HAS_);
#undef ACCELKIT_DETAIL_AND_HAS_
#endif

ACCELKIT_END_NAMESPACE
