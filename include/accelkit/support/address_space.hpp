// accelkit/support: fake device addresses for memory a driver names by
// handle (Vulkan's VkDeviceMemory, OpenCL's cl_mem, a DMA buffer's fd), so
// that a runtime can give PyTorch the pointers it computes with.
//
//   AddressSpace<VkBuffer> space{"vk"};
//   void* p = space.map(buffer, bytes);           // malloc: returns p
//   Location<VkBuffer> at = space.locate(q, n, "memcpy_async");
//   vkCmdCopyBuffer(..., at.handle, ...);         // at.offset: q == p + at.offset
//   VkBuffer b = space.unmap(p, "free");          // free: then destroy b
//
// Memory whose address the driver chose (a persistently mapped allocation
// handed to PyTorch as it is, pinned host memory that is a driver buffer
// too) is recorded with add(address, bytes, handle): the same lookup, the
// same unmap, the same errors, at the driver's addresses.
//
//   void* h = mapped_address_of(buffer);          // host_malloc, or direct mode
//   space.add(h, bytes, buffer, "host_malloc");   // h stays the pointer
//   if (auto at = space.find(src, n)) ...         // pinned: copy from at->handle
//
// Note [Fake device addresses]
// Problem: PyTorch addresses device memory with pointers and does arithmetic
// on them (a view is its storage's pointer plus an offset; the caching
// allocator carves blocks out of one driver allocation), but some drivers
// name memory by an opaque handle and an offset, and have no address for it.
// Decision: each allocation gets a range of addresses of its own in a span
// that holds no host memory; any address inside the range maps back to the
// allocation's handle and the offset, by a sorted map, in O(log n). Addresses
// are given in increasing order and never again after unmap, and a gap of one
// alignment unit separates two ranges, so a stale pointer (a view kept past
// its storage's free) or one past an end (an off-by-one) is an error naming
// the address, never another allocation's memory.
// Ranges the driver placed itself (add) share the map but not the span: one
// may not overlap the span, where it would take addresses map gives.
// Limits: the addresses are not host memory: code that dereferences one
// (a host kernel, a debugger) faults or reads garbage; declare
// host_access none (or mapped, with host_map returning the driver's host
// address of the byte), so the SDK copies around host code. The span is
// spent, not recycled: the default 32 TiB lasts for 32 TiB of allocations
// over the process's life (the SDK's caching pool makes few). The default
// span [16 TiB, 48 TiB) is free in a Linux x86-64 process in practice, not
// by guarantee; reserve one (mmap PROT_NONE) and pass it when that matters.
// Two spaces with the same span give the same addresses: keep one space for
// all the devices of a process (the handle says which device), or give each
// its own span.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/assert.hpp>
#include <accelkit/error.hpp>
#include <accelkit/support/range_map.hpp>

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

struct AddressSpaceOptions {
  std::uintptr_t base = std::uintptr_t{1} << 44;  // 16 TiB (Note [Fake device addresses])
  std::uintptr_t size = std::uintptr_t{1} << 45;  // 32 TiB
  // Each range starts at a multiple of it (a power of two; at least the
  // alignment the runtime declares in its properties).
  std::size_t alignment = 4096;
  // The driver's code for an address in no allocation; none: a ValueError.
  std::optional<std::int64_t> error_code;
};

// An address inside an allocation: its handle, the offset from its start,
// and its size.
template <class Handle>
struct Location {
  Handle handle;
  std::size_t offset = 0;
  std::size_t bytes = 0;
};

template <class Handle>
class AddressSpace {
 public:
  explicit AddressSpace(std::string_view backend, AddressSpaceOptions options = {})
      : backend_(backend), options_(options) {
    if (options_.alignment == 0 || (options_.alignment & (options_.alignment - 1)) != 0 ||
        options_.base % options_.alignment != 0 || options_.base == 0 || options_.size == 0 ||
        options_.size - 1 > UINTPTR_MAX - options_.base)
      throw ValueError(backend_, "AddressSpace: the alignment must be a power of two, and the "
                                 "span non-empty, aligned, above 0 and inside the address "
                                 "space");
  }
  AddressSpace(const AddressSpace&) = delete;
  AddressSpace& operator=(const AddressSpace&) = delete;

  // A new range of `bytes` addresses for the allocation `handle`. An error
  // for zero bytes (a range without addresses could not be told from its
  // neighbour's end) and when the span has no room left.
  void* map(Handle handle, std::size_t bytes, std::string_view call = "malloc") {
    if (bytes == 0)
      fail(call, "a zero-byte allocation has no addresses (allocate at least one byte)");
    std::unique_lock<std::shared_mutex> lock(mutex_);
    // Offsets from the span's base, so that nothing wraps: the range and the
    // gap after it must fit in what is left.
    std::uintptr_t left = options_.size - used_;
    std::uintptr_t need = static_cast<std::uintptr_t>(bytes);
    if (need > left || left - need < options_.alignment)
      fail(call, fmt::format("the address space is exhausted: {} bytes asked, {} left of the "
                             "span [{:#x}, {:#x}] (addresses are not reused)",
                             bytes, left, options_.base, last()));
    std::uintptr_t at = options_.base + used_;
    // Nothing else lies in the span past used_ (add refuses the span).
    bool inserted = ranges_.insert(reinterpret_cast<void*>(at), bytes, std::move(handle));
    ACCELKIT_ASSERT(inserted, "AddressSpace: a new range overlaps a live one");
    (void)inserted;
    // The next range starts one alignment unit past this one's end, aligned.
    std::uintptr_t after = used_ + need + options_.alignment;  // <= size
    std::uintptr_t pad = (options_.alignment - after % options_.alignment) % options_.alignment;
    used_ = pad > options_.size - after ? options_.size : after + pad;
    return reinterpret_cast<void*>(at);
  }

