// accelkit: the PyTorch side of a backend — device guard, allocators, hooks
// — compiled once, for R = ErasedRuntime, in the SDK's library part (Note
// [Erased backend] in torch/erased.hpp; the native operators, the CPU
// fallback and the host kernels are in the headers beside it, which all
// include this one first). Vendor kernels include <accelkit/torch/kernels.hpp>.
//
// Note [fmt beside libtorch]: the wheel's include directory carries its own
// fmt headers, which shadow the system fmt in any translation unit that
// includes PyTorch, while its compiled fmt is not exported. Translation units
// that include this header must define FMT_HEADER_ONLY (the accelkit::torch
// CMake target does).
//
// Note [CPU kernel stubs]: PyTorch's x86-64 builds compile every
// TensorIterator kernel stub for AVX2 and AVX512 and export the stub lookup
// with those variants in its signature; the macros that say so are not part
// of the installed headers. Host kernels (host_kernels.hpp) call stubs, so
// they are defined here, before any PyTorch header: include accelkit's torch
// headers first in a translation unit (a PyTorch header included before them
// shows as an undefined at::native::DispatchStubImpl::get_call_ptr at link).
#pragma once

#if defined(__x86_64__) || defined(_M_X64)
#ifndef HAVE_AVX512_CPU_DEFINITION
#define HAVE_AVX512_CPU_DEFINITION
#endif
#ifndef HAVE_AVX2_CPU_DEFINITION
#define HAVE_AVX2_CPU_DEFINITION
#endif
#define ACCELKIT_TORCH_CPU_STUBS 1
#endif

#include <accelkit/accelkit.hpp>
#include <accelkit/torch/erased.hpp>
#include <accelkit/torch/generator.hpp>

#include <ATen/ATen.h>
#include <ATen/EmptyTensor.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>

ACCELKIT_BEGIN_NAMESPACE
namespace torch_adapter {

inline constexpr c10::DeviceType kDeviceType = c10::DeviceType::PrivateUse1;

// Raises the PyTorch error that matches an accelkit error's kind (Note
// [Error kinds]): Python sees IndexError, ValueError, torch.OutOfMemoryError
// or RuntimeError.
[[noreturn]] inline void rethrow(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::index: TORCH_CHECK_INDEX(false, e.what());
    case ErrorKind::value: TORCH_CHECK_VALUE(false, e.what());
    case ErrorKind::out_of_memory: TORCH_CHECK_WITH(OutOfMemoryError, false, e.what());
    default: TORCH_CHECK(false, e.what());
  }
}

// Runs f, translating accelkit errors into PyTorch's.
template <class F>
decltype(auto) translated(F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    rethrow(e);
  }
}

// Runs f where nothing may throw (a deleter, a guard's destructor): a
// failure is reported (Note [Diagnostics]), not thrown.
template <class R, class F>
void reporting_failures(F&& f) noexcept {
  try {
    f();
  } catch (const Error& e) {
    report(Severity::error, R::name, e.message());
  } catch (const std::exception& e) {
    report(Severity::error, R::name, e.what());
  } catch (...) {
    report(Severity::error, R::name, "unknown error");
  }
}

// Everything the adapters share for the module's backend (Note [Erased
// backend]): views of the bound backend's core objects, created on first use
// and never destroyed (PyTorch calls into them from static destructors).
// Defined for ErasedRuntime only: the adapters are compiled for it, and the
// runtime's own objects live in ErasedBackend<R> (torch/erased.hpp).
template <class R>
class State;

template <>
class ACCELKIT_HIDDEN State<ErasedRuntime> {
 public:
  static State& get() {
    static State* const state = new State();
    return *state;
  }
  Backend<ErasedRuntime>& backend() { return backend_; }
  Streams<ErasedRuntime>& streams() { return streams_; }
  CachingAllocator<ErasedRuntime>& device_memory() { return device_memory_; }
  HostAllocator<ErasedRuntime>& host_memory() { return host_memory_; }

