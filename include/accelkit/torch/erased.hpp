// accelkit: the erased backend — what the torch adapters need of a runtime's
// core objects (Backend<R>, its streams, events, pools and host maps) behind
// one abstract interface, so that the adapters are compiled once, for the
// tag ErasedRuntime, instead of once per runtime. Includes no PyTorch header.
//
// Note [Erased backend]
// The torch adapters (guard, allocators, hooks, ATen kernels, host kernels,
// CPU fallback, profiler, the torch.ops.<name> library) are templates on a
// runtime R, and compiling them for R in the registration unit took 2.4x the
// time of a unit that includes only <torch/extension.h>. They use R only
// through a few core objects: Backend<R>, Streams<R>, Event<R>,
// CachingAllocator<R>, HostAllocator<R>, HostMaps<R>, and R::name. So:
// - BackendInterface below is those objects' members that the adapters call,
//   as virtual functions; ErasedBackend<R> implements it over the real core
//   objects of R (the ones State<R> used to own), in the registration unit,
//   which includes the core and this header only;
// - the core classes are specialized for the tag ErasedRuntime, each member
//   one virtual call to the bound interface, and the adapters are compiled
//   for R = ErasedRuntime once, in the SDK's library sources
//   (cmake/accelkit_torch_adapters.cpp, an object library that
//   accelkit_add_torch_backend links into each backend's module);
// - ACCELKIT_REGISTER_BACKEND(R) defines bound_backend() and
//   bound_backend_name() for R, which the library calls: one backend per
//   module, as PyTorch has one PrivateUse1 slot.
// ErasedRuntime is hidden (ACCELKIT_HIDDEN): every template instantiated for
// it is local to its module, so that two backends' modules in one process
// (each with its own bound backend) never share a function-local static
// (GCC makes those STB_GNU_UNIQUE, unified across dlopen'ed libraries) nor
// interpose each other's functions. The cost is one indirect call per core
// member the adapters call (a handful per operator), no allocation and no
// lock.
#pragma once

#include <accelkit/accelkit.hpp>
#include <accelkit/detail/contract.hpp>
#include <accelkit/detail/once.hpp>
#include <accelkit/torch/python_lock.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#if defined(__GNUC__) || defined(__clang__)
#define ACCELKIT_HIDDEN __attribute__((visibility("hidden")))
#else
#define ACCELKIT_HIDDEN
#endif

ACCELKIT_BEGIN_NAMESPACE
namespace torch_adapter {

// One open host map (HostMaps<R>::Ticket, whose type differs per R).
struct ErasedTicket {
  device_index device = 0;
  char* base = nullptr;
  std::uint64_t id = 0;
};

// What the torch adapters call on a runtime's core objects (Note [Erased
// backend]); the members are those of the classes named in each group.
class ACCELKIT_HIDDEN BackendInterface {
 public:
  virtual ~BackendInterface() = default;

  // Backend<R>
  virtual int device_count() noexcept = 0;
  virtual bool is_initialized() noexcept = 0;
  virtual bool in_bad_fork() noexcept = 0;
  virtual void lazy_init() = 0;
  virtual std::string init_error() noexcept = 0;
  virtual const Environment& environment() noexcept = 0;
  virtual void check_visible(device_index device) = 0;
  virtual int physical(device_index device) = 0;
  virtual device_index current_device() = 0;
  virtual void set_device(device_index device) = 0;
  virtual void set_device_deferred(device_index device) = 0;
  virtual device_index exchange_device(device_index device) = 0;
  virtual const DeviceProperties& properties(device_index device) = 0;
  virtual MemoryInfo memory_info(device_index device) = 0;
  virtual bool can_access_peer(device_index device, device_index peer) = 0;
  virtual void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                            CopyKind kind, StreamHandle stream, bool host_pinned) = 0;
  virtual void memset_async(device_index device, void* ptr, int value, std::size_t bytes,
                            StreamHandle stream) = 0;
  virtual void memcpy_peer_async(void* dst, device_index dst_device, const void* src,
                                 device_index src_device, std::size_t bytes,
                                 StreamHandle stream) = 0;
  virtual void stream_synchronize(device_index device, StreamHandle stream) = 0;
  // Note [Host signals] (device/backend.hpp)
  virtual bool has_stream_signals() noexcept = 0;
  virtual SignalHandle signal_create(device_index device) = 0;
  virtual void stream_wait_signal(device_index device, StreamHandle stream, SignalHandle signal) = 0;
  virtual void signal_complete(device_index device, SignalHandle signal, int error,
                               std::string reason) = 0;
  virtual void signal_destroy(device_index device, SignalHandle signal) = 0;
  virtual std::string report_json() = 0;
  virtual std::string report_text() = 0;
  // The contract members the runtime implements (torch.ops.<name>.runtime_members).
  virtual std::vector<std::string> runtime_members() = 0;

