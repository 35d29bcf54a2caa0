// PyTorch's allocator settings: parsing, their sources, size rounding, and
// each key's effect on the allocators (Note [Allocator configuration], Note
// [Run-time allocator settings]).
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>

#include "minimal_runtime.hpp"
#include "simdev_runtime.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

using namespace accelkit;
using memory_constants::kMiB;

using namespace accelkit_tests;
namespace {
AllocatorConfig parse(const std::string& text) {
  return AllocatorConfig::parse("acme", "ACME_ALLOC_CONF", text);
}
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ValueError& e) {
    CHECK(e.backend() == "acme");
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("alloc conf: PyTorch's keys set the policy") {
  AllocatorConfig c = parse(
      "max_split_size_mb:128, garbage_collection_threshold:0.6,max_non_split_rounding_mb:8,"
      "large_segment_size_mb:32,per_process_memory_fraction:0.5,expandable_segments:False,"
      "pinned_use_background_threads:False");
  CHECK(c.max_split_size == 128 * kMiB);
  CHECK(c.garbage_collection_threshold == Approx(0.6));
  CHECK(c.max_non_split_rounding == 8 * kMiB);
  CHECK(c.large_segment_size == 32 * kMiB);
  CHECK(c.memory_fraction == Approx(0.5));
  CHECK(c.caching);
  AllocatorConfig d = parse("");
  CHECK(d.max_split_size == std::numeric_limits<std::size_t>::max());
  CHECK(d.garbage_collection_threshold == 0.0);
}

TEST_CASE("alloc conf: roundup_power2_divisions takes one value or a list by interval") {
  AllocatorConfig all = parse("roundup_power2_divisions:4");
  for (std::size_t d : all.roundup_power2_divisions) CHECK(d == 4);
  AllocatorConfig list = parse("roundup_power2_divisions:[1:2,4:8,>:1]");
  CHECK(list.roundup_power2_divisions[0] == 2);   // [1, 2) MiB
  CHECK(list.roundup_power2_divisions[1] == 0);   // [2, 4) MiB unset
  CHECK(list.roundup_power2_divisions[2] == 8);   // [4, 8) MiB
  CHECK(list.roundup_power2_divisions[3] == 1);   // > : the rest
  CHECK(list.roundup_power2_divisions[15] == 1);
}

TEST_CASE("alloc conf: sizes round to 512 bytes, or to power-of-two divisions") {
  AllocatorConfig c;
  CHECK(c.round_size(1) == 512);
  CHECK(c.round_size(512) == 512);
  CHECK(c.round_size(513) == 1024);
  CHECK(c.round_size(3 * kMiB + 1) == 3 * kMiB + 512);
  AllocatorConfig p = parse("roundup_power2_divisions:4");
  // 1.3 MiB lies in [1, 2) MiB, whose quarter steps are 1.25, 1.5, 1.75 MiB.
  CHECK(p.round_size(static_cast<std::size_t>(1.3 * kMiB)) == kMiB + kMiB / 2);
  CHECK(p.round_size(5 * kMiB) == 5 * kMiB);  // already on a step
  CHECK(p.round_size(4 * kMiB) == 4 * kMiB);  // a power of two
  CHECK(p.round_size(1000) == 1024);          // small sizes: 512-byte steps
}

TEST_CASE("alloc conf: unknown keys and bad values are ValueErrors naming them") {
  CHECK(contains(error_of("max_split_size:128"),
                 "ACME_ALLOC_CONF='max_split_size:128': unknown key 'max_split_size'"));
  CHECK(contains(error_of("max_split_size_mb:abc"),
                 "max_split_size_mb expects a whole number in 1..1073741824, got 'abc'"));
  CHECK(contains(error_of("max_split_size_mb:19"),
                 "max_split_size_mb must be at least large_segment_size_mb (20), got '19'"));
  CHECK(contains(error_of("max_split_size_mb:-5"), "got '-5'"));
  CHECK(contains(error_of("garbage_collection_threshold:1.0"),
                 "garbage_collection_threshold expects a number in (0, 1), got '1.0'"));
  CHECK(contains(error_of("garbage_collection_threshold:0.5x"), "got '0.5x'"));
  CHECK(contains(error_of("per_process_memory_fraction:0"), "got '0'"));
  CHECK(contains(error_of("per_process_memory_fraction:nan"), "got 'nan'"));
  CHECK(contains(error_of("expandable_segments:maybe"), "expects True or False, got 'maybe'"));
  CHECK(contains(error_of("roundup_power2_divisions:3"), "3 is not a power of two"));
  CHECK(contains(error_of("roundup_power2_divisions:[3:4]"), "interval 3 MiB is not a power"));
  CHECK(contains(error_of("max_split_size_mb"), "missing value after 'max_split_size_mb'"));
  CHECK(contains(error_of("max_split_size_mb=128"), "unknown key 'max_split_size_mb=128'"));
  CHECK(contains(error_of("max_split_size_mb:128 garbage_collection_threshold:0.5"),
                 "got '128garbage_collection_threshold'"));
  CHECK(contains(error_of(":5"), "unexpected ':'"));
}

TEST_CASE("alloc conf: every key of c10 and CUDA is read, or refused saying why") {
  AllocatorConfig c = parse(
      "expandable_segments:True,pinned_use_background_threads:True,"
      "pinned_max_round_threshold_mb:4,pinned_max_cached_size_mb:64,backend:native,"
      "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False,"
      "graph_capture_record_stream_reuse:False,pinned_reserve_segment_size_mb:0,"
      "pinned_free_catch_all:False,throw_on_cudamalloc_oom:False,"
      "release_lock_on_hipmalloc:True,pinned_use_hip_host_register:False");
  CHECK(c.expandable_segments);
  CHECK(c.pinned_use_background_threads);
  CHECK(c.pinned_max_round_threshold == 4 * kMiB);
  CHECK(c.pinned_max_cached_size == 64 * kMiB);
  CHECK(contains(error_of("backend:cudaMallocAsync"),
                 "backend:cudaMallocAsync is refused: the native caching allocator is the only"));
  CHECK(contains(error_of("release_lock_on_cudamalloc:False"),
                 "release_lock_on_cudamalloc:False is refused: the pool never holds a lock"));
  CHECK(contains(error_of("pinned_use_cuda_host_register:True"),
                 "pinned_use_cuda_host_register:True is refused: pinned memory comes from"));
  CHECK(contains(error_of("pinned_num_register_threads:4"),
                 "pinned_num_register_threads:4 is refused"));
  CHECK(contains(error_of("graph_capture_record_stream_reuse:True"), "is refused"));
  CHECK(contains(error_of("pinned_reserve_segment_size_mb:64"), "is refused"));
  CHECK(contains(error_of("pinned_free_catch_all:True"), "is refused"));
  CHECK(contains(error_of("throw_on_cudamalloc_oom:True"), "is refused"));
  CHECK(contains(error_of("throw_on_cudamalloc_oom:yes"), "expects True or False, got 'yes'"));
  CHECK(contains(error_of("pinned_max_cached_size_mb:big"), "got 'big'"));
  CHECK(contains(error_of("large_segment_size_mb:10"), "got '10'"));  // c10: above 10
  CHECK(contains(error_of("large_segment_size_mb:32,max_split_size_mb:24"),
                 "max_split_size_mb must be at least large_segment_size_mb (32), got '24'"));
  CHECK(parse("max_split_size_mb:20").max_split_size == 20 * kMiB);  // c10's least
  // Each key c10 may not know is one the parser reads.
  for (std::string_view key : AllocatorConfig::kCudaKeys)
    CHECK_FALSE(contains(error_of(std::string(key) + ":0"), "unknown key"));
  CHECK(AllocatorConfig::names("a:1, per_process_memory_fraction:0.5", "per_process_memory_fraction"));
  CHECK_FALSE(AllocatorConfig::names("roundup_power2_divisions:[1:2]", "1"));
}

TEST_CASE("alloc conf: PYTORCH_ALLOC_CONF, or else PYTORCH_CUDA_ALLOC_CONF, then <NAME>_ALLOC_CONF "
          "key by key") {
  auto from = [](std::map<std::string, std::string> vars) {
    return AllocatorConfig::from_environment("acme", Environment::fixed(std::move(vars)));
  };
  AllocatorConfig all = from({{"PYTORCH_ALLOC_CONF", "max_split_size_mb:64,garbage_collection_threshold:0.5"},
                              {"PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:4"},
                              {"ACME_ALLOC_CONF", "max_split_size_mb:128"}});
  CHECK(all.max_split_size == 128 * kMiB);           // the backend's over PyTorch's
  CHECK(all.garbage_collection_threshold == Approx(0.5));  // PyTorch's, not named later
  CHECK(all.roundup_power2_divisions[0] == 0);        // the older name: unread
  AllocatorConfig old = from({{"PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:4"},
                              {"PYTORCH_HIP_ALLOC_CONF", "roundup_power2_divisions:8"}});
  CHECK(old.roundup_power2_divisions[0] == 4);
  CHECK(from({{"PYTORCH_HIP_ALLOC_CONF", "roundup_power2_divisions:8"}})
            .roundup_power2_divisions[0] == 8);
  AllocatorConfig empty_new = from({{"PYTORCH_ALLOC_CONF", ""},
                                    {"PYTORCH_CUDA_ALLOC_CONF", "roundup_power2_divisions:4"}});
  CHECK(empty_new.roundup_power2_divisions[0] == 0);  // set, though empty
  try {
    from({{"PYTORCH_ALLOC_CONF", "max_split_size_mb:64,typo:1"}});
    FAIL("an unknown key was accepted");
  } catch (const ValueError& e) {
    CHECK(contains(e.what(), "acme: PYTORCH_ALLOC_CONF='max_split_size_mb:64,typo:1': unknown key 'typo'"));
  }
  try {
    from({{"PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:2"}});
    FAIL("a bad value was accepted");
  } catch (const ValueError& e) {
    CHECK(contains(e.what(), "PYTORCH_CUDA_ALLOC_CONF='garbage_collection_threshold:2'"));
  }
}

TEST_CASE("alloc conf: read from the backend's variables") {
  AllocatorConfig c = AllocatorConfig::from_environment(
      "acme", Environment::fixed({{"ACME_ALLOC_CONF", "max_split_size_mb:64"},
                                  {"ACME_NO_MEMORY_CACHING", "1"}}));
  CHECK(c.max_split_size == 64 * kMiB);
  CHECK_FALSE(c.caching);
  CHECK(AllocatorConfig::from_environment("acme", Environment::fixed({})).caching);
  try {
    AllocatorConfig::from_environment("acme",
                                      Environment::fixed({{"ACME_NO_MEMORY_CACHING", "yes"}}));
    FAIL("a malformed switch was accepted");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()) == "acme: ACME_NO_MEMORY_CACHING='yes': expected 1 or 0");
  }
}

