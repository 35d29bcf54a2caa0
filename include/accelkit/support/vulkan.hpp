// accelkit/support: the Vulkan plumbing that every runtime over Vulkan
// compute writes whatever its device: VkResult names, enumerations as
// vectors, a physical device's compute queue family, memory types and
// extensions, a logical device with timeline semaphores and its queue,
// buffers over memory of their own, the allocations a runtime hands out by
// address (support::AddressSpace) and their storage-buffer bindings, command
// pools and buffers, timeline submissions and waits, streams over timeline
// semaphores (support::Timeline) with their queries, waits and failures,
// byte fills, timestamps, and compute pipelines whose storage buffers are
// push descriptors (VK_KHR_push_descriptor) recorded with a barrier before
// each dispatch.
//
// Each call that can fail takes `check(VkResult, const char* fn)`, the
// runtime's own policy (a driver error, a lost device), called with every
// result that is not VK_SUCCESS; it throws, or returns where the caller
// ignores the failure (a destructor).
//
//   auto check = [&](VkResult r, const char* fn) { my_check(r, call, fn); };
//   VkDevice dev = vulkan::create_device(pd, *vulkan::compute_family(pd), {}, check);
//   vulkan::Buffer b;
//   if (!vulkan::allocate(b, dev, bytes, type, /*map=*/true, check)) return nullptr;  // out of memory
//
// Plain functions and RAII objects: the thread safety is Vulkan's
// (vkQueueSubmit and command pools need the caller's external locks), but
// for Allocations and TimelineStream, which say what they lock.
#pragma once

#include <vulkan/vulkan.h>

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/support/address_space.hpp>
#include <accelkit/support/driver_info.hpp>
#include <accelkit/support/map_count.hpp>
#include <accelkit/support/timeline.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

// Vulkan's structures are made to be filled in part.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"