  // Streams<R>
  virtual std::pair<int, int> priority_range(device_index device) = 0;
  virtual Stream default_stream(device_index device) = 0;
  virtual Stream pool_stream(device_index device, int priority) = 0;
  virtual Stream create_stream(device_index device, int priority) = 0;
  virtual Stream current_stream(device_index device) = 0;
  virtual Stream exchange_stream(const Stream& s) = 0;
  virtual StreamHandle handle(const Stream& s) = 0;
  virtual StreamHandle current_handle(device_index device) = 0;
  virtual bool stream_query(const Stream& s) = 0;
  virtual void synchronize(const Stream& s) = 0;
  virtual void device_synchronize(device_index device) = 0;

  // Event<R>, as an opaque object the interface creates and deletes.
  virtual void* event_create(EventFlags flags) = 0;
  virtual void event_delete(void* event) noexcept = 0;
  virtual void event_record(void* event, const Stream& s) = 0;
  virtual void event_block(void* event, const Stream& s) = 0;
  virtual bool event_query(void* event) = 0;
  virtual void event_synchronize(void* event) = 0;
  virtual float event_elapsed_time(void* start, void* end) = 0;

  // CachingAllocator<R> and its per-device allocators
  virtual void* device_allocate(device_index device, std::size_t bytes, StreamHandle stream) = 0;
  virtual void* device_try_allocate(device_index device, std::size_t bytes, StreamHandle stream) = 0;
  virtual void device_deallocate(device_index device, void* ptr) = 0;
  virtual bool device_contains(device_index device, const void* ptr) = 0;
  virtual void device_record_stream(device_index device, void* ptr, StreamHandle stream) = 0;
  virtual void device_empty_cache() = 0;
  virtual DeviceStats device_stats(device_index device) = 0;
  virtual MemorySnapshot device_snapshot(device_index device) = 0;
  virtual double memory_fraction(device_index device) = 0;
  virtual void set_memory_fraction(device_index device, double fraction) = 0;
  virtual void device_reset_peak_stats(device_index device) = 0;
  virtual void device_reset_accumulated_stats(device_index device) = 0;

  // HostAllocator<R>
  virtual void* host_allocate(device_index device, std::size_t bytes) = 0;
  virtual void host_deallocate(void* ptr) = 0;
  virtual bool host_is_allocation(const void* ptr) = 0;
  virtual void host_record_stream(void* ptr, device_index device, StreamHandle stream) = 0;
  virtual void host_empty_cache() = 0;
  virtual HostStats host_stats() = 0;
  virtual void host_reset_peak_stats() = 0;
  virtual void host_reset_accumulated_stats() = 0;

  // HostMaps<R>
  virtual ErasedTicket maps_acquire(device_index device, void* ptr, std::size_t bytes) = 0;
  virtual void maps_acquire_all(device_index device,
                                std::vector<std::pair<void*, std::size_t>> ranges,
                                std::vector<ErasedTicket>& tickets) = 0;
  virtual void maps_release(const ErasedTicket& t) = 0;
  virtual void maps_forget(device_index device, void* ptr) = 0;
};

// The module's backend, defined by ACCELKIT_REGISTER_BACKEND(R) (Note
// [Erased backend]): created on first use, never destroyed.
ACCELKIT_HIDDEN BackendInterface& bound_backend();
// R::name, without creating anything (the library registers the device
// name while the module loads).
ACCELKIT_HIDDEN std::string_view bound_backend_name() noexcept;

