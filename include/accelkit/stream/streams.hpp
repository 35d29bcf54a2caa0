// accelkit: streams and events with the same semantics on every backend.
//
// Note [Stream pools]
// Problem: creating a driver stream costs a driver call and a handle, and
// PyTorch code expects torch.cuda's streams: a default stream per device,
// streams from a pool by priority, streams of its own, and streams a vendor
// made.
// Decision: as torch.cuda does, each device has a default stream, and pools
// of streams per priority level (kStreamsPerPool each), created on first
// use of that level and handed out round-robin; a caller may also create a
// stream of its own, or wrap a stream the vendor created without taking
// ownership. A Stream is a small value (device, id); the current stream of
// each device is thread-local, so reading or exchanging it never calls the
// driver.
// Limits: pooled streams are shared: two callers of pool_stream() may get
// the same stream, and their work is then ordered on it.
//
// Note [Stream priorities]
// Problem: drivers number stream priorities each their own way; PyTorch's
// convention is 0 for the default and negative numbers for more urgent,
// down to -(levels - 1).
// Decision: PyTorch's levels map onto the driver's range from
// properties().stream_priorities, level 0 at its lowest; priorities beyond
// the range are clamped, as torch.cuda does.
// Limits: at most kMaxLevels levels are used, however many the driver has.
//
// Note [Stream and event lifetime]
// Problem: after reset_device(), or the destruction of an owned or wrapped
// stream, Python objects may still hold Stream and Event values whose
// driver handles are gone.
// Decision: ids carry the device's generation; any use of an old Stream or
// Event is a RuntimeError naming the backend, device and stream, never a
// driver call on a dead handle.
// Limits: the generation has 16 bits: a value kept across 65,536 resets of
// its device would pass the check.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/once.hpp>
#include <accelkit/detail/per_device.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/error.hpp>
#include <accelkit/stream/event_pool.hpp>
#include <accelkit/types.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <mutex>
#include <unordered_map>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

// A stream of a device: a value, cheap to copy and compare. The id encodes
// the kind of stream, its priority level and index, and the device's
// generation (Note [Stream and event lifetime]).
struct Stream {
  device_index device = 0;
  std::int64_t id = 0;
  friend bool operator==(const Stream& a, const Stream& b) noexcept {
    return a.device == b.device && a.id == b.id;
  }
  friend bool operator!=(const Stream& a, const Stream& b) noexcept { return !(a == b); }
};

namespace detail {
// id layout: [generation:16][kind:4][level:4][index:32]; kind 0 = default.
enum class StreamKind : std::int64_t { default_stream = 0, pooled = 1, owned = 2, external = 3 };
constexpr std::int64_t make_stream_id(std::uint16_t generation, StreamKind kind, int level,
                                      std::uint32_t index) noexcept {
  return (static_cast<std::int64_t>(generation) << 40) |
         (static_cast<std::int64_t>(kind) << 36) | (static_cast<std::int64_t>(level) << 32) |
         static_cast<std::int64_t>(index);
}
constexpr std::uint16_t stream_generation(std::int64_t id) noexcept {
  return static_cast<std::uint16_t>(id >> 40);
}
constexpr StreamKind stream_kind(std::int64_t id) noexcept {
  return static_cast<StreamKind>((id >> 36) & 0xF);
}
constexpr int stream_level(std::int64_t id) noexcept { return static_cast<int>((id >> 32) & 0xF); }
constexpr std::uint32_t stream_index(std::int64_t id) noexcept {
  return static_cast<std::uint32_t>(id & 0xFFFFFFFF);
}
}  // namespace detail

template <class R>
class Streams {
 public:
  static constexpr int kStreamsPerPool = 32;
  static constexpr int kMaxLevels = 8;

  explicit Streams(Backend<R>& backend) : backend_(backend), id_(next_id()) {}
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  ~Streams() {
    devices_.for_each([this](device_index device, Device& d) {
      try {
        destroy_all(device, d);
      } catch (...) {
        // Teardown with a dead driver: nothing left to release to.
      }
    });
  }