ACCELKIT_BEGIN_NAMESPACE
namespace support::vulkan {

inline const char* result_name(VkResult r) {
  switch (r) {
    case VK_SUCCESS: return "VK_SUCCESS";
    case VK_NOT_READY: return "VK_NOT_READY";
    case VK_TIMEOUT: return "VK_TIMEOUT";
    case VK_ERROR_OUT_OF_HOST_MEMORY: return "VK_ERROR_OUT_OF_HOST_MEMORY";
    case VK_ERROR_OUT_OF_DEVICE_MEMORY: return "VK_ERROR_OUT_OF_DEVICE_MEMORY";
    case VK_ERROR_INITIALIZATION_FAILED: return "VK_ERROR_INITIALIZATION_FAILED";
    case VK_ERROR_DEVICE_LOST: return "VK_ERROR_DEVICE_LOST";
    case VK_ERROR_MEMORY_MAP_FAILED: return "VK_ERROR_MEMORY_MAP_FAILED";
    case VK_ERROR_EXTENSION_NOT_PRESENT: return "VK_ERROR_EXTENSION_NOT_PRESENT";
    case VK_ERROR_FEATURE_NOT_PRESENT: return "VK_ERROR_FEATURE_NOT_PRESENT";
    case VK_ERROR_INCOMPATIBLE_DRIVER: return "VK_ERROR_INCOMPATIBLE_DRIVER";
    case VK_ERROR_UNKNOWN: return "VK_ERROR_UNKNOWN";
    case VK_ERROR_VALIDATION_FAILED_EXT: return "VK_ERROR_VALIDATION_FAILED_EXT";
    default: return "a Vulkan error";
  }
}

// A packed VK_MAKE_API_VERSION value (apiVersion, driverVersion) as a Version.
inline Version version(std::uint32_t v) {
  return {static_cast<int>(VK_API_VERSION_MAJOR(v)), static_cast<int>(VK_API_VERSION_MINOR(v)),
          static_cast<int>(VK_API_VERSION_PATCH(v))};
}

// What a two-call enumeration gives: enumerate<VkPhysicalDevice>(vkEnumeratePhysicalDevices, instance).
template <class T, class F, class... A>
std::vector<T> enumerate(F&& f, A... args) {
  std::uint32_t n = 0;
  f(args..., &n, nullptr);
  std::vector<T> out(n);
  f(args..., &n, out.data());
  out.resize(n);
  return out;
}

// An instance of API version `api`; VK_NULL_HANDLE where the machine has no
// Vulkan driver (VK_ERROR_INCOMPATIBLE_DRIVER, VK_ERROR_INITIALIZATION_FAILED).
template <class Check>
VkInstance create_instance(const char* application, std::uint32_t api, Check&& check) {
  VkApplicationInfo app{VK_STRUCTURE_TYPE_APPLICATION_INFO, nullptr, application, 0, nullptr, 0, api};
  VkInstanceCreateInfo ci{VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO, nullptr, 0, &app};
  VkInstance instance = VK_NULL_HANDLE;
  VkResult r = vkCreateInstance(&ci, nullptr, &instance);
  if (r == VK_ERROR_INCOMPATIBLE_DRIVER || r == VK_ERROR_INITIALIZATION_FAILED) return VK_NULL_HANDLE;
  if (r != VK_SUCCESS) check(r, "vkCreateInstance");
  return instance;
}

// The first queue family of `pd` with compute (its properties in *props),
// or nullopt.
inline std::optional<std::uint32_t> compute_family(VkPhysicalDevice pd,
                                                   VkQueueFamilyProperties* props = nullptr) {
  auto families = enumerate<VkQueueFamilyProperties>(vkGetPhysicalDeviceQueueFamilyProperties, pd);
  for (std::uint32_t i = 0; i < families.size(); ++i)
    if (families[i].queueFlags & VK_QUEUE_COMPUTE_BIT) {
      if (props) *props = families[i];
      return i;
    }
  return std::nullopt;
}

// A memory type with every flag of `need`: the first that also has every
// flag of `prefer`, else the first; nullopt where none has `need`.
inline std::optional<std::uint32_t> memory_type(const VkPhysicalDeviceMemoryProperties& mp,
                                                VkMemoryPropertyFlags need,
                                                VkMemoryPropertyFlags prefer) {
  std::optional<std::uint32_t> found;
  for (std::uint32_t i = 0; i < mp.memoryTypeCount; ++i) {
    VkMemoryPropertyFlags t = mp.memoryTypes[i].propertyFlags;
    if ((t & need) != need) continue;
    if ((t & prefer) == prefer) return i;
    if (!found) found = i;
  }
  return found;
}

inline bool has_extension(VkPhysicalDevice pd, std::string_view name) {
  for (const auto& e :
       enumerate<VkExtensionProperties>(vkEnumerateDeviceExtensionProperties, pd, nullptr))
    if (name == e.extensionName) return true;
  return false;
}

// A physical device as a compute runtime over Vulkan 1.2 takes it.
struct Physical {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  std::uint32_t family = 0;       // the first queue family with compute
  VkQueueFamilyProperties queue{};  // its properties (timestampValidBits)
  VkPhysicalDeviceProperties properties{};
  VkPhysicalDeviceMemoryProperties memory{};
  VkDeviceSize max_allocation = 0;  // maxMemoryAllocationSize
  bool push_descriptor = false;     // VK_KHR_push_descriptor
};
// nullopt where `pd` lacks Vulkan 1.2, timeline semaphores or a compute queue.
inline std::optional<Physical> describe(VkPhysicalDevice pd) {
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES};
  VkPhysicalDeviceFeatures2 f{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
  vkGetPhysicalDeviceFeatures2(pd, &f);
  VkPhysicalDeviceMaintenance3Properties m3{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &m3};
  vkGetPhysicalDeviceProperties2(pd, &p2);
  Physical p;
  auto family = compute_family(pd, &p.queue);
  if (p2.properties.apiVersion < VK_API_VERSION_1_2 || !f12.timelineSemaphore || !family) return std::nullopt;
  p.handle = pd;
  p.family = *family;
  p.properties = p2.properties;
  vkGetPhysicalDeviceMemoryProperties(pd, &p.memory);
  p.max_allocation = m3.maxMemoryAllocationSize;
  p.push_descriptor = has_extension(pd, VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
  return p;
}

// What Vulkan reports of `pd` as DeviceProperties: name, vendor (a PCI or
// Khronos id), uuid, driver version (from the driver's text, else its
// packed number), runtime version (the API's) and subgroup size; `driver`
// gets "driverName (driverInfo)". Vulkan reports no compute units or clock
// rate: unknown (0).
inline DeviceProperties properties(VkPhysicalDevice pd, std::string* driver = nullptr) {
  VkPhysicalDeviceDriverProperties dp{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES};
  VkPhysicalDeviceSubgroupProperties subgroup{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES, &dp};
  VkPhysicalDeviceIDProperties id{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES, &subgroup};
  VkPhysicalDeviceProperties2 p2{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, &id};
  vkGetPhysicalDeviceProperties2(pd, &p2);
  DeviceProperties p;
  p.name = p2.properties.deviceName;
  p.vendor = pci_vendor_name(p2.properties.vendorID);
  p.uuid = uuid_from_bytes(id.deviceUUID);
  p.driver_version = parse_version(dp.driverInfo);
  if (p.driver_version == Version{}) p.driver_version = version(p2.properties.driverVersion);
  p.runtime_version = version(p2.properties.apiVersion);
  p.subgroup_size = static_cast<int>(subgroup.subgroupSize);
  if (driver) *driver = std::string(dp.driverName) + " (" + dp.driverInfo + ")";
  return p;
}

// A logical device with one queue of `family`, timeline semaphores, the
// `extensions`, and the shader features kernels may use where `pd` has
// them: 8- and 16-bit storage buffers, float16, float64, int8, int16, int64.
template <class Check>
VkDevice create_device(VkPhysicalDevice pd, std::uint32_t family,
                       const std::vector<const char*>& extensions, Check&& check) {
  VkPhysicalDeviceVulkan11Features f11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  VkPhysicalDeviceVulkan12Features f12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &f11};
  VkPhysicalDeviceFeatures2 has{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &f12};
  vkGetPhysicalDeviceFeatures2(pd, &has);
  VkPhysicalDeviceVulkan11Features e11{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES};
  e11.storageBuffer16BitAccess = f11.storageBuffer16BitAccess;
  VkPhysicalDeviceVulkan12Features e12{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, &e11};
  e12.timelineSemaphore = VK_TRUE;
  e12.shaderFloat16 = f12.shaderFloat16;
  e12.shaderInt8 = f12.shaderInt8;
  e12.storageBuffer8BitAccess = f12.storageBuffer8BitAccess;
  VkPhysicalDeviceFeatures2 want{VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, &e12};
  want.features.shaderInt64 = has.features.shaderInt64;
  want.features.shaderInt16 = has.features.shaderInt16;
  want.features.shaderFloat64 = has.features.shaderFloat64;
  float priority = 1;
  VkDeviceQueueCreateInfo qi{VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO, nullptr, 0, family, 1, &priority};
  VkDeviceCreateInfo ci{VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, &want, 0, 1, &qi};
  ci.enabledExtensionCount = static_cast<std::uint32_t>(extensions.size());
  ci.ppEnabledExtensionNames = extensions.data();
  VkDevice device = VK_NULL_HANDLE;
  if (VkResult r = vkCreateDevice(pd, &ci, nullptr, &device); r != VK_SUCCESS) check(r, "vkCreateDevice");
  return device;
}

// A VkBuffer (storage, transfer source and destination) bound to
// VkDeviceMemory of its own, mapped persistently at `host` where asked;
// all of it released with the object.
struct Buffer {
  VkDevice device = VK_NULL_HANDLE;
  VkBuffer buffer = VK_NULL_HANDLE;
  VkDeviceMemory memory = VK_NULL_HANDLE;
  void* host = nullptr;
  Buffer() = default;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() {
    if (host) vkUnmapMemory(device, memory);
    if (buffer) vkDestroyBuffer(device, buffer, nullptr);
    if (memory) vkFreeMemory(device, memory, nullptr);
  }
};

// Makes `b` (empty) a buffer of `bytes` rounded up to 4 (vkCmdFillBuffer's
// unit) over new memory of type `type`, mapped where `map`. False where the
// driver is out of memory (b then holds what it has, released with it).
template <class Check>
bool allocate(Buffer& b, VkDevice device, VkDeviceSize bytes, std::uint32_t type, bool map, Check&& check) {
  b.device = device;
  VkBufferCreateInfo bi{VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, nullptr, 0, (bytes + 3) / 4 * 4,
                        VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | VK_BUFFER_USAGE_TRANSFER_SRC_BIT |
                            VK_BUFFER_USAGE_TRANSFER_DST_BIT};
  if (VkResult r = vkCreateBuffer(device, &bi, nullptr, &b.buffer); r != VK_SUCCESS) check(r, "vkCreateBuffer");
  VkMemoryRequirements req;
  vkGetBufferMemoryRequirements(device, b.buffer, &req);
  VkMemoryAllocateInfo ai{VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, nullptr, req.size, type};
  VkResult r = vkAllocateMemory(device, &ai, nullptr, &b.memory);
  if (r == VK_ERROR_OUT_OF_DEVICE_MEMORY || r == VK_ERROR_OUT_OF_HOST_MEMORY) return false;
  if (r != VK_SUCCESS) check(r, "vkAllocateMemory");
  if ((r = vkBindBufferMemory(device, b.buffer, b.memory, 0)) != VK_SUCCESS) check(r, "vkBindBufferMemory");
  if (map && (r = vkMapMemory(device, b.memory, 0, VK_WHOLE_SIZE, 0, &b.host)) != VK_SUCCESS)
    check(r, "vkMapMemory");
  return true;
}

// A span of a buffer as commands bind it: the buffer, and the span's
// offset and length in it.
struct BufferRef {
  VkBuffer buffer;
  VkDeviceSize offset;
  VkDeviceSize bytes;
};

// The storage-buffer binding of `r` for elements of `element` bytes: from
// r's offset rounded down to minStorageBufferOffsetAlignment to its end;
// returns the element offset of r's start in it. Nullopt where r's offset
// is not a multiple of `element` or the binding exceeds maxStorageBufferRange.
inline std::optional<std::uint32_t> bind(const BufferRef& r, const VkPhysicalDeviceLimits& limits,
                                         VkDeviceSize element, VkDescriptorBufferInfo& info) {
  VkDeviceSize start = r.offset / limits.minStorageBufferOffsetAlignment * limits.minStorageBufferOffsetAlignment;
  if (r.offset % element != 0 || r.offset - start + r.bytes > limits.maxStorageBufferRange) return std::nullopt;
  info = {r.buffer, start, r.offset - start + r.bytes};
  return static_cast<std::uint32_t>((r.offset - start) / element);
}

// A Buffer a runtime hands out: memory of device `ordinal`, pinned host
// memory or not, the user's `bytes` starting at `base` in the buffer, and
// the maps host_map made of it (support::MapCount), undone with it.
struct Allocation : Buffer {
  int ordinal = 0;
  VkDeviceSize base = 0;
  std::size_t bytes = 0;
  bool pinned = false;
  MapCount maps;
  ~Allocation() {
    if (!host && maps.mapped()) vkUnmapMemory(device, memory);
  }
};

// Every Allocation of a runtime's devices by the address PyTorch has for it
// (Note [Fake device addresses]), with lookups that also check the device
// and the kind; their errors are DriverErrors of `code` naming the call.
// Thread-safe.
class Allocations : public AddressSpace<std::shared_ptr<Allocation>> {
 public:
  Allocations(std::string_view backend, std::int64_t code, AddressSpaceOptions options = {})
      : AddressSpace(backend, with_code(options, code)), backend_(backend), code_(code) {}