// ---------------------------------------------------------------------------
// Each key's effect on the allocators: every test fails where its key is read
// and then ignored.
namespace {
using SimBackend = Backend<simdev::SimRuntime>;
using Allocator = DeviceCachingAllocator<simdev::SimRuntime>;
using Host = HostAllocator<simdev::SimRuntime>;
AllocatorConfig sim_conf(const std::string& text) {
  return AllocatorConfig::parse("simdev", "SIMDEV_ALLOC_CONF", text);
}
constexpr auto all = static_cast<std::size_t>(StatType::aggregate);

// Forgets the strings applied to AllocatorSettings::process() by a test.
struct ForgetApplied {
  ~ForgetApplied() { AllocatorSettings::process().forget_applied(); }
};

// Whether a 12 MiB request after a freed 40 MiB block splits that block.
bool splits_large_block(Allocator& a, StreamHandle s) {
  void* p = a.allocate(40 * kMiB, s);
  a.deallocate(p);
  void* q = a.allocate(12 * kMiB, s);
  a.deallocate(q);
  a.empty_cache();
  return q == p;
}
}  // namespace

TEST_CASE("alloc conf effect: max_split_size_mb keeps big blocks whole") {
  SimBackend b(Environment::fixed({}), sim(1, 128));
  StreamHandle s = b.stream_create(0, 0);
  Allocator plain(b, 0, AllocatorConfig{});
  CHECK(splits_large_block(plain, s));
  Allocator limited(b, 0, sim_conf("max_split_size_mb:32"));
  CHECK_FALSE(splits_large_block(limited, s));
  CHECK(limited.stats().max_split_size == 32 * static_cast<std::int64_t>(kMiB));
}

