// accelkit: the Runtime contract listed once, each member with its meaning
// (runtime.hpp and docs/contract.md show it as a table).
//
// Note [Contract diagnostics]
// A vendor who forgets a member, or gets its return type or parameters
// wrong, should read one line that names the member and its expected
// signature, not a page of template backtrace from deep inside the SDK.
// Every member has one detection trait (a named concept under C++20, a
// constexpr test under C++17), and check_contract<R> holds one static_assert
// per member whose message is the exact expected signature. The entry point
// that instantiates a backend (Backend<R>) instantiates check_contract<R>;
// it cannot live at class scope of Runtime<R>, where R is still incomplete.
// Limits: an optional member that is overloaded or a template escapes the
// "mistyped" diagnostic: when none of its forms matches, it counts as absent.
//
// Note [The contract table]
// The contract is needed in many shapes (traits, diagnostics, forwarding,
// defaults, compile-fail cases, the documentation tables), and copies of it
// drift. So the members are written once, in the lists below, each entry
// with a comment that is its meaning (for an optional member, after
// "Absent:", what the SDK does without it). Generated from the lists:
//   - the detection traits (has_<member>, names_<member>), the concepts and
//     is_runtime_v;
//   - the diagnostics, whose signature text is the list's own tokens
//     (#Ret " " #member #params);
//   - Backend<R>'s pass-through functions, for the members marked `forward`
//     (logical device in, physical ordinal to the runtime) or
//     `forward_nonempty` (the same, nothing called for 0 bytes); the members
//     marked `sdk` are wrapped by hand in Backend<R>, which applies the
//     default of an optional member that is absent;
//   - the values of the optional constants, their defaults included
//     (constant_<member><R>);
//   - contract_members, the list with signatures that the compile-fail tests
//     are made from (one case per member and way to get it wrong);
//   - the tables of runtime.hpp and docs/contract.md, written by
//     scripts/contract_docs.py from this file's text (the comments do not
//     reach the compiler); core.contract_docs fails when either is stale or
//     names other members or signatures than contract_members.
// Limits: a comment must precede each entry and must not contain "*/"; the
// generator reads the lists as text, so an entry keeps the X(...) / C(...)
// shape. Adding a member here adds its trait, diagnostic, forwarding
// function and test cases; the tables follow by running the script.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/types.hpp>

#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>
#if ACCELKIT_HAS_CONCEPTS
#include <concepts>
#endif

ACCELKIT_BEGIN_NAMESPACE

template <class Derived>
class Runtime;

