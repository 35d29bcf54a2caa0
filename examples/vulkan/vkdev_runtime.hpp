// vkdev: a reference backend over Vulkan 1.2+ compute (timeline semaphores),
// written as a vendor would write one, on accelkit's support helpers (the
// Vulkan plumbing: support/vulkan.hpp). Tested on lavapipe (Debian
// mesa-vulkan-drivers). Named `vkdev`: "vulkan" is one of PyTorch's devices.
//
// The contract on Vulkan:
//   device memory  a VkBuffer over memory of its own per malloc; PyTorch's
//                  pointers are fake addresses (Note [Fake device addresses])
//                  or, in direct mode, the mapped host address; locate() turns
//                  any pointer into (buffer, offset)
//   pinned memory  a mapped host-visible VkBuffer, in the address space too,
//                  so that copies to and from it are vkCmdCopyBuffer
//   streams        a timeline semaphore each, on the one queue (Note [vkdev streams])
//   events         (timeline, value) of the record; timing ones a timestamp
//   copies         vkCmdCopyBuffer; pageable host memory through a staging
//                  buffer (filled at the call, or waited for and read)
//   memset         vulkan::fill_bytes (vkCmdFillBuffer's unit is 4 bytes)
//   errors         DriverError with the VkResult; VK_ERROR_DEVICE_LOST and
//                  failed queued work lose the device (Note [vkdev lost devices])
//   memory budget  the heap's size, which the driver does not keep: malloc
//                  counts against it (support::MemoryBudget), nullptr past it
//
// Configuration, read at the first device_count():
//   VKDEV_HOST_ACCESS none (default): memory the host does not address;
//                  mapped: as none, host_map maps the allocation (vkMapMemory,
//                  counted) and returns the host address; direct: host-visible
//                  coherent memory mapped persistently, its address the pointer
//   VKDEV_INJECT_FAULT test only: member[@n][:async], comma list (Note [Fault hooks])
//
// Note [vkdev streams]
// Problem: Vulkan has one queue (lavapipe's) for many PyTorch streams, and a
// submission costs more than recording a command.
// Decision: a stream is a timeline semaphore and a command pool, kept as
// support::Timeline does (Note [Timeline streams]); its records go into one
// command buffer, a memory barrier between two, submitted at the stream's
// next event record, wait, query or synchronize, a copy to pageable memory,
// or every kBatch records; all streams submit to the one queue under a mutex.
// Limits: work recorded and not yet submitted does not run until one of
// those calls; a host waiting by other means (polling memory) waits forever.
//
// Note [vkdev lost devices]
// Problem: Vulkan reports a failure of queued work only as
// VK_ERROR_DEVICE_LOST, after which the device can do nothing; a healthy
// lavapipe never fails, so the kit's errors group needs the fault hook.
// Decision: a queued fault (VKDEV_INJECT_FAULT's :async) marks the stream's
// submission that holds the work; the first call that sees that value reached
// (a query, a synchronize, an event's) reports the loss, as a real
// VK_ERROR_DEVICE_LOST from any call does. From then on every call that would
// run work on the device is refused with the first failure (kept by
// support::LostState); releases still work.
// Limits: the device stays lost for the process's life.
#pragma once

#include <vulkan/vulkan.h>

#include <accelkit/accelkit.hpp>
#include <accelkit/support/fault_hook.hpp>
#include <accelkit/support/handle_table.hpp>
#include <accelkit/support/lost_state.hpp>
#include <accelkit/support/memory_budget.hpp>
#include <accelkit/support/timeline.hpp>
#include <accelkit/support/vulkan.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

// Vulkan's structures are made to be filled in part.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

