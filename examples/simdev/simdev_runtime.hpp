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
// Configuration, read at the first device_count() (each a clear error when
// malformed):
//   SIMDEV_DEVICE_COUNT   number of devices (default 2, 0..64)
//   SIMDEV_MEMORY_MB      capacity per device in MiB (default 1024): one value
//                         for all devices, or a comma list, one per device
//   SIMDEV_HOST_VISIBLE   1 (default) or 0: whether the host may touch device
//                         memory directly
//   SIMDEV_INJECT_FAULT   comma list of member[@n]: that member throws a driver
//                         error on its n-th call (default 1), once
//   SIMDEV_EVENT_CREATE_NS what creating an event costs (default 2000 ns, as
//                         real drivers' event creation does; busy-waited)
#pragma once

#include <accelkit/accelkit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include <sys/mman.h>

namespace simdev {

// Driver error codes, as a real driver would define them.
enum ErrorCode : int {
  kInvalidValue = 1,
  kInvalidDevice = 101,
  kInvalidHandle = 400,
  kNotReady = 600,
  kInjectedFault = 999,
};

struct Config {
  int device_count = 2;
  std::vector<std::uint64_t> memory_bytes{1024ull << 20};  // one entry, or one per device
  bool host_visible = true;
  std::map<std::string, int> faults;  // member -> the call number that first fails
  long event_create_ns = 2000;

  std::uint64_t capacity(int device) const {
    return memory_bytes.size() == 1 ? memory_bytes[0]
                                    : memory_bytes[static_cast<std::size_t>(device)];
  }