// R::name of the bound backend, where the adapters write R::name: converts
// to std::string_view, prints, and formats.
struct ErasedName {
  operator std::string_view() const noexcept { return bound_backend_name(); }
  std::string_view view() const noexcept { return bound_backend_name(); }
};
inline std::ostream& operator<<(std::ostream& os, const ErasedName& n) { return os << n.view(); }

// The runtime the torch adapters are compiled for (Note [Erased backend]).
struct ACCELKIT_HIDDEN ErasedRuntime {
  static constexpr ErasedName name{};
};

}  // namespace torch_adapter

// ---------------------------------------- the core, specialized for the tag

template <>
class ACCELKIT_HIDDEN Backend<torch_adapter::ErasedRuntime> {
 public:
  static constexpr torch_adapter::ErasedName name{};
  explicit Backend(torch_adapter::BackendInterface& b) : b_(&b) {}
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;
  static Backend& instance() {
    static Backend* const backend = new Backend(torch_adapter::bound_backend());
    return *backend;
  }
  torch_adapter::BackendInterface& erased() noexcept { return *b_; }

  int device_count() noexcept { return b_->device_count(); }
  bool is_initialized() const noexcept { return b_->is_initialized(); }
  bool in_bad_fork() const noexcept { return b_->in_bad_fork(); }
  void lazy_init() { b_->lazy_init(); }
  std::string init_error() noexcept { return b_->init_error(); }
  const Environment& environment() const noexcept { return b_->environment(); }
  void check_visible(device_index d) { b_->check_visible(d); }
  int physical(device_index d) { return b_->physical(d); }
  device_index current_device() { return b_->current_device(); }
  void set_device(device_index d) { b_->set_device(d); }
  void set_device_deferred(device_index d) { b_->set_device_deferred(d); }
  device_index exchange_device(device_index d) { return b_->exchange_device(d); }
  const DeviceProperties& properties(device_index d) { return b_->properties(d); }
  MemoryInfo memory_info(device_index d) { return b_->memory_info(d); }
  bool can_access_peer(device_index d, device_index peer) { return b_->can_access_peer(d, peer); }
  void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                    CopyKind kind, StreamHandle stream, bool host_pinned) {
    b_->memcpy_async(device, dst, src, bytes, kind, stream, host_pinned);
  }
  void memset_async(device_index device, void* ptr, int value, std::size_t bytes,
                    StreamHandle stream) {
    b_->memset_async(device, ptr, value, bytes, stream);
  }
  void memcpy_peer_async(void* dst, device_index dst_device, const void* src,
                         device_index src_device, std::size_t bytes, StreamHandle stream) {
    b_->memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream);
  }
  void stream_synchronize(device_index d, StreamHandle s) { b_->stream_synchronize(d, s); }
  // Backend<R>::has_stream_signals, known once bound.
  bool stream_signals() noexcept { return b_->has_stream_signals(); }
  SignalHandle signal_create(device_index d) { return b_->signal_create(d); }
  void stream_wait_signal(device_index d, StreamHandle s, SignalHandle g) {
    b_->stream_wait_signal(d, s, g);
  }
  void signal_complete(device_index d, SignalHandle g, int error, std::string reason = {}) {
    b_->signal_complete(d, g, error, std::move(reason));
  }
  void signal_destroy(device_index d, SignalHandle g) { b_->signal_destroy(d, g); }

 private:
  torch_adapter::BackendInterface* b_;
};

template <>
class ACCELKIT_HIDDEN Streams<torch_adapter::ErasedRuntime> {
 public:
  explicit Streams(torch_adapter::BackendInterface& b) : b_(&b) {}
  Streams(const Streams&) = delete;
  Streams& operator=(const Streams&) = delete;
  torch_adapter::BackendInterface& erased() noexcept { return *b_; }