namespace vkdev {
namespace vulkan = accelkit::support::vulkan;

using vulkan::BufferRef;  // a span of device (or pinned) memory as kernels bind it
using HostAccess = accelkit::HostAccessLevel;  // VKDEV_HOST_ACCESS

class VulkanRuntime : public accelkit::Runtime<VulkanRuntime> {
  using Stream = vulkan::TimelineStream;  // Note [vkdev streams]
  struct Device;
  using AllocPtr = std::shared_ptr<vulkan::Allocation>;
  // The runtime's checks (Note [vkdev lost devices]) as the Vulkan helpers
  // take them: of a VkResult, and of a failure of queued work.
  auto checker(Device& d, std::string_view call) {
    return [this, &d, call](VkResult r, const char* fn) { check(d, r, call, fn); };
  }
  auto lost_by(Device& d, std::string_view call) {
    return [this, &d, call](const std::string& failed) {
      lose(d, call, fmt::format("queued work of {} failed: VK_ERROR_DEVICE_LOST (injected fault, "
                                "VKDEV_INJECT_FAULT)", failed));
    };
  }

 public:
  static constexpr std::string_view name = "vkdev";
  // lavapipe starts its threads when it enumerates its device.
  static constexpr bool fork_safe_discovery = false;
  // Misuse (a pointer or handle that names nothing) has no VkResult of its own.
  static constexpr VkResult kInvalid = VK_ERROR_VALIDATION_FAILED_EXT;

  VulkanRuntime() = default;
  VulkanRuntime(const VulkanRuntime&) = delete;
  VulkanRuntime& operator=(const VulkanRuntime&) = delete;
  ~VulkanRuntime() {
    events_.clear();
    for (auto& d : devices_) {
      if (!d->device) continue;
      d->streams.clear();
      d->sync_stream.reset();  // each waits for its work when it goes
      vkDeviceWaitIdle(d->device);
    }
    space_.reset();  // allocations the SDK still held go now
    devices_.clear();
    if (instance_) vkDestroyInstance(instance_, nullptr);
  }

  // ------------------------------------------------------------ contract

  int device_count() {
    discover();
    return static_cast<int>(devices_.size());
  }

  accelkit::DeviceProperties properties(int device) {
    Device& d = dev(device, "properties");
    std::string driver;
    accelkit::DeviceProperties p = vulkan::properties(d.vk.handle, &driver);
    p.total_memory = d.memory.total();
    p.max_allocation = std::min<std::uint64_t>(d.vk.max_allocation - kAlign, d.memory.total());
    p.dtypes = accelkit::DTypeSet::all();  // through the SDK's fallback
    p.host_access = access_;
    p.stream_priorities = accelkit::StreamPriorityRange::from_levels(1);
    p.memory_alignment = kAlign;
    p.event_timing = d.vk.queue.timestampValidBits > 0;
    // DLPack's kDLVulkan would promise a consumer Vulkan memory it could
    // bind; the fake addresses are the SDK's alone: the default, kDLExtDev.
    p.extras.push_back({"vkdev.host_access", std::string(to_string(access_))});
    p.extras.push_back({"vkdev.driver", driver});
    p.extras.push_back({"vkdev.push_descriptor", d.vk.push_descriptor});
    return p;
  }

  int get_device() { return current_device_; }
  void set_device(int device) {
    context(device, "set_device");
    current_device_ = device;
  }

  accelkit::MemoryInfo memory_info(int device) { return dev(device, "memory_info").memory.info(); }

  // nullptr past the budget (the heap's size: lavapipe would allocate far
  // more) and when the driver is out of memory.
  void* malloc(int device, std::size_t bytes) {
    Device& d = live(device, "malloc");
    fault("malloc");
    auto held = d.memory.reserve(bytes);
    if (bytes > d.vk.max_allocation - kAlign || !held) return nullptr;
    // Direct: vkMapMemory aligns to less than kAlign; the user's bytes start
    // at the first aligned address of a slightly larger allocation.
    AllocPtr a = allocate(d, access_ == HostAccess::direct ? bytes + kAlign : bytes, d.device_type,
                          access_ == HostAccess::direct, "malloc");
    if (!a) return nullptr;
    held.keep();
    a->bytes = bytes;
    return space_->hand_out(a, kAlign, "malloc");
  }

