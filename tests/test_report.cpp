// The device and capability report.
#include "catch.hpp"
#include "support.hpp"

#include <accelkit/accelkit.hpp>
#include <accelkit/detail/json.hpp>

#include "simdev_runtime.hpp"

#include <string>

using namespace accelkit;
using SimBackend = Backend<simdev::SimRuntime>;

using namespace accelkit_tests;
namespace {
simdev::Config two_devices() {
  simdev::Config c;
  c.device_count = 2;
  c.memory_bytes = {32ull << 20, 64ull << 20};
  return c;
}
}  // namespace

TEST_CASE("report: JSON carries every schema field of every device") {
  SimBackend b(Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", "1,0"}}), two_devices());
  std::string j = report_json(b);
  CHECK(contains(j, "\"schema_version\": 5"));
  CHECK(contains(j, "\"dlpack_device_type\": 12"));
  CHECK(contains(j, "\"dlpack_pinned_device_type\": 1"));
  CHECK(contains(j, "\"host_access\": \"direct\""));
  CHECK(contains(j, "\"backend\": \"simdev\""));
  CHECK(contains(j, "\"visible_devices_variable\": \"SIMDEV_VISIBLE_DEVICES\""));
  CHECK(contains(j, "\"device_count\": 2"));
  CHECK(contains(j, "\"init_error\": null"));
  CHECK(contains(j, "\"index\": 0,\n      \"physical_index\": 1"));
  CHECK(contains(j, "\"total_memory\": 67108864"));  // logical 0 is physical 1
  CHECK(contains(j, "\"free_memory\": 67108864"));
  CHECK(contains(j, "\"pci_bus_id\": \"0000:11:00.0\""));
  CHECK(contains(j, "\"float8_e4m3fn\""));
  CHECK(contains(j, "\"levels\": 3"));
  CHECK(contains(j, "\"pytorch_most_urgent\": -2"));
  CHECK(contains(j, "\"event_timing\": true"));
  CHECK(contains(j, "\"simdev.host_memory_backed\": true"));
  CHECK(contains(j, "\"peer_access\": [\n    [\n      true,\n      true\n    ]"));
  CHECK(b.runtime().contexts_created() == 0);  // reporting created no context
}

namespace {
// simdev as a driver that tells no compute units and no clock rate, and
// leaves event_timing as DeviceProperties has it (it has event_elapsed_time).
struct Vague : simdev::SimRuntime, Runtime<Vague> {
  using SimRuntime::SimRuntime;
  DeviceProperties properties(device_index d) {
    DeviceProperties p = SimRuntime::properties(d);
    p.compute_units = 0;
    p.clock_rate_khz = 0;
    p.event_timing = DeviceProperties{}.event_timing;
    return p;
  }
};
}  // namespace

TEST_CASE("report: unknown compute units and clock rate are null and \"unknown\"") {
  Backend<Vague> b(Environment::fixed({}), two_devices());
  std::string j = report_json(b);
  CHECK(contains(j, "\"compute_units\": null"));
  CHECK(contains(j, "\"clock_rate_khz\": null"));
  std::string t = report_text(b);
  CHECK(contains(t, "unknown compute units, subgroup "));
  CHECK(contains(t, ", clock unknown, L2 "));
  CHECK_FALSE(contains(t, "0 MHz"));
  // A known clock rate is in MHz.
  SimBackend known(Environment::fixed({}), two_devices());
  CHECK(contains(report_text(known), ", 1000 MHz, L2 "));
}

TEST_CASE("report: a runtime with event_elapsed_time times events unless it says otherwise") {
  Backend<Vague> b(Environment::fixed({}), two_devices());
  CHECK(b.properties(0).event_timing);
  CHECK(contains(report_text(b), "event timing yes"));
  StreamHandle s = b.stream_create(0, 0);
  EventHandle e1 = b.event_create(0, EventFlags::timing), e2 = b.event_create(0, EventFlags::timing);
  b.event_record(0, e1, s);
  b.event_record(0, e2, s);
  b.stream_synchronize(0, s);
  CHECK(b.event_elapsed_time(0, e1, e2) >= 0);
  b.event_destroy(0, e1);
  b.event_destroy(0, e2);
  b.stream_destroy(0, s);
}

TEST_CASE("report: a failed discovery reports 0 devices and the reason") {
  SimBackend b(Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", "7"}}), two_devices());
  std::string j = report_json(b);
  CHECK(contains(j, "\"device_count\": 0"));
  CHECK(contains(j, "\"init_error\": \"simdev: SIMDEV_VISIBLE_DEVICES='7': entry '7' is not a "
                    "device: simdev has 2 devices (indices 0..1)\""));
  CHECK(contains(j, "\"devices\": []"));
  CHECK(contains(j, "\"peer_access\": null"));
  std::string t = report_text(b);
  CHECK(contains(t, "backend simdev: 0 visible devices"));
  CHECK(contains(t, "discovery failed: simdev: SIMDEV_VISIBLE_DEVICES='7'"));
}

TEST_CASE("report: text summary names each device and its capabilities") {
  SimBackend b(Environment::fixed({}), two_devices());
  std::string t = report_text(b);
  CHECK(contains(t, "backend simdev: 2 visible devices"));
  CHECK(contains(t, "simdev:0  SimDev S1 (accelkit, simdev-1)"));
  CHECK(contains(t, "memory 32 MiB total, 32 MiB free"));
  CHECK(contains(t, "simdev:1  SimDev S1"));
  CHECK(contains(t, "stream priorities 0..-2 (3 levels), event timing yes"));
  CHECK(contains(t, "DLPack device type kDLExtDev (12), pinned host memory kDLCPU (1)"));
  CHECK(contains(t, "peer access (row can access column):"));
}

TEST_CASE("report: the JSON writer escapes strings and nests containers") {
  detail::JsonWriter w;
  w.begin_object()
      .field("s", std::string("a\"b\\c\nd\x01"))
      .key("empty").begin_array().end_array()
      .key("list").begin_array().value(1).value(2.5).value(false).null().end_array()
      .end_object();
  CHECK(w.str() ==
        "{\n  \"s\": \"a\\\"b\\\\c\\nd\\u0001\",\n  \"empty\": [],\n  \"list\": [\n    1,\n    "
        "2.5,\n    false,\n    null\n  ]\n}");
}