  // Reads SIMDEV_* from `env`; throws accelkit::ValueError naming the variable
  // and value when one is malformed.
  static Config from_environment(const accelkit::Environment& env) {
    Config c;
    auto bad = [](const std::string& var, const std::string& value, const std::string& why) {
      return accelkit::ValueError("simdev", fmt::format("{}='{}': {}", var, value, why));
    };
    auto parse_int = [&](const std::string& var, const std::string& text, long long lo,
                         long long hi) -> long long {
      std::string_view t = accelkit::detail::trim(text);
      if (t.empty() || t.size() > 12 ||
          !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        throw bad(var, text, "expected a non-negative integer");
      long long v = std::stoll(std::string(t));
      if (v < lo || v > hi) throw bad(var, text, fmt::format("must be in {}..{}", lo, hi));
      return v;
    };
    if (auto v = env.get("SIMDEV_DEVICE_COUNT"))
      c.device_count = static_cast<int>(parse_int("SIMDEV_DEVICE_COUNT", *v, 0, 64));
    if (auto v = env.get("SIMDEV_MEMORY_MB")) {
      c.memory_bytes.clear();
      for (std::string_view item : accelkit::detail::split_list(*v)) {
        long long mb = 0;
        try {
          mb = parse_int("SIMDEV_MEMORY_MB", std::string(item), 1, 1 << 20);
        } catch (const accelkit::ValueError&) {
          throw bad("SIMDEV_MEMORY_MB", *v,
                    fmt::format("entry '{}' is not a capacity in MiB (1..{})", item, 1 << 20));
        }
        c.memory_bytes.push_back(static_cast<std::uint64_t>(mb) << 20);
      }
      if (c.memory_bytes.size() != 1 &&
          c.memory_bytes.size() != static_cast<std::size_t>(c.device_count))
        throw bad("SIMDEV_MEMORY_MB", *v,
                  fmt::format("gives {} capacities for {} devices (give one, or one per device)",
                              c.memory_bytes.size(), c.device_count));
    }
    if (auto v = env.get("SIMDEV_HOST_VISIBLE")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.host_visible = true;
      else if (t == "0") c.host_visible = false;
      else throw bad("SIMDEV_HOST_VISIBLE", *v, "expected 0 or 1");
    }
    if (auto v = env.get("SIMDEV_EVENT_CREATE_NS"))
      c.event_create_ns = static_cast<long>(parse_int("SIMDEV_EVENT_CREATE_NS", *v, 0, 1'000'000));
    if (auto v = env.get("SIMDEV_INJECT_FAULT")) {
      for (std::string_view item : accelkit::detail::split_list(*v)) {
        std::string entry(item);
        auto at = entry.find('@');
        std::string member = entry.substr(0, at);
        int nth = at == std::string::npos
                      ? 1
                      : static_cast<int>(parse_int("SIMDEV_INJECT_FAULT", entry.substr(at + 1),
                                                   1, 1'000'000'000));
        if (member.empty() || !accelkit::detail::is_identifier_part(member))
          throw bad("SIMDEV_INJECT_FAULT", *v,
                    fmt::format("entry '{}' is not member[@n]", entry));
        c.faults[member] = nth;
      }
    }
    return c;
  }
};

class SimRuntime : public accelkit::Runtime<SimRuntime> {
 public:
  static constexpr std::string_view name = "simdev";

  // Configured from the process environment at the first device_count().
  SimRuntime() = default;
  // Configured explicitly (tests).
  explicit SimRuntime(Config config) : config_(std::move(config)), configured_(true) {}

  // ------------------------------------------------------------ contract

  int device_count() {
    configure();
    fault("device_count");
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
    p.compute_units = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    p.subgroup_size = 32;
    p.clock_rate_khz = 1'000'000;
    p.l2_cache_bytes = 4u << 20;
    p.dtypes = accelkit::DTypeSet::all();
    p.host_visible_memory = config_.host_visible;
    p.unified_memory = false;
    p.stream_priorities = {0, -2};  // CUDA-style: numerically lower is more urgent
    p.event_timing = true;
    p.async_copy_engines = 2;
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

  void* malloc(int device, std::size_t bytes) {
    check(device, "malloc");
    fault("malloc");
    Device& d = context(device);
    std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
    std::uint64_t used = d.used.fetch_add(rounded);
    if (used + rounded > config_.capacity(device)) {
      d.used.fetch_sub(rounded);
      return nullptr;
    }
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      d.used.fetch_sub(rounded);
      return nullptr;
    }
    std::lock_guard<std::mutex> lock(d.mutex);
    d.allocations.emplace(p, rounded);
    return p;
  }

  void free(int device, void* ptr) {
    check(device, "free");
    fault("free");
    Device& d = context(device);
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(d.mutex);
      auto it = d.allocations.find(ptr);
      if (it == d.allocations.end())
        driver_error(kInvalidValue, "free",
                     fmt::format("pointer {} was not allocated on device {}", ptr, device));
      bytes = it->second;
      d.allocations.erase(it);
    }
    ::munmap(ptr, bytes);
    d.used.fetch_sub(bytes);
  }

  void* host_malloc(std::size_t bytes) {
    fault("host_malloc");
    std::size_t rounded = (bytes + kPage - 1) / kPage * kPage;
    void* p = ::mmap(nullptr, rounded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    pinned_.emplace(static_cast<char*>(p), rounded);
    return p;
  }
  void host_free(void* ptr) {
    fault("host_free");
    std::size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(pinned_mutex_);
      auto it = pinned_.find(static_cast<char*>(ptr));
      if (it == pinned_.end())
        driver_error(kInvalidValue, "host_free",
                     fmt::format("pointer {} was not allocated by host_malloc", ptr));
      bytes = it->second;
      pinned_.erase(it);
    }
    ::munmap(ptr, bytes);
  }

  void memcpy(int device, void* dst, const void* src, std::size_t bytes, accelkit::CopyKind) {
    check(device, "memcpy");
    fault("memcpy");
    copies_.fetch_add(1, std::memory_order_relaxed);
    std::memcpy(dst, src, bytes);
  }

  // Copies that touch pinned host memory, or only device memory, run on the
  // stream; a copy from or to pageable host memory waits for the stream and
  // runs at once, as CUDA's do.
  void memcpy_async(int device, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "memcpy_async");
    fault("memcpy_async");
    copies_.fetch_add(1, std::memory_order_relaxed);
    const void* host = kind == accelkit::CopyKind::host_to_device   ? src
                       : kind == accelkit::CopyKind::device_to_host ? dst
                                                                    : nullptr;
    if (host != nullptr && !is_pinned(host, bytes)) {
      s->synchronize();
      std::memcpy(dst, src, bytes);
      return;
    }
    s->enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes,
                    accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "memset_async");
    fault("memset_async");
    s->enqueue([ptr, value, bytes] { std::memset(ptr, value, bytes); });
  }

