// accelkit: the registrations of the module's backend with PyTorch (the
// device name, allocators, hooks, profilers, the torch.ops.<name> library,
// the ATen kernels and fallbacks), compiled once for ErasedRuntime in the
// SDK's library sources (Note [Erased backend]); ACCELKIT_REGISTER_BACKEND(R)
// (torch/register.hpp) binds them to runtime R.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/autocast.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/host_kernels.hpp>
#include <accelkit/torch/host_results.hpp>
#include <accelkit/torch/kernels.hpp>
#include <accelkit/torch/kineto.hpp>
#include <accelkit/torch/ops.hpp>
#include <accelkit/torch/signals.hpp>
#include <accelkit/torch/sparse.hpp>

#include <c10/core/impl/alloc_cpu.h>

#include <limits>
#include <string>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace torch_adapter {

// Registrations that need no macro: the device name, the allocator, the
// hooks, and the operators of the Python device module (torch.ops.<name>.*).
// Reports of the SDK (Note [Diagnostics]) as PyTorch warnings: a Python
// UserWarning, or the C++ warning handler's output.
inline void warn_through_torch(Severity, std::string_view backend, std::string_view message) {
  TORCH_WARN(backend, ": ", message);
}

// A device index from an operator's int64 argument: IndexError naming it
// when it does not fit (instead of narrowing 2**32 to 0), then the SDK's
// own check (visible devices).
template <class R>
device_index device_arg(int64_t d) {
  TORCH_CHECK_INDEX(d >= std::numeric_limits<device_index>::min() &&
                        d <= std::numeric_limits<device_index>::max(),
                    R::name, ": invalid device index ", d);
  return static_cast<device_index>(d);
}

// The SDK's ATen kernels for the backend, through the table that vendor
// kernels share (Note [Vendor kernel registration]).
template <class R>
void register_kernels() {
  KernelTable<R>& table = KernelTable<R>::get();
  register_aten_ops<R>(table);
  register_host_kernels<R>(table);
  register_cpu_kernels_over_composites<R>(table);
}

template <class R>
bool register_backend() {
  set_diagnostic_handler(&warn_through_torch);
  c10::register_privateuse1_backend(std::string(R::name));
  c10::SetAllocator(kDeviceType, &device_allocator<R>());
  HostResults<R>::install();  // Note [CPU results in device memory]
  at::RegisterPrivateUse1HooksInterface(new Hooks<R>());
  register_profilers<R>();  // Note [Profiler device times], [Kineto device activities]
  static torch::Library lib(torch::Library::DEF, std::string(R::name), std::nullopt, __FILE__,
                            __LINE__);
  lib.def("device_count() -> int", [] { return static_cast<int64_t>(Backend<R>::instance().device_count()); });
  // IndexError unless `device` is visible (without initializing).
  lib.def("check_device(int device) -> ()", [](int64_t d) {
    device_index i = device_arg<R>(d);
    translated([&] { Backend<R>::instance().check_visible(i); });
  });
  lib.def("init_error() -> str", [] { return Backend<R>::instance().init_error(); });
  lib.def("is_initialized() -> bool", [] { return Backend<R>::instance().is_initialized(); });
  lib.def("in_bad_fork() -> bool", [] { return Backend<R>::instance().in_bad_fork(); });
  // torch.<name>.init(): initializes the backend now rather than at first use.
  lib.def("init() -> ()", [] { translated([&] { Backend<R>::instance().lazy_init(); }); });
  lib.def("can_access_peer(int device, int peer) -> bool", [](int64_t d, int64_t peer) {
    return translated([&] {
      return Backend<R>::instance().can_access_peer(device_arg<R>(d), device_arg<R>(peer));
    });
  });
  lib.def("default_stream(int device) -> Stream", [](int64_t d) {
    return translated([&] {
      State<R>& s = State<R>::get();
      return s.to_c10(s.streams().default_stream(device_arg<R>(d)));
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
    TORCH_CHECK_INDEX(d >= -1 && d <= std::numeric_limits<c10::DeviceIndex>::max(), R::name,
                      ": invalid device index ", d);
    return Hooks<R>().getDefaultGenerator(static_cast<c10::DeviceIndex>(d));
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
    int n = Backend<R>::instance().device_count();
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
          [] { return Backend<R>::instance().erased().runtime_members(); });
  // Returns the pinned host cache to the driver (torch.<name>.empty_cache
  // empties the device caches).
  lib.def("host_empty_cache() -> ()", [] {
    translated([&] {
      if (Backend<R>::instance().is_initialized()) State<R>::get().host_memory().empty_cache();
    });
  });
  register_signal_ops<R>(lib);  // Note [Host signals]
  lib.def("report_json() -> str", [] { return Backend<R>::instance().erased().report_json(); });
  lib.def("report_text() -> str", [] { return Backend<R>::instance().erased().report_text(); });
  lib.def("fallback_report() -> str", [] { return Fallback<R>::get().report(); });
  lib.def("reset_fallback_report() -> ()", [] { Fallback<R>::get().reset(); });
  lib.def("memory_snapshot_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      return to_json(State<R>::get().device_memory().device(device_arg<R>(d)).snapshot());
    });
  });
  lib.def("memory_stats_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      return to_json(State<R>::get().device_memory().device(device_arg<R>(d)).stats());
    });
  });
  lib.def("memory_fraction(int device) -> float", [](int64_t d) {
    return translated([&] {
      return State<R>::get().device_memory().device(device_arg<R>(d)).memory_fraction();
    });
  });
  // The pinned host pool's statistics, and their resets; {} before the
  // backend is initialized, as on CUDA.
  lib.def("host_memory_stats_json() -> str", [] {
    return translated([&]() -> std::string {
      if (!Backend<R>::instance().is_initialized()) return "{}";
      return to_json(State<R>::get().host_memory().stats());
    });
  });
  lib.def("host_reset_peak_stats() -> ()", [] {
    translated([&] {
      if (Backend<R>::instance().is_initialized()) State<R>::get().host_memory().reset_peak_stats();
    });
  });
  lib.def("host_reset_accumulated_stats() -> ()", [] {
    translated([&] {
      if (Backend<R>::instance().is_initialized())
        State<R>::get().host_memory().reset_accumulated_stats();
    });
  });
  lib.def("set_memory_fraction(float fraction, int device) -> ()", [](double f, int64_t d) {
    translated([&] {
      State<R>::get().device_memory().device(device_arg<R>(d)).set_memory_fraction(f);
    });
  });
  return true;
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

