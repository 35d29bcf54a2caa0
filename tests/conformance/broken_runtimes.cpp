// The conformance kit catches what it claims to: runtimes that each break
// one rule of the contract (simdev with one member replaced, Note [Wrapped
// runtimes]) fail the check of that rule, naming it (ctest:
// conformance.cpp.broken). The whole suite passes on the correct runtimes
// (conformance.cpp.simdev, conformance.cpp.minimal).
#include "../catch.hpp"

#include <accelkit/testing/conformance.hpp>
#include <simdev_runtime.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace {

using accelkit::CopyKind;
using accelkit::DeviceProperties;
using accelkit::EventFlags;
using accelkit::EventHandle;
using accelkit::StreamHandle;
using accelkit::device_index;
using accelkit::testing::CheckResult;
using accelkit::testing::CheckStatus;
using accelkit::testing::Wrap;
using simdev::SimRuntime;

bool contains(const std::string& s, const char* part) { return s.find(part) != std::string::npos; }

// Checks that `r` failed with the rule it proves and a message naming what
// broke it.
void expect_failed(const CheckResult& r, const char* broke) {
  INFO(r.group << "/" << r.name << ": " << r.message);
  CHECK(r.status == CheckStatus::fail);
  CHECK_FALSE(r.rule.empty());
  CHECK(contains(r.message, broke));
}

// malloc returns memory 16 bytes past an aligned block.
struct Misaligned : Wrap<Misaligned, SimRuntime> {
  void* malloc(device_index device, std::size_t bytes) {
    void* p = inner().malloc(device, bytes + 256);
    return p ? static_cast<char*>(p) + 16 : nullptr;
  }
  void free(device_index device, void* ptr) { inner().free(device, static_cast<char*>(ptr) - 16); }
};

// An event never recorded queries false.
struct EventNeverRecordedBusy : Wrap<EventNeverRecordedBusy, SimRuntime> {
  std::mutex m;
  std::set<std::uintptr_t> recorded;
  void event_record(device_index device, EventHandle event, StreamHandle stream) {
    {
      std::lock_guard<std::mutex> lock(m);
      recorded.insert(event.value);
    }
    inner().event_record(device, event, stream);
  }
  bool event_query(device_index device, EventHandle event) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (!recorded.count(event.value)) return false;
    }
    return inner().event_query(device, event);
  }
};

// stream_query waits for the queued work.
struct BlockingQuery : Wrap<BlockingQuery, SimRuntime> {
  bool stream_query(device_index device, StreamHandle stream) {
    inner().stream_synchronize(device, stream);
    return true;
  }
};

// An event completes before its stream counts the work before it done: the
// first stream_query after an event_synchronize answers busy.
struct BusyAfterEvent : Wrap<BusyAfterEvent, SimRuntime> {
  void event_synchronize(device_index device, EventHandle event) {
    inner().event_synchronize(device, event);
    lagging = true;
  }
  bool stream_query(device_index device, StreamHandle stream) {
    if (lagging.exchange(false)) return false;
    return inner().stream_query(device, stream);
  }
  std::atomic<bool> lagging{false};
};

// The runtime applies <NAME>_VISIBLE_DEVICES itself, as a driver that reads
// the variable would: it reports only as many devices as the variable names,
// so the SDK, which applies the variable too, numbers them twice.
struct FiltersVisibility : Wrap<FiltersVisibility, SimRuntime> {
  int device_count() {
    int n = inner().device_count();
    const char* v = std::getenv("SIMDEV_VISIBLE_DEVICES");
    if (v == nullptr) return n;
    std::string s(v);
    int named = s.empty() ? 0 : 1 + static_cast<int>(std::count(s.begin(), s.end(), ','));
    return std::min(n, named);
  }
};

// device_count makes a context: it opens device 0 (an allocation, in
// simdev) before it answers; simdev's context hook counts it.
struct ContextAtDiscovery : Wrap<ContextAtDiscovery, SimRuntime> {
  int device_count() {
    int n = inner().device_count();
    if (n > 0) inner().free(0, inner().malloc(0, 256));
    return n;
  }
  int contexts_created() const { return inner().contexts_created(); }
};

// properties() claims more than the device has.
struct WrongProperties : Wrap<WrongProperties, SimRuntime> {
  DeviceProperties properties(device_index device) {
    DeviceProperties p = inner().properties(device);
    p.max_allocation = p.total_memory * 2;
    return p;
  }
};

