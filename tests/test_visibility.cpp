// Parsing of <NAME>_VISIBLE_DEVICES (Note [Visible devices]).
#include "catch.hpp"

#include <accelkit/device/visibility.hpp>

#include <string>
#include <vector>

using namespace accelkit;

namespace {
const std::vector<std::string> uuids = {
    "5d1dde00-0000-4000-8000-000000000000",
    "5d1dde00-0000-4000-8000-000000000001",
    "abcdef12-3456-4000-8000-00000000000f",
};
int uuid_calls = 0;

std::vector<int> parse(const std::string& value, int count = 3) {
  return parse_visible_devices("acme", "ACME_VISIBLE_DEVICES", value, count, [](int i) {
    ++uuid_calls;
    return uuids.at(static_cast<std::size_t>(i));
  });
}

// The ValueError message for `value`, or "" when it parsed.
std::string error_of(const std::string& value, int count = 3) {
  try {
    parse(value, count);
  } catch (const ValueError& e) {
    CHECK(e.backend() == "acme");
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("visibility: the variable is named after the backend") {
  CHECK(visible_devices_variable("simdev") == "SIMDEV_VISIBLE_DEVICES");
  CHECK(visible_devices_variable("acme_npu") == "ACME_NPU_VISIBLE_DEVICES");
}

TEST_CASE("visibility: indices filter and reorder") {
  CHECK(parse("0,1,2") == std::vector<int>{0, 1, 2});
  CHECK(parse("2,0") == std::vector<int>{2, 0});
  CHECK(parse("1") == std::vector<int>{1});
  CHECK(parse(" 2 , 1 ") == std::vector<int>{2, 1});
}

TEST_CASE("visibility: an empty value hides every device") {
  CHECK(parse("").empty());
  CHECK(parse("   ").empty());
}

TEST_CASE("visibility: UUIDs and unique UUID prefixes select devices, case-insensitively") {
  uuid_calls = 0;
  CHECK(parse("0,2") == std::vector<int>{0, 2});
  CHECK(uuid_calls == 0);  // indices alone never query properties
  CHECK(parse("5d1dde00-0000-4000-8000-000000000001") == std::vector<int>{1});
  CHECK(parse("ABCDEF12,0") == std::vector<int>{2, 0});
  CHECK(parse("abcd") == std::vector<int>{2});
}

TEST_CASE("visibility: malformed values are ValueErrors naming the variable and the entry") {
  std::string e = error_of("0,x");
  CHECK(e.find("ACME_VISIBLE_DEVICES='0,x'") != std::string::npos);
  CHECK(e.find("entry 'x'") != std::string::npos);
  CHECK(e.find("neither a device index") != std::string::npos);

  e = error_of("0,,1");
  CHECK(e.find("entry ''") != std::string::npos);
  CHECK(e.find("empty") != std::string::npos);
  CHECK(error_of("0,").find("empty") != std::string::npos);

  e = error_of("-1");
  CHECK(e.find("entry '-1'") != std::string::npos);

  e = error_of("3");
  CHECK(e.find("entry '3' is not a device: acme has 3 devices (indices 0..2)") !=
        std::string::npos);
  CHECK(error_of("99999999999999999999").find("is not a device") != std::string::npos);

  e = error_of("1,1");
  CHECK(e.find("names device 1 a second time") != std::string::npos);
  e = error_of("1,5d1dde00-0000-4000-8000-000000000001");
  CHECK(e.find("a second time") != std::string::npos);

  e = error_of("5d1dde00");
  CHECK(e.find("ambiguous") != std::string::npos);
  CHECK(e.find("devices 0 and 1") != std::string::npos);

  e = error_of("ffff0000");
  CHECK(e.find("entry 'ffff0000' matches the UUID of no device") != std::string::npos);

  CHECK(error_of("1.5").find("entry '1.5'") != std::string::npos);
  CHECK(error_of("0;1").find("entry '0;1'") != std::string::npos);
  CHECK(error_of("0", 0).find("acme has 0 devices") != std::string::npos);
}