  c10::Stream to_c10(const Stream& s) {
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(s.device)), s.id);
  }
  Stream from_c10(const c10::Stream& s) {
    return Stream{static_cast<device_index>(s.device_index()), s.id()};
  }
  StreamHandle current_handle(device_index d) { return streams_.current_handle(d); }

 private:
  State()
      : backend_(Backend<ErasedRuntime>::instance()),
        streams_(backend_.erased()),
        device_memory_(backend_.erased()),
        host_memory_(backend_.erased()) {}
  Backend<ErasedRuntime>& backend_;
  Streams<ErasedRuntime> streams_;
  CachingAllocator<ErasedRuntime> device_memory_;
  HostAllocator<ErasedRuntime> host_memory_;
};

// ------------------------------------------------------------ device guard

template <class R>
struct GuardImpl final : c10::impl::DeviceGuardImplInterface {
  using Ev = accelkit::Event<R>;
  static State<R>& st() { return State<R>::get(); }
  static c10::Device dev(device_index d) { return c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d)); }
  // A device without an index (torch.Stream(device="simdev")) is the current one.
  static device_index index(c10::Device d) {
    return d.has_index() ? d.index() : st().backend().current_device();
  }

  c10::DeviceType type() const override { return kDeviceType; }
  c10::Device exchangeDevice(c10::Device d) const override {
    return translated([&] { return dev(st().backend().exchange_device(d.index())); });
  }
  c10::Device getDevice() const override {
    return translated([&] { return dev(st().backend().current_device()); });
  }
  // Both are called where an exception ends the process (the autograd
  // engine's device threads; guard destructors): Note [Deferred device
  // switch].
  void setDevice(c10::Device d) const override {
    translated([&] { st().backend().set_device_deferred(d.index()); });
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    reporting_failures<R>([&] { st().backend().set_device_deferred(d.index()); });
  }
  c10::Stream getStream(c10::Device d) const override {
    return translated([&] { return st().to_c10(st().streams().current_stream(index(d))); });
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    return translated([&] { return st().to_c10(st().streams().default_stream(index(d))); });
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high_priority) const override {
    return translated([&] {
      device_index i = index(d);
      int priority = high_priority ? st().streams().priority_range(i).first : 0;
      return st().to_c10(st().streams().pool_stream(i, priority));
    });
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    return translated([&] { return st().to_c10(st().streams().pool_stream(index(d), priority)); });
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    return translated([&] { return st().to_c10(st().streams().exchange_stream(st().from_c10(s))); });
  }
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return translated([&] {
      return reinterpret_cast<void*>(st().streams().handle(st().from_c10(s)).value);
    });
  }
  void destroyEvent(void* event, const c10::DeviceIndex) const noexcept override {
    delete static_cast<Ev*>(event);
  }
  void record(void** event, const c10::Stream& s, const c10::DeviceIndex device,
              const c10::EventFlag flag) const override {
    translated([&] {
      TORCH_CHECK(device == -1 || device == s.device_index(), R::name,
                  ": event of device ", static_cast<int>(device), " recorded on a stream of device ",
                  static_cast<int>(s.device_index()));
      if (!*event)
        *event = new Ev(st().streams(), flag == c10::EventFlag::BACKEND_DEFAULT
                                            ? EventFlags::timing
                                            : EventFlags::none);
      static_cast<Ev*>(*event)->record(st().from_c10(s));
    });
  }
  void block(void* event, const c10::Stream& s) const override {
    if (!event) return;
    translated([&] { static_cast<Ev*>(event)->block(st().from_c10(s)); });
  }
  bool queryEvent(void* event) const override {
    if (!event) return true;
    return translated([&] { return static_cast<Ev*>(event)->query(); });
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return static_cast<c10::DeviceIndex>(st().backend().device_count());
  }
  bool queryStream(const c10::Stream& s) const override {
    return translated([&] { return st().streams().query(st().from_c10(s)); });
  }
  void synchronizeStream(const c10::Stream& s) const override {
    translated([&] { st().streams().synchronize(st().from_c10(s)); });
  }
  void synchronizeEvent(void* event) const override {
    if (!event) return;
    translated([&] { static_cast<Ev*>(event)->synchronize(); });
  }
  void synchronizeDevice(const c10::DeviceIndex d) const override {
    translated([&] { st().streams().device_synchronize(d); });
  }
  void recordDataPtrOnStream(const c10::DataPtr& p, const c10::Stream& s) const override {
    if (!p.get()) return;
    translated([&] {
      st().device_memory().record_stream(p.device().index(), p.get(),
                                         st().streams().handle(st().from_c10(s)));
    });
  }
  double elapsedTime(void* start, void* end, const c10::DeviceIndex) const override {
    TORCH_CHECK_VALUE(start && end, R::name, ": elapsed_time needs both events recorded first");
    return translated(
        [&] { return static_cast<double>(static_cast<Ev*>(start)->elapsed_time(*static_cast<Ev*>(end))); });
  }
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    return translated([&] {
      c10::DeviceCapability cap;
      cap.capability_data.capability_bits = 0;
      const DeviceProperties& p = st().backend().properties(d.index());
      auto set = [&](c10::ScalarType t, DType ours) {
        if (p.dtypes.contains(ours)) cap.capability_data.capability_bits |= (1ULL << static_cast<int>(t));
      };
      set(c10::ScalarType::Double, DType::float64);
      set(c10::ScalarType::Float, DType::float32);
      set(c10::ScalarType::Half, DType::float16);
      set(c10::ScalarType::BFloat16, DType::bfloat16);
      set(c10::ScalarType::Float8_e4m3fn, DType::float8_e4m3fn);
      set(c10::ScalarType::Float8_e5m2, DType::float8_e5m2);
      set(c10::ScalarType::Float8_e4m3fnuz, DType::float8_e4m3fnuz);
      set(c10::ScalarType::Float8_e5m2fnuz, DType::float8_e5m2fnuz);
      set(c10::ScalarType::Float8_e8m0fnu, DType::float8_e8m0fnu);
      set(c10::ScalarType::ComplexHalf, DType::complex32);
      set(c10::ScalarType::ComplexFloat, DType::complex64);
      set(c10::ScalarType::ComplexDouble, DType::complex128);
      set(c10::ScalarType::Char, DType::int8);
      set(c10::ScalarType::Short, DType::int16);
      set(c10::ScalarType::Int, DType::int32);
      set(c10::ScalarType::Long, DType::int64);
      set(c10::ScalarType::Byte, DType::uint8);
      set(c10::ScalarType::UInt16, DType::uint16);
      set(c10::ScalarType::UInt32, DType::uint32);
      set(c10::ScalarType::UInt64, DType::uint64);
      set(c10::ScalarType::Bool, DType::bool_);
      return cap;
    });
  }
};

