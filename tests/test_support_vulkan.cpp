// support/vulkan.hpp on the machine's Vulkan device (lavapipe here): memory
// types, a device, buffers, a timeline stream's byte fill and copy, its
// waits across streams, and timestamps.
#include "catch.hpp"

#include <accelkit/support/vulkan.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

namespace vulkan = accelkit::support::vulkan;

namespace {
auto check = [](VkResult r, const char* fn) {
  throw std::runtime_error(std::string(fn) + ": " + vulkan::result_name(r));
};
}  // namespace

TEST_CASE("support: Vulkan names results and versions, and picks memory types by need and preference") {
  CHECK(std::string(vulkan::result_name(VK_ERROR_DEVICE_LOST)) == "VK_ERROR_DEVICE_LOST");
  CHECK(std::string(vulkan::result_name(static_cast<VkResult>(-12345))) == "a Vulkan error");
  CHECK(vulkan::version(VK_MAKE_API_VERSION(0, 1, 3, 230)) == accelkit::Version{1, 3, 230});
  VkPhysicalDeviceMemoryProperties mp{};
  mp.memoryTypeCount = 3;
  mp.memoryTypes[0].propertyFlags = VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT;
  mp.memoryTypes[1].propertyFlags = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT;
  mp.memoryTypes[2].propertyFlags = VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_CACHED_BIT;
  CHECK(vulkan::memory_type(mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, 0) == 1u);
  CHECK(vulkan::memory_type(mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT, VK_MEMORY_PROPERTY_HOST_CACHED_BIT) == 2u);
  CHECK(vulkan::memory_type(mp, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) == 0u);
  CHECK_FALSE(vulkan::memory_type(mp, VK_MEMORY_PROPERTY_PROTECTED_BIT, 0));
}

TEST_CASE("support: a Vulkan timeline stream fills bytes at any offset, copies, waits for another stream and times its work") {
  VkInstance instance = vulkan::create_instance("accelkit test", VK_API_VERSION_1_2, check);
  if (!instance) {
    WARN("no Vulkan driver");
    return;
  }
  auto devices = vulkan::enumerate<VkPhysicalDevice>(vkEnumeratePhysicalDevices, instance);
  REQUIRE(!devices.empty());
  VkPhysicalDevice pd = devices[0];
  VkQueueFamilyProperties qf{};
  auto family = vulkan::compute_family(pd, &qf);
  REQUIRE(family);
  CHECK_FALSE(vulkan::has_extension(pd, "VK_no_such_extension"));
  VkPhysicalDeviceMemoryProperties mp;
  vkGetPhysicalDeviceMemoryProperties(pd, &mp);
  auto host = vulkan::memory_type(mp, VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | VK_MEMORY_PROPERTY_HOST_COHERENT_BIT, 0);
  auto local = vulkan::memory_type(mp, 0, VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT);
  REQUIRE((host && local));
  VkDevice dev = vulkan::create_device(pd, *family, {}, check);
  VkQueue queue;
  vkGetDeviceQueue(dev, *family, 0, &queue);
  std::mutex queue_mutex;
  {
    vulkan::Buffer patterns, out, device_side;
    REQUIRE(vulkan::allocate(patterns, dev, 1024, *host, true, check));
    REQUIRE(vulkan::allocate(out, dev, 64, *host, true, check));
    REQUIRE(vulkan::allocate(device_side, dev, 61, *local, false, check));  // rounded up to 64
    vulkan::write_fill_patterns(patterns.host);
    std::memset(out.host, 0, 64);
    auto a = std::make_shared<vulkan::TimelineStream>(dev, *family, check);
    auto b = std::make_shared<vulkan::TimelineStream>(dev, *family, check);
    VkQueryPool t0 = vulkan::create_timestamp(dev, check), t1 = vulkan::create_timestamp(dev, check);
    std::uint64_t filled = 0;
    {
      std::lock_guard<std::mutex> lock(a->mutex);
      VkCommandBuffer cb = a->commands(check);
      vulkan::write_timestamp(cb, t0);
      vulkan::fill_bytes(cb, device_side.buffer, 0, 64, 0x11, patterns.buffer);
      cb = a->commands(check);  // a second record: after a barrier
      vulkan::fill_bytes(cb, device_side.buffer, 3, 54, 0xab, patterns.buffer);  // unaligned both ends
      filled = a->submit_to(queue, queue_mutex, check);
    }
    {
      std::lock_guard<std::mutex> lock(b->mutex);
      b->wait_for(a, filled);
      VkBufferCopy c{0, 0, 64};
      VkCommandBuffer cb = b->commands(check);
      vkCmdCopyBuffer(cb, device_side.buffer, out.buffer, 1, &c);
      cb = b->commands(check);
      vulkan::write_timestamp(cb, t1);
      std::uint64_t done = b->submit_to(queue, queue_mutex, check);
      vulkan::wait(dev, b->timeline, done, check);
      CHECK(vulkan::counter(dev, b->timeline, check) >= done);
    }
    auto* bytes = static_cast<unsigned char*>(out.host);
    for (int i = 0; i < 64; ++i) CHECK(int(bytes[i]) == (i >= 3 && i < 57 ? 0xab : 0x11));
    auto s0 = vulkan::read_timestamp(dev, t0, check), s1 = vulkan::read_timestamp(dev, t1, check);
    if (qf.timestampValidBits) {
      REQUIRE((s0 && s1));
      CHECK(*s1 >= *s0);
    }
    vkDestroyQueryPool(dev, t0, nullptr);
    vkDestroyQueryPool(dev, t1, nullptr);
  }
  vkDestroyDevice(dev, nullptr);
  vkDestroyInstance(instance, nullptr);
}