  Backend<R>& backend() noexcept { return backend_; }

  // PyTorch's priority range of a device: {most urgent, default}, e.g. {-2, 0}.
  std::pair<int, int> priority_range(device_index device) {
    return {-(levels(device) - 1), 0};
  }

  // The default stream of a device.
  Stream default_stream(device_index device) {
    Device& d = dev(device);
    return Stream{device, detail::make_stream_id(d.generation, detail::StreamKind::default_stream,
                                                 0, 0)};
  }

  // A stream from the device's pool for `priority` (PyTorch numbering,
  // clamped), round-robin; the pool is created on first use.
  Stream pool_stream(device_index device, int priority = 0) {
    Device& d = dev(device);
    int level = level_of(device, priority);
    Pool& pool = d.pools[static_cast<std::size_t>(level)];
    // A failure part-way destroys the streams already created and leaves
    // the pool to be created again by the next call.
    pool.created.call([&] {
      int native = native_priority(device, level);
      std::size_t made = 0;
      try {
        for (; made < pool.handles.size(); ++made)
          pool.handles[made] = backend_.stream_create(device, native);
      } catch (...) {
        for (std::size_t i = 0; i < made; ++i) {
          try {
            backend_.stream_destroy(device, pool.handles[i]);
          } catch (...) {
            // Reported by the creation failure being thrown.
          }
          pool.handles[i] = StreamHandle{};
        }
        throw;
      }
    });
    auto index = static_cast<std::uint32_t>(pool.next.fetch_add(1) % kStreamsPerPool);
    return Stream{device, detail::make_stream_id(d.generation, detail::StreamKind::pooled, level,
                                                 index)};
  }

  // A new stream owned by the caller until destroy_stream().
  Stream create_stream(device_index device, int priority = 0) {
    Device& d = dev(device);
    int level = level_of(device, priority);
    StreamHandle h = backend_.stream_create(device, native_priority(device, level));
    std::lock_guard<std::mutex> lock(d.mutex);
    d.registry.push_back({h, true, true});
    return Stream{device, detail::make_stream_id(d.generation, detail::StreamKind::owned, level,
                                                 static_cast<std::uint32_t>(d.registry.size() - 1))};
  }

  // Wraps a stream the vendor created; accelkit never destroys it.
  Stream wrap_external(device_index device, StreamHandle handle) {
    Device& d = dev(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    d.registry.push_back({handle, false, true});
    return Stream{device, detail::make_stream_id(d.generation, detail::StreamKind::external, 0,
                                                 static_cast<std::uint32_t>(d.registry.size() - 1))};
  }

  // Destroys an owned stream (after its queued work), or forgets a wrapped
  // one. Using it afterwards is a RuntimeError.
  void destroy_stream(const Stream& s) {
    Device& d = dev(s.device);
    auto kind = detail::stream_kind(s.id);
    if (kind != detail::StreamKind::owned && kind != detail::StreamKind::external)
      throw ValueError(Backend<R>::name,
                       fmt::format("{} is a default or pool stream, which cannot be destroyed",
                                   describe(s)));
    StreamHandle h;
    bool owned;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      Entry& e = entry(d, s);
      h = e.handle;
      owned = e.owned;
      e.live = false;
    }
    if (owned) backend_.stream_destroy(s.device, h);
  }

  // The driver handle of the thread's current stream of `device` (the hot
  // path of every allocation and copy).
  StreamHandle current_handle(device_index device) {
    CurrentTable& t = tls_current();
    if (device >= 0 && device < kMaxDevices && !t.set[static_cast<std::size_t>(device)]) {
      if (Device* d = devices_.find(device))
        if (StreamHandle h = d->default_ready.load(std::memory_order_acquire); h != StreamHandle{})
          return h;
    }
    return handle(current_stream(device));
  }