TEST_CASE("alloc conf effect: max_non_split_rounding_mb bounds the waste of an unsplit block") {
  SimBackend b(Environment::fixed({}), sim(1, 256));
  StreamHandle s = b.stream_create(0, 0);
  auto reuses = [&](const std::string& text) {
    Allocator a(b, 0, sim_conf(text));
    void* p = a.allocate(40 * kMiB, s);
    a.deallocate(p);
    void* q = a.allocate(36 * kMiB, s);  // 4 MiB less than the cached block
    a.deallocate(q);
    return q == p;
  };
  CHECK(reuses("max_split_size_mb:32"));  // within the default 20 MiB
  CHECK_FALSE(reuses("max_split_size_mb:32,max_non_split_rounding_mb:2"));
}

TEST_CASE("alloc conf effect: roundup_power2_divisions rounds request sizes") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  StreamHandle s = b.stream_create(0, 0);
  const auto bytes = static_cast<std::size_t>(1.1 * kMiB);
  auto allocated = [&](const std::string& text) {
    Allocator a(b, 0, sim_conf(text));
    void* p = a.allocate(bytes, s);
    std::int64_t n = a.stats().allocated_bytes[all].current;
    a.deallocate(p);
    return n;
  };
  CHECK(allocated("") == static_cast<std::int64_t>((bytes + 511) / 512 * 512));
  CHECK(allocated("roundup_power2_divisions:4") == static_cast<std::int64_t>(kMiB + kMiB / 4));
  CHECK(allocated("roundup_power2_divisions:[1:2,>:4]") == static_cast<std::int64_t>(kMiB + kMiB / 2));
}