// Leaves event_timing at its default (true for a runtime with
// event_elapsed_time), but the device has no timer: elapsed_time fails.
struct UntimedEvents : Wrap<UntimedEvents, SimRuntime> {
  DeviceProperties properties(device_index device) {
    DeviceProperties p = inner().properties(device);
    p.event_timing = DeviceProperties{}.event_timing;
    return p;
  }
  float event_elapsed_time(device_index, EventHandle, EventHandle) {
    driver_error(1, "event_elapsed_time", "no timer on this device");
  }
};

// A synchronous copy drops its last byte.
struct TailDroppingCopy : Wrap<TailDroppingCopy, SimRuntime> {
  void memcpy(device_index device, void* dst, const void* src, std::size_t bytes, CopyKind kind) {
    inner().memcpy(device, dst, src, bytes > 1 ? bytes - 1 : bytes, kind);
  }
};

// A wait released early: stream_wait_event does not wait.
struct WaitIgnored : Wrap<WaitIgnored, SimRuntime> {
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}
};

// Recording an event again does not replace its first record.
struct FirstRecordKept : Wrap<FirstRecordKept, SimRuntime> {
  std::mutex m;
  std::set<std::uintptr_t> recorded;
  void event_record(device_index device, EventHandle event, StreamHandle stream) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (!recorded.insert(event.value).second) return;
    }
    inner().event_record(device, event, stream);
  }
};

// Waits resolved late: stream_wait_event is applied only when the waiting
// stream next gets work, against the record the event holds then, so
// recording the event again releases a wait made before.
struct LateWait : Wrap<LateWait, SimRuntime> {
  std::mutex m;
  std::map<std::pair<device_index, std::uintptr_t>, std::vector<EventHandle>> pending;
  void stream_wait_event(device_index device, StreamHandle stream, EventHandle event) {
    std::lock_guard<std::mutex> lock(m);
    pending[{device, stream.value}].push_back(event);
  }
  void apply(device_index device, StreamHandle stream) {
    std::vector<EventHandle> waits;
    {
      std::lock_guard<std::mutex> lock(m);
      auto it = pending.find({device, stream.value});
      if (it == pending.end()) return;
      waits.swap(it->second);
      pending.erase(it);
    }
    for (EventHandle e : waits) inner().stream_wait_event(device, stream, e);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    apply(d, s);
    inner().memcpy_async(d, dst, src, n, k, s, pinned);
  }
  void memset_async(device_index d, void* p, int value, std::size_t n, StreamHandle s) {
    apply(d, s);
    inner().memset_async(d, p, value, n, s);
  }
  void event_record(device_index d, EventHandle e, StreamHandle s) {
    apply(d, s);
    inner().event_record(d, e, s);
  }
  void stream_synchronize(device_index d, StreamHandle s) {
    apply(d, s);
    inner().stream_synchronize(d, s);
  }
};

// A wait across devices is a no-op.
struct PeerWaitIgnored : Wrap<PeerWaitIgnored, SimRuntime> {
  void stream_wait_peer_event(device_index, StreamHandle, device_index, EventHandle) {}
};

// stream_synchronize returns before the work is done: the SDK then frees
// memory that queued work still uses.
struct EarlySynchronize : Wrap<EarlySynchronize, SimRuntime> {
  void stream_synchronize(device_index, StreamHandle) {}
  void device_synchronize(device_index) {}
};

// Discovery starts a driver thread (as PoCL's does), yet the runtime claims
// fork-safe discovery.
struct ThreadAtDiscovery : Wrap<ThreadAtDiscovery, SimRuntime> {
  ThreadAtDiscovery() : Wrap(config()) {}
  static simdev::Config config() {
    simdev::Config c = simdev::Config::from_environment(accelkit::Environment::process());
    c.discovery_thread = true;
    return c;
  }
};