  // The driver handle of a live stream; RuntimeError for a destroyed one or
  // one from before the device's reset.
  StreamHandle handle(const Stream& s) {
    Device& d = dev(s.device);
    check_generation(d, s);
    check_id(s);
    switch (detail::stream_kind(s.id)) {
      case detail::StreamKind::default_stream: {
        d.default_created.call([&] {
          d.default_handle = backend_.stream_create(s.device, native_priority(s.device, 0));
          d.default_ready.store(d.default_handle, std::memory_order_release);
        });
        return d.default_handle;
      }
      case detail::StreamKind::pooled: {
        Pool& pool = d.pools[static_cast<std::size_t>(detail::stream_level(s.id))];
        if (!pool.created.done())  // an id made up by a caller (torch.Stream(stream_id=...))
          throw no_stream(s);
        return pool.handles[detail::stream_index(s.id)];
      }
      default: {
        std::lock_guard<std::mutex> lock(d.mutex);
        return entry(d, s).handle;
      }
    }
  }

  // ---------------------------------------------------- current stream

  // The calling thread's current stream on `device` (its default stream
  // until set). No driver call.
  Stream current_stream(device_index device) {
    CurrentTable& t = tls_current();
    if (device >= 0 && device < kMaxDevices && t.set[static_cast<std::size_t>(device)])
      return t.streams[static_cast<std::size_t>(device)];
    return default_stream(device);
  }
  // Sets the thread's current stream of the stream's device, returning the
  // previous one. No driver call.
  Stream exchange_stream(const Stream& s) {
    Stream previous = current_stream(s.device);
    set_current_stream(s);
    return previous;
  }
  void set_current_stream(const Stream& s) {
    Device& d = dev(s.device);
    check_generation(d, s);
    check_id(s);
    if (s.device >= kMaxDevices)
      throw IndexError(Backend<R>::name,
                       fmt::format("device {} exceeds the {} devices whose current stream "
                                   "accelkit tracks",
                                   s.device, kMaxDevices));
    CurrentTable& t = tls_current();
    t.streams[static_cast<std::size_t>(s.device)] = s;
    t.set[static_cast<std::size_t>(s.device)] = true;
  }

  // ----------------------------------------------------------- semantics

  bool query(const Stream& s) { return backend_.stream_query(s.device, handle(s)); }
  void synchronize(const Stream& s) { backend_.stream_synchronize(s.device, handle(s)); }
  // Work queued on `waiter` from now on runs after the work queued so far on
  // `target` (an event from the pool, not a new one), also when `target` is
  // a stream of another device (Note [Cross-device waits]).
  void wait_stream(const Stream& waiter, const Stream& target) {
    StreamHandle waiting = handle(waiter);
    EventPool<R>& pool = events(target.device, EventFlags::none);
    EventHandle e = pool.record(handle(target));
    try {
      wait_event(waiter.device, waiting, target.device, e);
    } catch (...) {
      pool.release(e);
      throw;
    }
    // Back to the pool, reused once this record has completed (Note
    // [Pooled event reuse]); a wait on the host has seen it complete.
    pool.release(e, host_waits(waiter.device, target.device));
  }
  // Work queued on `stream` of `device` from now on waits for the last
  // record of `event`, an event of `event_device`: the same device's
  // stream_wait_event, or a cross-device wait (Note [Cross-device waits]).
  void wait_event(device_index device, StreamHandle stream, device_index event_device,
                  EventHandle event) {
    if (device == event_device)
      backend_.stream_wait_event(device, stream, event);
    else
      backend_.stream_wait_peer_event(device, stream, event_device, event);
  }
  // Whether a wait of a stream of `device` for an event of `event_device`
  // happens on the host (Note [Cross-device waits]): it has returned only
  // once the event's record completed.
  static constexpr bool host_waits(device_index device, device_index event_device) noexcept {
    return device != event_device && !detail::has_stream_wait_peer_event<R>;
  }
  void device_synchronize(device_index device) { backend_.device_synchronize(device); }

