// The Runtime contract: detection of members, names, error types.
#include "catch.hpp"

#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <algorithm>
#include <string>
#include <vector>

using namespace accelkit;

namespace {
// The smallest type that satisfies the contract, used to probe detection.
struct Exact : Runtime<Exact> {
  static constexpr std::string_view name = "exact";
  int device_count() { return 0; }
  DeviceProperties properties(device_index) { return {}; }
  device_index get_device() { return 0; }
  void set_device(device_index) {}
  void* malloc(device_index, std::size_t) { return nullptr; }
  void free(device_index, void*) {}
  void* host_malloc(device_index, std::size_t) { return nullptr; }
  void host_free(device_index, void*) {}
  void memcpy(device_index, void*, const void*, std::size_t, CopyKind) {}
  void memcpy_async(device_index, void*, const void*, std::size_t, CopyKind, StreamHandle, bool) {}
  void memset_async(device_index, void*, int, std::size_t, StreamHandle) {}
  StreamHandle stream_create(device_index, int) { return {}; }
  void stream_destroy(device_index, StreamHandle) {}
  bool stream_query(device_index, StreamHandle) { return true; }
  void stream_synchronize(device_index, StreamHandle) {}
  void stream_wait_event(device_index, StreamHandle, EventHandle) {}
  EventHandle event_create(device_index, EventFlags) { return {}; }
  void event_destroy(device_index, EventHandle) {}
  void event_record(device_index, EventHandle, StreamHandle) {}
  bool event_query(device_index, EventHandle) { return true; }
  void event_synchronize(device_index, EventHandle) {}
  void device_synchronize(device_index) {}
};

struct ExactWithoutEvents : Exact {};  // derives from Runtime<Exact>, not its own base
}  // namespace

TEST_CASE("contract: a runtime with exactly the required members satisfies it") {
  STATIC_REQUIRE(is_runtime_v<Exact>);
  STATIC_REQUIRE(is_runtime_v<simdev::SimRuntime>);
  STATIC_REQUIRE_FALSE(is_runtime_v<int>);
  STATIC_REQUIRE_FALSE(is_runtime_v<ExactWithoutEvents>);
#if ACCELKIT_HAS_CONCEPTS
  STATIC_REQUIRE(accelkit::runtime<Exact>);
#endif
}

TEST_CASE("contract: optional members are detected only when present") {
  STATIC_REQUIRE_FALSE(detail::has_event_elapsed_time<Exact>);
  STATIC_REQUIRE_FALSE(detail::has_can_access_peer<Exact>);
  STATIC_REQUIRE_FALSE(detail::names_event_elapsed_time<Exact>);
  STATIC_REQUIRE(detail::has_event_elapsed_time<simdev::SimRuntime>);
  STATIC_REQUIRE(detail::has_can_access_peer<simdev::SimRuntime>);
  STATIC_REQUIRE(detail::has_memcpy_peer_async<simdev::SimRuntime>);
  STATIC_REQUIRE(detail::has_initialize<simdev::SimRuntime>);
  STATIC_REQUIRE_FALSE(detail::has_memory_info<simdev::SimRuntime>);
}

namespace {
struct OwnKernels : Exact {
  static constexpr bool host_kernels = false;
};
struct MistypedKernels : Exact {
  static constexpr int host_kernels = 0;
};
}  // namespace

TEST_CASE("contract: optional constants take their default when absent") {
  STATIC_REQUIRE(detail::constant_host_kernels<Exact>);
  STATIC_REQUIRE_FALSE(detail::constant_host_kernels<OwnKernels>);
  STATIC_REQUIRE(detail::has_host_kernels<OwnKernels>);
  // Declared with another type: not taken (check_contract names it).
  STATIC_REQUIRE(detail::names_host_kernels<MistypedKernels>);
  STATIC_REQUIRE_FALSE(detail::has_host_kernels<MistypedKernels>);
  STATIC_REQUIRE(detail::constant_host_kernels<MistypedKernels>);
  // fork_safe_discovery: true unless a runtime says otherwise.
  STATIC_REQUIRE(detail::constant_fork_safe_discovery<Exact>);
  STATIC_REQUIRE(detail::constant_fork_safe_discovery<simdev::SimRuntime>);
}