// A failure of queued work is lost: every call that would report it
// swallows the DriverError.
struct LostAsyncError : Wrap<LostAsyncError, SimRuntime> {
  template <class F>
  static void quietly(F&& f) {
    try {
      f();
    } catch (const accelkit::DriverError&) {
    }
  }
  void inject_fault(const std::string& member, int nth, bool async) {
    inner().inject_fault(member, nth, async);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    quietly([&] { inner().memcpy_async(d, dst, src, n, k, s, pinned); });
  }
  void memset_async(device_index d, void* p, int value, std::size_t n, StreamHandle s) {
    quietly([&] { inner().memset_async(d, p, value, n, s); });
  }
  void stream_synchronize(device_index d, StreamHandle s) {
    quietly([&] { inner().stream_synchronize(d, s); });
  }
  bool stream_query(device_index d, StreamHandle s) {
    bool idle = true;
    quietly([&] { idle = inner().stream_query(d, s); });
    return idle;
  }
  void event_record(device_index d, EventHandle e, StreamHandle s) {
    quietly([&] { inner().event_record(d, e, s); });
  }
  void event_synchronize(device_index d, EventHandle e) {
    quietly([&] { inner().event_synchronize(d, e); });
  }
  bool event_query(device_index d, EventHandle e) {
    bool done = true;
    quietly([&] { done = inner().event_query(d, e); });
    return done;
  }
  void device_synchronize(device_index d) {
    quietly([&] { inner().device_synchronize(d); });
  }
};

// simdev whose failures of queued work lose the device
// (SIMDEV_STICKY_FAULTS=1 whatever the environment says).
simdev::Config sticky_config() {
  simdev::Config c = simdev::Config::from_environment(accelkit::Environment::process());
  c.sticky_faults = true;
  return c;
}

// Loses its device correctly (Note [simdev sticky faults]): the errors
// checks pass on it through their loss branch.
struct StickyFaults : Wrap<StickyFaults, SimRuntime> {
  StickyFaults() : Wrap(sticky_config()) {}
  void inject_fault(const std::string& member, int nth, bool async) {
    inner().inject_fault(member, nth, async);
  }
};

// Reports every failure of queued work as a lost device, and then runs later
// work as if nothing happened: it claims a loss it does not have.
struct ClaimsLoss : Wrap<ClaimsLoss, SimRuntime> {
  template <class F>
  static decltype(auto) as_loss(F&& f) {
    try {
      return f();
    } catch (const accelkit::DeviceLostError&) {
      throw;
    } catch (const accelkit::DriverError& e) {
      device_lost(e.code(), e.call(), e.driver_message());
    }
  }
  void inject_fault(const std::string& member, int nth, bool async) {
    inner().inject_fault(member, nth, async);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    as_loss([&] { inner().memcpy_async(d, dst, src, n, k, s, pinned); });
  }
  void memset_async(device_index d, void* p, int value, std::size_t n, StreamHandle s) {
    as_loss([&] { inner().memset_async(d, p, value, n, s); });
  }
  void stream_synchronize(device_index d, StreamHandle s) {
    as_loss([&] { inner().stream_synchronize(d, s); });
  }
  bool stream_query(device_index d, StreamHandle s) {
    return as_loss([&] { return inner().stream_query(d, s); });
  }
  void event_record(device_index d, EventHandle e, StreamHandle s) {
    as_loss([&] { inner().event_record(d, e, s); });
  }
  void event_synchronize(device_index d, EventHandle e) {
    as_loss([&] { inner().event_synchronize(d, e); });
  }
  bool event_query(device_index d, EventHandle e) {
    return as_loss([&] { return inner().event_query(d, e); });
  }
  void device_synchronize(device_index d) {
    as_loss([&] { inner().device_synchronize(d); });
  }
};

// Its device stops working at the first failure of queued work, which it
// reports as a plain DriverError: later copies are dropped without an error,
// as if the device had recovered.
struct LossAsPlainError : Wrap<LossAsPlainError, SimRuntime> {
  std::atomic<bool> failed{false};
  template <class F>
  void noting(F&& f) {
    try {
      f();
    } catch (const accelkit::DriverError&) {
      failed = true;
      throw;
    }
  }
  void inject_fault(const std::string& member, int nth, bool async) {
    inner().inject_fault(member, nth, async);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    if (!failed) noting([&] { inner().memcpy_async(d, dst, src, n, k, s, pinned); });
  }
  void memset_async(device_index d, void* p, int value, std::size_t n, StreamHandle s) {
    if (!failed) noting([&] { inner().memset_async(d, p, value, n, s); });
  }
  void stream_synchronize(device_index d, StreamHandle s) {
    noting([&] { inner().stream_synchronize(d, s); });
  }
  bool stream_query(device_index d, StreamHandle s) {
    bool idle = true;
    noting([&] { idle = inner().stream_query(d, s); });
    return idle;
  }
  void event_record(device_index d, EventHandle e, StreamHandle s) {
    noting([&] { inner().event_record(d, e, s); });
  }
  void event_synchronize(device_index d, EventHandle e) {
    noting([&] { inner().event_synchronize(d, e); });
  }
  bool event_query(device_index d, EventHandle e) {
    bool done = true;
    noting([&] { done = inner().event_query(d, e); });
    return done;
  }
  void device_synchronize(device_index d) {
    noting([&] { inner().device_synchronize(d); });
  }
};

