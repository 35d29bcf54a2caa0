// The capability schema: validation, dtype sets, typed extras.
#include "catch.hpp"

#include <accelkit/properties.hpp>

#include <string>

using namespace accelkit;

namespace {
DeviceProperties sound() {
  DeviceProperties p;
  p.name = "Acme A1";
  p.vendor = "Acme";
  p.architecture = "acme-2";
  p.uuid = "01234567-89ab-cdef-0123-456789abcdef";
  p.pci_bus_id = "0000:3b:00.0";
  p.driver_version = {1, 2, 3};
  p.runtime_version = {4, 5, 6};
  p.total_memory = 1ull << 30;
  p.max_allocation = 1ull << 29;
  p.compute_units = 8;
  p.subgroup_size = 32;
  p.clock_rate_khz = 1'500'000;
  p.l2_cache_bytes = 1 << 20;
  p.dtypes = {DType::float32, DType::float16, DType::complex64};
  p.stream_priorities = {0, -3};
  p.extras = {{"acme.tensor_cores", true}, {"acme.sram_bytes", std::int64_t{1} << 20}};
  return p;
}

// The single problem reported for `p`.
std::string only_problem(const DeviceProperties& p) {
  auto problems = property_problems(p, "acme");
  REQUIRE(problems.size() == 1);
  return problems[0];
}
}  // namespace

TEST_CASE("properties: uuid_from_bytes gives the canonical text of 16 bytes") {
  const unsigned char bytes[16] = {0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77,
                                   0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff};
  std::string text = uuid_from_bytes(bytes);
  CHECK(text == "00112233-4455-6677-8899-aabbccddeeff");
  CHECK(detail::is_canonical_uuid(text));
}

TEST_CASE("properties: a consistent schema passes validation") {
  CHECK(property_problems(sound(), "acme").empty());
  CHECK_NOTHROW(validate_properties(sound(), "acme", 0));
  auto p = sound();
  p.pci_bus_id.clear();  // not a PCI device
  CHECK(property_problems(p, "acme").empty());
}

TEST_CASE("properties: compute units and clock rate may be unknown (0)") {
  auto p = sound();
  p.compute_units = 0;
  p.clock_rate_khz = 0;
  CHECK(property_problems(p, "acme").empty());
  CHECK(DeviceProperties{}.compute_units == 0);
  CHECK(DeviceProperties{}.clock_rate_khz == 0);
}

TEST_CASE("properties: event_timing is true unless the runtime says its device cannot time") {
  // The SDK sets it false for a runtime without event_elapsed_time
  // (test_report.cpp, test_discovery.cpp).
  CHECK(DeviceProperties{}.event_timing);
}