  // The address for `a` (its bytes set): a fake one, or where `a` is mapped
  // persistently its host address rounded up to `align` (a->base: the
  // rounding, for which the buffer has room).
  void* hand_out(std::shared_ptr<Allocation> a, std::size_t align, std::string_view call) {
    if (!a->host) return map(a, a->bytes, call);
    auto host = reinterpret_cast<std::uintptr_t>(a->host);
    a->base = (align - host % align) % align;
    a->host = static_cast<char*>(a->host) + a->base;
    add(a->host, a->bytes, a, call);
    return a->host;
  }
  // The allocation of `device` holding [p, p + bytes) and p's offset in it.
  std::pair<std::shared_ptr<Allocation>, std::size_t> owned(int device, const void* p, std::size_t bytes,
                                                            std::string_view call) const {
    auto at = locate(p, bytes, call);
    if (at.handle->ordinal != device)
      fail(call, fmt::format("{} is memory of device {}, used on device {}", p, at.handle->ordinal, device));
    return {at.handle, at.offset};
  }
  // The same as commands bind it.
  BufferRef span(int device, const void* p, std::size_t bytes, std::string_view call) const {
    auto [a, offset] = owned(device, p, bytes, call);
    return {a->buffer, a->base + offset, bytes};
  }
  // Pinned memory of `device` holding [p, p + bytes); nothing for any other.
  std::optional<BufferRef> pinned(int device, const void* p, std::size_t bytes) const {
    auto at = find(p, bytes);
    if (!at || !at->handle->pinned || at->handle->ordinal != device) return std::nullopt;
    return BufferRef{at->handle->buffer, at->handle->base + at->offset, bytes};
  }
  // Ends `ptr`, which malloc (pinned: host_malloc) of `device` returned.
  std::shared_ptr<Allocation> take(int device, const void* ptr, bool pinned, std::string_view call) {
    auto at = locate(ptr, 1, call);
    if (at.offset != 0 || at.handle->pinned != pinned || at.handle->ordinal != device)
      fail(call, fmt::format("{} was not returned by {}({}, ·)", ptr, pinned ? "host_malloc" : "malloc", device));
    return unmap(ptr, call);
  }

