// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is one unit, compiled side by side with the registration unit
// and the vendor's sources: each more unit would parse PyTorch's headers
// again and compile inline code the others compile too, which on two cores
// costs more than it saves (bench/compile_bench.py times the units).
//
// In order: the device guard, the allocators, the hooks, the profilers and
// the device name; the operators of the backend's Python device module
// (torch.ops.<name>.*); the CPU fallback of every operator without a kernel
// (Note [CPU fallback policy] in accelkit/torch/fallback.hpp); the native
// operators and the host kernels (Note [Host kernels]), the math-bit
// fallthroughs, autocast and the sparse layouts' refusal, and the order of
// the ATen kernels' registration.
#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/allocator_settings.hpp>
#include <accelkit/torch/autocast.hpp>
#include <accelkit/torch/backend_meta.hpp>
#include <accelkit/torch/dlpack.hpp>
#include <accelkit/torch/fallback.hpp>
#include <accelkit/torch/graph.hpp>
#include <accelkit/torch/history.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/host_kernels.hpp>
#include <accelkit/torch/host_results.hpp>
#include <accelkit/torch/kernels.hpp>
#include <accelkit/torch/kineto.hpp>
#include <accelkit/torch/nested.hpp>
#include <accelkit/torch/ops.hpp>
#include <accelkit/torch/quantized.hpp>
#include <accelkit/torch/signals.hpp>
#include <accelkit/torch/sparse.hpp>
#include <accelkit/torch/storage.hpp>

#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {
namespace {

// Reports of the SDK (Note [Diagnostics]) as PyTorch warnings: a Python
// UserWarning, or the C++ warning handler's output.
inline void warn_through_torch(Severity, std::string_view backend, std::string_view message) {
  TORCH_WARN(backend, ": ", message);
}

bool register_backend() {
  set_diagnostic_handler(&warn_through_torch);
  c10::register_privateuse1_backend(std::string(backend_name()));
  c10::SetAllocator(kDeviceType, &device_allocator());
  at::setHostAllocator(kDeviceType, &pinned_allocator());  // Note [Host allocator]
  register_graph_impl();  // Note [Graphs through PyTorch]
  HostResults::install();  // Note [CPU results in device memory]
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  register_profilers();  // Note [Profiler device times], [Kineto device activities]
  register_allocator_settings();  // Note [Allocator settings hook]
  register_backend_meta_serialization();  // Note [Backend metadata]
  return true;
}

}  // namespace

c10::DataPtr DeviceAllocator::allocate_or(std::size_t n, bool must) {
    return translated([&] {
      BackendInterface& b = backend();
      device_index d = b.current_device();
      StreamHandle h = b.current_handle(d);
      void* p = must ? b.device_allocate(d, n, h) : b.device_try_allocate(d, n, h);
      if (p && host_kernel_depth > 0) {
        try {
          b.stream_synchronize(d, h);
          // A host kernel writes it from the host: mapped with the kernel's
          // other memory (Note [Map scopes]).
          if (MapScope* maps = MapScope::innermost(d)) maps->add(p, n);
        } catch (...) {
          b.device_deallocate(d, p);
          throw;
        }
      }
      return wrap(p, d);
    });
}

