// accelkit: the filling operators (fill_, zero_): on the host when it can
// address the memory, else a device memset or a copy from the CPU.
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/host_access.hpp>

#include <ATen/MemoryOverlap.h>

#include <cstring>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct FillOps : HostAccess {
  using HostAccess::dev, HostAccess::nbytes, HostAccess::stream_of,
      HostAccess::queued, HostAccess::host_ready, HostAccess::run_on_host,
      HostAccess::host_view, HostAccess::from_cpu;

  static at::Tensor& fill(at::Tensor& self, const at::Scalar& value) {
    return translated([&]() -> at::Tensor& {
      if (self.numel() == 0) return self;
      if (std::optional<StreamHandle> h = capturing_stream(dev(self))) {
        captured_fill(self, value, *h);
        return self;
      }
      if (host_ready(dev(self))) {
        host_view(self).fill_(value);
      } else if (at::has_internal_overlap(self) == at::MemOverlap::Yes) {
        // Elements that share memory (an expanded tensor), which the CPU's
        // fill_ takes and a copy from the CPU refuses.
        HostAccess::through_cpu(self, [&](const at::Tensor& view) { view.fill_(value); });
      } else {
        from_cpu(self, at::scalar_tensor(value, self.options().device(at::kCPU)));
      }
      return self;
    });
  }

  // fill_ on a capturing stream (Note [Refusals during capture]): the value
  // written from a pinned buffer that the graph keeps (Note [Captured pinned
  // copies]), or a memset where every byte of the value is the same. A
  // tensor whose elements do not fill one dense range is refused.
  static void captured_fill(at::Tensor& self, const at::Scalar& value, StreamHandle h) {
    device_index d = dev(self);
    BackendInterface& b = backend();
    if (!self.is_non_overlapping_and_dense())
      b.capture_refuse(d, h, "aten::fill_.Scalar (a fill of elements that do not form one dense "
                             "range, done by the host)");
    at::Tensor one = at::scalar_tensor(value, self.options().device(at::kCPU));
    const auto* bytes = static_cast<const unsigned char*>(one.data_ptr());
    std::size_t size = one.element_size();
    bool uniform = true;
    for (std::size_t i = 1; i < size; ++i) uniform = uniform && bytes[i] == bytes[0];
    if (uniform) {
      b.memset_async(d, self.data_ptr(), bytes[0], nbytes(self), h);
      note_device_work();
      return;
    }
    c10::DataPtr pinned = pinned_allocator().allocate(nbytes(self));
    at::from_blob(pinned.get(), {self.numel()}, one.options()).fill_(value);
    c10::Storage storage(c10::Storage::use_byte_size_t(), nbytes(self), std::move(pinned),
                         &pinned_allocator(), /*resizable=*/false);
    if (!CaptureKeeps::get().keep(d, h, storage))
      b.capture_refuse(d, h, "aten::fill_.Scalar (a fill from a pinned buffer, on a stream that "
                             "no graph of the torch layer captures)");
    b.memcpy_async(d, self.data_ptr(), storage.data(), nbytes(self), CopyKind::host_to_device, h,
                   true);
    note_device_work();
  }

  static at::Tensor& zero(at::Tensor& self) {
    return translated([&]() -> at::Tensor& {
      if (self.numel() == 0) return self;
      if (self.is_contiguous()) {
        if (run_on_host(dev(self))) {
          std::memset(HostAccess::host_ptr(dev(self), self.data_ptr()), 0, nbytes(self));
          return self;
        }
        backend().memset_async(dev(self), self.data_ptr(), 0, nbytes(self),
                                    stream_of(dev(self)));
        queued(dev(self));
        return self;
      }
      return fill(self, 0);
    });
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
