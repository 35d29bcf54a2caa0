// accelkit: the copy operators (_copy_from, _copy_from_and_resize) between
// devices and between a device and the host, strided, dtype-converting and
// non_blocking from pinned memory, with the lazy conjugate and negative bits
// resolved here (Note [Math bits in copies]); and _local_scalar_dense, the
// copy of one element to the host (Tensor.item()).
#pragma once

#include <accelkit/torch/adapter.hpp>
#include <accelkit/torch/host_access.hpp>

#include <ATen/MemoryOverlap.h>

#include <cstring>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

struct CopyOps : HostAccess {
  using HostAccess::on_device, HostAccess::dev, HostAccess::nbytes,
      HostAccess::stream_of, HostAccess::sync, HostAccess::queued,
      HostAccess::host_ready, HostAccess::run_on_host, HostAccess::host_view,
      HostAccess::to_cpu, HostAccess::from_cpu;

  // One memcpy of nbytes from data_ptr copies a to b: the same dtype and
  // sizes, both contiguous or both with the same strides and no gaps nor
  // overlaps (channels-last, any dense permutation: the elements fill
  // [data_ptr, data_ptr + nbytes) at the same offsets).
  static bool same_layout(const at::Tensor& a, const at::Tensor& b) {
    return a.scalar_type() == b.scalar_type() && a.sizes() == b.sizes() &&
           ((a.is_contiguous() && b.is_contiguous()) ||
            (a.strides() == b.strides() && a.is_non_overlapping_and_dense()));
  }

  // Note [Math bits in copies]: a tensor may carry a lazy conjugate or
  // negative bit (x.conj(), a view that conjugates on read). PyTorch's
  // copy_ hands tensors of other backends to _copy_from before it resolves
  // those bits, and the Conjugate/Negative fallbacks, which would resolve
  // them by cloning, clone through copy_ again: an endless recursion. So
  // _copy_from and _copy_from_and_resize fall through those keys (see
  // register_aten_ops) and resolve the bits here: the source's raw values are
  // read without its bits, the bits applied on the CPU, and a destination
  // with bits of its own gets the values that read back as the source's.
  static bool math_bits(const at::Tensor& t) { return t.is_conj() || t.is_neg(); }
  // The same memory without the lazy bits (the raw values).
  static at::Tensor raw(const at::Tensor& t) {
    at::Tensor a = at::alias(t);
    a._set_conj(false);
    a._set_neg(false);
    return a;
  }
  static at::Tensor copy_with_math_bits(const at::Tensor& self, const at::Tensor& dst) {
    at::Tensor values = on_device(self) ? to_cpu(raw(self)) : raw(self).clone();
    values._set_conj(self.is_conj());
    values._set_neg(self.is_neg());
    values = values.resolve_conj().resolve_neg();
    if (!on_device(dst)) {
      dst.copy_(values);  // the CPU's copy_ resolves dst's bits
      return dst;
    }
    // Stored so that reading through dst's bits gives `values`.
    if (dst.is_neg()) values = values.neg();
    if (dst.is_conj()) values = values.conj().resolve_conj();
    from_cpu(raw(dst), values);
    return dst;
  }

  // Note [Copies within one tensor's memory]
  // As the CPU's copy_: a copy onto the very same elements (the same
  // storage, offset, sizes, strides, dtype and bits) does nothing; a copy
  // into a destination whose elements overlap each other, or between
  // elements that partly overlap, raises PyTorch's own overlap error, where
  // PyTorch's check can tell (dense ranges; strided ones it calls too hard
  // to tell, and copies, as the CPU does). Such a copy between two tensors
  // of one storage runs as the CPU's copy_ on one host image of the storage
  // (the host's view of it, or a copy of it when the host cannot reach it
  // now), so an element written before another reads it is read as the CPU
  // reads it, not as a copy of the whole source would give it.
  // PyTorch hands a backend's copies to _copy_from before its own checks,
  // and a driver given overlapping ranges may refuse them (OpenCL: -8,
  // CL_MEM_COPY_OVERLAP) or copy them in any order.
  static bool same_elements(const at::Tensor& self, const at::Tensor& dst) {
    return self.is_alias_of(dst) && self.storage_offset() == dst.storage_offset() &&
           self.sizes() == dst.sizes() && self.strides() == dst.strides() &&
           self.scalar_type() == dst.scalar_type() && self.is_conj() == dst.is_conj() &&
           self.is_neg() == dst.is_neg();
  }

