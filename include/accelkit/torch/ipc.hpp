// accelkit: device memory shared between processes (torch.multiprocessing
// queues and pipes): the producer's registry of sent storages, the
// consumer's opened segments, inter-process events, and the operators
// torch.ops.<name>.ipc_* that python/accelkit/_sharing.py and the device
// module's Event call.
//
// Note [Sharing device memory between processes]
// Problem: a storage sent to another process must arrive as a view of the
// same device memory, stay valid there while the receiver uses it, though
// the sender may drop its own reference at once, and show the sender's
// writes queued before the send. The runtime names only whole allocations
// (Note [Inter-process memory] in device/backend.hpp), and the caching
// allocator carves many storages out of one.
// Decision, as CUDA's torch.multiprocessing: the sender exports the whole
// segment that holds the storage (DeviceCachingAllocator::segment_of) and
// sends its handle with the storage's offset and size; the receiver opens a
// segment once per process (a cache keyed by the handle; closed when its
// last storage dies) and builds a storage that cannot be resized. The
// sender swaps the storage's DataPtr for one whose deleter hands the
// allocator's DataPtr to the registry (same pointer and context: Note
// [DataPtr context]), which frees it once every receiver has released it.
// The count across processes is a slot of a reference file the sender owns
// (support/ipc_refs.hpp): each send adds one pending open, and a receiver
// takes an OFD read lock on the slot's byte, through its own open of
// /proc/<pid>/fd/<fd>, before taking its open off the count; it unlocks
// when its last storage over the slot dies, and the kernel unlocks for a
// receiver that dies. The registry frees what was released at each send,
// at ipc_collect(), and where the allocator has no room (a reclaimer, run
// before the cache goes back to the driver). Ordering: at each send an
// event made with EventFlags::interprocess is recorded on the current
// stream of the storage's device and its handle sent; the receiver makes
// its current stream wait for it before it builds the storage. A runtime
// without the event members has the sender's stream synchronized instead.
// A receiver's storage, when it dies, first synchronizes its device (the
// receiver's work on it, on any stream, completes before the sender may
// reuse the memory), then unlocks. Memory opened after its sender exits is
// what the runtime makes of it (simdev keeps it until closed; CUDA leaves
// it undefined).
// A send that comes back to its sender gives a storage over the same
// memory (no handle is opened in the process that exported it).
// Limits: memory of expandable segments is refused (RuntimeError naming
// the setting): its pages are mapped into one reserved range, not one
// allocation; memory that is not the caching allocator's (received from
// another process, copy-on-write) is refused too (the receiver raises the
// reason: python/accelkit/_sharing.py). A send whose message is
// never received keeps the memory until the sender exits. A receiver that
// forks shares its lock with the child (one open file description), so the
// memory is kept until both released it; the child itself never unlocks
// (Note [DataPtr context]: a child forked after initialization leaves
// device memory alone). Opening needs the sender alive (RuntimeError naming
// its pid otherwise). Linux only (memfd, OFD locks, /proc).
#pragma once

#include <accelkit/detail/strings.hpp>
#include <accelkit/support/ipc_refs.hpp>
#include <accelkit/torch/common.hpp>
#include <accelkit/torch/device_allocator.hpp>
#include <accelkit/torch/errors.hpp>

#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <torch/library.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <unistd.h>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

namespace ipc_detail {

template <class Bytes>
std::string to_hex(const Bytes& b) {
  return ::accelkit::detail::to_hex(b.data(), b.size());
}
template <class Handle>
Handle from_hex(const std::string& s, const char* what) {
  Handle h;
  TORCH_CHECK_VALUE(s.size() == h.bytes.size() * 2, backend_name(), ": ", what, " handle of ",
                    s.size() / 2, " bytes, expected ", h.bytes.size());
  bool parsed = ::accelkit::detail::from_hex(s, h.bytes.data(), h.bytes.size());
  TORCH_CHECK_VALUE(parsed, backend_name(), ": malformed ", what, " handle '", s, "'");
  return h;
}

inline c10::Device device_of(device_index d) {
  return c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d));
}

}  // namespace ipc_detail