TEST_CASE("contract: the table lists each member once, with its signature") {
  std::vector<std::string_view> names;
  int required = 0;
  for (const auto& m : detail::contract_members) {
    names.push_back(m.name);
    required += m.required;
    CHECK(m.signature.find(m.name) != std::string_view::npos);
  }
  auto sorted = names;
  std::sort(sorted.begin(), sorted.end());
  CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  CHECK(required == 23);  // name and 22 functions
  CHECK(names.size() == 56);  // and 31 optional functions, 2 optional constants
  CHECK(detail::contract_members[1].signature == "int device_count()");
  CHECK(detail::contract_members[9].signature ==
        "void memcpy(device_index device, void* dst, const void* src, std::size_t bytes, "
        "CopyKind kind)");
}

TEST_CASE("contract: Backend's generated pass-throughs map the device and skip empty copies") {
  simdev::Config config;
  config.device_count = 3;
  Backend<simdev::SimRuntime> backend(Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", "2,0"}}),
                                      config);
  auto& rt = backend.runtime();
  // Logical 0 is physical 2: a stream made through the backend is one of
  // physical device 2's, unknown to physical device 0 (logical 1).
  StreamHandle s = backend.stream_create(0, 0);
  CHECK(backend.stream_query(0, s));
  CHECK(rt.stream_query(2, s));
  CHECK_THROWS_AS(backend.stream_query(1, s), DriverError);
  CHECK_THROWS_AS(backend.stream_query(2, s), IndexError);
  backend.stream_destroy(0, s);
  // 0 bytes: nothing reaches the runtime (whose memcpy would refuse a null
  // pointer), but the device is still checked.
  backend.memcpy(1, nullptr, nullptr, 0, CopyKind::host_to_device);
  CHECK_THROWS_AS(backend.memcpy(5, nullptr, nullptr, 0, CopyKind::host_to_device), IndexError);
}

TEST_CASE("contract: backend names are lowercase identifiers that are not PyTorch devices") {
  STATIC_REQUIRE(detail::is_valid_backend_name("simdev"));
  STATIC_REQUIRE(detail::is_valid_backend_name("acme_npu2"));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name(""));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name("cuda"));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name("privateuseone"));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name("Acme"));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name("2npu"));
  STATIC_REQUIRE_FALSE(detail::is_valid_backend_name("acme-npu"));
}

TEST_CASE("contract: driver_error throws DriverError with backend, code, call and message") {
  try {
    simdev::SimRuntime::driver_error(42, "memcpy_async", "link down");
    FAIL("driver_error returned");
  } catch (const DriverError& e) {
    CHECK(e.kind() == ErrorKind::driver);
    CHECK(e.backend() == "simdev");
    CHECK(e.code() == 42);
    CHECK(e.call() == "memcpy_async");
    CHECK(e.driver_message() == "link down");
    CHECK(std::string(e.what()) == "simdev: driver error 42 in memcpy_async: link down");
  }
}

TEST_CASE("contract: each error type carries the kind PyTorch users expect") {
  CHECK(IndexError("b", "m").kind() == ErrorKind::index);
  CHECK(ValueError("b", "m").kind() == ErrorKind::value);
  CHECK(RuntimeError("b", "m").kind() == ErrorKind::runtime);
  CHECK(OutOfMemoryError("b", "m").kind() == ErrorKind::out_of_memory);
  CHECK(NotSupportedError("b", "m").kind() == ErrorKind::not_supported);
  CHECK(std::string(ValueError("acme", "bad").what()) == "acme: bad");
  CHECK(std::string(ValueError("", "bad").what()) == "bad");
  CHECK(to_string(ErrorKind::out_of_memory) == "OutOfMemoryError");
}

TEST_CASE("contract: stream and event handles round-trip pointers and compare by value") {
  int x = 0;
  auto s = StreamHandle::from_pointer(&x);
  CHECK(s.as_pointer<int>() == &x);
  CHECK(s == StreamHandle::from_pointer(&x));
  CHECK(s != StreamHandle{});
  CHECK(has_flag(EventFlags::timing | EventFlags::blocking_sync, EventFlags::blocking_sync));
  CHECK_FALSE(has_flag(EventFlags::none, EventFlags::timing));
}
