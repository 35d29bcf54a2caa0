// accelkit: a sharded map from live pointers to their allocator records.
//
// Note [Pointer map]
// free(ptr) must find the block that ptr starts, from any thread. One map
// under one lock would serialize every thread on the device; node-based maps
// cost a heap allocation per insert. This map is split into 1024 shards by a
// hash of the pointer, each an open-addressing table (linear probing,
// tombstones, no allocation except when it grows) under its own spinlock.
// Two threads contend only when their pointers hash to one shard; with the
// handful of hot blocks a thread cycles through, 64 shards made that happen
// in about a third of runs (measured: 1.46x instead of 1.8x for two threads),
// 1024 make it rare, for at most a few KiB per shard in use.
// The values are small trivially copyable records (a pointer, or what the
// device allocator needs to free a block without reading its record, Note
// [Freeing without the block record]); a value-initialized V means "absent".
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/spinlock.hpp>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

template <class V>
class PointerMap {
  static_assert(std::is_trivially_copyable<V>::value, "values are copied into the table");

 public:
  static constexpr std::size_t kShards = 1024;
  static_assert(kShards == (std::size_t{1} << 10), "shard() takes the top 10 hash bits");

  void insert(const void* key, const V& value) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    s.table.insert(reinterpret_cast<std::uintptr_t>(key), value);
  }
  // Removes and returns the value of `key`, or V{} when absent.
  V erase(const void* key) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    return s.table.erase(reinterpret_cast<std::uintptr_t>(key));
  }
  V find(const void* key) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    return s.table.find(reinterpret_cast<std::uintptr_t>(key));
  }
  // Calls f(V&) on the value of `key` under the shard's lock; false when
  // `key` is absent.
  template <class F>
  bool update(const void* key, F&& f) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    V* v = s.table.slot(reinterpret_cast<std::uintptr_t>(key));
    if (!v) return false;
    f(*v);
    return true;
  }
  // Starts loading the slot where `key` would go, so that an insert() that
  // follows other work finds it in cache.
  void prefetch(const void* key) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    s.table.prefetch(reinterpret_cast<std::uintptr_t>(key));
  }
  std::size_t size() {
    std::size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard<SpinLock> lock(s.lock);
      n += s.table.size();
    }
    return n;
  }

 private:
  // Open addressing with linear probing; key 0 marks an empty slot, 1 a
  // tombstone (neither is a valid allocation address).
  class Table {
   public:
    void insert(std::uintptr_t key, const V& value) {
      if ((used_ + 1) * 2 > slots_.size()) grow();
      std::size_t i = index(key);
      std::size_t tomb = npos;
      while (slots_[i].key != kEmpty) {
        if (slots_[i].key == key) {
          slots_[i].value = value;
          return;
        }
        if (slots_[i].key == kTomb && tomb == npos) tomb = i;
        i = (i + 1) & (slots_.size() - 1);
      }
      if (tomb != npos) {
        i = tomb;
      } else {
        ++used_;
      }
      slots_[i] = {key, value};
      ++size_;
    }
    V erase(std::uintptr_t key) {
      if (slots_.empty()) return V{};
      std::size_t i = locate(key);
      if (i == npos) return V{};
      V v = slots_[i].value;
      slots_[i] = {kTomb, V{}};
      --size_;
      return v;
    }
    V find(std::uintptr_t key) const {
      if (slots_.empty()) return V{};
      std::size_t i = locate(key);
      return i == npos ? V{} : slots_[i].value;
    }
    V* slot(std::uintptr_t key) {
      if (slots_.empty()) return nullptr;
      std::size_t i = locate(key);
      return i == npos ? nullptr : &slots_[i].value;
    }
    std::size_t size() const { return size_; }
    void prefetch(std::uintptr_t key) const {
      if (!slots_.empty()) ACCELKIT_PREFETCH(&slots_[index(key)]);
    }

   private:
    static constexpr std::uintptr_t kEmpty = 0, kTomb = 1;
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    // A power-of-two size and alignment, so that no slot straddles two
    // cache lines.
    static constexpr std::size_t slot_align(std::size_t n) {
      std::size_t a = 1;
      while (a < n) a *= 2;
      return a;
    }
    struct alignas(slot_align(sizeof(std::uintptr_t) + sizeof(V))) Slot {
      std::uintptr_t key = kEmpty;
      V value{};
    };
    std::size_t index(std::uintptr_t key) const {
      std::uint64_t h = static_cast<std::uint64_t>(key >> 9) * 0xC2B2AE3D27D4EB4Full;
      return static_cast<std::size_t>(h >> 32) & (slots_.size() - 1);
    }
    std::size_t locate(std::uintptr_t key) const {
      std::size_t i = index(key);
      while (slots_[i].key != kEmpty) {
        if (slots_[i].key == key) return i;
        i = (i + 1) & (slots_.size() - 1);
      }
      return npos;
    }
    void grow() {
      std::vector<Slot> old;
      old.swap(slots_);
      // Grow when live entries fill a quarter; otherwise just drop tombstones.
      std::size_t capacity = old.empty() ? 64 : old.size();
      if ((size_ + 1) * 4 > capacity) capacity *= 2;
      slots_.assign(capacity, Slot{});
      used_ = size_ = 0;
      for (const Slot& s : old)
        if (s.key != kEmpty && s.key != kTomb) insert(s.key, s.value);
    }

    std::vector<Slot> slots_;
    std::size_t used_ = 0;  // live entries and tombstones
    std::size_t size_ = 0;  // live entries
  };

  struct alignas(64) Shard {
    SpinLock lock;
    Table table;
  };

  Shard& shard(const void* key) {
    auto k = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key) >> 9);
    return shards_[(k * 0x9E3779B97F4A7C15ull) >> 54];  // top 10 bits: 1024 shards
  }

  Shard shards_[kShards];
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