  bool can_access_peer(int device, int peer) {
    check(device, "can_access_peer");
    check(peer, "can_access_peer");
    return config_.host_visible;
  }

  void memcpy_peer_async(void* dst, int dst_device, const void* src, int src_device,
                         std::size_t bytes, accelkit::StreamHandle stream) {
    check(dst_device, "memcpy_peer_async");
    auto s = stream_of(src_device, stream, "memcpy_peer_async");
    fault("memcpy_peer_async");
    s->enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  }

  accelkit::StreamHandle stream_create(int device, int priority) {
    check(device, "stream_create");
    fault("stream_create");
    if (priority > 0 || priority < -2)
      driver_error(kInvalidValue, "stream_create",
                   fmt::format("priority {} is outside simdev's range 0..-2", priority));
    Device& d = context(device);
    auto s = std::make_shared<Stream>(device, priority);
    accelkit::StreamHandle h = accelkit::StreamHandle::from_pointer(s.get());
    std::lock_guard<std::mutex> lock(d.mutex);
    d.streams.emplace(h.value, std::move(s));
    return h;
  }

  // Waits for the stream's queued work, then stops its worker.
  void stream_destroy(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_destroy");
    fault("stream_destroy");
    {
      Device& d = context(device);
      std::lock_guard<std::mutex> lock(d.mutex);
      d.streams.erase(stream.value);
    }
    s->stop();
  }

  bool stream_query(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_query");
    fault("stream_query");
    return s->idle();
  }

  void stream_synchronize(int device, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "stream_synchronize");
    fault("stream_synchronize");
    s->synchronize();
  }

  void stream_wait_event(int device, accelkit::StreamHandle stream, accelkit::EventHandle event) {
    auto s = stream_of(device, stream, "stream_wait_event");
    auto e = event_of(event, "stream_wait_event");
    fault("stream_wait_event");
    std::uint64_t target = e->records.load();
    if (target == 0) return;  // never recorded: nothing to wait for
    s->enqueue([e, target] { e->wait_for(target); });
  }

  accelkit::EventHandle event_create(int device, accelkit::EventFlags flags) {
    check(device, "event_create");
    fault("event_create");
    context(device);
    ++events_created_;
    if (config_.event_create_ns > 0) {  // the driver's cost of a new event
      auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(config_.event_create_ns);
      while (std::chrono::steady_clock::now() < until) {
      }
    }
    auto e = std::make_shared<Event>();
    e->device = device;
    e->timing = accelkit::has_flag(flags, accelkit::EventFlags::timing);
    accelkit::EventHandle h = accelkit::EventHandle::from_pointer(e.get());
    std::lock_guard<std::mutex> lock(events_mutex_);
    events_.emplace(h.value, std::move(e));
    return h;
  }

  void event_destroy(int device, accelkit::EventHandle event) {
    check(device, "event_destroy");
    event_of(event, "event_destroy");
    fault("event_destroy");
    std::lock_guard<std::mutex> lock(events_mutex_);
    events_.erase(event.value);  // queued records keep the state alive
  }

  void event_record(int device, accelkit::EventHandle event, accelkit::StreamHandle stream) {
    auto s = stream_of(device, stream, "event_record");
    auto e = event_of(event, "event_record");
    fault("event_record");
    if (e->device != device)
      driver_error(kInvalidValue, "event_record",
                   fmt::format("event of device {} recorded on a stream of device {}", e->device,
                               device));
    std::uint64_t target = ++e->records;
    s->record(e, target);
  }

  bool event_query(int, accelkit::EventHandle event) {
    auto e = event_of(event, "event_query");
    fault("event_query");
    return e->done();
  }