// What a send carries besides the tensor's own metadata (the operator
// ipc_share's result, ipc_open's arguments).
struct IpcShared {
  device_index device = 0;
  std::string handle;          // the segment's IpcMemHandle, hex
  std::size_t segment_size = 0;
  std::size_t offset = 0;      // of the storage in the segment
  std::size_t nbytes = 0;      // of the storage
  int pid = 0;                 // the sender, its reference file and slot
  int fd = 0;
  std::uint32_t slot = 0;
  std::string event;           // IpcEventHandle, hex; empty: the stream was synchronized
};

// The sender's side (Note [Sharing device memory between processes]).
class IpcSender {
 public:
  static IpcSender& get() {
    static IpcSender* const s = new IpcSender();  // deleters run during exit
    return *s;
  }

  IpcShared share(const c10::Storage& storage);
  // What this process sent, received back (a send to itself): a storage
  // over the same memory.
  at::Tensor reopen(const IpcShared& s);
  // A send to this process itself found its storage alive: its pending open.
  void take_back(int fd, std::uint32_t slot) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& f : files_)
      if (f->fd() == fd && f->pending(slot) > 0) f->take_back(slot);
  }
  // The storage of a sent entry died (its DataPtr's deleter).
  void storage_died(device_index d, void* p) noexcept;
  // Frees what every receiver released; the number of entries freed.
  std::size_t collect();
  // Without waiting for a lock held elsewhere (the allocator's reclaimer).
  void try_collect() noexcept;
  std::size_t sent() {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }
  std::size_t ref_files() {
    std::lock_guard<std::mutex> lock(mutex_);
    return files_.size();
  }

 private:
  struct Entry {
    device_index device = 0;
    void* ptr = nullptr;
    std::size_t nbytes = 0;
    char* base = nullptr;  // the segment
    std::size_t segment_size = 0;
    std::string handle;
    c10::DataPtr original;  // the allocator's
    int storages = 1;       // this process's live storages over it
    support::RefFile* file = nullptr;
    std::uint32_t slot = 0;
    std::vector<EventHandle> events;
  };
  // What is freed once the lock is dropped.
  struct Freed {
    std::vector<c10::DataPtr> memory;
    std::vector<std::pair<device_index, EventHandle>> events;
    ~Freed() {
      for (const auto& de : events)  // a lambda may not capture a binding in C++17
        reporting_failures([&] { backend().raw_event_destroy(de.first, de.second); });
      for (auto& m : memory) reporting_failures([&] { m.clear(); });
    }
  };

  bool released(const Entry& e) const {
    try {
      return e.file->released(e.slot);
    } catch (const Error& err) {
      report(Severity::error, backend_name(), err.message());
      return false;
    }
  }
  // Under the lock: moves a released entry's memory and events to `out`.
  void retire(std::map<std::pair<device_index, void*>, Entry>::iterator it, Freed& out) {
    Entry& e = it->second;
    out.memory.push_back(std::move(e.original));
    for (EventHandle ev : e.events) out.events.emplace_back(e.device, ev);
    e.file->free_slot(e.slot);
    entries_.erase(it);
  }
  void collect_locked(Freed& out, std::size_t& count) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      auto next = std::next(it);
      if (it->second.storages == 0 && released(it->second)) {
        retire(it, out);
        ++count;
      }
      it = next;
    }
    for (auto it = files_.begin(); it != files_.end();)
      it = (*it)->used() == 0 ? files_.erase(it) : std::next(it);
  }
  std::pair<support::RefFile*, std::uint32_t> acquire_slot() {
    for (auto& f : files_)
      if (std::optional<std::uint32_t> s = f->acquire()) return {f.get(), *s};
    files_.push_back(std::make_unique<support::RefFile>(backend_name()));
    return {files_.back().get(), *files_.back()->acquire()};
  }
  void attach_reclaimer(device_index d) {
    if (reclaiming_.size() <= static_cast<std::size_t>(d)) reclaiming_.resize(d + 1, false);
    if (reclaiming_[d]) return;
    backend().device_attach_reclaimer(d, [] { IpcSender::get().try_collect(); });
    reclaiming_[d] = true;
  }

  std::mutex mutex_;
  std::map<std::pair<device_index, void*>, Entry> entries_;
  std::vector<std::unique_ptr<support::RefFile>> files_;
  std::vector<bool> reclaiming_;
};