// storage.resize_(n): new memory of exactly n bytes, keeping the prefix.
void Hooks::resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const {
  translated([&] {
    if (newsize != storage.nbytes()) StorageOps::reallocate_storage(storage, newsize);
  });
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

C10_REGISTER_GUARD_IMPL(PrivateUse1, ::accelkit::torch_adapter::GuardImpl);
static const bool accelkit_backend_registered_ = ::accelkit::torch_adapter::register_backend();

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

// A memory pool's id from an operator's int[] argument: two non-negative
// integers (ValueError otherwise).
inline MempoolId mempool_arg(c10::IntArrayRef id) {
  TORCH_CHECK_VALUE(id.size() == 2 && id[0] >= 0 && id[1] >= 0, backend_name(),
                    ": a memory pool id is two non-negative integers, got ", id);
  return MempoolId{static_cast<std::uint64_t>(id[0]), static_cast<std::uint64_t>(id[1])};
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
  // empties the device caches), through the host allocator PyTorch holds
  // (Note [Host allocator]).
  lib.def("host_empty_cache() -> ()", [] { registered_host_allocator().empty_cache(); });
  register_signal_ops(lib);  // Note [Host signals]
  register_ipc_ops(lib);     // Note [Sharing device memory between processes]
  register_dlpack_ops(lib);  // Note [DLPack through the schema]
  lib.def("report_json() -> str", [] { return backend().report_json(); });
  lib.def("report_text() -> str", [] { return backend().report_text(); });
  lib.def("fallback_report() -> str", [] { return Fallback::get().report(); });
  lib.def("reset_fallback_report() -> ()", [] { Fallback::get().reset(); });
  // The pool's snapshot with its history, frames symbolized (Note [History
  // frames]).
  lib.def("memory_snapshot_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      MemorySnapshot snapshot = backend().device_snapshot(device_arg(d));
      SnapshotFrames frames(snapshot);
      return to_json(snapshot, frames.writer());
    });
  });
  // torch.<name>.memory._record_memory_history, on device `device` or (-1)
  // every device, as CUDA's (which initializes the device too): the
  // arguments' strings are checked before anything changes.
  lib.def("record_memory_history(int device, str? enabled, str? context, str stacks, "
          "int max_entries, bool clear_history, str[] skip_actions) -> ()",
          [](int64_t d, std::optional<std::string> enabled, std::optional<std::string> context,
             std::string stacks, int64_t max_entries, bool clear_history,
             std::vector<std::string> skip_actions) {
            HistoryOptions options = HistoryArguments::parse(enabled, context, stacks, max_entries,
                                                             clear_history, skip_actions);
            translated([&] {
              BackendInterface& b = backend();
              if (d != -1) return b.device_record_history(device_arg(d), options);
              b.lazy_init();
              for (int i = 0, n = b.device_count(); i < n; ++i) b.device_record_history(i, options);
            });
          });
  // torch.<name>.memory._attach_out_of_memory_observer: `callback` is the
  // address of a C function void(int64 device, int64 requested, int64
  // allocated, int64 device_free) that lives as long as the process (a
  // ctypes callback Python keeps), attached to every device's pool (all
  // made now).
  lib.def("attach_oom_observer(int callback) -> ()", [](int64_t callback) {
    OomObserver observer = oom_observer_at(callback);
    translated([&] {
      BackendInterface& b = backend();
      b.lazy_init();
      for (int i = 0, n = b.device_count(); i < n; ++i) b.device_attach_oom_observer(i, observer);
    });
  });
  lib.def("memory_stats_json(int device) -> str", [](int64_t d) {
    return translated([&] {
      return to_json(backend().device_stats(device_arg(d)));
    });
  });
  // Graphs and private pools (Note [Graphs through PyTorch], Note [Private
  // pools]): what the Python device module's Graph, graph_pool_handle,
  // MemPool and use_mem_pool call.
  lib.def("is_stream_capturing(Stream s) -> bool", [](c10::Stream s) {
    return translated([&] {
      Stream st = from_c10(s);
      return backend().stream_is_capturing(st.device, backend().handle(st));
    });
  });
  lib.def("capture_underway(int device) -> bool", [](int64_t d) {
    return translated([&] { return backend().capture_underway(device_arg(d)); });
  });
  // [n, 0] for graph pools (graph_pool_handle), [0, n] for user pools (MemPool).
  lib.def("new_mempool_id(bool user_created) -> int[]", [](bool user_created) {
    MempoolId id = next_mempool_id(user_created);
    return std::vector<int64_t>{static_cast<int64_t>(id.first), static_cast<int64_t>(id.second)};
  });
  lib.def("mempool_create(int device, int[] id) -> ()", [](int64_t d, c10::IntArrayRef id) {
    translated([&] { backend().device_create_pool(device_arg(d), mempool_arg(id)); });
  });
  lib.def("mempool_release(int device, int[] id) -> ()", [](int64_t d, c10::IntArrayRef id) {
    translated([&] { backend().device_release_pool(device_arg(d), mempool_arg(id)); });
  });
  lib.def("mempool_use_count(int device, int[] id) -> int", [](int64_t d, c10::IntArrayRef id) {
    return translated([&] {
      return static_cast<int64_t>(backend().device_pool_use_count(device_arg(d), mempool_arg(id)));
    });
  });
  // Allocations of the calling thread, on any stream, come from the pool
  // until the matching end (a use of the pool, which mempool_release drops).
  lib.def("begin_allocate_current_thread_to_pool(int device, int[] id) -> ()",
          [](int64_t d, c10::IntArrayRef id) {
            translated([&] {
              std::thread::id me = std::this_thread::get_id();
              backend().device_begin_allocate_to_pool(
                  device_arg(d), mempool_arg(id),
                  [me](StreamHandle) { return std::this_thread::get_id() == me; });
            });
          });
  lib.def("end_allocate_current_thread_to_pool(int device, int[] id) -> ()",
          [](int64_t d, c10::IntArrayRef id) {
            translated(
                [&] { backend().device_end_allocate_to_pool(device_arg(d), mempool_arg(id)); });
          });
  // The private pools device `device` knows, as pairs flattened: [a0, b0, a1, b1, ...].
  lib.def("mempool_ids(int device) -> int[]", [](int64_t d) {
    return translated([&] {
      std::vector<int64_t> out;
      for (MempoolId id : backend().device_pool_ids(device_arg(d))) {
        out.push_back(static_cast<int64_t>(id.first));
        out.push_back(static_cast<int64_t>(id.second));
      }
      return out;
    });
  });
  lib.def("pool_stats_json(int device, int[] id) -> str", [](int64_t d, c10::IntArrayRef id) {
    return translated([&] {
      return to_json(backend().device_pool_stats(device_arg(d), mempool_arg(id)));
    });
  });
  lib.def("empty_cache_pool(int device, int[] id) -> ()", [](int64_t d, c10::IntArrayRef id) {
    translated([&] { backend().device_empty_cache_pool(device_arg(d), mempool_arg(id)); });
  });
  lib.def("memory_fraction(int device) -> float", [](int64_t d) {
    return translated([&] {
      return backend().memory_fraction(device_arg(d));
    });
  });
  // The pinned host pool's statistics, and their resets, as PyTorch's
  // host allocator for the device type gives them (Note [Host
  // allocator]); {} before the backend is initialized, as on CUDA.
  lib.def("host_memory_stats_json() -> str", [] {
    if (!backend().is_initialized()) return std::string("{}");
    return to_json(PinnedAllocator::from_c10_stats(registered_host_allocator().get_stats()));
  });
  lib.def("host_reset_peak_stats() -> ()", [] { registered_host_allocator().reset_peak_stats(); });
  lib.def("host_reset_accumulated_stats() -> ()",
          [] { registered_host_allocator().reset_accumulated_stats(); });
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

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  Fallback::get().run(op, stack);
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&::accelkit::torch_adapter::fallback>());
}