namespace detail {

// Member functions: X(member, return type, (parameters), how Backend<R> calls
// it, (arguments)). The parameters are the exact signature a runtime
// declares; the arguments are the parameter names.
#define ACCELKIT_REQUIRED_MEMBERS(X)                                                           \
  /* The number of physical devices. Must not create a device context; may start driver        \
     threads only if fork_safe_discovery is false (Note [Fork safety]). A DriverError makes    \
     the SDK report 0 devices and keep the reason. */                                          \
  X(device_count, int, (), sdk, ())                                                            \
  /* The device's capabilities, in the schema of properties.hpp. Must not create a context;    \
     called once per device, then validated and cached. */                                     \
  X(properties, DeviceProperties, (device_index device), sdk, (device))                        \
  /* The driver's current device of the calling thread. */                                     \
  X(get_device, device_index, (), sdk, ())                                                     \
  /* Makes `device` current for the calling thread; may create its context. */                 \
  X(set_device, void, (device_index device), sdk, (device))                                    \
  /* `bytes` (> 0) of device memory, aligned to at least properties().memory_alignment         \
     (Note [Memory alignment]). nullptr when out of memory or when the driver refuses the      \
     request (the SDK tells them apart by the free memory: Note [Refusal and exhaustion]);     \
     DriverError for other failures. */                                                        \
  X(malloc, void*, (device_index device, std::size_t bytes), sdk, (device, bytes))             \
  /* Releases memory from malloc(device, ·), at once if the driver likes: the SDK never        \
     frees memory that queued work still uses (Note [Ordered release]). */                     \
  X(free, void, (device_index device, void* ptr), sdk, (device, ptr))                          \
  /* `bytes` (> 0) of page-locked host memory, allocated in `device`'s context and usable      \
     by the async copies of every device, as CUDA's portable pinned memory                     \
     (Note [Pinned memory per device]); nullptr when out of memory. */                         \
  X(host_malloc, void*, (device_index device, std::size_t bytes), sdk, (device, bytes))        \
  /* Releases memory from host_malloc(device, ·); as for free, never while queued work uses    \
     it. */                                                                                    \
  X(host_free, void, (device_index device, void* ptr), sdk, (device, ptr))                     \
  /* Copies `bytes` (> 0) synchronously: complete on return. Not ordered with streams (the     \
     SDK synchronizes first where order matters). `kind` says which side is host memory;       \
     device_to_device stays within `device`. */                                                \
  X(memcpy, void,                                                                              \
    (device_index device, void* dst, const void* src, std::size_t bytes, CopyKind kind),       \
    forward_nonempty, (device, dst, src, bytes, kind))                                         \
  /* Enqueues the copy of `bytes` (> 0) on `stream`. host_pinned true: the host side is        \
     host_malloc memory (of any device), which the SDK keeps alive and untouched until the     \
     stream has passed the copy, so the copy may run later; false: pageable host memory,       \
     done with before the call returns. Always false for device_to_device. A runtime whose     \
     driver copies from any host pointer (CUDA, OpenCL SVM) needs no record of its             \
     host_malloc ranges; one whose driver copies only its own buffers (Vulkan's mapped         \
     VkBuffer) keeps that record to find the buffer behind a pinned pointer: host_pinned says  \
     whether to look (Note [Pinned copies]). */                                                \
  X(memcpy_async, void,                                                                        \
    (device_index device, void* dst, const void* src, std::size_t bytes, CopyKind kind,        \
     StreamHandle stream, bool host_pinned),                                                   \
    forward_nonempty, (device, dst, src, bytes, kind, stream, host_pinned))                    \
  /* Enqueues on `stream` the fill of `bytes` (> 0) bytes of device memory at `ptr`            \
     (anywhere inside an allocation from malloc(device, ·), or inside pages vm_map mapped)     \
     with the low byte of `value`, as std::memset does. */                                     \
  X(memset_async, void,                                                                        \
    (device_index device, void* ptr, int value, std::size_t bytes, StreamHandle stream),       \
    forward_nonempty, (device, ptr, value, bytes, stream))                                     \
  /* A new stream; `priority` in the driver's numbering, within                                \
     properties().stream_priorities (with StreamPriorityRange::from_levels(n): a level, 0 =    \
     default .. n-1 = most urgent). */                                                         \
  X(stream_create, StreamHandle, (device_index device, int priority), forward,                 \
    (device, priority))                                                                        \
  /* Releases the stream; its queued work still completes (the call may return before). */     \
  X(stream_destroy, void, (device_index device, StreamHandle stream), forward,                 \
    (device, stream))                                                                          \
  /* True iff all work queued on the stream so far has completed; never blocks. */             \
  X(stream_query, bool, (device_index device, StreamHandle stream), forward, (device, stream)) \
  /* Blocks until all work queued on the stream so far has completed. */                       \
  X(stream_synchronize, void, (device_index device, StreamHandle stream), forward,             \
    (device, stream))                                                                          \
  /* Work queued on `stream` later waits for the event's last record as of this call           \
     (recording the event again does not change it); no wait if the event was never            \
     recorded. */                                                                              \
  X(stream_wait_event, void, (device_index device, StreamHandle stream, EventHandle event),    \
    forward, (device, stream, event))                                                          \
  /* A new event; EventFlags::timing asks for timestamps, EventFlags::blocking_sync lets       \
     event_synchronize yield the CPU, EventFlags::interprocess (never with timing) lets        \
     ipc_event_export name it to another process. */                                           \
  X(event_create, EventHandle, (device_index device, EventFlags flags), forward,               \
    (device, flags))                                                                           \
  /* Releases the event; pending records may still complete. */                                \
  X(event_destroy, void, (device_index device, EventHandle event), forward, (device, event))   \
  /* Captures the work queued on `stream` so far; a new record replaces the last (the SDK      \
     does not record a pooled event again before its last record has completed:                \
     Note [Pooled event reuse]). */                                                            \
  X(event_record, void, (device_index device, EventHandle event, StreamHandle stream),         \
    forward, (device, event, stream))                                                          \
  /* True iff the captured work has completed; true for an event never recorded. */            \
  X(event_query, bool, (device_index device, EventHandle event), forward, (device, event))     \
  /* Blocks until the captured work has completed; returns at once for an event never          \
     recorded. */                                                                              \
  X(event_synchronize, void, (device_index device, EventHandle event), forward,                \
    (device, event))                                                                           \
  /* Blocks until the work of every stream of `device`, the SDK's included, has completed. */  \
  X(device_synchronize, void, (device_index device), forward, (device))

#define ACCELKIT_OPTIONAL_MEMBERS(X)                                                           \
  /* Called once, at the first device use (never for device_count or properties). Absent:      \
     nothing. */                                                                               \
  X(initialize, void, (), sdk, ())                                                             \
  /* Live free and total bytes of `device`. Absent: total = properties().total_memory, free    \
     = total minus the bytes the SDK holds from malloc on the device. */                       \
  X(memory_info, MemoryInfo, (device_index device), sdk, (device))                             \
  /* Whether `device` may read and write `peer`'s memory directly. Absent: false; copies       \
     between devices are staged through pinned host memory. */                                 \
  X(can_access_peer, bool, (device_index device, device_index peer), sdk, (device, peer))      \
  /* Enqueues the copy of `bytes` (> 0) from `src` on src_device to `dst` on dst_device on     \
     `stream`, a stream of src_device. Absent: the SDK synchronizes `stream` and copies        \
     through a host_malloc buffer, synchronously. */                                           \
  X(memcpy_peer_async, void,                                                                   \
    (void* dst, device_index dst_device, const void* src, device_index src_device,             \
     std::size_t bytes, StreamHandle stream),                                                  \
    sdk, (dst, dst_device, src, src_device, bytes, stream))                                    \
  /* Milliseconds between two completed records of timing events. Absent:                      \
     properties().event_timing is false, and asking raises NotSupportedError naming the        \
     backend. */                                                                               \
  X(event_elapsed_time, float, (device_index device, EventHandle start, EventHandle end), sdk, \
    (device, start, end))                                                                      \
  /* Work queued on `stream` (of `device`) later waits, on the device, for the last record     \
     as of this call of `event`, an event of event_device (never `device`); no wait if         \
     never recorded (Note [Cross-device waits]). Absent: the SDK waits on the host, in         \
     event_synchronize(event_device, event), before the call returns. */                       \
  X(stream_wait_peer_event, void,                                                              \
    (device_index device, StreamHandle stream, device_index event_device, EventHandle event),  \
    sdk, (device, stream, event_device, event))                                                \
  /* Makes [ptr, ptr + bytes), inside one allocation from malloc(device, ·) (or mapped         \
     pages of one vm_reserve range), readable and writable by the host until the matching      \
     host_unmap, and returns the host address of the byte at ptr: the host reaches the range   \
     at [ret, ret + bytes), never at ptr unless ret is ptr (a runtime that maps in place       \
     returns ptr). Called only for a device whose host_access is mapped, from any thread,      \
     after the SDK waited for the device's work on the range; work another thread queued on    \
     the range since (a read) may still be pending, and the map coexists with it, neither      \
     refusing nor waiting for it. The SDK never maps a range twice at once and writes nothing  \
     to it on the device until it unmaps (Note [Map scopes]). nullptr is a failure: a          \
     RuntimeError naming the backend and the range. Absent: a device reporting host_access     \
     mapped without both members is refused at its first properties query. */                  \
  X(host_map, void*, (device_index device, void* ptr, std::size_t bytes), sdk,                 \
    (device, ptr, bytes))                                                                      \
  /* Ends the host's access to a range given to host_map with the same arguments (the device   \
     address, not the returned one): what the host wrote is the device's when it returns; a    \
     host access after it, at either address, may fault. Absent: as host_map. */               \
  X(host_unmap, void, (device_index device, void* ptr, std::size_t bytes), sdk,                \
    (device, ptr, bytes))                                                                      \
  /* A new host signal of `device`, not completed; the four signal members go together         \
     (Note [Host signals]). Absent: the SDK's own signal, which a stream waits for on the      \
     calling thread. */                                                                        \
  X(signal_create, SignalHandle, (device_index device), sdk, (device))                         \
  /* Work queued on `stream` later waits, on the device, until the signal is completed;        \
     returns at once; no wait if it is completed already. Absent: the calling thread blocks    \
     until the signal is completed (RuntimeError if it failed). */                             \
  X(stream_wait_signal, void,                                                                  \
    (device_index device, StreamHandle stream, SignalHandle signal), sdk,                      \
    (device, stream, signal))                                                                  \
  /* Completes the signal, once, from any thread: `error` 0 is success; otherwise every        \
     stream waiting for it reports an asynchronous error (with `error` as the code where       \
     the driver carries one) and goes on. Absent: as signal_create. */                         \
  X(signal_complete, void, (device_index device, SignalHandle signal, int error), sdk,         \
    (device, signal, error))                                                                   \
  /* Releases the signal; waits queued on it still pass after signal_complete. A signal not    \
     completed that a stream waits for is refused with DriverError and stays usable.           \
     Absent: as signal_create. */                                                              \
  X(signal_destroy, void, (device_index device, SignalHandle signal), sdk, (device, signal))   \
  /* Begins capturing `stream` (not capturing, not the default stream): work queued on it      \
     until stream_end_capture is recorded into a graph, not run. Only device-to-device and     \
     pinned memcpy_async, memset_async and the runtime's own kernel launches are queued on a   \
     capturing stream; the SDK refuses the rest (Note [Capture rules]). `mode` says what the   \
     SDK refuses on other threads meanwhile; the runtime may pass it to its driver. The seven  \
     graph members go together. Absent: capturing raises NotSupportedError naming the          \
     backend, and no stream is ever capturing. */                                              \
  X(stream_begin_capture, void, (device_index device, StreamHandle stream, CaptureMode mode),  \
    sdk, (device, stream, mode))                                                               \
  /* Ends the capture of `stream` and returns the graph of the work recorded, which reads and  \
     writes device memory when launched, at the addresses queued (never contents copied at     \
     capture). The stream is not capturing afterwards, also when the call throws (a capture    \
     the driver invalidated: DriverError). Absent: as stream_begin_capture. */                 \
  X(stream_end_capture, GraphHandle, (device_index device, StreamHandle stream), sdk,          \
    (device, stream))                                                                          \
  /* Whether `stream` is capturing, as the driver sees it. Absent: as stream_begin_capture     \
     (false). */                                                                               \
  X(stream_is_capturing, bool, (device_index device, StreamHandle stream), sdk,                \
    (device, stream))                                                                          \
  /* An executable form of `graph`, launchable many times; the graph may be destroyed after.   \
     Absent: as stream_begin_capture. */                                                       \
  X(graph_instantiate, GraphExecHandle, (device_index device, GraphHandle graph), sdk,         \
    (device, graph))                                                                           \
  /* Enqueues the graph's work on `stream` (not capturing), in the order it was captured,      \
     reading device memory when it runs; launches of one exec may be queued many times, on     \
     any streams of `device`, each running whole, in its stream's order. Absent: as            \
     stream_begin_capture. */                                                                  \
  X(graph_launch, void, (device_index device, GraphExecHandle exec, StreamHandle stream), sdk, \
    (device, exec, stream))                                                                    \
  /* Releases the exec; launches of it already queued still complete (the call may return     \
     before). Absent: as stream_begin_capture. */                                              \
  X(graph_exec_destroy, void, (device_index device, GraphExecHandle exec), sdk,                \
    (device, exec))                                                                            \
  /* Releases the graph; execs instantiated from it, and their queued launches, are not        \
     affected. Absent: as stream_begin_capture. */                                             \
  X(graph_destroy, void, (device_index device, GraphHandle graph), sdk, (device, graph))       \
  /* The page size of virtual memory on `device`: a power of two, a multiple of                \
     properties().memory_alignment; every size and address of the other vm members is a        \
     multiple of it. The seven vm members go together (Note [Virtual memory]). Absent: the     \
     caching allocator refuses expandable_segments with NotSupportedError naming the           \
     backend and the missing members. */                                                       \
  X(vm_granularity, std::size_t, (device_index device), sdk, (device))                         \
  /* A range of `bytes` device addresses, aligned to the granularity, with no memory behind    \
     it (an access faults); nullptr where no such range is left. Absent: as                    \
     vm_granularity. */                                                                        \
  X(vm_reserve, void*, (device_index device, std::size_t bytes), sdk, (device, bytes))         \
  /* Gives back a whole range from vm_reserve (the same base and bytes). Every page of it      \
     must be unmapped first (DriverError otherwise, the range unchanged). Absent: as           \
     vm_granularity. */                                                                        \
  X(vm_release, void, (device_index device, void* base, std::size_t bytes), sdk,               \
    (device, base, bytes))                                                                     \
  /* `bytes` of physical memory, not mapped anywhere, counted against the device's             \
     capacity as malloc's memory is; a null handle (!h) where the device has no room. Absent:  \
     as vm_granularity. */                                                                     \
  X(vm_create, PhysicalHandle, (device_index device, std::size_t bytes), sdk, (device, bytes)) \
  /* Frees physical memory from vm_create that is mapped nowhere (DriverError otherwise).     \
     Absent: as vm_granularity. */                                                             \
  X(vm_destroy, void, (device_index device, PhysicalHandle memory), sdk, (device, memory))     \
  /* Maps all of `memory` (`bytes` long, its size at vm_create) at `at`, inside one reserved   \
     range, on pages not mapped yet (DriverError otherwise, nothing mapped). The pages are     \
     then device memory as malloc's is: work of every stream may read and write them, and      \
     the host too where the device's memory is host-visible. Absent: as vm_granularity. */     \
  X(vm_map, void, (device_index device, void* at, std::size_t bytes, PhysicalHandle memory),   \
    sdk, (device, at, bytes, memory))                                                          \
  /* Unmaps whole mapped pieces: [at, at + bytes) is one range given to vm_map or a run of     \
     adjacent ones. Refused (DriverError, nothing unmapped) while work queued on any stream    \
     still uses the range, as free is (the SDK waits first: Note [Ordered release]); work      \
     queued later naming it fails as for freed memory. Absent: as vm_granularity. */           \
  X(vm_unmap, void, (device_index device, void* at, std::size_t bytes), sdk,                   \
    (device, at, bytes))                                                                       \
  /* A handle naming the whole allocation that starts at `ptr` (from malloc(device, ·),        \
     never vm memory) to another process, valid while the allocation lives; the same memory    \
     may be exported again. The three memory members go together                               \
     (Note [Inter-process memory]). Absent: sharing a tensor with another process raises       \
     RuntimeError naming the backend. */                                                       \
  X(ipc_mem_export, IpcMemHandle, (device_index device, void* ptr), sdk, (device, ptr))        \
  /* In another process: maps the whole allocation the handle names and returns its base       \
     here, device memory of `device` for every stream and copy of this process until           \
     ipc_mem_close. What it holds once the exporter freed the memory or exited is the          \
     runtime's (CUDA: undefined); the SDK frees no memory a process still holds open.          \
     DriverError for a handle of this process, one open here already, of memory freed, of a    \
     process that has exited, or not a handle. Absent: as ipc_mem_export. */                   \
  X(ipc_mem_open, void*, (device_index device, const IpcMemHandle& handle), sdk,                \
    (device, handle))                                                                          \
  /* Unmaps what ipc_mem_open returned (DriverError for any other pointer); the exporter's     \
     memory is not affected. Refused while queued work uses it, as free is. Absent: as         \
     ipc_mem_export. */                                                                        \
  X(ipc_mem_close, void, (device_index device, void* ptr), sdk, (device, ptr))                 \
  /* A handle naming `event` (made with EventFlags::interprocess) to another process; the      \
     two event members go together and need the memory members. Absent: the SDK                \
     synchronizes the producer's stream before a handle is sent. */                            \
  X(ipc_event_export, IpcEventHandle, (device_index device, EventHandle event), sdk,           \
    (device, event))                                                                           \
  /* In another process: an event of `device` standing for the exporter's, which               \
     stream_wait_event, event_query and event_synchronize follow (its last record as of the    \
     call; none: no wait) and event_destroy releases; never recorded here. An exporter that    \
     exits with that record incomplete makes them fail with DriverError, never hang.           \
     Absent: as ipc_event_export. */                                                           \
  X(ipc_event_open, EventHandle, (device_index device, const IpcEventHandle& handle), sdk,      \
    (device, handle))

// Constants: C(member, type, default). `static constexpr type member`; a
// required one has no default.
#define ACCELKIT_REQUIRED_CONSTANTS(C)                                                         \
  /* The backend's name: the device type ("simdev:0"), the prefix of its variables             \
     (SIMDEV_*) and its Python module (torch.simdev); a lowercase identifier that is not a     \
     PyTorch device type. */                                                                   \
  C(name, std::string_view, )
#define ACCELKIT_OPTIONAL_CONSTANTS(C)                                                         \
  /* Whether PyTorch's CPU kernels of the hottest operators run in place on device memory      \
     the host can reach (host_access mapped or direct); false for a runtime that brings        \
     kernels of its own. */                                                                    \
  C(host_kernels, bool, true)                                                                  \
  /* Whether discovery (device_count, properties) leaves nothing that fork() breaks; false     \
     for a driver that starts threads at its first device query (PoCL): a child forked         \
     after discovery then refuses device use, as after initialization (Note [Fork safety]). */ \
  C(fork_safe_discovery, bool, true)

#define ACCELKIT_DETAIL_UNPAREN_(...) __VA_ARGS__
#define ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params) #Ret " " #member #params
#define ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type) "static constexpr " #Type " " #member

// One callable per member name: calling it calls that member on the runtime;
// `name` is the member's.
#define ACCELKIT_DETAIL_CALLER_(member, ...)                                  \
  struct call_##member {                                                      \
    static constexpr const char* name = #member;                              \
    template <class R, class... A>                                            \
    auto operator()(R& r, A&&... a) const                                     \
        -> decltype(r.member(std::forward<A>(a)...)) {                        \
      return r.member(std::forward<A>(a)...);                                 \
    }                                                                         \
  };
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_CALLER_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_CALLER_)
#undef ACCELKIT_DETAIL_CALLER_