 private:
  static AddressSpaceOptions with_code(AddressSpaceOptions o, std::int64_t code) {
    o.error_code = code;
    return o;
  }
  [[noreturn]] void fail(std::string_view call, const std::string& what) const {
    throw DriverError(backend_, code_, call, what);
  }
  std::string_view backend_;
  std::int64_t code_;
};

// A timeline semaphore at 0.
template <class Check>
VkSemaphore create_timeline(VkDevice device, Check&& check) {
  VkSemaphoreTypeCreateInfo ti{VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO, nullptr,
                               VK_SEMAPHORE_TYPE_TIMELINE, 0};
  VkSemaphoreCreateInfo si{VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, &ti};
  VkSemaphore s = VK_NULL_HANDLE;
  if (VkResult r = vkCreateSemaphore(device, &si, nullptr, &s); r != VK_SUCCESS) check(r, "vkCreateSemaphore");
  return s;
}

template <class Check>
std::uint64_t counter(VkDevice device, VkSemaphore timeline, Check&& check) {
  std::uint64_t v = 0;
  VkResult r = vkGetSemaphoreCounterValue(device, timeline, &v);
  if (r != VK_SUCCESS) check(r, "vkGetSemaphoreCounterValue");
  return v;
}

// Waits until `timeline` reaches `value`.
template <class Check>
void wait(VkDevice device, VkSemaphore timeline, std::uint64_t value, Check&& check) {
  VkSemaphoreWaitInfo wi{VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO, nullptr, 0, 1, &timeline, &value};
  if (VkResult r = vkWaitSemaphores(device, &wi, UINT64_MAX); r != VK_SUCCESS) check(r, "vkWaitSemaphores");
}

// Submits `cb` (none where null) to `queue` (the caller holds the queue's
// lock), its commands waiting for each (timeline, value) of `waits`; signals
// `timeline` to `value` when done.
template <class Check>
void submit(VkQueue queue, const VkCommandBuffer* cb,
            const std::vector<std::pair<VkSemaphore, std::uint64_t>>& waits, VkSemaphore timeline,
            std::uint64_t value, Check&& check) {
  std::vector<VkSemaphore> sems;
  std::vector<std::uint64_t> values;
  for (auto [s, v] : waits) {
    sems.push_back(s);
    values.push_back(v);
  }
  std::vector<VkPipelineStageFlags> stages(sems.size(), VK_PIPELINE_STAGE_ALL_COMMANDS_BIT);
  VkTimelineSemaphoreSubmitInfo ti{VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO, nullptr,
                                   static_cast<std::uint32_t>(values.size()), values.data(), 1, &value};
  VkSubmitInfo si{VK_STRUCTURE_TYPE_SUBMIT_INFO, &ti, static_cast<std::uint32_t>(sems.size()),
                  sems.data(), stages.data(), cb ? 1u : 0u, cb, 1, &timeline};
  if (VkResult r = vkQueueSubmit(queue, 1, &si, VK_NULL_HANDLE); r != VK_SUCCESS) check(r, "vkQueueSubmit");
}

// A command pool of `family` whose command buffers reset as they begin.
template <class Check>
VkCommandPool create_pool(VkDevice device, std::uint32_t family, Check&& check) {
  VkCommandPoolCreateInfo pi{VK_STRUCTURE_TYPE_COMMAND_POOL_CREATE_INFO, nullptr,
                             VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, family};
  VkCommandPool pool = VK_NULL_HANDLE;
  if (VkResult r = vkCreateCommandPool(device, &pi, nullptr, &pool); r != VK_SUCCESS) check(r, "vkCreateCommandPool");
  return pool;
}

// A primary command buffer of `pool`.
template <class Check>
VkCommandBuffer allocate_commands(VkDevice device, VkCommandPool pool, Check&& check) {
  VkCommandBufferAllocateInfo ai{VK_STRUCTURE_TYPE_COMMAND_BUFFER_ALLOCATE_INFO, nullptr, pool,
                                 VK_COMMAND_BUFFER_LEVEL_PRIMARY, 1};
  VkCommandBuffer cb = VK_NULL_HANDLE;
  if (VkResult r = vkAllocateCommandBuffers(device, &ai, &cb); r != VK_SUCCESS) check(r, "vkAllocateCommandBuffers");
  return cb;
}
// Begins `cb` (again: a pool made by create_pool resets it) for one submission.
template <class Check>
void begin(VkCommandBuffer cb, Check&& check) {
  VkCommandBufferBeginInfo bi{VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO, nullptr,
                              VK_COMMAND_BUFFER_USAGE_ONE_TIME_SUBMIT_BIT};
  if (VkResult r = vkBeginCommandBuffer(cb, &bi); r != VK_SUCCESS) check(r, "vkBeginCommandBuffer");
}

// Orders every command recorded after it on `cb` behind every command
// before it, memory included (shader and transfer reads and writes).
inline void full_barrier(VkCommandBuffer cb) {
  constexpr VkAccessFlags all = VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT |
                                VK_ACCESS_TRANSFER_READ_BIT | VK_ACCESS_TRANSFER_WRITE_BIT;
  VkMemoryBarrier mb{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr, all, all};
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT, VK_PIPELINE_STAGE_ALL_COMMANDS_BIT,
                       0, 1, &mb, 0, nullptr, 0, nullptr);
}