template <std::size_t D>
void free_sent(void* p) {
  if (p == nullptr || backend().in_bad_fork()) return;
  IpcSender::get().storage_died(static_cast<device_index>(D), p);
}
template <std::size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> make_sent_deleters(
    std::index_sequence<D...>) {
  return {{&free_sent<D>...}};
}
inline constexpr std::array<c10::DeleterFnPtr, kDeviceIndices> sent_deleters =
    make_sent_deleters(std::make_index_sequence<kDeviceIndices>{});

inline IpcShared IpcSender::share(const c10::Storage& storage) {
  BackendInterface& b = backend();
  c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
  device_index d = storage.device().index();
  void* p = impl->data_ptr().get();
  TORCH_CHECK(b.has_ipc_memory(), backend_name(), ": ", backend_name(),
              " has no inter-process memory handles");
  collect();
  IpcShared out;
  out.device = d;
  out.pid = static_cast<int>(::getpid());
  out.nbytes = storage.nbytes();
  std::vector<EventHandle> old_events;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    c10::DeleterFnPtr deleter = impl->data_ptr().get_deleter();
    auto key = std::make_pair(d, p);
    auto found = entries_.find(key);
    Entry* e = nullptr;
    if (deleter == sent_deleters[static_cast<std::size_t>(d)] && found != entries_.end()) {
      e = &found->second;  // sent before: one more pending open
      if (e->file->pending(e->slot) == 0) old_events.swap(e->events);  // every open happened
      e->file->add_pending(e->slot);
    } else {
      TORCH_CHECK(deleter == device_deleters[static_cast<std::size_t>(d)], backend_name(),
                  ": this storage (", p, " on ", storage.device(),
                  ") is not memory of the device's caching allocator (memory received from "
                  "another process, or copy-on-write), so it cannot be shared; clone() it first");
      SegmentSpan seg = translated([&] { return b.device_segment_of(d, p); });
      TORCH_CHECK(seg.base != nullptr, backend_name(), ": the storage at ", p, " on ",
                  storage.device(), " is in no segment of the caching allocator");
      TORCH_CHECK(!seg.expandable, backend_name(), ": the storage at ", p, " on ",
                  storage.device(),
                  " is in an expandable segment, which cannot be shared between processes; "
                  "share memory allocated with expandable_segments:False (PYTORCH_ALLOC_CONF)");
      IpcMemHandle h = translated([&] { return b.ipc_mem_export(d, seg.base); });
      attach_reclaimer(d);
      auto [file, slot] = translated([&] { return acquire_slot(); });
      Entry entry;
      entry.device = d;
      entry.ptr = p;
      entry.nbytes = storage.nbytes();
      entry.base = seg.base;
      entry.segment_size = seg.size;
      entry.handle = ipc_detail::to_hex(h.bytes);
      entry.file = file;
      entry.slot = slot;
      entry.original = impl->set_data_ptr(
          c10::DataPtr(p, p, sent_deleters[static_cast<std::size_t>(d)], storage.device()));
      e = &entries_.emplace(key, std::move(entry)).first->second;
    }
    out.handle = e->handle;
    out.segment_size = e->segment_size;
    out.offset = static_cast<std::size_t>(static_cast<char*>(p) - e->base);
    out.fd = e->file->fd();
    out.slot = e->slot;
    if (b.has_ipc_events()) {
      try {
        translated([&] {
          EventHandle ev = b.raw_event_create(d, EventFlags::interprocess);
          try {
            b.raw_event_record(d, ev, b.current_handle(d));
            out.event = ipc_detail::to_hex(b.ipc_event_export(d, ev).bytes);
          } catch (...) {
            b.raw_event_destroy(d, ev);
            throw;
          }
          e->events.push_back(ev);
        });
      } catch (...) {
        e->file->take_back(e->slot);
        throw;
      }
    }
  }
  for (EventHandle ev : old_events)
    reporting_failures([&] { b.raw_event_destroy(d, ev); });
  if (!b.has_ipc_events()) translated([&] { b.stream_synchronize(d, b.current_handle(d)); });
  return out;
}