  // Waits for the device, destroys every stream accelkit created on it and
  // invalidates every Stream and Event of it (Note [Stream and event
  // lifetime]). Must not run concurrently with other use of the device; the
  // old state is kept (not freed) so that a racing reader does not crash.
  void reset_device(device_index device) {
    Device& d = dev(device);
    backend_.device_synchronize(device);
    destroy_all(device, d);
    devices_.replace(device, backend_.device_count(), [&] {
      auto fresh = std::make_unique<Device>();
      fresh->generation = static_cast<std::uint16_t>(d.generation + 1);
      return fresh;
    });
  }

  // Generation of a device's streams and events (bumped by reset_device).
  std::uint16_t generation(device_index device) { return dev(device).generation; }

  // The pool of driver events with `flags` on a device.
  EventPool<R>& events(device_index device, EventFlags flags) {
    Device& d = dev(device);
    std::size_t slot = static_cast<unsigned>(flags) & 3u;
    d.event_pools_created[slot].call([&] {
      d.event_pools[slot] = std::make_unique<EventPool<R>>(backend_, device, flags);
    });
    return *d.event_pools[slot];
  }

  std::string describe(const Stream& s) const {
    static constexpr const char* kinds[] = {"default stream", "pool stream", "stream",
                                            "external stream"};
    auto kind = static_cast<std::size_t>(detail::stream_kind(s.id)) & 3u;
    return fmt::format("{} {:#x} of {}:{}", kinds[kind], s.id, Backend<R>::name, s.device);
  }

  void check_generation(device_index device, std::uint16_t generation, const char* what) {
    Device& d = dev(device);
    if (generation != d.generation)
      throw RuntimeError(Backend<R>::name,
                         fmt::format("{} of {}:{} belongs to the device before it was reset",
                                     what, Backend<R>::name, device));
  }

 private:
  static constexpr int kMaxDevices = 64;

  struct Pool {
    detail::Once created;
    std::array<StreamHandle, kStreamsPerPool> handles{};
    std::atomic<std::uint32_t> next{0};
  };
  struct Entry {
    StreamHandle handle;
    bool owned;
    bool live;
  };
  struct Device {
    std::uint16_t generation = 0;
    detail::Once default_created;
    StreamHandle default_handle{};
    std::atomic<StreamHandle> default_ready{StreamHandle{}};  // set once created
    std::array<Pool, kMaxLevels> pools;
    std::mutex mutex;
    std::vector<Entry> registry;
    std::array<detail::Once, 4> event_pools_created;
    std::array<std::unique_ptr<EventPool<R>>, 4> event_pools;
  };
  struct CurrentTable {
    std::uint64_t owner = 0;
    std::array<Stream, kMaxDevices> streams{};
    std::array<bool, kMaxDevices> set{};
  };

  static std::uint64_t next_id() noexcept {
    static std::atomic<std::uint64_t> next{1};
    return next.fetch_add(1, std::memory_order_relaxed);
  }

  // One table per thread and runtime type; a thread that alternates between
  // two Streams objects of one runtime (only tests do) starts afresh on each
  // switch.
  CurrentTable& tls_current() {
    static thread_local CurrentTable table;
    if (table.owner != id_) {
      table = CurrentTable{};
      table.owner = id_;
    }
    return table;
  }

  // A device's table. Once made, the device was checked then; only a fork
  // since needs checking again (Note [Fork safety]).
  ACCELKIT_ALWAYS_INLINE Device& dev(device_index device) {
    if (Device* d = devices_.find(device); d && !backend_.in_bad_fork()) return *d;
    return make_dev(device);
  }
  ACCELKIT_NOINLINE Device& make_dev(device_index device) {
    backend_.check_device(device);  // initialized, not in a forked child, visible
    return devices_.get(device, backend_.device_count(), [] { return std::make_unique<Device>(); });
  }