// Note [Device work inside host kernels]: a host kernel (host_kernels.hpp)
// is the current stream's work done on the host, in order. A device
// operation it issues (the zero_() of an output before a CPU kernel writes
// into it) must therefore be finished before the kernel's host code goes on;
// while this count is non-zero on a thread, the operators below wait for
// what they queue. On a device with host-visible memory they do not queue at
// all: they wait for the stream and do the work on the host thread, as the
// host kernel itself does. Queueing it would cost two thread switches (the
// stream's worker wakes, then the waiting thread), which on a virtual
// machine with idle cores is tens of microseconds for a memset of a few
// bytes.
inline thread_local int host_kernel_depth = 0;

// Note [Device work of an operator]: a count, per thread, of the device
// work the thread has done or queued through the SDK: each wait of a host
// access for the current stream before the host works on device memory or
// after queueing work on it (HostAccess: copies, fills, storage moves, the
// host kernels, the fallback's views), and each operator run through the
// CPU fallback or as a host kernel. The Kineto session (Note [Kineto device
// activities]) compares it at every mark, so that an operator that did no
// device work (a view, an allocation, a dtype query, an operator on CPU
// tensors) gets no device activity, as a CUDA operator that launched no
// kernel gets none. A vendor kernel reports its launch with
// Kernels<R>::enqueued() (torch/kernels.hpp), which counts it; other work
// the SDK does not see is reported with note_device_work(). A
// count cannot tell an operator's own work from its children's where both
// fall in its own time: a host kernel waits for the stream (counted) and
// then runs a CPU kernel that may call another operator of the device
// (relu calling clamp_min), so both show work.
inline thread_local std::uint64_t device_work = 0;
inline void note_device_work() noexcept { ++device_work; }