// A uint8 tensor over `nbytes` at `p` of device `d`, whose storage keeps its
// size, freed through `deleter`.
inline at::Tensor ipc_bytes(device_index d, char* p, std::size_t nbytes,
                            c10::DeleterFnPtr deleter) {
  c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes,
                       c10::DataPtr(p, p, deleter, ipc_detail::device_of(d)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  at::Tensor t = at::detail::make_tensor<c10::TensorImpl>(
      std::move(storage), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      caffe2::TypeMeta::Make<std::uint8_t>());
  t.unsafeGetTensorImpl()->set_sizes_contiguous({static_cast<std::int64_t>(nbytes)});
  return t;
}

inline at::Tensor IpcSender::reopen(const IpcShared& s) {
  char* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [key, e] : entries_) {
      if (e.device != s.device || e.handle != s.handle ||
          static_cast<std::size_t>(static_cast<char*>(e.ptr) - e.base) != s.offset)
        continue;
      ++e.storages;
      e.file->take_back(e.slot);
      p = static_cast<char*>(e.ptr);
      break;
    }
  }
  TORCH_CHECK(p != nullptr, backend_name(), ": this process sent the storage of ", s.nbytes,
              " bytes at offset ", s.offset, " of a segment of ", backend_name(), ":", s.device,
              " to itself, and no longer holds it");
  return ipc_bytes(s.device, p, s.nbytes, sent_deleters[static_cast<std::size_t>(s.device)]);
}

inline void IpcSender::storage_died(device_index d, void* p) noexcept {
  Freed freed;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = entries_.find(std::make_pair(d, p));
    if (it == entries_.end()) {
      report(Severity::error, backend_name(),
             fmt::format("a shared storage at {} on {}:{} died, but none was sent from there; "
                         "its memory is left alone",
                         p, backend_name(), d));
      return;
    }
    if (--it->second.storages == 0 && released(it->second))
      retire(it, freed);  // else kept until collected
  } catch (...) {
    report(Severity::error, backend_name(), "a shared storage's release failed");
  }
}

inline std::size_t IpcSender::collect() {
  Freed freed;
  std::size_t count = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  collect_locked(freed, count);
  return count;
}

inline void IpcSender::try_collect() noexcept {
  Freed freed;  // destroyed after the lock is released
  try {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) return;
    std::size_t count = 0;
    collect_locked(freed, count);
  } catch (...) {
  }
}

// The receiver's side (Note [Sharing device memory between processes]).
class IpcReceiver {
 public:
  static IpcReceiver& get() {
    static IpcReceiver* const r = new IpcReceiver();  // deleters run during exit
    return *r;
  }

  at::Tensor open(const IpcShared& s);
  // A sent storage this process already holds was sent again: waits for
  // its event and takes its pending open.
  void take_pending(const IpcShared& s);
  void storage_died(device_index d, void* p) noexcept;

  std::size_t opened() {
    std::lock_guard<std::mutex> lock(mutex_);
    return segments_.size();
  }
  std::size_t ref_files() {
    std::lock_guard<std::mutex> lock(mutex_);
    return files_.size();
  }