// A stream on one queue as support::Timeline keeps it (Note [Timeline
// streams]): a timeline semaphore, and a command pool whose command buffers
// are its batches, submitted to `queue` under `queue_mutex`. commands() and
// submit_to() are called under `mutex`, as Timeline's members; record,
// flush, fail_queued, reached, wait_until, synchronize and wait_event take
// it themselves. Those that wait or query report a failure marked on queued
// work (mark_failed) once, to `lost(call)`, which throws (a lost device).
struct TimelineStream : Timeline<TimelineStream, VkCommandBuffer> {
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  std::mutex* queue_mutex = nullptr;
  VkSemaphore timeline = VK_NULL_HANDLE;
  VkCommandPool pool = VK_NULL_HANDLE;
  template <class Check>
  TimelineStream(VkDevice d, std::uint32_t family, VkQueue q, std::mutex& qm, Check&& check)
      : device(d), queue(q), queue_mutex(&qm) {
    timeline = create_timeline(d, check);
    try {
      pool = create_pool(d, family, check);
    } catch (...) {
      vkDestroySemaphore(d, timeline, nullptr);
      throw;
    }
  }
  TimelineStream(const TimelineStream&) = delete;
  TimelineStream& operator=(const TimelineStream&) = delete;
  // Waits for the submitted work (a lost device returns at once).
  ~TimelineStream() {
    if (std::uint64_t last = submitted()) wait(device, timeline, last, [](VkResult, const char*) {});
    vkDestroyCommandPool(device, pool, nullptr);
    vkDestroySemaphore(device, timeline, nullptr);
  }
  // The open command buffer to record into: begun if just opened, else
  // after a full_barrier behind what it holds.
  template <class Check>
  VkCommandBuffer commands(Check&& check) {
    auto [cb, fresh] = open(counter(device, timeline, check),
                            [&] { return allocate_commands(device, pool, check); });
    if (fresh) begin(cb, check);
    else full_barrier(cb);
    return cb;
  }
  // Submits what was recorded and the pending waits, behind this stream's
  // last submission; returns submitted().
  template <class Check>
  std::uint64_t submit_to(Check&& check) {
    return submit([&](const VkCommandBuffer* cb, const auto& waits, std::uint64_t signal) {
      VkResult r = cb ? vkEndCommandBuffer(*cb) : VK_SUCCESS;
      if (r != VK_SUCCESS) check(r, "vkEndCommandBuffer");
      std::vector<std::pair<VkSemaphore, std::uint64_t>> on;
      if (signal > 1) on.emplace_back(timeline, signal - 1);
      for (const auto& w : waits) on.emplace_back(w.on->timeline, w.value);
      std::lock_guard<std::mutex> lock(*queue_mutex);
      vulkan::submit(queue, cb, on, timeline, signal, check);
    });
  }