  void event_synchronize(int, accelkit::EventHandle event) {
    auto e = event_of(event, "event_synchronize");
    fault("event_synchronize");
    e->wait_for(e->records.load());
  }

  float event_elapsed_time(int, accelkit::EventHandle start, accelkit::EventHandle end) {
    auto a = event_of(start, "event_elapsed_time");
    auto b = event_of(end, "event_elapsed_time");
    fault("event_elapsed_time");
    if (!a->timing || !b->timing)
      driver_error(kInvalidHandle, "event_elapsed_time", "both events must be timing events");
    if (a->records == 0 || b->records == 0)
      driver_error(kInvalidHandle, "event_elapsed_time", "both events must be recorded");
    if (!a->done() || !b->done())
      driver_error(kNotReady, "event_elapsed_time", "an event has not completed yet");
    std::lock_guard<std::mutex> la(a->mutex);
    auto ta = a->when;
    std::lock_guard<std::mutex> lb(b->mutex);
    return std::chrono::duration<float, std::milli>(b->when - ta).count();
  }

  void device_synchronize(int device) {
    check(device, "device_synchronize");
    fault("device_synchronize");
    std::vector<std::shared_ptr<Stream>> streams;
    {
      Device& d = context(device);
      std::lock_guard<std::mutex> lock(d.mutex);
      for (auto& kv : d.streams) streams.push_back(kv.second);
    }
    for (auto& s : streams) s->synchronize();
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
    stream_of(device, stream, "hold")->enqueue([gate] { gate->wait(); });
    return gate;
  }

  // ------------------------------------------------ simulator inspection

  // Devices whose context exists (set_device, malloc, streams... create one;
  // device_count and properties never do).
  int contexts_created() const { return contexts_.load(); }
  long events_created() const { return events_created_.load(); }
  // memcpy and memcpy_async calls so far (tests tell copying paths apart).
  long copies() const { return copies_.load(); }
  bool initialized() const { return initialized_; }
  std::uint64_t bytes_in_use(int device) { return context(device).used.load(); }
  long pinned_blocks() {
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    return static_cast<long>(pinned_.size());
  }
  // Makes `member` fail once, on its n-th call from now on (n = 1: the next).
  void inject_fault(const std::string& member, int nth = 1) {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    config_.faults[member] = nth + calls_[member];
  }
  void clear_faults() {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    config_.faults.clear();
  }

 private:
  static constexpr std::size_t kPage = 4096;

  // A stream: a FIFO of work run by a worker thread started on first use.
  class Stream {
   public:
    Stream(int device, int priority) : device_(device), priority_(priority) {}
    ~Stream() { stop(); }