// Reports host_access mapped, but its host_map fails: the check fails
// naming the failure, and frees the memory it allocated for the test.
struct FailingHostMap : Wrap<FailingHostMap, SimRuntime> {
  static inline std::atomic<int> live{0};
  DeviceProperties properties(device_index device) {
    DeviceProperties p = inner().properties(device);
    p.host_access = accelkit::HostAccessLevel::mapped;
    p.host_visible_memory = false;
    return p;
  }
  void* malloc(device_index device, std::size_t bytes) {
    void* p = inner().malloc(device, bytes);
    if (p != nullptr) ++live;
    return p;
  }
  void free(device_index device, void* p) {
    inner().free(device, p);
    --live;
  }
  void* host_map(device_index, void*, std::size_t) {
    driver_error(5, "host_map", "refused (test)");
  }
  void host_unmap(device_index, void*, std::size_t) {}
};

// Reports host_access mapped, and its host_map returns a buffer of its own
// rather than the memory (simdev's direct memory, which it leaves alone): the
// host reads and writes other bytes than the device's.
struct MapsElsewhere : Wrap<MapsElsewhere, SimRuntime> {
  std::mutex m;
  std::map<std::pair<void*, std::size_t>, std::vector<char>> buffers;
  DeviceProperties properties(device_index device) {
    DeviceProperties p = inner().properties(device);
    p.host_access = accelkit::HostAccessLevel::mapped;
    p.host_visible_memory = false;
    return p;
  }
  void* host_map(device_index, void* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m);
    std::vector<char>& b = buffers[{ptr, bytes}];
    b.assign(bytes, 0);
    return b.data();
  }
  void host_unmap(device_index, void* ptr, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(m);
    buffers.erase({ptr, bytes});
  }
};

// Work queued on a capturing stream runs at once as well as being captured
// (on a side stream of its own, waited for), as a driver that executes
// while it records.
struct RunsWhileCapturing : Wrap<RunsWhileCapturing, SimRuntime> {
  std::mutex m;
  std::map<device_index, StreamHandle> side;
  StreamHandle side_stream(device_index d) {
    std::lock_guard<std::mutex> lock(m);
    auto it = side.find(d);
    if (it == side.end()) it = side.emplace(d, inner().stream_create(d, 0)).first;
    return it->second;
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    if (inner().stream_is_capturing(d, s)) {
      StreamHandle now = side_stream(d);
      inner().memcpy_async(d, dst, src, n, k, now, pinned);
      inner().stream_synchronize(d, now);
    }
    inner().memcpy_async(d, dst, src, n, k, s, pinned);
  }
  void memset_async(device_index d, void* p, int value, std::size_t n, StreamHandle s) {
    if (inner().stream_is_capturing(d, s)) {
      StreamHandle now = side_stream(d);
      inner().memset_async(d, p, value, n, now);
      inner().stream_synchronize(d, now);
    }
    inner().memset_async(d, p, value, n, s);
  }
};

// A device-to-device copy captured into a graph copies the source's bytes as
// they were at the capture: the graph replays a snapshot (taken into pinned
// memory), not the source.
struct StaleReplay : Wrap<StaleReplay, SimRuntime> {
  std::mutex m;
  std::vector<std::pair<device_index, void*>> snapshots;
  ~StaleReplay() {
    for (auto [d, p] : snapshots) inner().host_free(d, p);
  }
  void memcpy_async(device_index d, void* dst, const void* src, std::size_t n, CopyKind k,
                    StreamHandle s, bool pinned) {
    if (k != CopyKind::device_to_device || !inner().stream_is_capturing(d, s))
      return inner().memcpy_async(d, dst, src, n, k, s, pinned);
    void* snapshot = inner().host_malloc(d, n);
    {
      std::lock_guard<std::mutex> lock(m);
      snapshots.emplace_back(d, snapshot);
    }
    inner().memcpy(d, snapshot, src, n, CopyKind::device_to_host);
    inner().memcpy_async(d, dst, snapshot, n, CopyKind::host_to_device, s, true);
  }
};