namespace {
namespace ta = ::accelkit::torch_adapter;
}

// The SDK's ATen kernels, through the table that vendor kernels share (Note
// [Vendor kernel registration]).
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  (void)m;
  ta::KernelTable& table = ta::KernelTable::get();
  ta::register_aten_ops(table);
  ta::register_host_kernels(table);
  ta::register_cpu_kernels_over_composites(table);
  ta::register_quantizing_ops(table);  // Note [Quantized tensors]
  ta::register_nested_creation(table);  // Note [Nested tensors]
  ta::register_backend_meta_ops(table);  // Note [Backend metadata]: clone
}
TORCH_LIBRARY_IMPL(aten, Conjugate, m) { ta::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(aten, Negative, m) { ta::register_math_bit_fallthroughs(m); }
TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::sparse_fallback>());
}
TORCH_LIBRARY_IMPL(_, SparseCsrPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::sparse_fallback>());
}
TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::nested_fallback>());
}
TORCH_LIBRARY_IMPL(aten, NestedTensorPrivateUse1, m) { ta::register_nested_kernels(m); }
TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&ta::quantized_fallback>());
}
// Note [Quantized tensors] (accelkit/torch/quantized.hpp).
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) { ta::register_quantized_ops(m); }
TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) { m.fallback(torch::CppFunction::makeFallthrough()); }
TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) { ta::register_autocast(m); }
