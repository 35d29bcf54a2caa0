// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is cut into units of about equal compile time, so that a build on
// two cores compiles them side by side.
//
// This unit: the operators of the backend's Python device module,
// torch.ops.<name>.* (python/accelkit).
#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/signals.hpp>

#include <limits>
#include <mutex>
#include <string>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {
namespace {

// A device index from an operator's int64 argument: IndexError naming it
// when it does not fit (instead of narrowing 2**32 to 0), then the SDK's
// own check (visible devices).
inline device_index device_arg(int64_t d) {
  TORCH_CHECK_INDEX(d >= std::numeric_limits<device_index>::min() &&
                        d <= std::numeric_limits<device_index>::max(),
                    backend_name(), ": invalid device index ", d);
  return static_cast<device_index>(d);
}

bool register_library() {
  static torch::Library lib(torch::Library::DEF, std::string(backend_name()), std::nullopt, __FILE__,
                            __LINE__);
  lib.def("device_count() -> int", [] { return static_cast<int64_t>(backend().device_count()); });
  // IndexError unless `device` is visible (without initializing).
  lib.def("check_device(int device) -> ()", [](int64_t d) {
    device_index i = device_arg(d);
    translated([&] { backend().check_visible(i); });
  });
  lib.def("init_error() -> str", [] { return backend().init_error(); });
  lib.def("is_initialized() -> bool", [] { return backend().is_initialized(); });
  lib.def("in_bad_fork() -> bool", [] { return backend().in_bad_fork(); });
  // torch.<name>.init(): initializes the backend now rather than at first use.
  lib.def("init() -> ()", [] { translated([&] { backend().lazy_init(); }); });
  lib.def("can_access_peer(int device, int peer) -> bool", [](int64_t d, int64_t peer) {
    return translated([&] {
      return backend().can_access_peer(device_arg(d), device_arg(peer));
    });
  });
  lib.def("default_stream(int device) -> Stream", [](int64_t d) {
    return translated([&] {
      return to_c10(backend().default_stream(device_arg(d)));
    });
  });
  // The device module's Event.elapsed_time: torch.Event's own refuses any
  // subclass of torch.Event as its argument (it compares the exact type).
  // `start` and `end` are the event_id of two events of this backend, which
  // the caller holds; 0 (not recorded yet) is a ValueError.
  lib.def("event_elapsed_time(int start, int end) -> float", [](int64_t start, int64_t end) {
    return c10::impl::getDeviceGuardImpl(c10::DeviceType::PrivateUse1)
        ->elapsedTime(reinterpret_cast<void*>(start), reinterpret_cast<void*>(end), -1);
  });
  // The devices' default generators (Note [Device generators]): device -1
  // is the current one; an index out of range is an IndexError.
  auto generator = [](int64_t d) {
    TORCH_CHECK_INDEX(d >= -1 && d <= std::numeric_limits<c10::DeviceIndex>::max(), backend_name(),
                      ": invalid device index ", d);
    return Hooks().getDefaultGenerator(static_cast<c10::DeviceIndex>(d));
  };
  // Optional in the schema: what PyTorch infers from a function returning at::Generator.
  lib.def("default_generator(int device) -> Generator?", generator);
  auto seed_device = [generator](int64_t d, int64_t seed) {
    at::Generator g = generator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_current_seed(static_cast<uint64_t>(seed));
  };
  lib.def("manual_seed(int device, int seed) -> ()", seed_device);
  lib.def("manual_seed_all(int seed) -> ()", [seed_device](int64_t seed) {
    int n = backend().device_count();
    for (int d = 0; d < n; ++d) seed_device(d, seed);
  });
  // Seeds are 64-bit unsigned, as PyTorch's: they cross the schema as
  // int64 (the Python module folds 2**63..2**64-1 onto the negatives).
  lib.def("initial_seed(int device) -> int", [generator](int64_t d) {
    at::Generator g = generator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    return static_cast<int64_t>(g.current_seed());
  });
  lib.def("get_rng_state(int device) -> Tensor", [generator](int64_t d) {
    at::Generator g = generator(d);
    std::lock_guard<std::mutex> lock(g.mutex());
    return g.get_state();
  });
  lib.def("set_rng_state(int device, Tensor state) -> ()", [generator](int64_t d, at::Tensor state) {
    at::Generator g = generator(d);  // DeviceGenerator::set_state checks the state
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(state);
  });
  // The contract members the runtime implements (the required ones and the
  // optional ones it has), from the contract's own list: tests that visit
  // every member (the fault sweep) take them from here.
  lib.def("runtime_members() -> str[]",
          [] { return backend().runtime_members(); });
  // Returns the pinned host cache to the driver (torch.<name>.empty_cache
  // empties the device caches).
  lib.def("host_empty_cache() -> ()", [] {
    translated([&] {
      if (backend().is_initialized()) backend().host_empty_cache();
    });
  });
  register_signal_ops(lib);  // Note [Host signals]
  lib.def("report_json() -> str", [] { return backend().report_json(); });
  lib.def("report_text() -> str", [] { return backend().report_text(); });
  lib.def("fallback_report() -> str", [] { return Fallback::get().report(); });
  lib.def("reset_fallback_report() -> ()", [] { Fallback::get().reset(); });
  lib.def("memory_snapshot_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      return to_json(backend().device_snapshot(device_arg(d)));
    });
  });
  lib.def("memory_stats_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      return to_json(backend().device_stats(device_arg(d)));
    });
  });
  lib.def("memory_fraction(int device) -> float", [](int64_t d) {
    return translated([&] {
      return backend().memory_fraction(device_arg(d));
    });
  });
  // The pinned host pool's statistics, and their resets; {} before the
  // backend is initialized, as on CUDA.
  lib.def("host_memory_stats_json() -> str", [] {
    return translated([&]() -> std::string {
      if (!backend().is_initialized()) return "{}";
      return to_json(backend().host_stats());
    });
  });
  lib.def("host_reset_peak_stats() -> ()", [] {
    translated([&] {
      if (backend().is_initialized()) backend().host_reset_peak_stats();
    });
  });
  lib.def("host_reset_accumulated_stats() -> ()", [] {
    translated([&] {
      if (backend().is_initialized())
        backend().host_reset_accumulated_stats();
    });
  });
  lib.def("set_memory_fraction(float fraction, int device) -> ()", [](double f, int64_t d) {
    translated([&] {
      backend().set_memory_fraction(device_arg(d), f);
    });
  });
  return true;
}

}  // namespace
}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

static const bool accelkit_library_registered_ = ::accelkit::torch_adapter::register_library();