 private:
  struct Segment {
    device_index device = 0;
    void* base = nullptr;
    int users = 0;
  };
  struct Received {
    std::string segment;  // key of segments_
    std::pair<int, int> file;
    std::uint32_t slot = 0;
    int count = 0;  // storages over this pointer
  };

  // A failure to open what `s` names: the sender's exit, said as such, or `e`.
  [[noreturn]] static void sender_gone(const IpcShared& s, const Error& e) {
    if (support::detail_refs::process_alive(s.pid)) rethrow(e);
    TORCH_CHECK(false, backend_name(), ": the process that shared this memory (pid ", s.pid,
                ") has exited; its memory cannot be opened (", e.message(), ")");
  }
  // The current stream of the storage's device waits for the sender's
  // event (Note [Sharing device memory between processes]).
  static void wait_for_sender(const IpcShared& s) {
    if (s.event.empty()) return;
    BackendInterface& b = backend();
    device_index d = s.device;
    IpcEventHandle eh = ipc_detail::from_hex<IpcEventHandle>(s.event, "event");
    try {
      EventHandle ev = b.ipc_event_open(d, eh);
      try {
        b.raw_stream_wait_event(d, b.current_handle(d), ev);
      } catch (...) {
        reporting_failures([&] { b.raw_event_destroy(d, ev); });
        throw;
      }
      b.raw_event_destroy(d, ev);
    } catch (const Error& e) {
      sender_gone(s, e);
    }
  }

  support::RefFileView& view(int pid, int fd) {
    auto key = std::make_pair(pid, fd);
    auto it = files_.find(key);
    if (it == files_.end())
      it = files_.emplace(key, std::make_unique<support::RefFileView>(backend_name(), pid, fd))
               .first;
    return *it->second;
  }
  void drop_hold(std::pair<int, int> key, std::uint32_t slot) {
    auto it = files_.find(key);
    if (it == files_.end()) return;
    it->second->drop(slot);
    if (it->second->idle()) files_.erase(it);
  }

  std::mutex mutex_;
  std::map<std::string, Segment> segments_;
  std::map<std::pair<int, int>, std::unique_ptr<support::RefFileView>> files_;
  std::map<void*, Received> received_;
};

template <std::size_t D>
void free_received(void* p) {
  if (p == nullptr || backend().in_bad_fork()) return;
  IpcReceiver::get().storage_died(static_cast<device_index>(D), p);
}
template <std::size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> make_received_deleters(
    std::index_sequence<D...>) {
  return {{&free_received<D>...}};
}
inline constexpr std::array<c10::DeleterFnPtr, kDeviceIndices> received_deleters =
    make_received_deleters(std::make_index_sequence<kDeviceIndices>{});

// Whether a DataPtr is of memory received from another process.
inline bool is_received(const c10::DataPtr& p) {
  return p.device().type() == kDeviceType && p.device().index() >= 0 &&
         p.get_deleter() == received_deleters[static_cast<std::size_t>(p.device().index())];
}

