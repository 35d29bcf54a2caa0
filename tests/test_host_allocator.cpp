// The pinned host allocator (Note [Pinned host allocator]) on simdev.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using SimBackend = Backend<simdev::SimRuntime>;
using Host = HostAllocator<simdev::SimRuntime>;

using namespace accelkit_tests;
TEST_CASE("host allocator: power-of-two blocks are cached and reused") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b);
  void* p = h.allocate(0, 1000);
  CHECK(b.runtime().pinned_blocks() == 1);
  h.deallocate(p);
  CHECK(h.allocate(0, 700) == p);  // same 1 KiB class
  void* q = h.allocate(0, 1025);   // 2 KiB class: a new block
  CHECK(q != p);
  HostStats st = h.stats();
  CHECK(st.segment.current == 2);
  CHECK(st.reserved_bytes.current == 1024 + 2048);
  CHECK(st.allocation.current == 2);
  CHECK(st.num_host_alloc == 2);
  CHECK(h.is_allocation(q));
  h.deallocate(p);
  h.deallocate(q);
  CHECK(h.allocate(0, 0) == nullptr);
  h.empty_cache();
  st = h.stats();
  CHECK(st.reserved_bytes.current == 0);
  CHECK(st.num_host_free == 2);
  CHECK(b.runtime().pinned_blocks() == 0);
  CHECK(st.allocation.allocated == st.allocation.freed);
}

TEST_CASE("host allocator: a block used by a stream is reused only after the stream passes") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b);
  StreamHandle s = b.stream_create(1, 0);
  void* p = h.allocate(0, 4096);
  h.record_stream(p, 1, s);
  auto gate = b.runtime().hold(1, s);
  h.deallocate(p);
  void* q = h.allocate(0, 4096);
  CHECK(q != p);
  gate->open();
  b.stream_synchronize(1, s);
  CHECK(h.allocate(0, 4096) == p);
  CHECK_THROWS_AS(h.record_stream(p, 7, s), IndexError);
  h.deallocate(p);
  h.deallocate(q);
}

TEST_CASE("host allocator: pinned memory is a device's, cached and returned per device") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b);
  void* p0 = h.allocate(0, 4096);
  void* p1 = h.allocate(1, 4096);
  CHECK(h.device_of(p0) == std::optional<device_index>(0));
  CHECK(h.device_of(p1) == std::optional<device_index>(1));
  CHECK(h.device_of(static_cast<char*>(p0) + 1) == std::nullopt);
  h.deallocate(p0);
  void* again = h.allocate(1, 4096);  // device 0's cached block is not device 1's
  CHECK(again != p0);
  CHECK(h.stats().num_host_alloc == 3);
  CHECK(h.allocate(0, 4096) == p0);  // but device 0's is
  CHECK_THROWS_AS(h.allocate(2, 64), IndexError);
  h.deallocate(p0);
  h.deallocate(p1);
  h.deallocate(again);
  h.empty_cache();  // each block goes back to its own device (simdev checks)
  CHECK(b.runtime().pinned_blocks() == 0);
  CHECK(h.stats().num_host_free == 3);
}

TEST_CASE("simdev: pinned memory freed as another device's is refused; every device's copies use it") {
  SimBackend b(Environment::fixed({}), sim());
  void* p = b.raw_host_malloc(1, 4096);
  try {
    b.raw_host_free(0, p);
    FAIL("freed as another device's pinned memory");
  } catch (const DriverError& e) {
    CHECK(std::string(e.what()).find("is pinned memory of device 1, freed as device 0's") !=
          std::string::npos);
  }
  StreamHandle s = b.stream_create(0, 0);
  void* dev = b.raw_malloc(0, 4096);
  std::memset(p, 5, 4096);
  {
    auto gate = b.runtime().hold(0, s);  // a claimed copy is queued, not waited for
    b.memcpy_async(0, dev, p, 4096, CopyKind::host_to_device, s, true);
    gate->open();
  }
  b.stream_synchronize(0, s);
  std::vector<char> back(4096, 0);
  b.memcpy(0, back.data(), dev, 4096, CopyKind::device_to_host);
  CHECK(back == std::vector<char>(4096, 5));
  b.raw_free(0, dev, 4096);
  b.raw_host_free(1, p);
  CHECK(b.runtime().pinned_blocks() == 0);
}

TEST_CASE("host allocator: bad frees and huge sizes are clear errors") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b);
  void* p = h.allocate(0, 64);
  h.deallocate(p);
  CHECK_THROWS_AS(h.deallocate(p), RuntimeError);
  try {
    h.allocate(0, std::size_t{1} << 60);
    FAIL("huge pinned allocation succeeded");
  } catch (const OutOfMemoryError& e) {
    CHECK(std::string(e.what()).find("cannot allocate 1.00 EiB") != std::string::npos);
  }
  b.runtime().inject_fault("host_malloc");
  CHECK_THROWS_AS(h.allocate(0, 1 << 20), DriverError);
  CHECK(h.stats().segment.current == 1);  // only the cached 512 B block
  CHECK(h.allocate(0, 1 << 20) != nullptr);
}

TEST_CASE("host allocator: teardown returns every block to the driver, in use or not") {
  SimBackend b(Environment::fixed({}), sim());
  {
    Host h(b);
    void* kept = h.allocate(0, 4096);     // still allocated at teardown
    h.deallocate(h.allocate(0, 1 << 20));  // cached
    CHECK(kept != nullptr);
    CHECK(b.runtime().pinned_blocks() == 2);
  }
  CHECK(b.runtime().pinned_blocks() == 0);
}

TEST_CASE("host allocator: with caching off every block returns to the driver") {
  SimBackend b(Environment::fixed({{"SIMDEV_NO_MEMORY_CACHING", "1"}}), sim());
  Host h(b);
  for (int i = 0; i < 3; ++i) {
    void* p = h.allocate(0, 3000);
    CHECK(b.runtime().pinned_blocks() == 1);
    h.deallocate(p);
    CHECK(b.runtime().pinned_blocks() == 0);
  }
  CHECK(h.stats().num_host_alloc == 3);
  CHECK(h.stats().reserved_bytes.current == 0);
}

TEST_CASE("host allocator: threads allocating concurrently get distinct blocks") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b);
  std::vector<std::thread> threads;
  std::vector<int> bad(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      std::vector<unsigned char*> mine;
      for (int i = 0; i < 2000; ++i) {
        std::size_t size = 64u << (i % 8);
        auto* p = static_cast<unsigned char*>(h.allocate(0, size));
        p[0] = static_cast<unsigned char>(t);
        mine.push_back(p);
        if (mine.size() > 16) {
          if (mine.front()[0] != t) ++bad[static_cast<std::size_t>(t)];
          h.deallocate(mine.front());
          mine.erase(mine.begin());
        }
      }
      for (auto* p : mine) h.deallocate(p);
    });
  for (auto& t : threads) t.join();
  for (int v : bad) CHECK(v == 0);
  CHECK(h.stats().allocation.current == 0);
}
