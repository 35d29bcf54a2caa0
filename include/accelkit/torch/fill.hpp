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

  static at::Tensor& zero(at::Tensor& self) {
    return translated([&]() -> at::Tensor& {
      if (self.numel() == 0) return self;
      if (self.is_contiguous()) {
        if (run_on_host(dev(self))) {
          std::memset(self.data_ptr(), 0, nbytes(self));
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
