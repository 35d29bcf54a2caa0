// accelkit: how the native operators reach device memory from the host:
// the current stream and its waits, CPU views of host-visible memory, and
// copies to and from the CPU otherwise (HostAccess, which the operator
// groups, the convolutions, the fallback and the host kernels build on).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/capture.hpp>

#include <cstddef>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

// Note [Mapped memory and other streams]
// A map scope maps a tensor's whole storage, read and write, and host_map
// requires that no queued work uses the range (runtime.hpp). PyTorch lets
// several streams read one tensor, so work queued on another stream of the
// device may still read a storage the current stream is done with: on a
// device whose host_access is mapped, the host paths therefore wait for
// every stream of the device (device_synchronize), not only the current
// one, before they map (host_wait). Work another device queued on this
// memory (a peer copy) is not waited for: its stream's owner orders it.
// Direct devices need no map, and wait for the current stream only.

// Note [Map scopes] (device/host_maps.hpp): the host paths' map scope. On a
// device whose host_access is mapped, each tensor (its whole storage) or
// range given to add() is mapped for the host until the scope ends; on any
// other device the scope does nothing. One thread, one device: the
// innermost open scope of the thread also takes the memory allocated while
// a host kernel runs (DeviceAllocator::allocate), and says that the host
// may touch the device's memory now (HostAccess::host_visible). add() may
// throw accelkit errors (call it inside translated()). The success path ends
// the scope with close(), which unmaps and throws the first failed unmap as
// PyTorch's error (translated here; later failures are reported through the
// diagnostics hook): host writes that may not have reached the device fail
// the operator. A scope left by an exception unmaps in its destructor,
// reporting failures through the diagnostics hook (the exception in flight
// is the operator's error). A tensor's storage that is copy-on-write
// (torch._lazy_clone) is copied before it is mapped (Note [Copy-on-write on
// the storage's device]): the host path may write it, and its new memory is
// what must be mapped.
class MapScope {
 public:
  explicit MapScope(device_index d)
      : d_(d), mapped_(backend().properties(d).host_access == HostAccessLevel::mapped) {
    if (!mapped_) return;
    outer_ = innermost_;
    innermost_ = this;
  }
  ~MapScope() {
    if (!mapped_ || closed_) return;
    innermost_ = outer_;
    for (auto it = tickets_.rbegin(); it != tickets_.rend(); ++it)
      reporting_failures([&] { backend().maps_release(*it); });
  }
  // Ends the scope now: unmaps everything, in reverse order, then throws the
  // first failure (a c10 error naming the backend). Idempotent.
  void close() {
    if (!mapped_ || closed_) return;
    closed_ = true;
    innermost_ = outer_;
    std::exception_ptr first;
    for (auto it = tickets_.rbegin(); it != tickets_.rend(); ++it) {
      try {
        backend().maps_release(*it);
      } catch (...) {
        if (!first) {
          first = std::current_exception();
        } else {
          reporting_failures([e = std::current_exception()] { std::rethrow_exception(e); });
        }
      }
    }
    tickets_.clear();
    if (first) translated([&] { std::rethrow_exception(first); });
  }
  MapScope(const MapScope&) = delete;
  MapScope& operator=(const MapScope&) = delete;

  // Maps the storage of a tensor of this scope's device (others: nothing).
  void add(const at::Tensor& t) {
    if (!mapped_ || !t.defined() || t.device().type() != kDeviceType || t.device().index() != d_ ||
        !t.has_storage())
      return;
    const c10::Storage& s = t.storage();
    add(s.mutable_data(), s.nbytes());  // a copy-on-write storage copied first
  }
  void add(void* p, std::size_t bytes) {
    if (!mapped_ || p == nullptr || bytes == 0) return;
    tickets_.push_back(backend().maps_acquire(d_, p, bytes));
  }
  // Maps the storages of the tensors of this scope's device, largest first,
  // so that a storage inside another (from_blob) only counts, whatever the
  // order of the tensors (Note [Map scopes]).
  void add_all(const std::vector<at::Tensor>& ts) {
    if (!mapped_) return;
    std::vector<std::pair<void*, std::size_t>> ranges;
    for (const at::Tensor& t : ts)
      if (t.defined() && t.device().type() == kDeviceType && t.device().index() == d_ &&
          t.has_storage())
        ranges.emplace_back(t.storage().mutable_data(), t.storage().nbytes());
    backend().maps_acquire_all(d_, std::move(ranges), tickets_);
  }
  // This thread's innermost open scope over mapped memory of d, if any.
  static MapScope* innermost(device_index d) {
    return innermost_ != nullptr && innermost_->d_ == d ? innermost_ : nullptr;
  }