  // Records [address, address + bytes) as the allocation `handle`, at
  // addresses the driver chose (a mapped allocation's host address, a
  // pinned host buffer): locate, find and unmap then treat it as one that
  // map made. An error for zero bytes, a range that wraps, one that
  // overlaps a recorded range (the address is already an allocation's:
  // unmap it first) or the span of fake addresses.
  void add(const void* address, std::size_t bytes, Handle handle,
           std::string_view call = "malloc") {
    auto b = reinterpret_cast<std::uintptr_t>(address);
    if (bytes == 0)
      fail(call, fmt::format("a zero-byte range at {} has no addresses", address));
    if (bytes - 1 > UINTPTR_MAX - b)
      fail(call, fmt::format("{} bytes at {} run past the end of the address space", bytes,
                             address));
    if (b <= last() && b + (bytes - 1) >= options_.base)
      fail(call, fmt::format("{} bytes at {} overlap {}'s span of fake device addresses "
                             "[{:#x}, {:#x}]: choose another span in AddressSpaceOptions",
                             bytes, address, backend_, options_.base, last()));
    std::unique_lock<std::shared_mutex> lock(mutex_);
    if (!ranges_.insert(address, bytes, std::move(handle))) {
      auto hit = ranges_.find(address, 1);
      if (!hit) hit = ranges_.find(static_cast<const char*>(address) + (bytes - 1), 1);
      fail(call, hit ? fmt::format("{} bytes at {} overlap the allocation at {} ({} bytes), "
                                   "which is still recorded",
                                   bytes, address, static_cast<void*>(hit.pointer()), hit.bytes)
                     : fmt::format("{} bytes at {} hold a recorded allocation", bytes, address));
    }
    added_ = true;
  }

  // Ends the allocation that starts at `address` (what map returned, or add
  // recorded) and returns its handle; a fake address is not given again.
  // An error for any other address, an address inside an allocation
  // included.
  Handle unmap(const void* address, std::string_view call = "free") {
    std::unique_lock<std::shared_mutex> lock(mutex_);
    std::optional<Handle> h = ranges_.erase(address);
    if (!h) {
      if (auto hit = ranges_.find(address))
        fail(call, fmt::format("address {} is {} bytes into the allocation at {}: free takes "
                               "the address malloc returned",
                               address, hit.offset, static_cast<void*>(hit.pointer())));
      fail(call, describe_miss(reinterpret_cast<std::uintptr_t>(address)));
    }
    return *h;
  }

  // The allocation that holds all of [p, p + bytes) (bytes = 0: p may be its
  // end), or nothing.
  std::optional<Location<Handle>> find(const void* p, std::size_t bytes = 1) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (auto hit = ranges_.find(p, bytes)) return Location<Handle>{*hit.value, hit.offset, hit.bytes};
    return std::nullopt;
  }
  // The same, or an error naming the call, the span and the allocation it
  // overruns or the reason it is in none.
  Location<Handle> locate(const void* p, std::size_t bytes, std::string_view call) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    if (auto hit = ranges_.find(p, bytes)) return Location<Handle>{*hit.value, hit.offset, hit.bytes};
    if (auto hit = ranges_.find(p, 0))
      fail(call, fmt::format("{} bytes at {} run past the end of the allocation at {} ({} "
                             "bytes, the span starts {} bytes into it)",
                             bytes, p, static_cast<void*>(hit.pointer()), hit.bytes, hit.offset));
    fail(call, describe_miss(reinterpret_cast<std::uintptr_t>(p)));
  }

  // Allocations mapped or added now.
  std::size_t size() const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    return ranges_.size();
  }

  // f(address, bytes, handle) for each allocation, by address, under the
  // space's lock: f must not call the space. For a runtime's destructor:
  // the memory still allocated.
  template <class F>
  void for_each(F&& f) const {
    std::shared_lock<std::shared_mutex> lock(mutex_);
    ranges_.for_each([&](std::uintptr_t b, std::size_t n, const Handle& h) {
      f(reinterpret_cast<void*>(b), n, h);
    });
  }

 private:
  std::uintptr_t last() const noexcept { return options_.base + (options_.size - 1); }
  std::string describe_miss(std::uintptr_t p) const {
    if ((p < options_.base || p > last()) && added_)
      return fmt::format("address {:#x} is in no allocation of {}: outside its fake device "
                         "addresses [{:#x}, {:#x}] and in no range it recorded (freed, or "
                         "never its memory)",
                         p, backend_, options_.base, last());
    if (p < options_.base || p > last())
      return fmt::format("address {:#x} is outside {}'s device address space [{:#x}, {:#x}]: "
                         "not a device pointer of this backend",
                         p, backend_, options_.base, last());
    if (p - options_.base >= used_)
      return fmt::format("address {:#x} was never given to an allocation", p);
    return fmt::format("address {:#x} is in no live allocation: its allocation was freed "
                       "(addresses are not reused), or it lies in the gap past an end",
                       p);
  }
  [[noreturn]] void fail(std::string_view call, const std::string& what) const {
    if (options_.error_code) throw DriverError(backend_, *options_.error_code, call, what);
    throw ValueError(backend_, fmt::format("{}: {}", call, what));
  }

  std::string_view backend_;
  AddressSpaceOptions options_;
  mutable std::shared_mutex mutex_;
  std::uintptr_t used_ = 0;  // the next range's offset from the base; the size when spent
  bool added_ = false;       // add has recorded a range (misses outside the span: not "foreign")
  RangeMap<Handle> ranges_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