  // Whether the copy is queued on a capturing stream: then only what the
  // device runs is taken (Note [Refusals during capture]): one layout and
  // dtype, on one device or between the device and pinned host memory,
  // whose storage the graph keeps alive (Note [Captured pinned copies]).
  // The rest is refused, naming the operator.
  static bool captured(const at::Tensor& self, const at::Tensor& dst) {
    std::optional<StreamHandle> h;
    device_index d = 0;
    for (const at::Tensor* t : {&self, &dst})
      if (!h && on_device(*t) && (h = capturing_stream(dev(*t)))) d = dev(*t);
    if (!h) return false;
    auto refuse = [&](std::string_view why) {
      backend().capture_refuse(d, *h, fmt::format("aten::_copy_from ({})", why));
    };
    if (math_bits(self) || math_bits(dst))
      refuse("a copy that resolves a conjugate or negative view, done by the host");
    if (!same_layout(self, dst))
      refuse("a copy between different dtypes or layouts, done by the host");
    if (on_device(self) && on_device(dst)) {
      if (dev(self) != dev(dst)) refuse("a copy between two devices");
      return true;
    }
    const at::Tensor& host = on_device(self) ? dst : self;
    if (!backend().host_is_allocation(host.storage().data()))
      refuse("a copy with pageable host memory, which the host reads or writes at once; "
             "copies with pinned memory (pin_memory()) are captured");
    CaptureKeeps::get().keep(d, *h, host.storage());
    return true;
  }

  static at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
    return translated([&] {
      if (self.numel() == 0) return dst;
      if (same_elements(self, dst)) return dst;  // Note [Copies within one tensor's memory]
      if (!dst.is_contiguous()) at::assert_no_internal_overlap(dst);
      if (self.is_alias_of(dst)) at::assert_no_partial_overlap(dst, self);
      // A captured copy is queued, never waited for: it runs at each replay.
      bool in_capture = captured(self, dst);
      if (math_bits(self) || math_bits(dst)) return copy_with_math_bits(self, dst);
      bool src_dev = on_device(self), dst_dev = on_device(dst);
      BackendInterface& b = backend();
      if (src_dev && dst_dev) {
        if (same_layout(self, dst)) {
          if (dev(self) == dev(dst)) {
            if (run_on_host(dev(dst))) {
              std::memmove(HostAccess::host_ptr(dev(dst), dst.data_ptr()),
                           HostAccess::host_ptr(dev(self), self.data_ptr()), nbytes(dst));
              return dst;
            }
            b.memcpy_async(dev(dst), dst.data_ptr(), self.data_ptr(), nbytes(dst),
                           CopyKind::device_to_device, stream_of(dev(dst)), false);
            queued(dev(dst));
          } else {
            sync(dev(dst));  // earlier work on dst finishes before it is overwritten
            b.memcpy_peer_async(dst.data_ptr(), dev(dst), self.data_ptr(), dev(self),
                                nbytes(dst), stream_of(dev(self)));
            sync(dev(self));
          }
          return dst;
        }
        if (dev(self) == dev(dst) && dst.sizes() == self.sizes() && host_ready(dev(self))) {
          host_view(dst).copy_(host_view(self));
          return dst;
        }
        if (dev(self) == dev(dst) && self.is_alias_of(dst)) {
          // One host image of the storage (Note [Copies within one tensor's memory]).
          HostAccess::through_cpu(dst, [&](const at::Tensor& view) {
            char* base = static_cast<char*>(view.data_ptr()) -
                         dst.storage_offset() * dst.element_size();
            view.copy_(at::from_blob(base + self.storage_offset() * self.element_size(),
                                     self.sizes(), self.strides(),
                                     self.options().device(at::kCPU)));
          });
          return dst;
        }
        from_cpu(dst, to_cpu(self));
        return dst;
      }
      // Between device d and host memory that is pinned (for any device:
      // Note [Pinned memory per device]) or not: left in flight on d's
      // stream only when asked to and the host side is pinned (Note [Pinned
      // copies]). A copy left in flight keeps its pinned block from reuse
      // until the stream has passed it, should the tensor be freed first
      // (as CUDA's pinned allocator records an event for it).
      // A captured one records no stream use (no event can be recorded on a
      // capturing stream): the graph keeps its pinned storage instead (Note
      // [Captured pinned copies]).
      auto transfer = [&](device_index d, CopyKind kind) {
        const at::Tensor& host = kind == CopyKind::host_to_device ? self : dst;
        bool pinned = backend().host_is_allocation(host.storage().data());
        bool in_flight = (non_blocking || in_capture) && pinned;
        if (in_flight && !in_capture)
          backend().host_record_stream(host.storage().mutable_data(), d, stream_of(d));
        b.memcpy_async(d, dst.data_ptr(), self.data_ptr(), nbytes(dst), kind, stream_of(d), pinned);
        if (in_flight) queued(d);
        else sync(d);
        return dst;
      };
      if (src_dev) {  // device -> host
        if (same_layout(self, dst))
          return transfer(dev(self), CopyKind::device_to_host);
        dst.copy_(to_cpu(self));
        return dst;
      }
      // host -> device
      if (same_layout(self, dst))
        return transfer(dev(dst), CopyKind::host_to_device);
      from_cpu(dst, self);
      return dst;
    });
  }

  static at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
    dst.resize_(self.sizes());
    return copy_from(self, dst, false);
  }

  static at::Scalar local_scalar_dense(const at::Tensor& self) {
    return translated([&] {
      refuse_if_capturing(dev(self), [] {
        return std::string("aten::_local_scalar_dense (Tensor.item(): the host reads the value "
                           "at once)");
      });
      return to_cpu(self).item();
    });
  }
};

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