    void enqueue(std::function<void()> work) {
      std::lock_guard<std::mutex> lock(mutex_);
      queue_.push_back(std::move(work));
      ++enqueued_;
      if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
      cv_.notify_all();
    }
    bool idle() {
      std::lock_guard<std::mutex> lock(mutex_);
      return completed_ == enqueued_;
    }
    // An event record: on an idle stream it completes at once, as on a
    // device; otherwise it completes when the stream reaches it.
    template <class Ev>
    void record(const std::shared_ptr<Ev>& e, std::uint64_t target) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (completed_ == enqueued_) {
        e->complete(target);
        return;
      }
      lock.unlock();
      enqueue([e, target] { e->complete(target); });
    }
    void synchronize() {
      std::unique_lock<std::mutex> lock(mutex_);
      std::uint64_t target = enqueued_;
      cv_.wait(lock, [&] { return completed_ >= target; });
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
        auto work = std::move(queue_.front());
        queue_.pop_front();
        lock.unlock();
        work();
        lock.lock();
        ++completed_;
        cv_.notify_all();
      }
    }

    int device_;
    int priority_;
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> queue_;
    std::uint64_t enqueued_ = 0;
    std::uint64_t completed_ = 0;
    bool stopping_ = false;
    std::thread worker_;
  };

  // An event: `records` counts event_record calls, `completed` is the
  // latest record its stream has reached. Only the last record matters.
  struct Event {
    int device = 0;
    bool timing = false;
    std::atomic<std::uint64_t> records{0};
    std::mutex mutex;
    std::condition_variable cv;
    std::uint64_t completed = 0;
    std::chrono::steady_clock::time_point when{};

    void complete(std::uint64_t target) {
      std::lock_guard<std::mutex> lock(mutex);
      if (target > completed) {
        completed = target;
        when = std::chrono::steady_clock::now();
      }
      cv.notify_all();
    }
    bool done() {
      std::uint64_t target = records.load();
      std::lock_guard<std::mutex> lock(mutex);
      return completed >= target;
    }
    void wait_for(std::uint64_t target) {
      std::unique_lock<std::mutex> lock(mutex);
      cv.wait(lock, [&] { return completed >= target; });
    }
  };

  struct Device {
    std::once_flag created;
    std::atomic<std::uint64_t> used{0};
    std::mutex mutex;
    std::unordered_map<void*, std::size_t> allocations;
    std::unordered_map<std::uintptr_t, std::shared_ptr<Stream>> streams;
  };

  void configure() {
    std::lock_guard<std::mutex> lock(config_mutex_);
    if (!configured_) {
      config_ = Config::from_environment(accelkit::Environment::process());
      configured_ = true;
    }
    if (!devices_) devices_ = std::make_unique<Device[]>(static_cast<std::size_t>(config_.device_count));
  }

  void check(int device, const char* call) {
    if (device < 0 || device >= config_.device_count)
      driver_error(kInvalidDevice, call,
                   fmt::format("no device {} (simdev has {})", device, config_.device_count));
  }

  Device& context(int device) {
    Device& d = devices_[static_cast<std::size_t>(device)];
    std::call_once(d.created, [this] { contexts_.fetch_add(1); });
    return d;
  }

  std::shared_ptr<Stream> stream_of(int device, accelkit::StreamHandle stream, const char* call) {
    check(device, call);
    Device& d = context(device);
    std::lock_guard<std::mutex> lock(d.mutex);
    auto it = d.streams.find(stream.value);
    if (it == d.streams.end())
      driver_error(kInvalidHandle, call,
                   fmt::format("stream {:#x} is not a live stream of device {}", stream.value,
                               device));
    return it->second;
  }

  std::shared_ptr<Event> event_of(accelkit::EventHandle event, const char* call) {
    std::lock_guard<std::mutex> lock(events_mutex_);
    auto it = events_.find(event.value);
    if (it == events_.end())
      driver_error(kInvalidHandle, call,
                   fmt::format("event {:#x} is not a live event", event.value));
    return it->second;
  }

  bool is_pinned(const void* p, std::size_t bytes) {
    const char* c = static_cast<const char*>(p);
    std::lock_guard<std::mutex> lock(pinned_mutex_);
    auto it = pinned_.upper_bound(const_cast<char*>(c));
    if (it == pinned_.begin()) return false;
    --it;
    return c >= it->first && c + bytes <= it->first + it->second;
  }

  void fault(const char* member) {
    std::lock_guard<std::mutex> lock(fault_mutex_);
    if (config_.faults.empty()) return;
    int n = ++calls_[member];
    auto it = config_.faults.find(member);
    if (it == config_.faults.end() || n != it->second) return;
    config_.faults.erase(it);  // one-shot: the next call succeeds again
    driver_error(kInjectedFault, member, "injected fault");
  }

  Config config_;
  bool configured_ = false;
  std::mutex config_mutex_;
  std::unique_ptr<Device[]> devices_;
  std::atomic<int> contexts_{0};
  std::atomic<long> events_created_{0};
  std::atomic<long> copies_{0};
  bool initialized_ = false;
  std::mutex pinned_mutex_;
  std::map<char*, std::size_t> pinned_;
  std::mutex events_mutex_;
  std::unordered_map<std::uintptr_t, std::shared_ptr<Event>> events_;
  std::mutex fault_mutex_;
  std::map<std::string, int> calls_;
  static inline thread_local int current_device_ = 0;
};

}  // namespace simdev