// The exact signature test: Caller(R&, parameters...) is valid and returns
// exactly Ret. Signature is the table's function type, Ret(parameters).
template <class Caller, class R, class Signature>
struct signature_test;
template <class Caller, class R, class Ret, class... P>
struct signature_test<Caller, R, Ret(P...)> {
#if ACCELKIT_HAS_CONCEPTS
  static constexpr bool value = requires(Caller c, R& r, P&&... p) {
    { c(r, std::forward<P>(p)...) } -> std::same_as<Ret>;
  };
#else
  static constexpr bool value = [] {
    if constexpr (std::is_invocable_v<Caller, R&, P...>)
      return std::is_same_v<std::invoke_result_t<Caller, R&, P...>, Ret>;
    else
      return false;
  }();
#endif
};

// has_<member><R>: R has the member with exactly the expected signature.
#if ACCELKIT_HAS_CONCEPTS
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, params, ...) \
  template <class R>                                     \
  concept has_##member = signature_test<call_##member, R, Ret params>::value;
#else
#define ACCELKIT_DETAIL_TRAIT_(member, Ret, params, ...) \
  template <class R>                                     \
  inline constexpr bool has_##member = signature_test<call_##member, R, Ret params>::value;
#endif
ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_TRAIT_)
#undef ACCELKIT_DETAIL_TRAIT_