  // The SDK frees nothing queued work still uses.
  void free(int device, void* ptr) {
    Device& d = dev(device, "free");
    d.memory.release(space_->take(device, ptr, false, "free")->bytes);
  }

  void* host_malloc(int device, std::size_t bytes) {
    Device& d = live(device, "host_malloc");
    AllocPtr a = allocate(d, bytes, d.host_type, true, "host_malloc");
    if (!a) return nullptr;
    a->pinned = true;
    return space_->hand_out(a, 1, "host_malloc");
  }
  void host_free(int device, void* ptr) {
    dev(device, "host_free");
    space_->take(device, ptr, true, "host_free");
  }

  // Mapped: Vulkan maps one range of a memory object at a time, so the
  // whole allocation is mapped while any range of it is (counted), and the
  // host address of `ptr` in that map is returned (support::MapCount).
  void* host_map(int device, void* ptr, std::size_t bytes) {
    Device& d = live(device, "host_map");
    auto [a, offset] = space_->owned(device, ptr, bytes, "host_map");
    void* base = a->maps.map([&, a = a] {
      void* p = nullptr;
      check(d, vkMapMemory(d.device, a->memory, 0, VK_WHOLE_SIZE, 0, &p), "host_map", "vkMapMemory");
      return p;
    });
    return static_cast<char*>(base) + a->base + offset;
  }
  void host_unmap(int device, void* ptr, std::size_t bytes) {
    Device& d = dev(device, "host_unmap");
    AllocPtr a = space_->owned(device, ptr, bytes, "host_unmap").first;
    if (!a->maps.unmap([&](void*) { vkUnmapMemory(d.device, a->memory); }))
      driver_error(kInvalid, "host_unmap", fmt::format("{} bytes at {} are not mapped", bytes, ptr));
  }

  void memcpy(int device, void* dst, const void* src, std::size_t bytes, accelkit::CopyKind kind) {
    Device& d = live(device, "memcpy");
    fault("memcpy");
    copy(d, *d.sync_stream, dst, src, bytes, kind, false, "memcpy");
    wait(d, *d.sync_stream, "memcpy");
  }

  void memcpy_async(int device, void* dst, const void* src, std::size_t bytes,
                    accelkit::CopyKind kind, accelkit::StreamHandle stream, bool host_pinned) {
    Device& d = live(device, "memcpy_async");
    auto s = stream_of(d, stream, "memcpy_async");
    auto f = fault("memcpy_async");
    copy(d, *s, dst, src, bytes, kind, host_pinned, "memcpy_async");
    if (f) s->fail_queued("memcpy_async");
  }

  void memset_async(int device, void* ptr, int value, std::size_t bytes,
                    accelkit::StreamHandle stream) {
    Device& d = live(device, "memset_async");
    auto s = stream_of(d, stream, "memset_async");
    auto f = fault("memset_async");
    BufferRef r = locate(device, ptr, bytes, "memset_async");
    s->record(kBatch, checker(d, "memset_async"), [&](VkCommandBuffer cb) {
      vulkan::fill_bytes(cb, r.buffer, r.offset, bytes, static_cast<std::uint8_t>(value), d.patterns->buffer);
    });
    if (f) s->fail_queued("memset_async");
  }

  accelkit::StreamHandle stream_create(int device, int priority) {
    Device& d = live(device, "stream_create");
    if (priority != 0)
      driver_error(kInvalid, "stream_create",
                   fmt::format("priority {} is outside this device's range 0..0", priority));
    return d.streams.add(make_stream(d));
  }