inline at::Tensor IpcReceiver::open(const IpcShared& s) {
  BackendInterface& b = backend();
  device_index d = s.device;
  TORCH_CHECK(b.has_ipc_memory(), backend_name(), ": ", backend_name(),
              " has no inter-process memory handles");
  TORCH_CHECK_VALUE(s.offset <= s.segment_size && s.nbytes <= s.segment_size - s.offset,
                    backend_name(), ": a shared storage of ", s.nbytes, " bytes at offset ",
                    s.offset, " does not fit its segment of ", s.segment_size, " bytes");
  IpcMemHandle mem = ipc_detail::from_hex<IpcMemHandle>(s.handle, "memory");
  if (s.pid == static_cast<int>(::getpid())) return IpcSender::get().reopen(s);
  std::string key = std::to_string(d) + ":" + s.handle;
  auto file = std::make_pair(s.pid, s.fd);
  // The hold first: whatever fails below, the sender's pending open is taken.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    translated([&] { view(s.pid, s.fd).hold(s.slot); });
  }
  char* p = nullptr;
  try {
    wait_for_sender(s);
    std::lock_guard<std::mutex> lock(mutex_);
    auto seg = segments_.find(key);
    if (seg == segments_.end()) {
      void* base = nullptr;
      try {
        base = b.ipc_mem_open(d, mem);
      } catch (const Error& e) {
        sender_gone(s, e);
      }
      seg = segments_.emplace(key, Segment{d, base, 0}).first;
    }
    p = static_cast<char*>(seg->second.base) + s.offset;
    Received& r = received_[p];
    if (r.count == 0) {
      r.segment = key;
      r.file = file;
      r.slot = s.slot;
      ++seg->second.users;
    } else {
      // The same memory is already held here (a storage that died and was
      // sent again while another lived): one hold of the slot suffices.
      drop_hold(file, s.slot);
    }
    ++r.count;
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    reporting_failures([&] { drop_hold(file, s.slot); });
    throw;
  }
  return ipc_bytes(d, p, s.nbytes, received_deleters[static_cast<std::size_t>(d)]);
}

inline void IpcReceiver::take_pending(const IpcShared& s) {
  if (s.pid == static_cast<int>(::getpid())) return IpcSender::get().take_back(s.fd, s.slot);
  try {
    wait_for_sender(s);
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = files_.find(std::make_pair(s.pid, s.fd));
    if (it != files_.end()) reporting_failures([&] { it->second->take_pending(s.slot); });
    throw;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  translated([&] {
    auto it = files_.find(std::make_pair(s.pid, s.fd));
    if (it != files_.end()) return it->second->take_pending(s.slot);
    support::RefFileView(backend_name(), s.pid, s.fd).take_pending(s.slot);
  });
}

inline void IpcReceiver::storage_died(device_index d, void* p) noexcept {
  // This process's work on the memory completes before the sender may
  // reuse it.
  reporting_failures([&] { backend().device_synchronize(d); });
  reporting_failures([&] {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = received_.find(p);
    if (it == received_.end()) {
      report(Severity::error, backend_name(),
             fmt::format("memory received from another process at {} on {}:{} was released, "
                         "but none was received there; left alone",
                         p, backend_name(), d));
      return;
    }
    Received& r = it->second;
    if (--r.count > 0) return;
    // A host map of it is ended before its segment may close (Note [Map scopes]).
    reporting_failures([&] { backend().maps_forget(d, p); });
    auto seg = segments_.find(r.segment);
    // The segment is closed before the slot is unlocked: the sender may then
    // free the memory, and its handle may name new memory.
    if (seg != segments_.end() && --seg->second.users == 0) {
      Segment closing = seg->second;
      segments_.erase(seg);
      reporting_failures([&] { backend().ipc_mem_close(closing.device, closing.base); });
    }
    auto file = r.file;
    std::uint32_t slot = r.slot;
    received_.erase(it);
    drop_hold(file, slot);
  });
}

// Events made with interprocess=True (torch.<name>.Event), and those
// opened from another process's handle (Event.from_ipc_handle), by id.
class IpcEvents {
 public:
  static IpcEvents& get() {
    static IpcEvents* const e = new IpcEvents();
    return *e;
  }
  std::int64_t create(device_index d) {
    EventHandle h = translated([&] { return backend().raw_event_create(d, EventFlags::interprocess); });
    return add(d, h, false);
  }
  std::int64_t open(device_index d, const IpcEventHandle& handle) {
    EventHandle h = translated([&] { return backend().ipc_event_open(d, handle); });
    return add(d, h, true);
  }
  void record(std::int64_t id, const Stream& s) {
    Item it = find(id);
    TORCH_CHECK(!it.opened, backend_name(),
                ": an event opened from another process's handle cannot be recorded here");
    TORCH_CHECK_VALUE(s.device == it.device, backend_name(), ": an event of ", backend_name(),
                      ":", it.device, " cannot be recorded on a stream of ", backend_name(), ":",
                      s.device);
    translated([&] { backend().raw_event_record(it.device, it.handle, backend().handle(s)); });
  }
  void wait(std::int64_t id, const Stream& s) {
    Item it = find(id);
    TORCH_CHECK_VALUE(s.device == it.device, backend_name(), ": a stream of ", backend_name(), ":",
                      s.device, " cannot wait for an inter-process event of ", backend_name(),
                      ":", it.device);
    translated([&] { backend().raw_stream_wait_event(it.device, backend().handle(s), it.handle); });
  }
  bool query(std::int64_t id) {
    Item it = find(id);
    return translated([&] { return backend().raw_event_query(it.device, it.handle); });
  }
  void synchronize(std::int64_t id) {
    Item it = find(id);
    translated([&] { backend().raw_event_synchronize(it.device, it.handle); });
  }
  std::string handle(std::int64_t id) {
    Item it = find(id);
    TORCH_CHECK(!it.opened, backend_name(),
                ": an event opened from another process's handle cannot be exported again");
    return translated(
        [&] { return ipc_detail::to_hex(backend().ipc_event_export(it.device, it.handle).bytes); });
  }
  std::int64_t device(std::int64_t id) { return find(id).device; }
  void destroy(std::int64_t id) {
    Item it;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto found = items_.find(id);
      if (found == items_.end()) return;
      it = found->second;
      items_.erase(found);
    }
    if (backend().in_bad_fork()) return;
    reporting_failures([&] { backend().raw_event_destroy(it.device, it.handle); });
  }

 private:
  struct Item {
    device_index device = 0;
    EventHandle handle{};
    bool opened = false;
  };
  std::int64_t add(device_index d, EventHandle h, bool opened) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::int64_t id = next_++;
    items_[id] = Item{d, h, opened};
    return id;
  }
  Item find(std::int64_t id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = items_.find(id);
    TORCH_CHECK_VALUE(it != items_.end(), backend_name(), ": no inter-process event ", id);
    return it->second;
  }
  std::mutex mutex_;
  std::map<std::int64_t, Item> items_;
  std::int64_t next_ = 1;
};