// has_<constant><R>: R declares `static constexpr Type constant`, a constant
// expression of exactly that type; names_<constant><R>: R declares something
// of that name.
#define ACCELKIT_DETAIL_CONSTANT_TRAIT_(member, Type, ...)                                   \
  template <class R, class = void>                                                          \
  inline constexpr bool names_##member = false;                                             \
  template <class R>                                                                        \
  inline constexpr bool names_##member<R, std::void_t<decltype(R::member)>> = true;         \
  template <class R, class = void>                                                          \
  inline constexpr bool has_##member = false;                                               \
  template <class R>                                                                        \
  inline constexpr bool has_##member<                                                       \
      R, std::enable_if_t<std::is_same_v<std::remove_cv_t<decltype(R::member)>, Type> &&    \
                          (static_cast<void>(static_cast<Type>(R::member)), true)>> = true;
ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_TRAIT_)
ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_TRAIT_)
#undef ACCELKIT_DETAIL_CONSTANT_TRAIT_

// constant_<constant><R>: the value of an optional constant, its default when
// R does not declare it.
#define ACCELKIT_DETAIL_CONSTANT_VALUE_(member, Type, default_value)          \
  template <class R>                                                          \
  constexpr Type constant_value_##member() {                                  \
    if constexpr (has_##member<R>)                                            \
      return R::member;                                                       \
    else                                                                      \
      return default_value;                                                   \
  }                                                                           \
  template <class R>                                                          \
  inline constexpr Type constant_##member = constant_value_##member<R>();
ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_VALUE_)
#undef ACCELKIT_DETAIL_CONSTANT_VALUE_