  void check_generation(Device& d, const Stream& s) {
    if (detail::stream_generation(s.id) != d.generation)
      throw RuntimeError(Backend<R>::name,
                         fmt::format("{} belongs to the device before it was reset", describe(s)));
  }

  // A Stream's id comes from users too (torch.Stream(stream_id=...)): its
  // kind, level and index must name a stream this device can have. Cheap
  // (no driver or property query): a pooled id must also name a pool that
  // exists, which handle() checks (pools exist only for the device's levels).
  void check_id(const Stream& s) {
    auto kind = static_cast<std::int64_t>(detail::stream_kind(s.id));
    int level = detail::stream_level(s.id);
    std::uint32_t index = detail::stream_index(s.id);
    bool ok = s.id >= 0 && kind <= static_cast<std::int64_t>(detail::StreamKind::external);
    if (ok && kind == static_cast<std::int64_t>(detail::StreamKind::default_stream))
      ok = level == 0 && index == 0;
    if (ok && kind == static_cast<std::int64_t>(detail::StreamKind::pooled))
      ok = level < kMaxLevels && index < static_cast<std::uint32_t>(kStreamsPerPool);
    if (ok && kind == static_cast<std::int64_t>(detail::StreamKind::external)) ok = level == 0;
    if (!ok) throw no_stream(s);
  }
  ValueError no_stream(const Stream& s) const {
    return ValueError(Backend<R>::name,
                      fmt::format("stream id {:#x} of {}:{} names no stream (kind {}, priority "
                                  "level {}, index {})",
                                  s.id, Backend<R>::name, s.device,
                                  static_cast<std::int64_t>(detail::stream_kind(s.id)),
                                  detail::stream_level(s.id), detail::stream_index(s.id)));
  }

  Entry& entry(Device& d, const Stream& s) {
    std::uint32_t i = detail::stream_index(s.id);
    if (i >= d.registry.size())
      throw RuntimeError(Backend<R>::name, fmt::format("{} does not exist", describe(s)));
    Entry& e = d.registry[i];
    if (!e.live)
      throw RuntimeError(Backend<R>::name, fmt::format("{} was destroyed", describe(s)));
    return e;
  }

  int levels(device_index device) {
    return std::min(kMaxLevels, backend_.properties(device).stream_priorities.levels());
  }
  // PyTorch priority -> level 0 (default) .. levels-1 (most urgent), clamped.
  int level_of(device_index device, int priority) {
    return std::clamp(-priority, 0, levels(device) - 1);
  }
  int native_priority(device_index device, int level) {
    StreamPriorityRange r = backend_.properties(device).stream_priorities;
    return r.highest >= r.lowest ? r.lowest + level : r.lowest - level;
  }

  void destroy_all(device_index device, Device& d) {
    if (d.default_handle != StreamHandle{}) backend_.stream_destroy(device, d.default_handle);
    d.default_handle = StreamHandle{};
    d.default_ready.store(StreamHandle{}, std::memory_order_release);
    for (Pool& p : d.pools)
      for (StreamHandle& h : p.handles) {
        if (h != StreamHandle{}) backend_.stream_destroy(device, h);
        h = StreamHandle{};
      }
    std::lock_guard<std::mutex> lock(d.mutex);
    for (Entry& e : d.registry) {
      if (e.live && e.owned) backend_.stream_destroy(device, e.handle);
      e.live = false;
    }
  }

  Backend<R>& backend_;
  std::uint64_t id_;
  // Made at first use; one reset keeps the old alive (Note [Per-device slots]).
  detail::PerDevice<Device> devices_;
};

