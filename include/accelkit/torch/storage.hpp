// accelkit: the operators on a tensor's device storage: resize_ and
// storage.resize_ (the hooks' resizePrivateUse1Bytes, src/accelkit_torch_adapters.cpp) onto new device memory
// that keeps the contents, _lazy_clone (copy-on-write storage), and
// record_stream, which keeps the memory from reuse until a stream has passed
// its free.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/compat.hpp>
#include <accelkit/torch/empty.hpp>
#include <accelkit/torch/host_access.hpp>
#include <accelkit/torch/ipc.hpp>

#include <cstring>

#include <ATen/ops/_lazy_clone_compositeexplicitautograd_dispatch.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/COW.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct StorageOps : HostAccess {
  using HostAccess::stream_of, HostAccess::queued;

  // Grows a storage to `n` bytes, keeping its contents (device to device).
  // Moves a storage to new memory of exactly `n` bytes, keeping the common
  // prefix (device to device, on the current stream), as the CPU does.
  static void reallocate_storage(const c10::Storage& storage, std::size_t n) {
    device_index d = storage.device().index();
    // As the CPU's: memory this process does not own, such as memory
    // received from another process (a view of part of its segment: Note
    // [Sharing device memory between processes]), keeps its size.
    TORCH_CHECK(storage.resizable(), backend_name(), ": trying to resize storage that is not "
                "resizable (", storage.nbytes(), " bytes on ", storage.device(), ") to ", n,
                " bytes");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = device_allocator().allocate(n);
    std::size_t keep = std::min(n, storage.nbytes());
    if (keep > 0) {
      if (HostAccess::run_on_host(d)) {  // inside a host kernel (Note [Map scopes])
        std::memcpy(HostAccess::host_ptr(d, fresh.get()), HostAccess::host_ptr(d, storage.data()),
                    keep);
      } else {
        backend().memcpy_async(d, fresh.get(), storage.data(), keep,
                                    CopyKind::device_to_device, stream_of(d), false);
        queued(d);
      }
    }
    const_cast<c10::Storage&>(storage).set_data_ptr_noswap(std::move(fresh));
    const_cast<c10::Storage&>(storage).set_nbytes(n);
  }
  // Grows a storage to `n` bytes (never shrinks: Tensor.resize_ keeps memory).
  static void grow_storage(const c10::Storage& storage, std::size_t n) {
    if (n > storage.nbytes()) reallocate_storage(storage, n);
  }

  static const at::Tensor& resize(const at::Tensor& self, c10::SymIntArrayRef size,
                                  std::optional<c10::MemoryFormat> memory_format) {
    return translated([&]() -> const at::Tensor& {
      auto* impl = self.unsafeGetTensorImpl();
      std::int64_t old_nbytes =
          impl->unsafe_storage() ? static_cast<std::int64_t>(impl->unsafe_storage().nbytes()) : 0;
      at::native::resize_impl_cpu_(impl, C10_AS_INTARRAYREF_SLOW(size), std::nullopt,
                                   /*resize_storage=*/false);
      if (impl->numel() > 0) {
        std::size_t needed = at::detail::computeStorageNbytesContiguous(
            impl->sizes(), self.element_size(), impl->storage_offset());
        grow_storage(impl->storage(), needed);
      }
      if (memory_format) impl->empty_tensor_restride(*memory_format);
      // The elements the growth added (Note [Deterministic fill of new memory]).
      if (C10_UNLIKELY(fill_uninitialized_memory()))
        at::native::fill_resize_deterministic_(self, old_nbytes);
      return self;
    });
  }

  // Note [Copy-on-write on the storage's device]
  // Problem: the first write to a copy-on-write storage (torch._lazy_clone)
  // copies its data: c10's materialize_cow calls the allocator's clone,
  // which allocates on the current device. CUDA's kernels enter the
  // tensor's device first (c10's generated DeviceGuard); the SDK's kernels
  // name devices by index and enter none, nor does data_ptr(), so with
  // another device current the copy would go to that device while the
  // tensor still names its own.
  // Decision: torch._lazy_clone runs PyTorch's composite kernel, then gives
  // both storages a materializer that enters the storage's device around
  // c10's materialize_cow: the copy is allocated there and made on that
  // device's current stream (DeviceAllocator::copy_data), whatever device
  // is current, in any thread.
  // Limits: a storage made copy-on-write other than through the
  // dispatcher's _lazy_clone keeps c10's materializer; on PyTorch 2.11,
  // whose storages take no materializer (Note [PyTorch versions]), the copy
  // is made on the current device. A read through
  // data_ptr() (copies to the CPU, the fallback) also materializes.
  static at::Tensor lazy_clone(const at::Tensor& self) {
    at::Tensor out = at::compositeexplicitautograd::_lazy_clone(self);
    for (c10::StorageImpl* s :
         {self.storage().unsafeGetStorageImpl(), out.storage().unsafeGetStorageImpl()}) {
      compat::set_materializer(s, &materialize_on_device);
    }
    return out;
  }
  static void materialize_on_device(c10::StorageImpl* s) {
    c10::DeviceGuard guard(s->device());
    c10::impl::cow::materialize_cow(s);
  }

  // Tensor.record_stream: the storage's memory is not reused before `s` has
  // passed the point of its free (the caching pool's record_stream).
  // The stream must be one of the tensor's device (the pool of that device
  // records it): RuntimeError naming both otherwise.
  static void record_stream(at::Tensor& self, c10::Stream s) {
    TORCH_CHECK(s.device() == self.device(), backend_name(), ": record_stream: the stream is on ",
                s.device(), " but the tensor is on ", self.device());
    // Memory received from another process is not the allocator's; its
    // release waits for the whole device (Note [Sharing device memory
    // between processes]).
    if (is_received(self.storage().data_ptr())) return;
    device_allocator().recordStream(self.storage().data_ptr(), s);
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