// torch.ops.<name>.ipc_*: the operators of python/accelkit/_sharing.py and
// the device module's Event (interprocess=True), ipc_collect and _ipc_state.
inline void register_ipc_ops(torch::Library& lib) {
  auto dev = [](int64_t d) {
    TORCH_CHECK_INDEX(d >= 0 && d < backend().device_count(), backend_name(),
                      ": invalid device index ", d);
    return static_cast<device_index>(d);
  };
  lib.def("ipc_has_memory() -> bool", [] { return backend().has_ipc_memory(); });
  lib.def("ipc_has_events() -> bool", [] { return backend().has_ipc_events(); });
  // `storage`: a uint8 tensor over the whole storage.
  lib.def("ipc_share(Tensor storage) -> (int, str, int, int, int, int, int, int, str)",
          [](const at::Tensor& t) {
            IpcShared s = IpcSender::get().share(t.storage());
            return std::make_tuple(static_cast<int64_t>(s.device), s.handle,
                                   static_cast<int64_t>(s.segment_size),
                                   static_cast<int64_t>(s.offset), static_cast<int64_t>(s.nbytes),
                                   static_cast<int64_t>(s.pid), static_cast<int64_t>(s.fd),
                                   static_cast<int64_t>(s.slot), s.event);
          });
  // What ipc_share returned, as the receiver's arguments.
  auto shared = [dev](int64_t d, std::string handle, int64_t segment_size, int64_t offset,
                      int64_t nbytes, int64_t pid, int64_t fd, int64_t slot, std::string event) {
    TORCH_CHECK_VALUE(segment_size >= 0 && offset >= 0 && nbytes >= 0 && pid > 0 && fd >= 0 &&
                          slot >= 0 && slot < support::kRefSlots,
                      backend_name(), ": malformed shared storage (segment ", segment_size,
                      " bytes, offset ", offset, ", ", nbytes, " bytes, pid ", pid, ", fd ", fd,
                      ", slot ", slot, ")");
    IpcShared s;
    s.device = dev(d);
    s.handle = std::move(handle);
    s.segment_size = static_cast<std::size_t>(segment_size);
    s.offset = static_cast<std::size_t>(offset);
    s.nbytes = static_cast<std::size_t>(nbytes);
    s.pid = static_cast<int>(pid);
    s.fd = static_cast<int>(fd);
    s.slot = static_cast<std::uint32_t>(slot);
    s.event = std::move(event);
    return s;
  };
  lib.def("ipc_open(int device, str handle, int segment_size, int offset, int nbytes, int pid, "
          "int fd, int slot, str event) -> Tensor",
          [shared](int64_t d, std::string handle, int64_t segment_size, int64_t offset,
                   int64_t nbytes, int64_t pid, int64_t fd, int64_t slot, std::string event) {
            return IpcReceiver::get().open(shared(d, std::move(handle), segment_size, offset,
                                                  nbytes, pid, fd, slot, std::move(event)));
          });
  lib.def("ipc_take_pending(int device, str handle, int segment_size, int offset, int nbytes, "
          "int pid, int fd, int slot, str event) -> ()",
          [shared](int64_t d, std::string handle, int64_t segment_size, int64_t offset,
                   int64_t nbytes, int64_t pid, int64_t fd, int64_t slot, std::string event) {
            IpcReceiver::get().take_pending(shared(d, std::move(handle), segment_size, offset,
                                                   nbytes, pid, fd, slot, std::move(event)));
          });
  lib.def("ipc_collect() -> int",
          [] { return static_cast<int64_t>(IpcSender::get().collect()); });
  // [sent, opened, ref_files] (torch.<name>.memory._ipc_state).
  lib.def("ipc_state() -> int[]", [] {
    auto& s = IpcSender::get();
    auto& r = IpcReceiver::get();
    return std::vector<int64_t>{static_cast<int64_t>(s.sent()), static_cast<int64_t>(r.opened()),
                                static_cast<int64_t>(s.ref_files() + r.ref_files())};
  });
  lib.def("ipc_event_create(int device) -> int",
          [dev](int64_t d) { return IpcEvents::get().create(dev(d)); });
  lib.def("ipc_event_open(int device, str handle) -> int", [dev](int64_t d, std::string h) {
    return IpcEvents::get().open(dev(d), ipc_detail::from_hex<IpcEventHandle>(h, "event"));
  });
  lib.def("ipc_event_record(int event, Stream stream) -> ()",
          [](int64_t e, c10::Stream s) { IpcEvents::get().record(e, from_c10(s)); });
  lib.def("ipc_event_wait(int event, Stream stream) -> ()",
          [](int64_t e, c10::Stream s) { IpcEvents::get().wait(e, from_c10(s)); });
  lib.def("ipc_event_query(int event) -> bool",
          [](int64_t e) { return IpcEvents::get().query(e); });
  lib.def("ipc_event_synchronize(int event) -> ()",
          [](int64_t e) { IpcEvents::get().synchronize(e); });
  lib.def("ipc_event_handle(int event) -> str",
          [](int64_t e) { return IpcEvents::get().handle(e); });
  lib.def("ipc_event_device(int event) -> int",
          [](int64_t e) { return IpcEvents::get().device(e); });
  lib.def("ipc_event_destroy(int event) -> ()",
          [](int64_t e) { IpcEvents::get().destroy(e); });
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