// names_<member><R>: R declares something of that name (so an optional member
// that fails has_<member> is mistyped rather than absent). An overloaded or
// templated member is not detected here; it then counts as absent.
#define ACCELKIT_DETAIL_NAMES_(member, ...)                                            \
  template <class R, class = void>                                                     \
  inline constexpr bool names_##member = false;                                        \
  template <class R>                                                                   \
  inline constexpr bool names_##member<R, std::void_t<decltype(&R::member)>> = true;
ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_NAMES_)
#undef ACCELKIT_DETAIL_NAMES_

// The table as data: each member's name, its signature as the diagnostics
// print it, and whether it is required.
struct ContractMember {
  std::string_view name;
  std::string_view signature;
  bool required;
};
#define ACCELKIT_DETAIL_ENTRY_REQUIRED_(member, Ret, params, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params), true},
#define ACCELKIT_DETAIL_ENTRY_OPTIONAL_(member, Ret, params, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params), false},
#define ACCELKIT_DETAIL_CONSTANT_REQUIRED_(member, Type, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type), true},
#define ACCELKIT_DETAIL_CONSTANT_OPTIONAL_(member, Type, ...) \
  ContractMember{#member, ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type), false},
inline constexpr ContractMember contract_members[] = {
    ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_REQUIRED_)
    ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_ENTRY_REQUIRED_)
    ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_ENTRY_OPTIONAL_)
    ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_CONSTANT_OPTIONAL_)};