// The host's access to one device's mapped memory for the length of a host
// path (Note [Map scopes]); torch/host_access.hpp.
template <class R>
class MapScope;

struct HostKernelScope {
  HostKernelScope() noexcept { ++host_kernel_depth; }
  ~HostKernelScope() { --host_kernel_depth; }
  HostKernelScope(const HostKernelScope&) = delete;
  HostKernelScope& operator=(const HostKernelScope&) = delete;
};

// -------------------------------------------------------------- allocators

inline void copy_stats(const StatArray& from, c10::CachingAllocator::StatArray& to) {
  for (std::size_t i = 0; i < from.size(); ++i) {
    to[i].current = from[i].current;
    to[i].peak = from[i].peak;
    to[i].allocated = from[i].allocated;
    to[i].freed = from[i].freed;
  }
}

// The device whose memory (from the caching pool) holds `p`, anywhere inside
// an allocation or not; nullopt for other memory.
template <class R>
std::optional<device_index> device_holding(const void* p) {
  State<R>& s = State<R>::get();
  int n = s.backend().device_count();
  for (int d = 0; d < n; ++d)
    if (s.device_memory().device(d).contains(p)) return d;
  return std::nullopt;
}

// The caching pool as PyTorch's DeviceAllocator for the device type, so that
// torch.accelerator's memory functions work.
template <class R>
struct DeviceAllocator final : c10::DeviceAllocator {
  static State<R>& st() { return State<R>::get(); }

  // Note [DataPtr context]: device memory is at least 128-byte aligned
  // (Note [Memory alignment]), so the context is the pointer with the
  // device index (0..127, c10's DeviceIndex) in its low 7 bits; the deleter
  // frees on the right device without searching.
  // A deleter cannot throw: a failure is reported (Note [Diagnostics]). In a
  // child forked after initialization the memory belongs to the parent's
  // device context, which the child does not have: it is left alone, as
  // CUDA leaves inherited device memory.
  static constexpr std::uintptr_t kContextMask = 0x7F;
  static_assert(std::numeric_limits<c10::DeviceIndex>::max() <= kContextMask,
                "a device index must fit below the 128-byte alignment (Note [DataPtr context])");
  static void* context(void* p, device_index d) {
    return reinterpret_cast<void*>(reinterpret_cast<std::uintptr_t>(p) | static_cast<std::uintptr_t>(d));
  }
  static void deleter(void* ctx) {
    auto v = reinterpret_cast<std::uintptr_t>(ctx);
    if (!v) return;
    if (Backend<R>::instance().in_bad_fork()) return;
    auto d = static_cast<device_index>(v & kContextMask);
    void* p = reinterpret_cast<void*>(v & ~kContextMask);
    // A block still mapped for the host is unmapped before the pool may
    // reuse or release it (Note [Map scopes]).
    reporting_failures<R>([&] { HostMaps<R>::get().forget(d, p); });
    reporting_failures<R>([&] { st().device_memory().device(d).deallocate(p); });
  }

  // Note [Host work on recycled blocks]: a block freed in stream order may
  // be handed out again while work queued before its free still reads it;
  // device work on the same stream runs after that work, but a host kernel
  // writes at once. So a host kernel waits for its stream after allocating
  // what it writes: a functional one allocates its output, then waits; a
  // block allocated while a host kernel runs (a temporary of its CPU kernel)
  // is handed out only after the stream has been waited for again, past
  // every use queued before the allocation.
  c10::DataPtr allocate(std::size_t n) override { return allocate_or(n, true); }
  // As allocate, but an empty DataPtr where the device has no room without
  // returning its cache to the driver (Note [CPU results in device memory]).
  c10::DataPtr try_allocate(std::size_t n) { return allocate_or(n, false); }