  // Calls rec(commands()); submits once the batch holds `batch` records.
  template <class Check, class F>
  void record(int batch, Check&& check, F&& rec) {
    std::lock_guard<std::mutex> lock(mutex);
    rec(commands(check));
    if (recorded() >= batch) submit_to(check);
  }
  // Submits; returns the value the stream's work so far completes at.
  template <class Check>
  std::uint64_t flush(Check&& check) {
    std::lock_guard<std::mutex> lock(mutex);
    return submit_to(check);
  }
  // The work `call` just queued fails (a test hook's injected failure).
  void fail_queued(std::string_view call) {
    std::lock_guard<std::mutex> lock(mutex);
    mark_failed(call);
  }
  // Whether the counter has reached `value`; a failure marked on the work
  // up to it goes to lost(call), once.
  template <class Check, class Lost>
  bool reached(std::uint64_t value, Check&& check, Lost&& lost) {
    if (counter(device, timeline, check) < value) return false;
    std::optional<std::string> failed;
    {
      std::lock_guard<std::mutex> lock(mutex);
      failed = failed_by(value);
    }
    if (failed) lost(*failed);
    return true;
  }
  template <class Check, class Lost>
  void wait_until(std::uint64_t value, Check&& check, Lost&& lost) {
    wait(device, timeline, value, check);
    reached(value, check, lost);
  }
  // Submits and waits for all the stream's work.
  template <class Check, class Lost>
  void synchronize(Check&& check, Lost&& lost) {
    wait_until(flush(check), check, lost);
  }
  // Work recorded from now on waits for `on` (another stream; null: none)
  // to reach `value`; what was recorded before is submitted first.
  template <class Check, class Lost>
  void wait_event(std::shared_ptr<TimelineStream> on, std::uint64_t value, Check&& check, Lost&& lost) {
    if (!on || on.get() == this || on->reached(value, check, lost)) return;
    std::lock_guard<std::mutex> lock(mutex);
    submit_to(check);
    wait_for(std::move(on), value);
  }
};

// Writes the 256 four-byte patterns of fill_bytes (byte v repeated at
// 4 * v) to `host`, 1024 bytes of a mapped buffer.
inline void write_fill_patterns(void* host) {
  for (int v = 0; v < 256; ++v) std::memset(static_cast<char*>(host) + 4 * v, v, 4);
}
// Records a fill of `bytes` bytes at `offset` of `buffer` with byte `value`:
// vkCmdFillBuffer (4-byte unit and alignment) on the aligned middle, the
// edges copied from `patterns` (write_fill_patterns).
inline void fill_bytes(VkCommandBuffer cb, VkBuffer buffer, VkDeviceSize offset, VkDeviceSize bytes,
                       std::uint8_t value, VkBuffer patterns) {
  VkDeviceSize head = std::min<VkDeviceSize>((4 - offset % 4) % 4, bytes);
  VkDeviceSize middle = (bytes - head) & ~VkDeviceSize{3}, tail = bytes - head - middle;
  if (middle) vkCmdFillBuffer(cb, buffer, offset + head, middle, value * 0x01010101u);
  for (auto [at, n] : {std::pair{offset, head}, std::pair{offset + head + middle, tail}}) {
    VkBufferCopy c{VkDeviceSize{value} * 4, at, n};
    if (n) vkCmdCopyBuffer(cb, patterns, buffer, 1, &c);
  }
}