  std::pair<int, int> priority_range(device_index d) { return b_->priority_range(d); }
  Stream default_stream(device_index d) { return b_->default_stream(d); }
  Stream pool_stream(device_index d, int priority = 0) { return b_->pool_stream(d, priority); }
  Stream create_stream(device_index d, int priority = 0) { return b_->create_stream(d, priority); }
  Stream current_stream(device_index d) { return b_->current_stream(d); }
  Stream exchange_stream(const Stream& s) { return b_->exchange_stream(s); }
  StreamHandle handle(const Stream& s) { return b_->handle(s); }
  StreamHandle current_handle(device_index d) { return b_->current_handle(d); }
  bool query(const Stream& s) { return b_->stream_query(s); }
  void synchronize(const Stream& s) { b_->synchronize(s); }
  void device_synchronize(device_index d) { b_->device_synchronize(d); }

 private:
  torch_adapter::BackendInterface* b_;
};

template <>
class ACCELKIT_HIDDEN Event<torch_adapter::ErasedRuntime> {
 public:
  explicit Event(Streams<torch_adapter::ErasedRuntime>& streams,
                 EventFlags flags = EventFlags::none)
      : b_(&streams.erased()), e_(b_->event_create(flags)) {}
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() {
    if (e_) b_->event_delete(e_);
  }
  void record(const Stream& s) { b_->event_record(e_, s); }
  void block(const Stream& s) { b_->event_block(e_, s); }
  bool query() { return b_->event_query(e_); }
  void synchronize() { b_->event_synchronize(e_); }
  float elapsed_time(const Event& end) { return b_->event_elapsed_time(e_, end.e_); }

 private:
  torch_adapter::BackendInterface* b_;
  void* e_;
};

template <>
class ACCELKIT_HIDDEN DeviceCachingAllocator<torch_adapter::ErasedRuntime> {
 public:
  DeviceCachingAllocator(torch_adapter::BackendInterface& b, device_index d) : b_(&b), d_(d) {}
  device_index device() const noexcept { return d_; }
  void* allocate(std::size_t bytes, StreamHandle stream) {
    return b_->device_allocate(d_, bytes, stream);
  }
  void* try_allocate(std::size_t bytes, StreamHandle stream) {
    return b_->device_try_allocate(d_, bytes, stream);
  }
  void deallocate(void* ptr) { b_->device_deallocate(d_, ptr); }
  bool contains(const void* ptr) { return b_->device_contains(d_, ptr); }
  void record_stream(void* ptr, StreamHandle stream) { b_->device_record_stream(d_, ptr, stream); }
  DeviceStats stats() { return b_->device_stats(d_); }
  MemorySnapshot snapshot() { return b_->device_snapshot(d_); }
  double memory_fraction() { return b_->memory_fraction(d_); }
  void set_memory_fraction(double f) { b_->set_memory_fraction(d_, f); }
  void reset_peak_stats() { b_->device_reset_peak_stats(d_); }
  void reset_accumulated_stats() { b_->device_reset_accumulated_stats(d_); }

 private:
  torch_adapter::BackendInterface* b_;
  device_index d_;
};

template <>
class ACCELKIT_HIDDEN CachingAllocator<torch_adapter::ErasedRuntime> {
 public:
  explicit CachingAllocator(torch_adapter::BackendInterface& b) : b_(&b) {}
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;
  // By value: a view of device d's allocator (each call checks d).
  DeviceCachingAllocator<torch_adapter::ErasedRuntime> device(device_index d) {
    return DeviceCachingAllocator<torch_adapter::ErasedRuntime>(*b_, d);
  }
  void* allocate(device_index d, std::size_t bytes, StreamHandle stream) {
    return b_->device_allocate(d, bytes, stream);
  }
  void* try_allocate(device_index d, std::size_t bytes, StreamHandle stream) {
    return b_->device_try_allocate(d, bytes, stream);
  }
  void deallocate(device_index d, void* ptr) { b_->device_deallocate(d, ptr); }
  void record_stream(device_index d, void* ptr, StreamHandle stream) {
    b_->device_record_stream(d, ptr, stream);
  }
  void empty_cache() { b_->device_empty_cache(); }

 private:
  torch_adapter::BackendInterface* b_;
};