 private:
  // allocate (`must`) or try_allocate.
  c10::DataPtr allocate_or(std::size_t n, bool must) {
    return translated([&] {
      State<R>& s = st();
      device_index d = s.backend().current_device();
      StreamHandle h = s.current_handle(d);
      void* p = must ? s.device_memory().allocate(d, n, h) : s.device_memory().try_allocate(d, n, h);
      if (p && host_kernel_depth > 0) {
        try {
          s.backend().stream_synchronize(d, h);
          // A host kernel writes it from the host: mapped with the kernel's
          // other memory (Note [Map scopes]).
          if (MapScope<R>* maps = MapScope<R>::innermost(d)) maps->add(p, n);
        } catch (...) {
          s.device_memory().device(d).deallocate(p);
          throw;
        }
      }
      void* ctx = p ? context(p, d) : nullptr;
      return c10::DataPtr(p, ctx, &deleter, c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d)));
    });
  }

 public:
  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }
  // A storage's clone (c10::Allocator::clone: dest was just allocated, on
  // the current device). The source may be another device's memory: the
  // copy then goes on the source's current stream, after the work queued
  // there, as a copy between devices.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    translated([&] {
      State<R>& s = st();
      device_index dd = device_holding<R>(dest).value_or(s.backend().current_device());
      device_index sd = device_holding<R>(src).value_or(dd);
      StreamHandle h = s.current_handle(sd);
      if (sd == dd) {
        s.backend().memcpy_async(dd, dest, src, count, CopyKind::device_to_device, h, false);
      } else {
        s.backend().memcpy_peer_async(dest, dd, src, sd, count, h);
      }
      note_device_work();
      s.backend().stream_synchronize(sd, h);
    });
  }
  bool initialized() override { return st().backend().is_initialized(); }
  void emptyCache(c10::MempoolId_t) override {
    translated([&] { st().device_memory().empty_cache(); });
  }
  void recordStream(const c10::DataPtr& p, c10::Stream s) override {
    if (!p.get()) return;
    translated([&] {
      st().device_memory().record_stream(p.device().index(), p.get(),
                                         st().streams().handle(st().from_c10(s)));
    });
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    return translated([&] {
      DeviceStats s = st().device_memory().device(d).stats();
      c10::CachingDeviceAllocator::DeviceStats out;
      copy_stats(s.allocation, out.allocation);
      copy_stats(s.segment, out.segment);
      copy_stats(s.active, out.active);
      copy_stats(s.inactive_split, out.inactive_split);
      copy_stats(s.allocated_bytes, out.allocated_bytes);
      copy_stats(s.reserved_bytes, out.reserved_bytes);
      copy_stats(s.active_bytes, out.active_bytes);
      copy_stats(s.inactive_split_bytes, out.inactive_split_bytes);
      copy_stats(s.requested_bytes, out.requested_bytes);
      out.num_alloc_retries = s.num_alloc_retries;
      out.num_ooms = s.num_ooms;
      out.num_sync_all_streams = s.num_sync_all_streams;
      out.num_device_alloc = s.num_device_alloc;
      out.num_device_free = s.num_device_free;
      out.max_split_size = s.max_split_size;
      return out;
    });
  }
  void resetAccumulatedStats(c10::DeviceIndex d) override {
    translated([&] { st().device_memory().device(d).reset_accumulated_stats(); });
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    translated([&] { st().device_memory().device(d).reset_peak_stats(); });
  }
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex d) override {
    return translated([&] {
      MemoryInfo m = st().backend().memory_info(d);
      return std::pair<std::size_t, std::size_t>(m.free, m.total);
    });
  }
};