// vm_unmap returns without unmapping: the pages stay usable after it (and
// their memory stays mapped, so the runtime's later destroy is refused).
struct UnmapKeepsPages : Wrap<UnmapKeepsPages, SimRuntime> {
  void vm_unmap(device_index, void*, std::size_t) {}
};

// vm_map over mapped pages replaces the old mapping instead of refusing.
struct MapReplaces : Wrap<MapReplaces, SimRuntime> {
  std::mutex m;
  std::map<std::pair<device_index, char*>, std::size_t> pieces;  // (device, at) -> bytes
  void vm_map(device_index d, void* at, std::size_t n, accelkit::PhysicalHandle h) {
    char* c = static_cast<char*>(at);
    {
      std::lock_guard<std::mutex> lock(m);
      for (auto it = pieces.begin(); it != pieces.end();) {
        auto [dev, p] = it->first;
        if (dev == d && p < c + n && c < p + it->second) {
          inner().vm_unmap(d, p, it->second);
          it = pieces.erase(it);
        } else {
          ++it;
        }
      }
    }
    inner().vm_map(d, at, n, h);
    std::lock_guard<std::mutex> lock(m);
    pieces[{d, c}] = n;
  }
  void vm_unmap(device_index d, void* at, std::size_t n) {
    inner().vm_unmap(d, at, n);
    std::lock_guard<std::mutex> lock(m);
    for (auto it = pieces.lower_bound({d, static_cast<char*>(at)});
         it != pieces.end() && it->first.first == d && it->first.second < static_cast<char*>(at) + n;)
      it = pieces.erase(it);
  }
};

// The handle opens other memory: ipc_mem_export names a decoy allocation
// of the same size (zeros), made at the first export and freed with the
// memory exported.
struct WrongMemoryHandle : Wrap<WrongMemoryHandle, SimRuntime> {
  std::mutex m;
  std::map<std::pair<device_index, void*>, std::size_t> sizes;
  std::map<std::pair<device_index, void*>, void*> decoys;
  void* malloc(device_index d, std::size_t bytes) {
    void* p = inner().malloc(d, bytes);
    std::lock_guard<std::mutex> lock(m);
    if (p) sizes[{d, p}] = bytes;
    return p;
  }
  void free(device_index d, void* p) {
    void* decoy = nullptr;
    {
      std::lock_guard<std::mutex> lock(m);
      sizes.erase({d, p});
      auto it = decoys.find({d, p});
      if (it != decoys.end()) {
        decoy = it->second;
        decoys.erase(it);
      }
    }
    if (decoy) inner().free(d, decoy);
    inner().free(d, p);
  }
  accelkit::IpcMemHandle ipc_mem_export(device_index d, void* p) {
    std::lock_guard<std::mutex> lock(m);
    void*& decoy = decoys[{d, p}];
    if (decoy == nullptr) {
      std::size_t bytes = sizes.at({d, p});
      decoy = inner().malloc(d, bytes);
      std::vector<unsigned char> zeros(bytes, 0);
      inner().memcpy(d, decoy, zeros.data(), bytes, CopyKind::host_to_device);
    }
    return inner().ipc_mem_export(d, decoy);
  }
};

// ipc_mem_close writes zeros over the first 4 KiB of what it unmaps: the
// exporter's memory changes.
struct ZeroingClose : Wrap<ZeroingClose, SimRuntime> {
  void ipc_mem_close(device_index d, void* p) {
    std::vector<unsigned char> zeros(4096, 0);
    inner().memcpy(d, p, zeros.data(), zeros.size(), CopyKind::host_to_device);
    inner().ipc_mem_close(d, p);
  }
};

// ipc_event_open gives a new event of this process, never recorded: a
// wait on it does not wait for the exporter's work.
struct LocalIpcEvent : Wrap<LocalIpcEvent, SimRuntime> {
  EventHandle ipc_event_open(device_index d, const accelkit::IpcEventHandle&) {
    return inner().event_create(d, EventFlags::none);
  }
};