#undef ACCELKIT_DETAIL_ENTRY_REQUIRED_
#undef ACCELKIT_DETAIL_ENTRY_OPTIONAL_
#undef ACCELKIT_DETAIL_CONSTANT_REQUIRED_
#undef ACCELKIT_DETAIL_CONSTANT_OPTIONAL_

// A backend name becomes a device type string ("simdev:0"), an environment
// variable prefix and a Python module (torch.simdev): a lowercase identifier,
// not one of PyTorch's built-in device types.
constexpr bool is_valid_backend_name(std::string_view n) noexcept {
  if (n.empty() || n.size() > 32 || !(n[0] >= 'a' && n[0] <= 'z')) return false;
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  constexpr std::string_view reserved[] = {"cpu", "cuda", "hip", "xpu", "mps", "meta", "mtia",
                                           "hpu", "xla", "lazy", "ipu", "ve", "vulkan", "fpga",
                                           "maia", "mkldnn", "opengl", "opencl", "ideep",
                                           "privateuseone"};
  for (std::string_view r : reserved)
    if (n == r) return false;
  return true;
}
template <class R>
constexpr bool has_valid_name() {
  if constexpr (has_name<R>)
    return is_valid_backend_name(R::name);
  else
    return true;  // reported by the "missing name" assertion instead
}

