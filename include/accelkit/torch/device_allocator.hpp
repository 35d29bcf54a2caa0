// accelkit: the caching pool as PyTorch's device allocator (torch.empty on
// the device, torch.accelerator's memory functions).
#pragma once

#include <accelkit/torch/common.hpp>
#include <accelkit/torch/device_work.hpp>
#include <accelkit/torch/errors.hpp>

#include <c10/core/CachingDeviceAllocator.h>

#include <array>
#include <cstddef>
#include <limits>
#include <optional>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
ACCELKIT_TORCH_NAMESPACE {

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
inline std::optional<device_index> device_holding(const void* p) {
  int n = backend().device_count();
  for (int d = 0; d < n; ++d)
    if (backend().device_contains(d, p)) return d;
  return std::nullopt;
}

// Note [DataPtr context]
// Problem: a DataPtr's deleter gets only the context, and must free the
// memory on the device that holds it; c10 wants the context to be the data
// pointer itself: copy-on-write storage (torch._lazy_clone) refuses a
// storage whose context is anything else, and rebuilds the last reference's
// DataPtr with the pointer as its context; Allocator::raw_allocate asserts
// it.
// Decision: the context is the pointer, and the device is in the deleter:
// one deleter per device index (device_deleters), chosen when the DataPtr
// is made, so that a free finds its device without a search.
// Limits: raw_deallocate gets a pointer alone: raw_deleter searches the
// devices' segments for it (device_holding). A deleter cannot throw: a
// failure is reported (Note [Diagnostics]). In a child forked after
// initialization the memory belongs to the parent's device context, which
// the child does not have: it is left alone, as CUDA leaves inherited
// device memory.
inline void free_device_memory(device_index d, void* p) {
  if (p == nullptr || backend().in_bad_fork()) return;
  // A block still mapped for the host is unmapped before the pool may
  // reuse or release it (Note [Map scopes]).
  reporting_failures([&] { backend().maps_forget(d, p); });
  reporting_failures([&] { backend().device_deallocate(d, p); });
}

template <std::size_t D>
void free_on_device(void* p) {
  free_device_memory(static_cast<device_index>(D), p);
}
template <std::size_t... D>
constexpr std::array<c10::DeleterFnPtr, sizeof...(D)> make_device_deleters(std::index_sequence<D...>) {
  return {{&free_on_device<D>...}};
}
// One deleter for every device index c10 can name (0..127).
inline constexpr std::size_t kDeviceIndices =
    static_cast<std::size_t>(std::numeric_limits<c10::DeviceIndex>::max()) + 1;
inline constexpr std::array<c10::DeleterFnPtr, kDeviceIndices> device_deleters =
    make_device_deleters(std::make_index_sequence<kDeviceIndices>{});

// The caching pool as PyTorch's DeviceAllocator for the device type, so that
// torch.accelerator's memory functions work.
struct DeviceAllocator final : c10::DeviceAllocator {

  // Device memory `p` of device `d` as a DataPtr that frees it there (Note
  // [DataPtr context]).
  static c10::DataPtr wrap(void* p, device_index d) {
    return c10::DataPtr(p, p, device_deleters[static_cast<std::size_t>(d)],
                        c10::Device(kDeviceType, static_cast<c10::DeviceIndex>(d)));
  }
  // raw_deallocate's deleter: the device is searched for (Note [DataPtr
  // context]).
  static void raw_free(void* p) {
    if (p == nullptr || backend().in_bad_fork()) return;
    std::optional<device_index> d;
    reporting_failures([&] { d = device_holding(p); });
    if (d) {
      free_device_memory(*d, p);
    } else {
      report(Severity::error, backend_name(),
             fmt::format("raw_deallocate of {}, which no device's pool holds; left alone", p));
    }
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
  // allocate (`must`) or try_allocate (src/accelkit_torch_adapters.cpp: a
  // block allocated inside a host kernel joins its map scope).
  c10::DataPtr allocate_or(std::size_t n, bool must);

 public:
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }
  // A storage's clone (c10::Allocator::clone: dest was just allocated, on
  // the current device). The source may be another device's memory: the
  // copy then goes on the source's current stream, after the work queued
  // there, as a copy between devices.
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    translated([&] {
      BackendInterface& b = backend();
      device_index dd = device_holding(dest).value_or(b.current_device());
      device_index sd = device_holding(src).value_or(dd);
      StreamHandle h = b.current_handle(sd);
      if (sd == dd) {
        b.memcpy_async(dd, dest, src, count, CopyKind::device_to_device, h, false);
      } else {
        b.memcpy_peer_async(dest, dd, src, sd, count, h);
      }
      note_device_work();
      b.stream_synchronize(sd, h);
    });
  }
  bool initialized() override { return backend().is_initialized(); }
  // {0,0}: every device's cache; a private pool's id: that pool's free
  // segments on every device, once no graph or MemPool uses it (Note
  // [Private pools]).
  void emptyCache(c10::MempoolId_t id) override {
    translated([&] {
      if (id.first == 0 && id.second == 0) return backend().device_empty_cache();
      int n = backend().device_count();
      for (int d = 0; d < n; ++d)
        backend().device_empty_cache_pool(d, MempoolId{id.first, id.second});
    });
  }
  void recordStream(const c10::DataPtr& p, c10::Stream s) override {
    if (!p.get()) return;
    translated([&] {
      backend().device_record_stream(p.device().index(), p.get(),
                                         backend().handle(from_c10(s)));
    });
  }
  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    return translated([&] {
      DeviceStats s = backend().device_stats(d);
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
    translated([&] { backend().device_reset_accumulated_stats(d); });
  }
  void resetPeakStats(c10::DeviceIndex d) override {
    translated([&] { backend().device_reset_peak_stats(d); });
  }
  std::pair<std::size_t, std::size_t> getMemoryInfo(c10::DeviceIndex d) override {
    return translated([&] {
      MemoryInfo m = backend().memory_info(d);
      return std::pair<std::size_t, std::size_t>(m.free, m.total);
    });
  }
};

inline DeviceAllocator& device_allocator() {
  static DeviceAllocator a;
  return a;
}

}  // namespace torch_adapter
ACCELKIT_END_NAMESPACE