// A wait on an opened event is a no-op (its query is the exporter's).
struct IpcWaitIgnored : Wrap<IpcWaitIgnored, SimRuntime> {
  std::mutex m;
  std::set<std::pair<device_index, std::uintptr_t>> opened;
  EventHandle ipc_event_open(device_index d, const accelkit::IpcEventHandle& h) {
    EventHandle e = inner().ipc_event_open(d, h);
    std::lock_guard<std::mutex> lock(m);
    opened.insert({d, e.value});
    return e;
  }
  void stream_wait_event(device_index d, StreamHandle s, EventHandle e) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (opened.count({d, e.value})) return;
    }
    inner().stream_wait_event(d, s, e);
  }
};

// A handle opens in the process that exported it (the allocation itself),
// which CUDA refuses.
struct SameProcessOpen : Wrap<SameProcessOpen, SimRuntime> {
  std::mutex m;
  std::map<std::pair<device_index, void*>, accelkit::IpcMemHandle> exported;
  std::set<std::pair<device_index, void*>> opened_here;
  accelkit::IpcMemHandle ipc_mem_export(device_index d, void* p) {
    accelkit::IpcMemHandle h = inner().ipc_mem_export(d, p);
    std::lock_guard<std::mutex> lock(m);
    exported[{d, p}] = h;
    return h;
  }
  void* ipc_mem_open(device_index d, const accelkit::IpcMemHandle& h) {
    {
      std::lock_guard<std::mutex> lock(m);
      for (auto& [key, handle] : exported)
        if (key.first == d && handle == h) {
          opened_here.insert(key);
          return key.second;
        }
    }
    return inner().ipc_mem_open(d, h);
  }
  void ipc_mem_close(device_index d, void* p) {
    {
      std::lock_guard<std::mutex> lock(m);
      if (opened_here.erase({d, p})) return;
    }
    inner().ipc_mem_close(d, p);
  }
};

}  // namespace

TEST_CASE("conformance kit: graph checks fail a runtime that runs captured work, and one that "
          "replays stale data") {
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(RunsWhileCapturing, graphs,
                                              capture_does_not_execute),
                "ran during the capture");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(StaleReplay, graphs,
                                              replay_reads_memory_at_run_time),
                "stale data");
  // Each breaks one rule: the other's check passes on it.
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(RunsWhileCapturing, graphs,
                                      replay_reads_memory_at_run_time)
            .status == CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(StaleReplay, graphs, capture_does_not_execute).status ==
        CheckStatus::pass);
}

TEST_CASE("conformance kit: each broken rule is reported, with the rule named") {
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(Misaligned, memory, malloc_aligned), "not aligned");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(EventNeverRecordedBusy, events,
                                              event_query_before_record),
                "never recorded");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(BlockingQuery, streams, stream_query_never_blocks),
                "waited for the work");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(BusyAfterEvent, streams, stream_idle_after_event),
                "1000 times in 1000");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(FiltersVisibility, discovery,
                                              visible_devices_select),
                "leave the variable to the SDK");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(ContextAtDiscovery, discovery,
                                              discovery_starts_no_context),
                "made 1 device context(s)");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(WrongProperties, properties, properties_valid),
                "max_allocation");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(UntimedEvents, properties, event_timing_matches),
                "no timer");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(TailDroppingCopy, copies, copies_every_direction),
                "came back different");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(WaitIgnored, streams, cross_stream_wait),
                "stream_wait_event");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(FirstRecordKept, events, event_rerecord_replaces),
                "recorded again");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LateWait, events, rerecord_keeps_earlier_waits),
                "recorded again on an idle stream");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(PeerWaitIgnored, events, cross_device_wait),
                "awaited work was still running");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(EarlySynchronize, ordering,
                                              no_free_under_queued_work),
                "queued work");  // the observer's words, or simdev's own refusal
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LostAsyncError, errors, error_at_synchronize),
                "surfaced 0 time(s)");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LostAsyncError, errors, error_at_event),
                "surfaced 0 time(s)");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(ThreadAtDiscovery, discovery, fork_after_discovery),
                "could not use device 0");
}