// The host signal members go together (Note [Host signals] in
// device/backend.hpp): how many of them R declares, and whether it has all.
template <class R>
inline constexpr int signal_members_named = int{names_signal_create<R>} +
                                            int{names_stream_wait_signal<R>} +
                                            int{names_signal_complete<R>} +
                                            int{names_signal_destroy<R>};
template <class R>
inline constexpr bool has_stream_signals = has_signal_create<R> && has_stream_wait_signal<R> &&
                                           has_signal_complete<R> && has_signal_destroy<R>;

// The graph members go together (Note [Capture rules] in
// device/captures.hpp): how many of them R declares, and whether it has all.
template <class R>
inline constexpr int graph_members_named =
    int{names_stream_begin_capture<R>} + int{names_stream_end_capture<R>} +
    int{names_stream_is_capturing<R>} + int{names_graph_instantiate<R>} +
    int{names_graph_launch<R>} + int{names_graph_exec_destroy<R>} + int{names_graph_destroy<R>};
template <class R>
inline constexpr bool has_graphs =
    has_stream_begin_capture<R> && has_stream_end_capture<R> && has_stream_is_capturing<R> &&
    has_graph_instantiate<R> && has_graph_launch<R> && has_graph_exec_destroy<R> &&
    has_graph_destroy<R>;

// The virtual-memory members go together (Note [Virtual memory] in
// device/backend.hpp): how many of them R declares, and whether it has all.
template <class R>
inline constexpr int virtual_memory_members_named =
    int{names_vm_granularity<R>} + int{names_vm_reserve<R>} + int{names_vm_release<R>} +
    int{names_vm_create<R>} + int{names_vm_destroy<R>} + int{names_vm_map<R>} +
    int{names_vm_unmap<R>};
template <class R>
inline constexpr bool has_virtual_memory =
    has_vm_granularity<R> && has_vm_reserve<R> && has_vm_release<R> && has_vm_create<R> &&
    has_vm_destroy<R> && has_vm_map<R> && has_vm_unmap<R>;

// The inter-process members go together in two groups (Note [Inter-process
// memory] in device/backend.hpp): memory (export, open, close) and events
// (export, open), the events needing the memory group.
template <class R>
inline constexpr int ipc_memory_members_named =
    int{names_ipc_mem_export<R>} + int{names_ipc_mem_open<R>} + int{names_ipc_mem_close<R>};
template <class R>
inline constexpr bool has_ipc_memory =
    has_ipc_mem_export<R> && has_ipc_mem_open<R> && has_ipc_mem_close<R>;
template <class R>
inline constexpr int ipc_event_members_named =
    int{names_ipc_event_export<R>} + int{names_ipc_event_open<R>};
template <class R>
inline constexpr bool has_ipc_events =
    has_ipc_memory<R> && has_ipc_event_export<R> && has_ipc_event_open<R>;

#define ACCELKIT_DETAIL_AND_HAS_(member, ...) &&has_##member<R>
template <class R>
inline constexpr bool satisfies_contract =
    std::is_base_of_v<Runtime<R>, R> && has_valid_name<R>()
        ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_AND_HAS_)
            ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_AND_HAS_);