// Pinned host memory for pin_memory(): a CPU allocator over HostAllocator,
// pinning for the calling thread's current device (Note [Pinned memory per
// device]: pin_memory() names no device).
template <class R>
struct PinnedAllocator final : c10::Allocator {
  static void deleter(void* ptr) {
    if (!ptr || Backend<R>::instance().in_bad_fork()) return;
    reporting_failures<R>([&] { State<R>::get().host_memory().deallocate(ptr); });
  }
  c10::DataPtr allocate(std::size_t n) override {
    return translated([&] {
      State<R>& s = State<R>::get();
      void* p = s.host_memory().allocate(s.backend().current_device(), n);
      return c10::DataPtr(p, p, &deleter, c10::Device(c10::DeviceType::CPU));
    });
  }
  c10::DeleterFnPtr raw_deleter() const override { return &deleter; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

template <class R>
DeviceAllocator<R>& device_allocator() {
  static DeviceAllocator<R> a;
  return a;
}
template <class R>
PinnedAllocator<R>& pinned_allocator() {
  static PinnedAllocator<R> a;
  return a;
}

// -------------------------------------------------------------------- hooks

template <class R>
struct Hooks final : at::PrivateUse1HooksInterface {
  static State<R>& st() { return State<R>::get(); }
  bool isBuilt() const override { return true; }
  // Never throws and never creates a device context.
  bool isAvailable() const override { return Backend<R>::instance().device_count() > 0; }
  bool hasPrimaryContext(c10::DeviceIndex) const override {
    return Backend<R>::instance().is_initialized();
  }
  void init() const override {
    translated([&] { st().backend().lazy_init(); });
  }
  c10::DeviceIndex deviceCount() const override {
    return static_cast<c10::DeviceIndex>(Backend<R>::instance().device_count());
  }
  void setCurrentDevice(c10::DeviceIndex d) const override {
    translated([&] { st().backend().set_device(d); });
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return translated([&] { return static_cast<c10::DeviceIndex>(st().backend().current_device()); });
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex d) const override {
    return translated([&] { return static_cast<c10::DeviceIndex>(st().backend().exchange_device(d)); });
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  bool isPinnedPtr(const void* p) const override {
    return p && Backend<R>::instance().is_initialized() && st().host_memory().is_allocation(p);
  }
  c10::Allocator* getPinnedMemoryAllocator() const override { return &pinned_allocator<R>(); }
  at::Device getDeviceFromPtr(void* p) const override {
    return translated([&] {
      std::optional<device_index> d = device_holding<R>(p);
      TORCH_CHECK(d, R::name, ": pointer ", p, " is not memory of any ", R::name, " device");
      return at::Device(kDeviceType, static_cast<c10::DeviceIndex>(*d));
    });
  }
  // Note [Device generators].
  const at::Generator& getDefaultGenerator(c10::DeviceIndex d) const override {
    static std::vector<at::Generator> generators = [] {
      std::vector<at::Generator> g;
      int n = Backend<R>::instance().device_count();
      for (int i = 0; i < n; ++i)
        g.push_back(at::make_generator<DeviceGenerator>(R::name, static_cast<c10::DeviceIndex>(i)));
      return g;
    }();
    // Neither the check nor the current device initializes the backend:
    // torch.manual_seed seeds every device's generator. Before
    // initialization every thread's device is 0.
    return generators[static_cast<std::size_t>(generator_device(d))];
  }
  at::Generator getNewGenerator(c10::DeviceIndex d) const override {
    return at::make_generator<DeviceGenerator>(R::name, generator_device(d));
  }
  // A generator's device: -1 is the current one; IndexError unless visible.
  static c10::DeviceIndex generator_device(c10::DeviceIndex d) {
    Backend<R>& b = Backend<R>::instance();
    if (d != -1) translated([&] { b.check_visible(d); });
    if (d == -1) d = b.is_initialized() ? translated([&] { return b.current_device(); }) : 0;
    return d;
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, std::size_t newsize) const override;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