TEST_CASE("properties: each inconsistency is reported in a clear sentence") {
  auto p = sound();
  p.max_allocation = p.total_memory + 1;
  CHECK(only_problem(p) == "max_allocation (1073741825) exceeds total_memory (1073741824)");

  p = sound();
  p.memory_alignment = 64;
  CHECK(only_problem(p) == "memory_alignment is 64 (must be a power of two, at least 128)");
  p.memory_alignment = 384;
  CHECK(only_problem(p) == "memory_alignment is 384 (must be a power of two, at least 128)");
  p.memory_alignment = 128;
  CHECK(property_problems(p, "acme").empty());

  p = sound();
  p.uuid = "not-a-uuid";
  CHECK(only_problem(p).find("uuid 'not-a-uuid'") != std::string::npos);

  p = sound();
  p.pci_bus_id = "3b:00.0";
  CHECK(only_problem(p).find("pci_bus_id '3b:00.0'") != std::string::npos);

  p = sound();
  p.subgroup_size = 24;
  CHECK(only_problem(p) == "subgroup_size is 24 (must be a power of two)");

  p = sound();
  p.compute_units = -1;
  CHECK(only_problem(p) == "compute_units is -1 (must be positive, or 0 when unknown)");

  p = sound();
  p.dtypes = {DType::float16};
  CHECK(only_problem(p) == "dtypes lacks float32, PyTorch's default dtype");

  p = sound();
  p.dtypes.add(DType::complex128);
  CHECK(only_problem(p) == "dtypes has complex128 but not its component type float64");

  p = sound();
  p.unified_memory = true;
  CHECK(only_problem(p) == "unified_memory is true but host_access is none, not direct");
  p.host_access = HostAccessLevel::mapped;
  CHECK(only_problem(p) == "unified_memory is true but host_access is mapped, not direct");
  p.host_access = HostAccessLevel::direct;
  CHECK(property_problems(p, "acme").empty());

  // host_visible_memory is the SDK's (derived from host_access).
  p = sound();
  p.host_visible_memory = true;
  CHECK(only_problem(p) ==
        "host_visible_memory is set by the runtime; the SDK derives it from host_access (set "
        "host_access = HostAccessLevel::direct instead)");

  p = sound();
  p.driver_version = {};
  CHECK(only_problem(p) == "driver_version is 0.0.0 (unset)");

  p = sound();
  p.clock_rate_khz = -5;
  CHECK(only_problem(p) == "clock_rate_khz is -5 (must be positive, or 0 when unknown)");

  p = sound();
  p.async_copy_engines = -1;
  CHECK(only_problem(p) == "async_copy_engines is -1 (must not be negative)");

  p = sound();
  p.l2_cache_bytes = p.total_memory * 2;
  CHECK(only_problem(p).find("l2_cache_bytes") == 0);

  p = sound();
  p.extras.push_back({"tensor_cores", false});
  CHECK(only_problem(p) ==
        "extra key 'tensor_cores' is not namespaced as 'acme.<name>' with [a-z0-9_] parts");
  p = sound();
  p.extras.push_back({"other.flag", false});
  CHECK(only_problem(p).find("'other.flag'") != std::string::npos);
  p = sound();
  p.extras.push_back({"acme.", false});
  CHECK(only_problem(p).find("'acme.'") != std::string::npos);
  p = sound();
  p.extras.push_back({"acme.tensor_cores", false});
  CHECK(only_problem(p) == "extra key 'acme.tensor_cores' appears twice");
}

TEST_CASE("properties: DLPack device types default to kDLExtDev and kDLCPU and are validated") {
  auto p = sound();
  CHECK(p.dlpack_device_type == DLPackDeviceType::ext_dev);
  CHECK(p.dlpack_pinned_device_type == DLPackDeviceType::cpu);
  CHECK(static_cast<int>(DLPackDeviceType::ext_dev) == 12);
  CHECK(static_cast<int>(DLPackDeviceType::opencl) == 4);
  CHECK(to_string(DLPackDeviceType::cuda_host) == "kDLCUDAHost");
  // A vendor's own type, and CUDA's pinned memory.
  p.dlpack_device_type = DLPackDeviceType::opencl;
  CHECK(property_problems(p, "acme").empty());
  p.dlpack_device_type = DLPackDeviceType::cuda;
  p.dlpack_pinned_device_type = DLPackDeviceType::cuda_host;
  CHECK(property_problems(p, "acme").empty());

  // Numbers DLPack does not define.
  p = sound();
  p.dlpack_device_type = static_cast<DLPackDeviceType>(5);
  CHECK(only_problem(p) == "dlpack_device_type is 5 (not a DLPack device type)");
  p = sound();
  p.dlpack_pinned_device_type = static_cast<DLPackDeviceType>(0);
  CHECK(only_problem(p) == "dlpack_pinned_device_type is 0 (not a DLPack device type)");
  // Device memory as a host kind, pinned memory as a device kind.
  p = sound();
  p.dlpack_device_type = DLPackDeviceType::cpu;
  CHECK(only_problem(p) == "dlpack_device_type is 1 (kDLCPU), a host memory type (device memory "
                           "needs a device's: kDLExtDev or the vendor's own)");
  p = sound();
  p.dlpack_pinned_device_type = DLPackDeviceType::ext_dev;
  CHECK(only_problem(p) == "dlpack_pinned_device_type is 12 (kDLExtDev), not a host memory type "
                           "(kDLCPU, kDLCUDAHost or kDLROCMHost)");
  CHECK_THROWS_AS(validate_properties(p, "acme", 0), ValueError);
}