  // The stream's work completes; its semaphore and pool go with the last
  // reference (an event recorded on it holds one), after that work.
  void stream_destroy(int device, accelkit::StreamHandle stream) {
    Device& d = dev(device, "stream_destroy");
    auto s = d.streams.remove(stream, "stream_destroy", device);
    if (!d.lost.lost()) s->flush(checker(d, "stream_destroy"));
  }

  bool stream_query(int device, accelkit::StreamHandle stream) {
    Device& d = live(device, "stream_query");
    auto s = stream_of(d, stream, "stream_query");
    return s->reached(s->flush(checker(d, "stream_query")), checker(d, "stream_query"),
                      lost_by(d, "stream_query"));
  }

  void stream_synchronize(int device, accelkit::StreamHandle stream) {
    Device& d = live(device, "stream_synchronize");
    wait(d, *stream_of(d, stream, "stream_synchronize"), "stream_synchronize");
  }

  void stream_wait_event(int device, accelkit::StreamHandle stream, accelkit::EventHandle event) {
    Device& d = live(device, "stream_wait_event");
    auto s = stream_of(d, stream, "stream_wait_event");
    auto e = event_of(device, event, "stream_wait_event", "waited for");
    auto f = fault("stream_wait_event");
    auto [on, value] = e->last();
    s->wait_event(on, value, checker(d, "stream_wait_event"), lost_by(d, "stream_wait_event"));
    if (f) s->fail_queued("stream_wait_event");
  }

  accelkit::EventHandle event_create(int device, accelkit::EventFlags flags) {
    Device& d = live(device, "event_create");
    auto e = std::make_shared<Event>();
    e->device = device;
    if (accelkit::has_flag(flags, accelkit::EventFlags::timing)) {
      if (d.vk.queue.timestampValidBits == 0)
        throw accelkit::NotSupportedError(name, "event timing: the device's queue has no timestamps");
      e->timing = std::make_unique<vulkan::Timestamp>(d.device, checker(d, "event_create"));
    }
    return events_.add(std::move(e));
  }

  void event_destroy(int, accelkit::EventHandle event) { events_.remove(event, "event_destroy"); }

  void event_record(int device, accelkit::EventHandle event, accelkit::StreamHandle stream) {
    Device& d = live(device, "event_record");
    auto s = stream_of(d, stream, "event_record");
    auto e = event_of(device, event, "event_record", "recorded");
    auto f = fault("event_record");
    if (e->timing)
      s->record(kBatch, checker(d, "event_record"),
                [&](VkCommandBuffer cb) { vulkan::write_timestamp(cb, e->timing->pool); });
    if (f) s->fail_queued("event_record");
    e->record(s, s->flush(checker(d, "event_record")));
  }

  bool event_query(int, accelkit::EventHandle event) {
    auto e = events_.get(event, "event_query");
    auto [s, value] = e->last();
    if (!s) return true;
    Device& d = live(e->device, "event_query");
    return s->reached(value, checker(d, "event_query"), lost_by(d, "event_query"));
  }

  void event_synchronize(int, accelkit::EventHandle event) {
    auto e = events_.get(event, "event_synchronize");
    auto [s, value] = e->last();
    if (!s) return;
    Device& d = live(e->device, "event_synchronize");
    s->wait_until(value, checker(d, "event_synchronize"), lost_by(d, "event_synchronize"));
  }

  float event_elapsed_time(int, accelkit::EventHandle start, accelkit::EventHandle end) {
    double t[2] = {}, period = 1;
    for (int i = 0; i < 2; ++i) {
      auto e = events_.get(i ? end : start, "event_elapsed_time");
      Device& d = live(e->device, "event_elapsed_time");
      if (!e->timing)
        driver_error(kInvalid, "event_elapsed_time", "both events must be timing events");
      if (!e->last().first)
        driver_error(kInvalid, "event_elapsed_time", "both events must be recorded");
      auto ticks = vulkan::read_timestamp(d.device, e->timing->pool, checker(d, "event_elapsed_time"));
      if (!ticks) driver_error(VK_NOT_READY, "event_elapsed_time", "an event has not completed yet");
      t[i] = static_cast<double>(*ticks);
      period = d.vk.properties.limits.timestampPeriod;
    }
    return static_cast<float>((t[1] - t[0]) * period / 1e6);  // ns to ms
  }