template <>
class ACCELKIT_HIDDEN HostAllocator<torch_adapter::ErasedRuntime> {
 public:
  explicit HostAllocator(torch_adapter::BackendInterface& b) : b_(&b) {}
  HostAllocator(const HostAllocator&) = delete;
  HostAllocator& operator=(const HostAllocator&) = delete;
  void* allocate(device_index d, std::size_t bytes) { return b_->host_allocate(d, bytes); }
  void deallocate(void* ptr) { b_->host_deallocate(ptr); }
  bool is_allocation(const void* ptr) { return b_->host_is_allocation(ptr); }
  void record_stream(void* ptr, device_index d, StreamHandle stream) {
    b_->host_record_stream(ptr, d, stream);
  }
  void empty_cache() { b_->host_empty_cache(); }
  HostStats stats() { return b_->host_stats(); }
  void reset_peak_stats() { b_->host_reset_peak_stats(); }
  void reset_accumulated_stats() { b_->host_reset_accumulated_stats(); }

 private:
  torch_adapter::BackendInterface* b_;
};

template <>
class ACCELKIT_HIDDEN HostMaps<torch_adapter::ErasedRuntime> {
 public:
  using Ticket = torch_adapter::ErasedTicket;
  explicit HostMaps(torch_adapter::BackendInterface& b) : b_(&b) {}
  static HostMaps& get() {
    static HostMaps* const maps = new HostMaps(torch_adapter::bound_backend());
    return *maps;
  }
  Ticket acquire(device_index d, void* ptr, std::size_t bytes) {
    return b_->maps_acquire(d, ptr, bytes);
  }
  void acquire_all(device_index d, std::vector<std::pair<void*, std::size_t>> ranges,
                   std::vector<Ticket>& tickets) {
    b_->maps_acquire_all(d, std::move(ranges), tickets);
  }
  void release(const Ticket& t) { b_->maps_release(t); }
  void forget(device_index d, void* ptr) { b_->maps_forget(d, ptr); }

 private:
  torch_adapter::BackendInterface* b_;
};

namespace torch_adapter {

// BackendInterface over runtime R's core objects: the backend, its streams
// (with their event pools), the caching pool and the pinned host pool,
// created as the adapters first use them (Note [Erased backend]).
template <class R>
class ACCELKIT_HIDDEN ErasedBackend final : public BackendInterface {
 public:
  ErasedBackend() : backend_(Backend<R>::instance()), streams_(backend_) {}

  Backend<R>& backend() noexcept { return backend_; }
  Streams<R>& streams() noexcept { return streams_; }
  CachingAllocator<R>& device_memory() {
    memory_once_.call([this] {
      device_memory_ = std::make_unique<CachingAllocator<R>>(
          backend_, AllocatorConfig::from_environment(R::name, backend_.environment()),
          [this](device_index d) { return &streams_.events(d, EventFlags::none); });
    });
    return *device_memory_;
  }
  HostAllocator<R>& host_memory() {
    host_once_.call([this] { host_memory_ = std::make_unique<HostAllocator<R>>(backend_); });
    return *host_memory_;
  }

