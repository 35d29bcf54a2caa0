// support/vulkan.hpp on the machine's Vulkan device (lavapipe here): memory
// types, a device, buffers, a timeline stream's byte fill and copy, its
// waits across streams, a failure marked on queued work, timestamps, the
// allocations a runtime hands out by address and their storage-buffer
// bindings.
#include "catch.hpp"

#include <accelkit/support/vulkan.hpp>

#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace vulkan = accelkit::support::vulkan;

namespace {
auto check = [](VkResult r, const char* fn) {
  throw std::runtime_error(std::string(fn) + ": " + vulkan::result_name(r));
};
auto no_loss = [](const std::string& call) { FAIL("no failure was marked, yet " << call << " failed"); };
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

TEST_CASE("support: a Vulkan logical device's timeline streams fill bytes at any offset, copy, wait for each other, time their work and report a failure of queued work once") {
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
  auto physical = vulkan::describe(pd);
  REQUIRE(physical);
  CHECK(physical->family == *family);
  {
    vulkan::LogicalDevice logical;
    logical.open(*physical, *host, check);
    CHECK((logical.push_descriptor_fn != nullptr) == physical->push_descriptor);
    VkDevice dev = logical.device;
    {
      vulkan::Buffer out, device_side;
      auto& patterns = *logical.patterns;
      CHECK(static_cast<unsigned char*>(patterns.host)[4 * 0xab + 3] == 0xab);
      REQUIRE(vulkan::allocate(out, dev, 64, *host, true, check));
      REQUIRE(vulkan::allocate(device_side, dev, 61, *local, false, check));  // rounded up to 64
      std::memset(out.host, 0, 64);
      auto a = std::make_shared<vulkan::TimelineStream>(dev, *family, logical.queue, logical.queue_mutex, check);
      auto b = std::make_shared<vulkan::TimelineStream>(dev, *family, logical.queue, logical.queue_mutex, check);
      vulkan::Timestamp stamp0(dev, check), stamp1(dev, check);
      VkQueryPool t0 = stamp0.pool, t1 = stamp1.pool;
      std::uint64_t filled = 0;
      {
        std::lock_guard<std::mutex> lock(a->mutex);
        VkCommandBuffer cb = a->commands(check);
        vulkan::write_timestamp(cb, t0);
        vulkan::fill_bytes(cb, device_side.buffer, 0, 64, 0x11, patterns.buffer);
        cb = a->commands(check);  // a second record: after a barrier
        vulkan::fill_bytes(cb, device_side.buffer, 3, 54, 0xab, patterns.buffer);  // unaligned both ends
        filled = a->submit_to(check);
      }
      b->wait_event(a, filled, check, no_loss);
      VkBufferCopy c{0, 0, 64};
      b->record(32, check, [&](VkCommandBuffer cb) { vkCmdCopyBuffer(cb, device_side.buffer, out.buffer, 1, &c); });
      b->record(32, check, [&](VkCommandBuffer cb) { vulkan::write_timestamp(cb, t1); });
      std::uint64_t done = b->flush(check);
      CHECK(done == 1);
      b->wait_until(done, check, no_loss);
      CHECK(vulkan::counter(dev, b->timeline, check) >= done);
      CHECK(b->reached(done, check, no_loss));
      auto* bytes = static_cast<unsigned char*>(out.host);
      for (int i = 0; i < 64; ++i) CHECK(int(bytes[i]) == (i >= 3 && i < 57 ? 0xab : 0x11));
      auto s0 = vulkan::read_timestamp(dev, t0, check), s1 = vulkan::read_timestamp(dev, t1, check);
      if (qf.timestampValidBits) {
        REQUIRE((s0 && s1));
        CHECK(*s1 >= *s0);
      }

      // A failure marked on queued work goes to `lost` once, at the first
      // query or wait that sees the counter pass it; a record past the batch
      // size submits by itself.
      std::vector<std::string> lost;
      auto lose = [&](const std::string& call) { lost.push_back(call); };
      b->record(1, check, [&](VkCommandBuffer cb) { vkCmdCopyBuffer(cb, device_side.buffer, out.buffer, 1, &c); });
      CHECK(b->submitted() == done + 1);
      b->record(32, check, [&](VkCommandBuffer cb) { vkCmdCopyBuffer(cb, device_side.buffer, out.buffer, 1, &c); });
      b->fail_queued("memcpy_async");
      b->synchronize(check, lose);
      CHECK(lost == std::vector<std::string>{"memcpy_async"});
      CHECK(b->reached(b->submitted(), check, lose));
      CHECK(lost.size() == 1);
    }
  }  // the device goes with `logical`, after its patterns
  vkDestroyInstance(instance, nullptr);
}

TEST_CASE("support: Vulkan allocations are found by address, device and kind, and bound as storage buffers") {
  constexpr std::int64_t kCode = -1000011001;
  vulkan::Allocations space("vkt", kCode);
  auto dev0 = std::make_shared<vulkan::Allocation>();
  dev0->bytes = 1000;
  void* p = space.hand_out(dev0, 256, "malloc");  // not mapped: a fake address
  alignas(256) static char host_bytes[1024 + 256];
  auto pinned = std::make_shared<vulkan::Allocation>();
  pinned->ordinal = 1;
  pinned->pinned = true;
  pinned->bytes = 512;
  pinned->host = host_bytes + 3;  // mapped: its host address rounded up
  void* h = space.hand_out(pinned, 256, "host_malloc");
  CHECK(h == host_bytes + 256);
  CHECK(pinned->base == 253);
  auto at = space.owned(0, static_cast<char*>(p) + 100, 8, "memcpy");
  CHECK((at.first == dev0 && at.second == 100));
  vulkan::BufferRef r = space.span(1, static_cast<char*>(h) + 8, 16, "memcpy");
  CHECK((r.offset == 253 + 8 && r.bytes == 16));
  CHECK(space.pinned(1, static_cast<char*>(h) + 8, 16));
  CHECK_FALSE(space.pinned(0, static_cast<char*>(h) + 8, 16));  // another device's
  CHECK_FALSE(space.pinned(0, p, 16));                           // not pinned
  CHECK_FALSE(space.pinned(1, host_bytes + 1024 + 255, 1));        // past its end
  auto refused = [&](auto&& f, const std::string& what) {
    try {
      f();
      FAIL("no error");
    } catch (const accelkit::DriverError& e) {
      CHECK(e.code() == kCode);
      CHECK(std::string(e.what()).find(what) != std::string::npos);
    }
  };
  refused([&] { space.owned(1, p, 8, "memcpy"); }, "is memory of device 0, used on device 1");
  refused([&] { space.take(0, h, true, "host_free"); }, "was not returned by host_malloc(0, ·)");
  refused([&] { space.take(0, p, true, "host_free"); }, "was not returned by host_malloc(0, ·)");
  refused([&] { space.take(0, static_cast<char*>(p) + 4, false, "free"); }, "was not returned by malloc(0, ·)");
  CHECK(space.take(0, p, false, "free") == dev0);
  CHECK(space.take(1, h, true, "host_free") == pinned);
  CHECK(space.size() == 0);
  pinned->host = nullptr;  // no memory of a device behind it to unmap

  VkPhysicalDeviceLimits limits{};
  limits.minStorageBufferOffsetAlignment = 64;
  limits.maxStorageBufferRange = 1024;
  VkDescriptorBufferInfo info{};
  CHECK(vulkan::bind({VK_NULL_HANDLE, 200, 100}, limits, 4, info) == 2u);  // from 192: 2 floats in
  CHECK((info.offset == 192 && info.range == 108));
  CHECK_FALSE(vulkan::bind({VK_NULL_HANDLE, 202, 100}, limits, 4, info));   // not a float's offset
  CHECK_FALSE(vulkan::bind({VK_NULL_HANDLE, 200, 1020}, limits, 4, info));  // past the range
  CHECK(vulkan::bind({VK_NULL_HANDLE, 192, 1024}, limits, 4, info) == 0u);
}