  void device_synchronize(int device) {
    Device& d = live(device, "device_synchronize");
    for (auto& s : d.streams.objects()) wait(d, *s, "device_synchronize");
    wait(d, *d.sync_stream, "device_synchronize");
  }

  // The test-only fault hook of the kit's errors group (Note [Fault hooks]).
  void inject_fault(const std::string& member, int nth = 1, bool async = false) {
    discover();
    faults_.arm(member, nth, async);
  }

  // ------------------------------------------------------------ for kernels

  // The device's description: handle, queue family, properties and limits, extensions.
  const vulkan::Physical& physical(int device) { return dev(device, "physical").vk; }
  // Its VkDevice and vkCmdPushDescriptorSetKHR, created at the first call.
  const vulkan::LogicalDevice& logical(int device) { return context(device, "logical"); }
  // f(VkQueue) under the mutex of the device's queue (vkQueueSubmit's rule).
  template <class F>
  decltype(auto) with_queue(int device, F&& f) {
    Device& d = live(device, "with_queue");
    std::lock_guard<std::mutex> lock(d.queue_mutex);
    return f(d.queue);
  }

  // The buffer and offset of [p, p + bytes): device memory of `device`, or
  // pinned memory of its context.
  BufferRef locate(int device, const void* p, std::size_t bytes, std::string_view call) {
    return space_->span(device, p, bytes, call);
  }

  // Records commands on `stream`, in its order (Note [vkdev streams]).
  template <class F>
  void enqueue(int device, accelkit::StreamHandle stream, std::string_view call, F&& rec) {
    Device& d = live(device, call);
    stream_of(d, stream, call)->record(kBatch, checker(d, call), std::forward<F>(rec));
  }

 private:
  static constexpr std::size_t kAlign = 256;
  static constexpr int kBatch = 32;  // records per submission at most

  // An event: (stream, value) of its last record (Note [Timeline streams]).
  struct Event : accelkit::support::TimelineEvent<Stream> {
    int device = 0;
    std::unique_ptr<vulkan::Timestamp> timing;  // timing events'
  };

  // A device: its description, memory types and budget, and, once created,
  // its VkDevice, queue and fill patterns (vulkan::LogicalDevice), streams.
  struct Device : vulkan::LogicalDevice {
    int index = 0;
    vulkan::Physical vk;
    std::uint32_t device_type = 0, host_type = 0;  // memory types
    accelkit::support::MemoryBudget memory;  // the heap's size
    std::once_flag created;
    std::shared_ptr<Stream> sync_stream;  // memcpy's
    accelkit::support::HandleTable<accelkit::StreamHandle, Stream> streams{name, "stream", kInvalid};
    accelkit::support::LostState lost;  // Note [vkdev lost devices]
  };

  // --------------------------------------------------------- errors

  [[noreturn]] void lose(Device& d, std::string_view call, const std::string& what) {
    d.lost.lose(fmt::format("{} in {}", what, call));
    device_lost(VK_ERROR_DEVICE_LOST, call, what);
  }
  void check(Device& d, VkResult r, std::string_view call, const char* fn) {
    if (r == VK_SUCCESS) return;
    std::string what = fmt::format("{} failed: {} ({})", fn, vulkan::result_name(r), static_cast<int>(r));
    if (r == VK_ERROR_DEVICE_LOST) lose(d, call, what);
    driver_error(r, call, what);
  }
  std::optional<accelkit::support::FaultTiming> fault(std::string_view member) {
    auto f = faults_.fire(member);
    if (f == accelkit::support::FaultTiming::at_call)
      driver_error(VK_ERROR_UNKNOWN, member, "injected fault (VKDEV_INJECT_FAULT)");
    return f;
  }