TEST_CASE("alloc conf effect: garbage_collection_threshold frees old cache before growing") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  StreamHandle s = b.stream_create(0, 0);
  auto reserved_after = [&](const std::string& text) {
    Allocator a(b, 0, sim_conf(text));
    void* x = a.allocate(12 * kMiB, s);
    a.deallocate(x);                     // 12 MiB cached
    void* y = a.allocate(22 * kMiB, s);  // 12 + 22 MiB > half of 64
    std::size_t r = a.reserved_bytes();
    a.deallocate(y);
    return r;
  };
  CHECK(reserved_after("") == 34 * kMiB);
  CHECK(reserved_after("garbage_collection_threshold:0.5") == 22 * kMiB);
}

TEST_CASE("alloc conf effect: per_process_memory_fraction caps reserved memory") {
  SimBackend b(Environment::fixed({}), sim(1, 64));
  StreamHandle s = b.stream_create(0, 0);
  Allocator a(b, 0, sim_conf("per_process_memory_fraction:0.25"));
  CHECK(a.memory_limit() == 16 * kMiB);
  CHECK(a.memory_fraction() == Approx(0.25));
  CHECK_THROWS_AS(a.allocate(20 * kMiB, s), OutOfMemoryError);
  a.deallocate(a.allocate(12 * kMiB, s));
}

TEST_CASE("alloc conf effect: large_segment_size_mb caps the segments of 1-10 MiB requests") {
  // A 1-10 MiB request's segment grows with the pool to a 32nd of what it
  // reserves (Note [Segment sizes]), up to large_segment_size_mb: 384 MiB
  // reserved ask for 12 MiB.
  SimBackend b(Environment::fixed({}), sim(1, 512));
  StreamHandle s = b.stream_create(0, 0);
  auto segment = [&](const std::string& text) {
    Allocator a(b, 0, sim_conf(text));
    void* big = a.allocate(384 * kMiB, s);
    void* p = a.allocate(2 * kMiB, s);
    std::size_t seg = a.reserved_bytes() - 384 * kMiB;
    a.deallocate(p);
    a.deallocate(big);
    return seg;
  };
  CHECK(segment("") == 12 * kMiB);
  CHECK(segment("large_segment_size_mb:11") == 11 * kMiB);
}

TEST_CASE("alloc conf effect: expandable_segments reaches the allocator") {
  // A runtime without the virtual-memory members refuses it, naming them.
  Backend<minimal::MinimalRuntime> m(Environment::fixed({}));
  try {
    CachingAllocator<minimal::MinimalRuntime> pools(m, sim_conf("expandable_segments:True"));
    FAIL("expandable segments were accepted without virtual memory");
  } catch (const NotSupportedError& e) {
    CHECK(contains(e.what(), "minimal: expandable_segments:True needs the runtime's virtual-memory"));
    CHECK(contains(e.what(), "vm_reserve"));
  }
  // The environment's setting arrives in every device's allocator.
  CachingAllocator<minimal::MinimalRuntime> pools(
      m, AllocatorConfig::from_environment(
             "minimal", Environment::fixed({{"MINIMAL_ALLOC_CONF", "expandable_segments:False"}})));
  CHECK_FALSE(pools.device(0).config().expandable_segments);
  AllocatorConfig on = sim_conf("expandable_segments:True");
  CHECK_THROWS_AS(pools.set_config(on), NotSupportedError);
  CHECK_FALSE(pools.config().expandable_segments);  // nothing changed
  // A runtime with them grows expandable segments, from the start or once
  // set at run time.
  if constexpr (Backend<simdev::SimRuntime>::has_virtual_memory()) {
    SimBackend b(Environment::fixed({}), sim(1, 128));
    StreamHandle s = b.stream_create(0, 0);
    auto expandable = [&](Allocator& a) {
      void* p = a.allocate(12 * kMiB, s);
      bool any = false;
      for (const SegmentSnapshot& seg : a.snapshot().segments) any = any || seg.expandable;
      a.deallocate(p);
      a.empty_cache();
      return any;
    };
    Allocator from_start(b, 0, on);
    CHECK(expandable(from_start));
    Allocator later(b, 0, AllocatorConfig{});
    CHECK_FALSE(expandable(later));
    later.set_config(on);
    CHECK(expandable(later));
  }
}