  int device_count() noexcept override { return backend_.device_count(); }
  bool is_initialized() noexcept override { return backend_.is_initialized(); }
  bool in_bad_fork() noexcept override { return backend_.in_bad_fork(); }
  void lazy_init() override { backend_.lazy_init(); }
  std::string init_error() noexcept override { return backend_.init_error(); }
  const Environment& environment() noexcept override { return backend_.environment(); }
  void check_visible(device_index d) override { backend_.check_visible(d); }
  int physical(device_index d) override { return backend_.physical(d); }
  device_index current_device() override { return backend_.current_device(); }
  void set_device(device_index d) override { backend_.set_device(d); }
  void set_device_deferred(device_index d) override { backend_.set_device_deferred(d); }
  device_index exchange_device(device_index d) override { return backend_.exchange_device(d); }
  const DeviceProperties& properties(device_index d) override { return backend_.properties(d); }
  MemoryInfo memory_info(device_index d) override { return backend_.memory_info(d); }
  bool can_access_peer(device_index d, device_index peer) override {
    return backend_.can_access_peer(d, peer);
  }
  void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                    CopyKind kind, StreamHandle stream, bool host_pinned) override {
    // A copy to or from pageable memory may wait for the stream in the
    // driver (as cudaMemcpyAsync does).
    std::optional<PythonLockRelease> unlocked;
    if (!host_pinned && kind != CopyKind::device_to_device) unlocked.emplace();
    backend_.memcpy_async(device, dst, src, bytes, kind, stream, host_pinned);
  }
  void memset_async(device_index device, void* ptr, int value, std::size_t bytes,
                    StreamHandle stream) override {
    backend_.memset_async(device, ptr, value, bytes, stream);
  }
  void memcpy_peer_async(void* dst, device_index dst_device, const void* src,
                         device_index src_device, std::size_t bytes,
                         StreamHandle stream) override {
    backend_.memcpy_peer_async(dst, dst_device, src, src_device, bytes, stream);
  }
  // The blocking waits release the GIL (Note [Blocking waits release the GIL]).
  void stream_synchronize(device_index d, StreamHandle s) override {
    PythonLockRelease unlocked;
    backend_.stream_synchronize(d, s);
  }
  bool has_stream_signals() noexcept override { return Backend<R>::has_stream_signals; }
  SignalHandle signal_create(device_index d) override { return backend_.signal_create(d); }
  void stream_wait_signal(device_index d, StreamHandle s, SignalHandle g) override {
    backend_.stream_wait_signal(d, s, g);
  }
  void signal_complete(device_index d, SignalHandle g, int error, std::string reason) override {
    backend_.signal_complete(d, g, error, std::move(reason));
  }
  void signal_destroy(device_index d, SignalHandle g) override { backend_.signal_destroy(d, g); }
  std::string report_json() override { return accelkit::report_json(backend_); }
  std::string report_text() override { return accelkit::report_text(backend_); }
  std::vector<std::string> runtime_members() override {
    std::vector<std::string> members;
#define ACCELKIT_DETAIL_NAME_(member, ...) members.push_back(#member);
#define ACCELKIT_DETAIL_OPTIONAL_NAME_(member, ...) \
  if constexpr (detail::has_##member<R>) members.push_back(#member);
    ACCELKIT_REQUIRED_MEMBERS(ACCELKIT_DETAIL_NAME_)
    ACCELKIT_OPTIONAL_MEMBERS(ACCELKIT_DETAIL_OPTIONAL_NAME_)
#undef ACCELKIT_DETAIL_OPTIONAL_NAME_
#undef ACCELKIT_DETAIL_NAME_
    return members;
  }

  std::pair<int, int> priority_range(device_index d) override {
    return streams_.priority_range(d);
  }
  Stream default_stream(device_index d) override { return streams_.default_stream(d); }
  Stream pool_stream(device_index d, int priority) override {
    return streams_.pool_stream(d, priority);
  }
  Stream create_stream(device_index d, int priority) override {
    return streams_.create_stream(d, priority);
  }
  Stream current_stream(device_index d) override { return streams_.current_stream(d); }
  Stream exchange_stream(const Stream& s) override { return streams_.exchange_stream(s); }
  StreamHandle handle(const Stream& s) override { return streams_.handle(s); }
  StreamHandle current_handle(device_index d) override { return streams_.current_handle(d); }
  bool stream_query(const Stream& s) override { return streams_.query(s); }
  void synchronize(const Stream& s) override {
    PythonLockRelease unlocked;
    streams_.synchronize(s);
  }
  void device_synchronize(device_index d) override {
    PythonLockRelease unlocked;
    streams_.device_synchronize(d);
  }

  void* event_create(EventFlags flags) override { return new Event<R>(streams_, flags); }
  void event_delete(void* e) noexcept override { delete static_cast<Event<R>*>(e); }
  void event_record(void* e, const Stream& s) override { static_cast<Event<R>*>(e)->record(s); }
  void event_block(void* e, const Stream& s) override { static_cast<Event<R>*>(e)->block(s); }
  bool event_query(void* e) override { return static_cast<Event<R>*>(e)->query(); }
  void event_synchronize(void* e) override {
    PythonLockRelease unlocked;
    static_cast<Event<R>*>(e)->synchronize();
  }
  float event_elapsed_time(void* start, void* end) override {
    return static_cast<Event<R>*>(start)->elapsed_time(*static_cast<Event<R>*>(end));
  }

  void* device_allocate(device_index d, std::size_t bytes, StreamHandle stream) override {
    return device_memory().allocate(d, bytes, stream);
  }
  void* device_try_allocate(device_index d, std::size_t bytes, StreamHandle stream) override {
    return device_memory().try_allocate(d, bytes, stream);
  }
  void device_deallocate(device_index d, void* ptr) override {
    device_memory().device(d).deallocate(ptr);
  }
  bool device_contains(device_index d, const void* ptr) override {
    return device_memory().device(d).contains(ptr);
  }
  void device_record_stream(device_index d, void* ptr, StreamHandle stream) override {
    device_memory().record_stream(d, ptr, stream);
  }
  void device_empty_cache() override {
    PythonLockRelease unlocked;  // waits for the work that used cached blocks
    device_memory().empty_cache();
  }
  DeviceStats device_stats(device_index d) override { return device_memory().device(d).stats(); }
  MemorySnapshot device_snapshot(device_index d) override {
    return device_memory().device(d).snapshot();
  }
  double memory_fraction(device_index d) override {
    return device_memory().device(d).memory_fraction();
  }
  void set_memory_fraction(device_index d, double f) override {
    device_memory().device(d).set_memory_fraction(f);
  }
  void device_reset_peak_stats(device_index d) override {
    device_memory().device(d).reset_peak_stats();
  }
  void device_reset_accumulated_stats(device_index d) override {
    device_memory().device(d).reset_accumulated_stats();
  }

  void* host_allocate(device_index d, std::size_t bytes) override {
    return host_memory().allocate(d, bytes);
  }
  void host_deallocate(void* ptr) override { host_memory().deallocate(ptr); }
  bool host_is_allocation(const void* ptr) override { return host_memory().is_allocation(ptr); }
  void host_record_stream(void* ptr, device_index d, StreamHandle stream) override {
    host_memory().record_stream(ptr, d, stream);
  }
  void host_empty_cache() override {
    PythonLockRelease unlocked;
    host_memory().empty_cache();
  }
  HostStats host_stats() override { return host_memory().stats(); }
  void host_reset_peak_stats() override { host_memory().reset_peak_stats(); }
  void host_reset_accumulated_stats() override { host_memory().reset_accumulated_stats(); }

  ErasedTicket maps_acquire(device_index d, void* ptr, std::size_t bytes) override {
    return erased(HostMaps<R>::get().acquire(d, ptr, bytes));
  }
  void maps_acquire_all(device_index d, std::vector<std::pair<void*, std::size_t>> ranges,
                        std::vector<ErasedTicket>& tickets) override {
    std::vector<typename HostMaps<R>::Ticket> got;
    try {
      HostMaps<R>::get().acquire_all(d, std::move(ranges), got);
    } catch (...) {
      for (const auto& t : got) tickets.push_back(erased(t));  // their holder releases them
      throw;
    }
    for (const auto& t : got) tickets.push_back(erased(t));
  }
  void maps_release(const ErasedTicket& t) override {
    HostMaps<R>::get().release(typename HostMaps<R>::Ticket{t.device, t.base, t.id});
  }
  void maps_forget(device_index d, void* ptr) override { HostMaps<R>::get().forget(d, ptr); }

 private:
  static ErasedTicket erased(const typename HostMaps<R>::Ticket& t) noexcept {
    return ErasedTicket{t.device, t.base, t.id};
  }
  Backend<R>& backend_;
  Streams<R> streams_;
  detail::Once memory_once_, host_once_;  // their configuration may be malformed
  std::unique_ptr<CachingAllocator<R>> device_memory_;
  std::unique_ptr<HostAllocator<R>> host_memory_;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE

template <>
struct fmt::formatter<::accelkit::torch_adapter::ErasedName> : fmt::formatter<std::string_view> {
  template <class Ctx>
  auto format(const ::accelkit::torch_adapter::ErasedName& n, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(n.view(), ctx);
  }
};