// An event: created lazily at its first record, from the device's event
// pool, returned to it when the Event is destroyed. Semantics as c10::Event
// and torch.Event (Note [Stream and event lifetime]).
template <class R>
class Event {
 public:
  explicit Event(Streams<R>& streams, EventFlags flags = EventFlags::none)
      : streams_(&streams), flags_(flags) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  Event(Event&& o) noexcept { *this = std::move(o); }
  Event& operator=(Event&& o) noexcept {
    if (this != &o) {
      release();
      streams_ = o.streams_;
      flags_ = o.flags_;
      device_ = o.device_;
      generation_ = o.generation_;
      handle_ = o.handle_;
      recorded_ = o.recorded_;
      completed_ = o.completed_;
      o.handle_ = EventHandle{};
      o.device_ = -1;
      o.recorded_ = false;
    }
    return *this;
  }
  ~Event() { release(); }

  bool was_recorded() const noexcept { return recorded_; }
  device_index device() const noexcept { return device_; }
  EventFlags flags() const noexcept { return flags_; }

  // Captures the work queued on `s` so far; replaces an earlier record.
  void record(const Stream& s) {
    if (device_ >= 0 && device_ != s.device)
      throw ValueError(name(), fmt::format("an event of {}:{} cannot be recorded on {}", name(),
                                           device_, streams_->describe(s)));
    StreamHandle sh = streams_->handle(s);
    if (device_ < 0) {
      handle_ = streams_->events(s.device, flags_).acquire();
      device_ = s.device;
      generation_ = streams_->generation(s.device);
    } else {
      check_live();
    }
    completed_ = false;
    streams_->backend().event_record(device_, handle_, sh);
    recorded_ = true;
  }

  // Makes work queued on `s` from now on wait for the recorded work, also
  // when `s` is a stream of another device (Note [Cross-device waits]).
  // No-op for an event never recorded.
  void block(const Stream& s) {
    if (!recorded_) return;
    check_live();
    streams_->wait_event(s.device, streams_->handle(s), device_, handle_);
    if (Streams<R>::host_waits(s.device, device_)) completed_ = true;
  }

  // True when the recorded work has completed; true if never recorded.
  bool query() {
    if (!recorded_) return true;
    check_live();
    completed_ = streams_->backend().event_query(device_, handle_);
    return completed_;
  }

  void synchronize() {
    if (!recorded_) return;
    check_live();
    streams_->backend().event_synchronize(device_, handle_);
    completed_ = true;
  }

  // Milliseconds from this event's record to `end`'s. Both must be timing
  // events, recorded, completed, on one device.
  float elapsed_time(const Event& end) {
    if (!has_flag(flags_, EventFlags::timing) || !has_flag(end.flags_, EventFlags::timing))
      throw ValueError(name(), "elapsed_time needs both events created with timing enabled");
    if (!recorded_ || !end.recorded_)
      throw ValueError(name(), "elapsed_time needs both events recorded first");
    if (device_ != end.device_)
      throw ValueError(name(), fmt::format("elapsed_time between events of {}:{} and {}:{}",
                                           name(), device_, name(), end.device_));
    check_live();
    streams_->backend().event_synchronize(device_, end.handle_);
    return streams_->backend().event_elapsed_time(device_, handle_, end.handle_);
  }

 private:
  static constexpr std::string_view name() { return Backend<R>::name; }

  void check_live() { streams_->check_generation(device_, generation_, "event"); }

  void release() noexcept {
    if (device_ < 0 || handle_ == EventHandle{}) return;
    try {
      if (streams_->generation(device_) == generation_)
        streams_->events(device_, flags_).release(handle_, completed_ || !recorded_);
    } catch (...) {
    }
    handle_ = EventHandle{};
    device_ = -1;
  }

  Streams<R>* streams_ = nullptr;
  EventFlags flags_ = EventFlags::none;
  device_index device_ = -1;
  std::uint16_t generation_ = 0;
  EventHandle handle_{};
  bool recorded_ = false;
  bool completed_ = true;  // its last record was seen complete (query, synchronize)
};

ACCELKIT_END_NAMESPACE
