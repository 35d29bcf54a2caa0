// <NAME>_ALLOC_CONF parsing and size rounding (Note [Allocator configuration]).
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/memory/config.hpp>

#include <string>

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
                 "max_split_size_mb expects a whole number in 21..1073741824, got 'abc'"));
  CHECK(contains(error_of("max_split_size_mb:20"), "got '20'"));
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

TEST_CASE("alloc conf: unsupported features are refused, not ignored") {
  CHECK(parse("expandable_segments:True").expandable_segments);
  CHECK_THROWS_AS(parse("pinned_use_background_threads:True"), NotSupportedError);
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