 private:
  static inline thread_local MapScope* innermost_ = nullptr;
  device_index d_;
  bool mapped_;
  bool closed_ = false;
  MapScope* outer_ = nullptr;
  std::vector<HostMapTicket> tickets_;
};

// The host paths' access to device memory, all static.
struct HostAccess {
  static bool on_device(const at::Tensor& t) { return t.device().type() == kDeviceType; }
  static device_index dev(const at::Tensor& t) { return t.device().index(); }
  static HostAccessLevel host_access(device_index d) {
    return backend().properties(d).host_access;
  }

  // Whether the host may touch d's memory now: directly, or mapped while
  // this thread's map scope on d is open (which maps what it touches: Note
  // [Map scopes]).
  static bool host_visible(device_index d) {
    HostAccessLevel a = host_access(d);
    return a == HostAccessLevel::direct ||
           (a == HostAccessLevel::mapped && MapScope::innermost(d) != nullptr);
  }

  // Whether a host path (host kernels, the zero-copy fallback) may run on
  // d's memory, opening a map scope where it must.
  static bool host_reachable(device_index d) { return host_access(d) != HostAccessLevel::none; }
  static std::size_t nbytes(const at::Tensor& t) {
    return static_cast<std::size_t>(t.numel()) * t.element_size();
  }
  static StreamHandle stream_of(device_index d) { return backend().current_handle(d); }
  // Before the host works on d's memory or after work was queued on d's
  // stream: counted as device work (Note [Device work of an operator]).
  static void sync(device_index d) {
    note_device_work();
    backend().stream_synchronize(d, stream_of(d));
  }

  // After queueing work on d's current stream (Note [Device work inside host kernels]).
  static void queued(device_index d) {
    note_device_work();
    if (host_kernel_depth > 0) sync(d);
  }

  // Before the host maps d's memory or works on it (Note [Mapped memory and
  // other streams]): d's current stream, or on a device whose host_access is
  // mapped, every stream of d.
  static void host_wait(device_index d) {
    if (host_access(d) != HostAccessLevel::mapped) return sync(d);
    note_device_work();
    backend().device_synchronize(d);
  }

  // Whether the host may work on d's memory now: it is host-visible, and
  // d's current stream has been waited for (so the work lands in order).
  static bool host_ready(device_index d) {
    if (!host_visible(d)) return false;
    host_wait(d);
    return true;
  }

  // Whether device work on d is better done right here, on the host
  // (Note [Device work inside host kernels]). Waits for d's stream if so.
  static bool run_on_host(device_index d) { return host_kernel_depth > 0 && host_ready(d); }

  // Whether a host path may run on d now: its memory is reachable (direct,
  // or mapped through a scope the caller opens), and d's current stream has
  // been waited for.
  static bool host_reachable_ready(device_index d) {
    if (!host_reachable(d)) return false;
    host_wait(d);
    return true;
  }

  // The host address of device memory `p` of d, which the host may touch
  // now (host_visible(d)): `p` itself on a direct device; on a mapped one,
  // where the open map holding it put it (host_map returns the address,
  // which the driver may choose: Note [Map scopes]), a RuntimeError naming
  // the pointer when no open map holds it. Every host path reaches device
  // memory through this.
  static void* host_ptr(device_index d, const void* p) {
    if (p == nullptr || host_access(d) != HostAccessLevel::mapped) return const_cast<void*>(p);
    return backend().maps_host_ptr(d, p);
  }

