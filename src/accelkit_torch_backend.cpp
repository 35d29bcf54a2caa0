// The SDK's library part, compiled once per project into the object library
// accelkit_torch_adapters that every backend's module links (Note [Backend
// interface] in accelkit/torch/backend_interface.hpp); the module's
// ACCELKIT_REGISTER_BACKEND(R) line defines the backend it uses. The same
// files and compile commands in every build tree (Note [One registration
// source for every build tree] in accelkit_register_backend.cpp). The
// library is cut into units of about equal compile time, so that a build on
// two cores compiles them side by side.
//
// This unit: the device guard, the allocators, the hooks and the profilers,
// and the device name.
#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/host_results.hpp>
#include <accelkit/torch/kineto.hpp>
#include <accelkit/torch/storage.hpp>

#include <string>

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
  HostResults::install();  // Note [CPU results in device memory]
  at::RegisterPrivateUse1HooksInterface(new Hooks());
  register_profilers();  // Note [Profiler device times], [Kineto device activities]
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
      void* ctx = p ? context(p, d) : nullptr;
      return c10::DataPtr(p, ctx, &deleter, c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d)));
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
