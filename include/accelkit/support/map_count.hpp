// accelkit/support: host maps of one allocation counted, for a driver that
// maps a memory object once at a time (Vulkan's vkMapMemory, a buffer mapped
// whole): the first host_map maps it, the last host_unmap unmaps it, and the
// ones between share the address.
//
//   struct Allocation { acme_mem_t mem; support::MapCount maps; };
//   void* host_map(...) {
//     void* base = a->maps.map([&] { return acme_map(a->mem); });  // may throw
//     return static_cast<char*>(base) + offset;
//   }
//   void host_unmap(...) {
//     if (!a->maps.unmap([&](void*) { acme_unmap(a->mem); })) driver_error(...);  // not mapped
//   }
//
// Thread-safe: map() and unmap() of one allocation run one at a time, the
// driver's calls included.
#pragma once

#include <accelkit/config.hpp>

#include <mutex>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

class MapCount {
 public:
  // The host address of the map, made by f() when none is held (nothing
  // counted if it throws).
  template <class Map>
  void* map(Map&& f) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_ == 0) address_ = f();
    ++count_;
    return address_;
  }
  // One map fewer; g(address) at the last. False when nothing is mapped.
  template <class Unmap>
  bool unmap(Unmap&& g) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (count_ == 0) return false;
    if (count_ == 1) g(address_);
    if (--count_ == 0) address_ = nullptr;
    return true;
  }
  // Whether any map is held (a destructor unmaps what was left mapped).
  bool mapped() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_ != 0;
  }

 private:
  mutable std::mutex mutex_;
  void* address_ = nullptr;
  int count_ = 0;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