  // A CPU tensor viewing the device memory of `t` (host-visible devices
  // only, at the host's address of it).
  static at::Tensor host_view(const at::Tensor& t) {
    return at::from_blob(host_ptr(dev(t), t.data_ptr()), t.sizes(), t.strides(),
                         at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
  }

  // The whole storage of a device tensor, copied to a CPU byte buffer, and
  // `t`'s view of it.
  static std::pair<at::Tensor, at::Tensor> storage_to_cpu(const at::Tensor& t) {
    device_index d = dev(t);
    const c10::Storage& s = t.storage();
    at::Tensor bytes = at::empty({static_cast<int64_t>(s.nbytes())}, at::TensorOptions().dtype(at::kByte));
    backend().memcpy_async(d, bytes.data_ptr(), s.data(), s.nbytes(), CopyKind::device_to_host,
                                stream_of(d), false);
    sync(d);
    at::Tensor view = at::from_blob(static_cast<char*>(bytes.data_ptr()) +
                                        t.storage_offset() * t.element_size(),
                                    t.sizes(), t.strides(),
                                    at::TensorOptions().dtype(t.scalar_type()).device(at::kCPU));
    return {bytes, view};
  }

  // A contiguous CPU tensor of these sizes and dtype, made from bytes: the
  // SDK's staging buffers raise no warning of their own (PyTorch warns when
  // a ComplexHalf tensor is made, which the user's call has done already).
  static at::Tensor host_empty(at::IntArrayRef sizes, at::ScalarType dtype) {
    int64_t bytes = c10::multiply_integers(sizes) * static_cast<int64_t>(c10::elementSize(dtype));
    return at::empty({bytes}, at::TensorOptions().dtype(at::kByte)).view(dtype).view(sizes);
  }

  // A contiguous CPU copy of a device tensor.
  static at::Tensor to_cpu(const at::Tensor& t) {
    device_index d = dev(t);
    if (t.is_contiguous()) {
      at::Tensor out = host_empty(t.sizes(), t.scalar_type());
      backend().memcpy_async(d, out.data_ptr(), t.data_ptr(), nbytes(t),
                                  CopyKind::device_to_host, stream_of(d), false);
      sync(d);
      return out;
    }
    at::Tensor out = host_empty(t.sizes(), t.scalar_type());
    if (host_ready(d)) return out.copy_(host_view(t));
    return out.copy_(storage_to_cpu(t).second);
  }

  // Writes a CPU tensor (broadcast and converted to dst's shape and dtype)
  // into a device tensor.
  static void from_cpu(const at::Tensor& dst, const at::Tensor& src) {
    device_index d = dev(dst);
    at::Tensor tmp = host_empty(dst.sizes(), dst.scalar_type());
    tmp.copy_(src);
    if (dst.is_contiguous()) {
      backend().memcpy_async(d, dst.data_ptr(), tmp.data_ptr(), nbytes(dst),
                                  CopyKind::host_to_device, stream_of(d), false);
      sync(d);
      return;
    }
    if (host_ready(d)) {
      host_view(dst).copy_(tmp);
      return;
    }
    through_cpu(dst, [&](const at::Tensor& view) { view.copy_(tmp); });
  }

  // Runs f(view) on a CPU view of a device tensor whose memory the host
  // cannot touch now: its storage read to the CPU, modified there, written
  // back.
  template <class F>
  static void through_cpu(const at::Tensor& dst, F&& f) {
    device_index d = dev(dst);
    auto [bytes, view] = storage_to_cpu(dst);
    f(view);
    const c10::Storage& s = dst.storage();
    backend().memcpy_async(d, s.mutable_data(), bytes.data_ptr(), s.nbytes(),
                                CopyKind::host_to_device, stream_of(d), false);
    sync(d);
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