TEST_CASE("alloc conf effect: set_config changes a live allocator") {
  SimBackend b(Environment::fixed({}), sim(1, 128));
  StreamHandle s = b.stream_create(0, 0);
  Allocator a(b, 0, AllocatorConfig{});
  CHECK(splits_large_block(a, s));
  a.set_config(sim_conf("max_split_size_mb:32,per_process_memory_fraction:0.5"));
  CHECK_FALSE(splits_large_block(a, s));
  CHECK(a.memory_limit() == 64 * kMiB);
  AllocatorConfig off;
  off.caching = false;
  CHECK_THROWS_AS(a.set_config(off), ValueError);
  AllocatorConfig bad = a.config();
  bad.memory_fraction = 2.0;
  CHECK_THROWS_AS(a.set_config(bad), ValueError);
  CHECK(a.config().max_split_size == 32 * kMiB);  // unchanged by the refusals
}

TEST_CASE("alloc conf effect: set_config while other threads allocate") {
  SimBackend b(Environment::fixed({}), sim(1, 256));
  Allocator a(b, 0, AllocatorConfig{});
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      StreamHandle s = b.stream_create(0, 0);
      std::size_t i = 0;
      while (!stop.load()) {
        ++i;
        std::size_t n = (i % 7 + 1) * (t ? 3 * kMiB : 100 * 1024) + 512 * (i % 13);
        a.deallocate(a.allocate(n, s));
      }
    });
  for (int i = 0; i < 200; ++i)
    a.set_config(sim_conf(i % 2 ? "max_split_size_mb:24,roundup_power2_divisions:4,"
                                  "garbage_collection_threshold:0.5,large_segment_size_mb:16"
                                : "roundup_power2_divisions:[1:2,>:8]"));
  stop = true;
  for (auto& t : threads) t.join();
  a.empty_cache();
  CHECK(a.reserved_bytes() == 0);
}

TEST_CASE("alloc conf: settings applied at run time reach every allocator, now and later") {
  ForgetApplied forget;
  SimBackend b(Environment::fixed({}), sim(2, 128));
  StreamHandle s = b.stream_create(0, 0);
  CachingAllocator<simdev::SimRuntime> pools(b, AllocatorConfig{});
  Allocator& d0 = pools.device(0);
  CHECK(splits_large_block(d0, s));
  AllocatorSettings::process().apply("simdev", "settings", "max_split_size_mb:32");
  CHECK_FALSE(splits_large_block(d0, s));                      // the live allocator
  CHECK(pools.device(1).config().max_split_size == 32 * kMiB);  // one made later
  // Over the current settings, key by key; the fraction reaches every device.
  AllocatorSettings::process().apply("simdev", "settings", "per_process_memory_fraction:0.5");
  CHECK(d0.config().max_split_size == 32 * kMiB);
  CHECK(d0.memory_limit() == 64 * kMiB);
  CHECK(pools.device(1).memory_fraction() == Approx(0.5));
  // A malformed string changes nothing.
  try {
    AllocatorSettings::process().apply("simdev", "settings", "max_split_size_mb:64,oops:1");
    FAIL("an unknown key was accepted");
  } catch (const ValueError& e) {
    CHECK(contains(e.what(), "unknown key 'oops'"));
  }
  CHECK(d0.config().max_split_size == 32 * kMiB);
  // A key one listener refuses changes no allocator.
  {
    Backend<minimal::MinimalRuntime> m(Environment::fixed({}));
    CachingAllocator<minimal::MinimalRuntime> other(m, AllocatorConfig{});
    CHECK(other.config().max_split_size == 32 * kMiB);  // made later: starts from them
    CHECK_THROWS_AS(AllocatorSettings::process().apply(
                        "simdev", "settings", "max_split_size_mb:48,expandable_segments:True"),
                    NotSupportedError);
    CHECK(d0.config().max_split_size == 32 * kMiB);
    CHECK(other.config().max_split_size == 32 * kMiB);
  }
  CHECK(AllocatorSettings::process().applied().size() == 2);
  // A pinned key reaches the pinned allocator.
  Host h(b);
  AllocatorSettings::process().apply("simdev", "settings", "pinned_max_round_threshold_mb:1");
  void* p = h.allocate(0, 3 * kMiB / 2);
  CHECK(h.stats().reserved_bytes.current == static_cast<std::int64_t>(3 * kMiB / 2));
  h.deallocate(p);
}

