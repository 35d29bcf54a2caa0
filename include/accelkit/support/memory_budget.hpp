// accelkit/support: device memory counted against a budget the runtime keeps
// itself, for a driver that would allocate past what the device should give
// (a software driver over host memory, a heap whose size is advice).
//
//   support::MemoryBudget budget{heap_size};
//   void* malloc(int device, std::size_t bytes) {
//     auto held = budget.reserve(bytes);
//     if (!held) return nullptr;                   // past the budget
//     void* p = driver_alloc(bytes);               // may throw, may fail
//     if (!p) return nullptr;                      // the reservation goes back
//     held.keep();
//     return p;
//   }
//   void free(int device, void* p) { budget.release(bytes_of(p)); driver_free(p); }
//   MemoryInfo memory_info(int device) { return budget.info(); }
//
// Thread-safe: reservations never take the count past the budget, however
// many threads reserve at once.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/types.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

class MemoryBudget {
 public:
  // Bytes reserved until keep() (they stay counted) or destruction (they go
  // back); false when the budget had no room (nothing reserved).
  class Reservation {
   public:
    Reservation(Reservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) { o.budget_ = nullptr; }
    Reservation(const Reservation&) = delete;
    Reservation& operator=(const Reservation&) = delete;
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation() {
      if (budget_) budget_->release(bytes_);
    }
    explicit operator bool() const noexcept { return budget_ != nullptr; }
    void keep() noexcept { budget_ = nullptr; }

   private:
    friend class MemoryBudget;
    Reservation(MemoryBudget* budget, std::uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    MemoryBudget* budget_;
    std::uint64_t bytes_;
  };

  explicit MemoryBudget(std::uint64_t total = 0) noexcept : total_(total) {}
  // The budget; set before the first reserve().
  void set_total(std::uint64_t total) noexcept { total_ = total; }
  std::uint64_t total() const noexcept { return total_; }
  std::uint64_t used() const noexcept { return used_.load(); }

  Reservation reserve(std::uint64_t bytes) noexcept {
    std::uint64_t used = used_.load();
    do {
      if (bytes > total_ - std::min(used, total_)) return {nullptr, 0};
    } while (!used_.compare_exchange_weak(used, used + bytes));
    return {this, bytes};
  }
  // Bytes a kept reservation counted, freed.
  void release(std::uint64_t bytes) noexcept { used_ -= bytes; }

  // memory_info's answer: the budget, and what is left of it.
  MemoryInfo info() const noexcept {
    std::uint64_t used = used_.load();
    return {used < total_ ? total_ - used : 0, total_};
  }

 private:
  std::uint64_t total_;
  std::atomic<std::uint64_t> used_{0};
};

}  // namespace support
ACCELKIT_END_NAMESPACE