#undef ACCELKIT_DETAIL_AND_HAS_

// Instantiating check_contract<R> fires one static_assert per member that is
// missing or mistyped, each naming the member with its expected signature.
#define ACCELKIT_DETAIL_MISSING_ "accelkit: Runtime is missing or mistypes: "
#define ACCELKIT_DETAIL_MISTYPED_ "accelkit: Runtime mistypes optional member: "
template <class R>
struct check_contract {
  static_assert(std::is_base_of_v<Runtime<R>, R>,
                "accelkit: a runtime must derive from accelkit::Runtime<Self> "
                "(struct MyRuntime : accelkit::Runtime<MyRuntime>)");
  static_assert(has_valid_name<R>(),
                "accelkit: Runtime::name must be a lowercase identifier ([a-z][a-z0-9_]*, at "
                "most 32 characters) and not a PyTorch device type such as \"cuda\"");
#define ACCELKIT_DETAIL_ASSERT_(member, Ret, params, ...) \
  static_assert(has_##member<R>,                          \
                ACCELKIT_DETAIL_MISSING_ ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params));
#define ACCELKIT_DETAIL_ASSERT_OPTIONAL_(member, Ret, params, ...) \
  static_assert(!names_##member<R> || has_##member<R>,             \
                ACCELKIT_DETAIL_MISTYPED_ ACCELKIT_DETAIL_FUNCTION_SIGNATURE_(member, Ret, params));
#define ACCELKIT_DETAIL_ASSERT_CONSTANT_(member, Type, ...) \
  static_assert(has_##member<R>,                            \
                ACCELKIT_DETAIL_MISSING_ ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type));
#define ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_(member, Type, ...) \
  static_assert(!names_##member<R> || has_##member<R>,               \
                ACCELKIT_DETAIL_MISTYPED_ ACCELKIT_DETAIL_CONSTANT_SIGNATURE_(member, Type));
  ACCELKIT_REQUIRED_CONSTANTS(ACCELKIT_DETAIL_ASSERT_CONSTANT_)
  ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_ASSERT_)
  ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_ASSERT_OPTIONAL_)
  ACCELKIT_OPTIONAL_CONSTANTS(ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_)
  static_assert(signal_members_named<R> == 0 || signal_members_named<R> == 4,
                "accelkit: Runtime has some of the host signal members but not all: "
                "signal_create, stream_wait_signal, signal_complete and signal_destroy go "
                "together (Note [Host signals])");
  static_assert(graph_members_named<R> == 0 || graph_members_named<R> == 7,
                "accelkit: Runtime has some of the graph members but not all: "
                "stream_begin_capture, stream_end_capture, stream_is_capturing, "
                "graph_instantiate, graph_launch, graph_exec_destroy and graph_destroy go "
                "together (Note [Capture rules])");
  static_assert(virtual_memory_members_named<R> == 0 || virtual_memory_members_named<R> == 7,
                "accelkit: Runtime has some of the virtual memory members but not all: "
                "vm_granularity, vm_reserve, vm_release, vm_create, vm_destroy, vm_map and "
                "vm_unmap go together (Note [Virtual memory])");
  static_assert(ipc_memory_members_named<R> == 0 || ipc_memory_members_named<R> == 3,
                "accelkit: Runtime has some of the inter-process memory members but not all: "
                "ipc_mem_export, ipc_mem_open and ipc_mem_close go together "
                "(Note [Inter-process memory])");
  static_assert(ipc_event_members_named<R> == 0 || ipc_event_members_named<R> == 2,
                "accelkit: Runtime has some of the inter-process event members but not all: "
                "ipc_event_export and ipc_event_open go together (Note [Inter-process memory])");
  static_assert(ipc_event_members_named<R> == 0 || ipc_memory_members_named<R> != 0,
                "accelkit: Runtime has the inter-process event members without the memory "
                "members: ipc_event_export and ipc_event_open need ipc_mem_export, ipc_mem_open "
                "and ipc_mem_close (Note [Inter-process memory])");
#undef ACCELKIT_DETAIL_ASSERT_
#undef ACCELKIT_DETAIL_ASSERT_OPTIONAL_
#undef ACCELKIT_DETAIL_ASSERT_CONSTANT_
#undef ACCELKIT_DETAIL_ASSERT_OPTIONAL_CONSTANT_
  static constexpr bool value = satisfies_contract<R>;
};
#undef ACCELKIT_DETAIL_MISSING_
#undef ACCELKIT_DETAIL_MISTYPED_

}  // namespace detail

ACCELKIT_END_NAMESPACE