  // --------------------------------------------------------- devices

  void discover() {
    std::call_once(discovered_, [&] {
      auto env = accelkit::Environment::process();
      if (auto v = env.get("VKDEV_HOST_ACCESS")) {
        std::string_view t = accelkit::detail::trim(*v);
        if (t == "none") access_ = HostAccess::none;
        else if (t == "mapped") access_ = HostAccess::mapped;
        else if (t == "direct") access_ = HostAccess::direct;
        else
          throw accelkit::ValueError(
              name, fmt::format("VKDEV_HOST_ACCESS='{}': expected none, mapped or direct", *v));
      }
      faults_.arm_from(env.get("VKDEV_INJECT_FAULT"));
      instance_ = vulkan::create_instance("vkdev", VK_API_VERSION_1_2, [](VkResult r, const char* fn) {
        driver_error(r, "device_count", fmt::format("{} failed: {}", fn, vulkan::result_name(r)));
      });
      if (!instance_) return;
      for (VkPhysicalDevice pd : vulkan::enumerate<VkPhysicalDevice>(vkEnumeratePhysicalDevices, instance_))
        if (auto d = usable(pd)) {
          d->index = static_cast<int>(devices_.size());
          devices_.push_back(std::move(d));
        }
    });
  }

  // A device with Vulkan 1.2, timeline semaphores, a compute queue and the
  // memory types the mode needs; nullptr otherwise (direct: a ValueError).
  std::unique_ptr<Device> usable(VkPhysicalDevice pd) {
    auto vk = vulkan::describe(pd);
    if (!vk) return nullptr;
    constexpr VkMemoryPropertyFlags host = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT;
    auto dtype = vulkan::memory_type(vk->memory, access_ == HostAccess::none ? 0 : host, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
    auto htype = vulkan::memory_type(vk->memory, host, VK_MEMORY_PROPERTY_HOST_CACHED_BIT);
    if (!dtype && access_ != HostAccess::none)
      throw accelkit::ValueError(
          name, fmt::format("VKDEV_HOST_ACCESS={}: device {} ({}) has no host-visible coherent "
                            "memory (use none)",
                            to_string(access_), devices_.size(), vk->properties.deviceName));
    if (!dtype || !htype) return nullptr;
    auto d = std::make_unique<Device>();
    d->vk = *vk;
    d->device_type = *dtype;
    d->host_type = *htype;
    d->memory.set_total(vk->memory.memoryHeaps[vk->memory.memoryTypes[*dtype].heapIndex].size);
    return d;
  }

  Device& dev(int device, std::string_view call) {
    discover();
    if (device < 0 || device >= static_cast<int>(devices_.size()))
      driver_error(kInvalid, call, fmt::format("no device {} (vkdev has {})", device, devices_.size()));
    return *devices_[static_cast<std::size_t>(device)];
  }

  // The device's context, created at its first use: the VkDevice with
  // timeline semaphores and the features kernels may use, its queue, the
  // fill patterns and memcpy's stream.
  Device& context(int device, std::string_view call) {
    Device& d = dev(device, call);
    std::call_once(d.created, [&] {
      d.open(d.vk, d.host_type, checker(d, call));
      d.sync_stream = make_stream(d);
    });
    return d;
  }

  // The context of a device that is not lost (Note [vkdev lost devices]).
  Device& live(int device, std::string_view call) {
    Device& d = context(device, call);
    if (auto first = d.lost.first())
      device_lost(VK_ERROR_DEVICE_LOST, call,
                  fmt::format("device {} was lost earlier ({}): it runs no more work", device, *first));
    return d;
  }

  // --------------------------------------------------------- memory

  // A buffer over new memory of `type`, mapped persistently when `map`;
  // nullptr when the driver is out of memory.
  AllocPtr allocate(Device& d, std::size_t bytes, std::uint32_t type, bool map, std::string_view call) {
    auto a = std::make_shared<vulkan::Allocation>();
    a->ordinal = d.index;
    a->bytes = bytes;
    return vulkan::allocate(*a, d.device, bytes, type, map, checker(d, call)) ? a : nullptr;
  }

  // Records the copy; pageable host memory goes through a staging buffer:
  // filled now (to the device), or waited for and read (to the host).
  void copy(Device& d, Stream& s, void* dst, const void* src, std::size_t bytes,
            accelkit::CopyKind kind, bool host_pinned, std::string_view call) {
    using K = accelkit::CopyKind;
    bool to_host = kind == K::device_to_host;
    const void* host = to_host ? dst : src;
    BufferRef dev = locate(d.index, to_host ? src : dst, bytes, call);
    BufferRef other{};
    AllocPtr staging;
    auto pinned = host_pinned ? space_->pinned(d.index, host, bytes) : std::nullopt;
    if (kind == K::device_to_device) {
      other = locate(d.index, src, bytes, call);
    } else if (pinned) {
      other = *pinned;
    } else {
      staging = allocate(d, bytes, d.host_type, true, call);
      if (!staging)
        driver_error(VK_ERROR_OUT_OF_HOST_MEMORY, call,
                     fmt::format("no host memory for a {}-byte staging buffer", bytes));
      if (!to_host) std::memcpy(staging->host, src, bytes);
      other = {staging->buffer, 0, bytes};
    }
    if (to_host) std::swap(dev, other);
    VkBufferCopy c{other.offset, dev.offset, bytes};
    s.record(kBatch, checker(d, call),
             [&](VkCommandBuffer cb) { vkCmdCopyBuffer(cb, other.buffer, dev.buffer, 1, &c); });
    if (!staging) return;
    if (!to_host) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.keep(std::move(staging));  // until the stream passed the copy
      return;
    }
    wait(d, s, call);
    std::memcpy(dst, staging->host, bytes);
  }