TEST_CASE("alloc conf effect: pinned_max_round_threshold_mb stops rounding big requests") {
  SimBackend b(Environment::fixed({}), sim());
  auto reserved = [&](const std::string& text, std::size_t bytes) {
    Host h(b, sim_conf(text));
    void* p = h.allocate(0, bytes);
    std::int64_t r = h.stats().reserved_bytes.current;
    h.deallocate(p);
    void* q = h.allocate(0, bytes - bytes / 4);  // the cached block serves a smaller one
    CHECK(q == p);
    h.deallocate(q);
    return r;
  };
  CHECK(reserved("", 3 * kMiB / 2) == static_cast<std::int64_t>(2 * kMiB));
  CHECK(reserved("pinned_max_round_threshold_mb:1", 3 * kMiB / 2) ==
        static_cast<std::int64_t>(3 * kMiB / 2));
  CHECK(reserved("pinned_max_round_threshold_mb:1", 1000) == 1024);  // below it: rounded
}

TEST_CASE("alloc conf effect: pinned_max_cached_size_mb returns big freed blocks") {
  SimBackend b(Environment::fixed({}), sim());
  Host h(b, sim_conf("pinned_max_cached_size_mb:1"));
  void* big = h.allocate(0, 3 * kMiB);
  void* small = h.allocate(0, 4096);
  CHECK(h.stats().reserved_bytes.current == static_cast<std::int64_t>(3 * kMiB + 4096));
  h.deallocate(big);
  h.deallocate(small);
  HostStats st = h.stats();
  CHECK(st.reserved_bytes.current == 4096);  // the big block went back; the small one stays
  CHECK(st.num_host_free == 1);
  // One used on a stream goes back once that stream passes.
  StreamHandle s = b.stream_create(0, 0);
  void* used = h.allocate(0, 3 * kMiB);
  h.record_stream(used, 0, s);
  auto gate = b.runtime().hold(0, s);
  h.deallocate(used);
  CHECK(h.stats().reserved_bytes.current == static_cast<std::int64_t>(3 * kMiB + 4096));
  gate->open();
  b.stream_synchronize(0, s);
  h.empty_cache();
  CHECK(h.stats().reserved_bytes.current == 0);
  CHECK(h.stats().num_host_free == 3);
}

TEST_CASE("alloc conf effect: pinned_use_background_threads returns freed blocks by itself") {
  SimBackend b(Environment::fixed({}), sim());
  StreamHandle s = b.stream_create(0, 0);
  auto pending_after_stream = [&](Host& h) {
    void* p = h.allocate(0, 4096);
    h.record_stream(p, 0, s);
    auto gate = b.runtime().hold(0, s);
    h.deallocate(p);
    CHECK(h.pending_frees() == 1);
    gate->open();
    b.stream_synchronize(0, s);
    // No call of the allocator's but this one, which looks without processing.
    for (int i = 0; i < 500 && h.pending_frees() != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return h.pending_frees();
  };
  Host plain(b, AllocatorConfig{});
  CHECK(pending_after_stream(plain) == 1);  // waits for the next allocation
  Host background(b, sim_conf("pinned_use_background_threads:True"));
  CHECK(pending_after_stream(background) == 0);
  void* q = background.allocate(0, 4096);  // the block came back to the cache
  CHECK(background.stats().num_host_alloc == 1);
  background.deallocate(q);
  // Turned off at run time: the thread stops; on again: it runs again.
  AllocatorConfig off = background.config();
  off.pinned_use_background_threads = false;
  background.set_config(off);
  CHECK(pending_after_stream(background) == 1);
  AllocatorConfig on = background.config();
  on.pinned_use_background_threads = true;
  background.set_config(on);
  for (int i = 0; i < 500 && background.pending_frees() != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  CHECK(background.pending_frees() == 0);
}
