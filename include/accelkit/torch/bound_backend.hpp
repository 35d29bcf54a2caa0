// accelkit: BoundBackend<R>, the backend interface over runtime R's core
// objects (Note [Backend interface] in torch/backend_interface.hpp): the
// one place of the torch layer compiled for the vendor's type, in the
// registration unit (ACCELKIT_REGISTER_BACKEND, torch/register.hpp).
// Includes no PyTorch header.
#pragma once

#include <accelkit/accelkit.hpp>
#include <accelkit/detail/contract.hpp>
#include <accelkit/detail/once.hpp>
#include <accelkit/torch/backend_interface.hpp>
#include <accelkit/torch/python_lock.hpp>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

// What a list entry's `gil` column does before the call (Note [Blocking
// waits release the GIL]).
#define ACCELKIT_TORCH_GIL_held
#define ACCELKIT_TORCH_GIL_released PythonLockRelease unlocked;

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// The backend, its streams (with their event pools), the caching pool and
// the pinned host pool of runtime R, the pools created as the adapters first
// use them.
template <class R>
class BoundBackend final : public BackendInterface {
 public:
  BoundBackend() : backend_(Backend<R>::instance()), streams_(backend_) {}

  // The overrides that forward to one core object, from the lists.
#define ACCELKIT_TORCH_BACKEND_(ret, name, member, params, args, gil) \
  ret name params override {                                         \
    ACCELKIT_TORCH_GIL_##gil return backend_.member args;            \
  }
#define ACCELKIT_TORCH_STREAMS_(ret, name, member, params, args, gil) \
  ret name params override {                                         \
    ACCELKIT_TORCH_GIL_##gil return streams_.member args;            \
  }
#define ACCELKIT_TORCH_POOL_(ret, name, member, params, args, gil) \
  ret name params override {                                      \
    ACCELKIT_TORCH_GIL_##gil return device_memory().member args;  \
  }
#define ACCELKIT_TORCH_DEVICE_POOL_(ret, name, member, params, args, gil) \
  ret name params override {                                             \
    ACCELKIT_TORCH_GIL_##gil return device_memory().device(d).member args; \
  }
#define ACCELKIT_TORCH_HOST_POOL_(ret, name, member, params, args, gil) \
  ret name params override {                                           \
    ACCELKIT_TORCH_GIL_##gil return host_memory().member args;         \
  }
  ACCELKIT_TORCH_BACKEND_MEMBERS(ACCELKIT_TORCH_BACKEND_)
  ACCELKIT_TORCH_STREAMS_MEMBERS(ACCELKIT_TORCH_STREAMS_)
  ACCELKIT_TORCH_POOL_MEMBERS(ACCELKIT_TORCH_POOL_)
  ACCELKIT_TORCH_DEVICE_POOL_MEMBERS(ACCELKIT_TORCH_DEVICE_POOL_)
  ACCELKIT_TORCH_HOST_POOL_MEMBERS(ACCELKIT_TORCH_HOST_POOL_)
#undef ACCELKIT_TORCH_HOST_POOL_
#undef ACCELKIT_TORCH_DEVICE_POOL_
#undef ACCELKIT_TORCH_POOL_
#undef ACCELKIT_TORCH_STREAMS_
#undef ACCELKIT_TORCH_BACKEND_

  void memcpy_async(device_index device, void* dst, const void* src, std::size_t bytes,
                    CopyKind kind, StreamHandle stream, bool host_pinned) override {
    // A copy to or from pageable memory may wait for the stream in the
    // driver (as cudaMemcpyAsync does).
    std::optional<PythonLockRelease> unlocked;
    if (!host_pinned && kind != CopyKind::device_to_device) unlocked.emplace();
    backend_.memcpy_async(device, dst, src, bytes, kind, stream, host_pinned);
  }
  bool has_stream_signals() override { return Backend<R>::has_stream_signals; }
  bool has_graphs() override { return Backend<R>::has_graphs; }
  bool has_ipc_memory() override { return Backend<R>::has_ipc_memory; }
  bool has_ipc_events() override { return Backend<R>::has_ipc_events; }
  [[noreturn]] void capture_refuse(device_index d, StreamHandle s,
                                   std::string_view what) override {
    backend_.capture_refuse(d, s, what);
  }
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

  HostMapTicket maps_acquire(device_index d, void* ptr, std::size_t bytes) override {
    return ticket(HostMaps<R>::get().acquire(d, ptr, bytes));
  }
  void maps_acquire_all(device_index d, std::vector<std::pair<void*, std::size_t>> ranges,
                        std::vector<HostMapTicket>& tickets) override {
    std::vector<typename HostMaps<R>::Ticket> got;
    try {
      HostMaps<R>::get().acquire_all(d, std::move(ranges), got);
    } catch (...) {
      for (const auto& t : got) tickets.push_back(ticket(t));  // their holder releases them
      throw;
    }
    for (const auto& t : got) tickets.push_back(ticket(t));
  }
  void maps_release(const HostMapTicket& t) override {
    HostMaps<R>::get().release(typename HostMaps<R>::Ticket{t.device, t.base, t.id});
  }
  void maps_forget(device_index d, void* ptr) override { HostMaps<R>::get().forget(d, ptr); }
  void* maps_host_ptr(device_index d, const void* p) override {
    return HostMaps<R>::get().host_ptr(d, p);
  }

 private:
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
  static HostMapTicket ticket(const typename HostMaps<R>::Ticket& t) noexcept {
    return HostMapTicket{t.device, t.base, t.id};
  }

  Backend<R>& backend_;
  Streams<R> streams_;
  detail::Once memory_once_, host_once_;  // their configuration may be malformed
  std::unique_ptr<CachingAllocator<R>> device_memory_;
  std::unique_ptr<HostAllocator<R>> host_memory_;
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