// A logical device as a compute runtime opens it on a Physical: the device
// (create_device, with VK_KHR_push_descriptor where it has the extension),
// its queue and the lock vkQueueSubmit needs, vkCmdPushDescriptorSetKHR
// (null without the extension), and fill_bytes' patterns in a mapped buffer
// of `host_type`. The device goes with the object, after the patterns.
struct LogicalDevice {
  VkDevice device = VK_NULL_HANDLE;
  VkQueue queue = VK_NULL_HANDLE;
  std::mutex queue_mutex;
  PFN_vkCmdPushDescriptorSetKHR push_descriptor_fn = nullptr;
  std::unique_ptr<Buffer> patterns;
  LogicalDevice() = default;
  LogicalDevice(const LogicalDevice&) = delete;
  LogicalDevice& operator=(const LogicalDevice&) = delete;
  ~LogicalDevice() {
    patterns.reset();
    if (device) vkDestroyDevice(device, nullptr);
  }
  template <class Check>
  void open(const Physical& pd, std::uint32_t host_type, Check&& check) {
    std::vector<const char*> extensions;
    if (pd.push_descriptor) extensions.push_back(VK_KHR_PUSH_DESCRIPTOR_EXTENSION_NAME);
    device = create_device(pd.handle, pd.family, extensions, check);
    vkGetDeviceQueue(device, pd.family, 0, &queue);
    if (pd.push_descriptor)
      push_descriptor_fn = reinterpret_cast<PFN_vkCmdPushDescriptorSetKHR>(
          vkGetDeviceProcAddr(device, "vkCmdPushDescriptorSetKHR"));
    patterns = std::make_unique<Buffer>();
    if (!allocate(*patterns, device, 1024, host_type, true, check))
      check(VK_ERROR_OUT_OF_HOST_MEMORY, "vkAllocateMemory (the fill patterns)");
    write_fill_patterns(patterns->host);
  }
};

// A query pool of one timestamp (an event's).
template <class Check>
VkQueryPool create_timestamp(VkDevice device, Check&& check) {
  VkQueryPoolCreateInfo qi{VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO, nullptr, 0, VK_QUERY_TYPE_TIMESTAMP, 1};
  VkQueryPool q = VK_NULL_HANDLE;
  if (VkResult r = vkCreateQueryPool(device, &qi, nullptr, &q); r != VK_SUCCESS) check(r, "vkCreateQueryPool");
  return q;
}
// The same, destroyed with the object.
struct Timestamp {
  VkDevice device = VK_NULL_HANDLE;
  VkQueryPool pool = VK_NULL_HANDLE;
  template <class Check>
  Timestamp(VkDevice d, Check&& check) : device(d), pool(create_timestamp(d, check)) {}
  Timestamp(const Timestamp&) = delete;
  Timestamp& operator=(const Timestamp&) = delete;
  ~Timestamp() { vkDestroyQueryPool(device, pool, nullptr); }
};
inline void write_timestamp(VkCommandBuffer cb, VkQueryPool q) {
  vkCmdResetQueryPool(cb, q, 0, 1);
  vkCmdWriteTimestamp(cb, VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, q, 0);
}
// The timestamp in ticks; nullopt while its command has not run.
template <class Check>
std::optional<std::uint64_t> read_timestamp(VkDevice device, VkQueryPool q, Check&& check) {
  std::uint64_t t = 0;
  VkResult r = vkGetQueryPoolResults(device, q, 0, 1, sizeof t, &t, sizeof t, VK_QUERY_RESULT_64_BIT);
  if (r == VK_NOT_READY) return std::nullopt;
  if (r != VK_SUCCESS) check(r, "vkGetQueryPoolResults");
  return t;
}

// A compute pipeline from SPIR-V whose `bindings` storage buffers (set 0,
// bindings 0..bindings-1) are push descriptors and whose parameters are
// `push_bytes` of push constants. Kept, not destroyed, unless destroy()ed.
struct ComputePipeline {
  VkShaderModule module = VK_NULL_HANDLE;
  VkDescriptorSetLayout set_layout = VK_NULL_HANDLE;
  VkPipelineLayout layout = VK_NULL_HANDLE;
  VkPipeline pipeline = VK_NULL_HANDLE;
  std::uint32_t bindings = 0, push_bytes = 0;
};
inline constexpr std::uint32_t kMaxBindings = 8;