TEST_CASE("properties: validate_properties lists every problem with backend and device") {
  DeviceProperties empty;
  auto problems = property_problems(empty, "acme");
  CHECK(problems.size() >= 9);  // compute units and clock rate may be unknown (0)
  try {
    validate_properties(empty, "acme", 3);
    FAIL("validation passed an empty schema");
  } catch (const ValueError& e) {
    std::string what = e.what();
    CHECK(what.find("acme: device 3 reports inconsistent properties: name is empty; vendor is "
                    "empty") == 0);
    CHECK(what.find("total_memory is 0") != std::string::npos);
  }
}

TEST_CASE("properties: dtype sets hold exactly what was added") {
  DTypeSet s{DType::float32, DType::float8_e4m3fn};
  CHECK(s.contains(DType::float32));
  CHECK(s.contains(DType::float8_e4m3fn));
  CHECK_FALSE(s.contains(DType::float8_e5m2));
  CHECK(s.to_vector() == std::vector<DType>{DType::float32, DType::float8_e4m3fn});
  s.remove(DType::float32);
  CHECK_FALSE(s.contains(DType::float32));
  CHECK(DTypeSet::all().to_vector().size() == dtype_count);
  CHECK(to_string(DType::bool_) == "bool");
  CHECK(to_string(DType::float8_e5m2fnuz) == "float8_e5m2fnuz");
  STATIC_REQUIRE(DTypeSet{DType::int8}.contains(DType::int8));
}

TEST_CASE("properties: extras are read with their type, and a wrong type is a ValueError") {
  auto p = sound();
  CHECK(p.extra<bool>("acme.tensor_cores") == true);
  CHECK(p.extra<std::int64_t>("acme.sram_bytes") == (std::int64_t{1} << 20));
  CHECK_FALSE(p.extra<bool>("acme.absent").has_value());
  CHECK_THROWS_AS(p.extra<std::string>("acme.tensor_cores"), ValueError);
  try {
    p.extra<double>("acme.sram_bytes");
  } catch (const ValueError& e) {
    CHECK(std::string(e.what()) == "device extra 'acme.sram_bytes' is of type integer, not float");
  }
}

TEST_CASE("properties: stream priority levels count both ends") {
  CHECK(StreamPriorityRange{0, -2}.levels() == 3);
  CHECK(StreamPriorityRange{0, 3}.levels() == 4);
  CHECK(StreamPriorityRange{}.levels() == 1);
}

TEST_CASE("properties: UUID, architecture and copy engines may be unknown; the UUID is derived") {
  auto p = sound();
  p.uuid.clear();
  p.architecture.clear();
  p.async_copy_engines.reset();
  CHECK_FALSE(property_problems(p, "acme").empty());  // an empty UUID is filled first
  fill_unknown(p, "acme", 0);
  CHECK(p.uuid_derived);
  CHECK(property_problems(p, "acme").empty());
  CHECK(p.uuid[14] == '8');                                        // version 8
  CHECK((p.uuid[19] == '8' || p.uuid[19] == '9' || p.uuid[19] == 'a' || p.uuid[19] == 'b'));
  // Stable: the same inputs give the same UUID in every process and run (the
  // value is pinned), and each input counts.
  CHECK(p.uuid == derived_uuid("acme", p, 0));
  CHECK(p.uuid == "d30815a7-6045-8711-856b-7a36fbcf87e6");
  auto other = p;
  CHECK(derived_uuid("acme", other, 1) != p.uuid);
  other.pci_bus_id = "0000:3c:00.0";
  CHECK(derived_uuid("acme", other, 0) != p.uuid);
  CHECK(derived_uuid("bcme", p, 0) != p.uuid);
  // A UUID the runtime gave is kept.
  auto given = sound();
  fill_unknown(given, "acme", 0);
  CHECK(given.uuid == "01234567-89ab-cdef-0123-456789abcdef");
  CHECK_FALSE(given.uuid_derived);
}