  // --------------------------------------------------------- streams

  std::shared_ptr<Stream> make_stream(Device& d) {
    return std::make_shared<Stream>(d.device, d.vk.family, d.queue, d.queue_mutex, checker(d, "stream_create"));
  }

  // The event, which must be of `device`, the stream's it is `use`d on.
  std::shared_ptr<Event> event_of(int device, accelkit::EventHandle h, std::string_view call,
                                  std::string_view use) {
    auto e = events_.get(h, call);
    if (e->device != device)
      driver_error(kInvalid, call,
                   fmt::format("event of device {} {} on a stream of device {}", e->device, use,
                               device));
    return e;
  }
  std::shared_ptr<Stream> stream_of(Device& d, accelkit::StreamHandle h, std::string_view call) {
    return d.streams.get(h, call, d.index);
  }

  // Submits and waits for all the stream's work (Note [vkdev lost devices]).
  void wait(Device& d, Stream& s, std::string_view call) { s.synchronize(checker(d, call), lost_by(d, call)); }

  std::once_flag discovered_;
  HostAccess access_ = HostAccess::none;
  VkInstance instance_ = VK_NULL_HANDLE;
  std::vector<std::unique_ptr<Device>> devices_;
  // Every allocation of every device: fake addresses (none, mapped), host
  // addresses (direct, pinned).
  std::optional<vulkan::Allocations> space_{std::in_place, name, kInvalid};
  accelkit::support::HandleTable<accelkit::EventHandle, Event> events_{name, "event", kInvalid};
  accelkit::support::FaultHook faults_{
      name, "VKDEV_INJECT_FAULT", {"memcpy_async", "memset_async", "event_record", "stream_wait_event"}};
  static inline thread_local int current_device_ = 0;
};

}  // namespace vkdev

#pragma GCC diagnostic pop