// Creates `pl` (at most kMaxBindings bindings) from `code` (`bytes` long),
// its specialization constant 0 (32 bits) set to `*constant` where given.
template <class Check>
void create_pipeline(VkDevice device, ComputePipeline& pl, const std::uint32_t* code, std::size_t bytes,
                     std::uint32_t bindings, std::uint32_t push_bytes,
                     std::optional<std::uint32_t> constant, Check&& check) {
  pl.bindings = bindings;
  pl.push_bytes = push_bytes;
  auto ok = [&](VkResult r, const char* fn) { if (r != VK_SUCCESS) check(r, fn); };
  VkShaderModuleCreateInfo mi{VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO, nullptr, 0, bytes, code};
  ok(vkCreateShaderModule(device, &mi, nullptr, &pl.module), "vkCreateShaderModule");
  std::array<VkDescriptorSetLayoutBinding, kMaxBindings> b{};
  for (std::uint32_t i = 0; i < bindings; ++i)
    b[i] = {i, VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, 1, VK_SHADER_STAGE_COMPUTE_BIT, nullptr};
  VkDescriptorSetLayoutCreateInfo li{VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO, nullptr,
                                     VK_DESCRIPTOR_SET_LAYOUT_CREATE_PUSH_DESCRIPTOR_BIT_KHR,
                                     bindings, b.data()};
  ok(vkCreateDescriptorSetLayout(device, &li, nullptr, &pl.set_layout), "vkCreateDescriptorSetLayout");
  VkPushConstantRange range{VK_SHADER_STAGE_COMPUTE_BIT, 0, push_bytes};
  VkPipelineLayoutCreateInfo pi{VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO, nullptr, 0, 1,
                                &pl.set_layout, push_bytes ? 1u : 0u, &range};
  ok(vkCreatePipelineLayout(device, &pi, nullptr, &pl.layout), "vkCreatePipelineLayout");
  VkSpecializationMapEntry entry{0, 0, sizeof(std::uint32_t)};
  std::uint32_t value = constant.value_or(0);
  VkSpecializationInfo spec{1, &entry, sizeof value, &value};
  VkComputePipelineCreateInfo ci{VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO};
  ci.stage = {VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO, nullptr, 0,
              VK_SHADER_STAGE_COMPUTE_BIT, pl.module, "main", constant ? &spec : nullptr};
  ci.layout = pl.layout;
  ok(vkCreateComputePipelines(device, VK_NULL_HANDLE, 1, &ci, nullptr, &pl.pipeline),
     "vkCreateComputePipelines");
}

inline void destroy(VkDevice device, ComputePipeline& pl) {
  vkDestroyPipeline(device, pl.pipeline, nullptr);
  vkDestroyPipelineLayout(device, pl.layout, nullptr);
  vkDestroyDescriptorSetLayout(device, pl.set_layout, nullptr);
  vkDestroyShaderModule(device, pl.module, nullptr);
  pl = ComputePipeline{};
}

// Records on `cb` a barrier (earlier compute and transfer writes visible to
// the dispatch), the pipeline, its pl.bindings `buffers` as push
// descriptors (`push_set`: vkCmdPushDescriptorSetKHR of the device), its
// push constants and vkCmdDispatch(x, y, 1).
inline void dispatch(VkCommandBuffer cb, PFN_vkCmdPushDescriptorSetKHR push_set,
                     const ComputePipeline& pl, const VkDescriptorBufferInfo* buffers,
                     const void* push, std::uint32_t x, std::uint32_t y) {
  VkMemoryBarrier barrier{VK_STRUCTURE_TYPE_MEMORY_BARRIER, nullptr,
                          VK_ACCESS_SHADER_WRITE_BIT | VK_ACCESS_TRANSFER_WRITE_BIT,
                          VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT};
  vkCmdPipelineBarrier(cb, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | VK_PIPELINE_STAGE_TRANSFER_BIT,
                       VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT, 0, 1, &barrier, 0, nullptr, 0, nullptr);
  std::array<VkWriteDescriptorSet, kMaxBindings> writes{};
  for (std::uint32_t i = 0; i < pl.bindings; ++i)
    writes[i] = {VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, nullptr, VK_NULL_HANDLE, i, 0, 1,
                 VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, nullptr, &buffers[i], nullptr};
  vkCmdBindPipeline(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.pipeline);
  push_set(cb, VK_PIPELINE_BIND_POINT_COMPUTE, pl.layout, 0, pl.bindings, writes.data());
  if (pl.push_bytes)
    vkCmdPushConstants(cb, pl.layout, VK_SHADER_STAGE_COMPUTE_BIT, 0, pl.push_bytes, push);
  vkCmdDispatch(cb, x, y, 1);
}

}  // namespace support::vulkan
ACCELKIT_END_NAMESPACE

#pragma GCC diagnostic pop