TEST_CASE("conformance kit: a check with nothing to check skips, saying why") {
  // simdev in its default mode: direct host access, no device mapped.
  CheckResult r = ACCELKIT_CONFORMANCE_EVALUATE(SimRuntime, properties,
                                                host_mapped_memory_is_visible);
  INFO(r.message);
  CHECK(r.status == CheckStatus::skip);
  CHECK(contains(r.message, "no device reports host_access mapped"));
}

TEST_CASE("conformance kit: a throwing host_map fails the check and leaks nothing") {
  CheckResult r = ACCELKIT_CONFORMANCE_EVALUATE(FailingHostMap, properties,
                                                host_mapped_memory_is_visible);
  INFO(r.message);
  CHECK(r.status == CheckStatus::fail);
  CHECK(contains(r.message, "refused (test)"));
  CHECK(FailingHostMap::live.load() == 0);
}

TEST_CASE("conformance kit: a host_map that returns another address than the memory's fails "
          "the check") {
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(MapsElsewhere, properties,
                                              host_mapped_memory_is_visible),
                "at the address host_map returned");
}

TEST_CASE("conformance kit: virtual memory checks fail a runtime whose unmap leaves the pages "
          "usable, and one that maps over mapped pages") {
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(UnmapKeepsPages, virtual_memory,
                                              unmap_then_use_faults),
                "ran without an error");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(MapReplaces, virtual_memory,
                                              map_refused_outside_or_over),
                "over a page mapped already was not refused");
  // Each breaks one rule: the other checks pass on it.
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(MapReplaces, virtual_memory, unmap_then_use_faults)
            .status == CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(MapReplaces, virtual_memory, round_trip).status ==
        CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(UnmapKeepsPages, virtual_memory, capacity_counted)
            .status == CheckStatus::pass);
}

TEST_CASE("conformance kit: interprocess checks fail a runtime whose handle opens other memory, "
          "one whose close changes the exporter's memory, one whose opened event does not "
          "wait, and one that opens its own handles") {
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(WrongMemoryHandle, interprocess, memory_round_trip),
                "read other bytes than the exporting process wrote");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(WrongMemoryHandle, interprocess,
                                              handle_names_whole_allocation),
                "the handle must name the whole allocation");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(ZeroingClose, interprocess,
                                              close_keeps_exporter_memory),
                "the exporter's bytes changed");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LocalIpcEvent, interprocess,
                                              event_orders_write_before_read),
                "event_query of the opened event answered complete");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(IpcWaitIgnored, interprocess,
                                              event_orders_write_before_read),
                "ran past the wait");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(SameProcessOpen, interprocess,
                                              open_in_exporting_process_refused),
                "must be refused with a DriverError");
  // Each breaks one rule: other checks pass on it.
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(WrongMemoryHandle, interprocess,
                                      open_in_exporting_process_refused)
            .status == CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(ZeroingClose, interprocess, memory_round_trip).status ==
        CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(LocalIpcEvent, interprocess, close_keeps_exporter_memory)
            .status == CheckStatus::pass);
  CHECK(ACCELKIT_CONFORMANCE_EVALUATE(SameProcessOpen, interprocess, memory_round_trip).status ==
        CheckStatus::pass);
}

TEST_CASE("conformance kit: errors checks pass a runtime that loses its device correctly, and "
          "fail one that reports a loss and then runs later work, and one that reports a loss as "
          "a plain error and then drops work silently") {
  for (CheckResult r : {ACCELKIT_CONFORMANCE_EVALUATE(StickyFaults, errors, error_at_synchronize),
                        ACCELKIT_CONFORMANCE_EVALUATE(StickyFaults, errors, error_at_query),
                        ACCELKIT_CONFORMANCE_EVALUATE(StickyFaults, errors, error_at_event)}) {
    INFO(r.name << ": " << r.message);
    CHECK(r.status == CheckStatus::pass);
  }
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(ClaimsLoss, errors, error_at_synchronize),
                "and then ran a memcpy on it without an error");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(ClaimsLoss, errors, error_at_event),
                "and then ran a memcpy on it without an error");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LossAsPlainError, errors, error_at_synchronize),
                "after an asynchronous error, a copy came back wrong");
  expect_failed(ACCELKIT_CONFORMANCE_EVALUATE(LossAsPlainError, errors, error_at_query),
                "after an asynchronous error, a copy came back wrong");
}
