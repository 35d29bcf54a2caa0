// accelkit: a sharded map from live pointers to their allocator records.
//
// Note [Pointer map]
// free(ptr) must find the block that ptr starts, from any thread. One map
// under one lock would serialize every thread on the device; node-based maps
// cost a heap allocation per insert. This map is split into shards (1024 unless
// told otherwise) by a
// hash of the pointer, each an open-addressing table (linear probing,
// backward-shift deletion, no allocation except when it grows) under its own
// spinlock.
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

template <class V, unsigned ShardBits = 10>
class PointerMap {
  static_assert(std::is_trivially_copyable<V>::value, "values are copied into the table");

 public:
  static constexpr std::size_t kShards = std::size_t{1} << ShardBits;
  static_assert(ShardBits >= 1 && ShardBits <= 16, "shard() takes the top ShardBits hash bits");

  ACCELKIT_ALWAYS_INLINE void insert(const void* key, const V& value) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    s.table.insert(reinterpret_cast<std::uintptr_t>(key), value);
  }
  // Removes and returns the value of `key`, or V{} when absent.
  ACCELKIT_ALWAYS_INLINE V erase(const void* key) {
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
  // Calls f(V) on every value, each shard under its lock (for teardown and
  // reports: entries added or removed meanwhile may or may not be seen).
  template <class F>
  void for_each(F&& f) {
    for (Shard& s : shards_) {
      std::lock_guard<SpinLock> lock(s.lock);
      s.table.for_each(f);
    }
  }
  // Calls f(V&) under the shard's lock on the value of `key`, inserted
  // value-initialized if absent; erases `key` when f returns false.
  template <class F>
  void modify(const void* key, F&& f) {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    auto k = reinterpret_cast<std::uintptr_t>(key);
    V* v = s.table.slot(k);
    if (!v) {
      s.table.insert(k, V{});  // may throw: nothing changed
      v = s.table.slot(k);
    }
    if (!f(*v)) s.table.erase(k);
  }
  // The same for a key that is present (nothing happens otherwise); never
  // allocates.
  template <class F>
  void modify_existing(const void* key, F&& f) noexcept {
    Shard& s = shard(key);
    std::lock_guard<SpinLock> lock(s.lock);
    auto k = reinterpret_cast<std::uintptr_t>(key);
    if (V* v = s.table.slot(k))
      if (!f(*v)) s.table.erase(k);
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
  // Open addressing with linear probing; key 0 marks an empty slot (never a
  // valid allocation address). An erase shifts the entries after it back
  // instead of leaving a tombstone, so the table holds no dead slots and runs
  // at up to 70% load.
  class Table {
   public:
    ACCELKIT_ALWAYS_INLINE void insert(std::uintptr_t key, const V& value) {
      if ((size_ + 1) * 10 > slots_.size() * 7) grow();
      std::size_t i = index(key);
      while (slots_[i].key != kEmpty) {
        if (slots_[i].key == key) {
          slots_[i].value = value;
          return;
        }
        i = next(i);
      }
      slots_[i] = {key, value};
      ++size_;
    }
    ACCELKIT_ALWAYS_INLINE V erase(std::uintptr_t key) {
      if (slots_.empty()) return V{};
      std::size_t i = locate(key);
      if (i == npos) return V{};
      V v = slots_[i].value;
      // Backward-shift deletion: move later entries of the probe run into
      // the hole unless that would put them before their home slot.
      for (std::size_t j = next(i); slots_[j].key != kEmpty; j = next(j)) {
        std::size_t home = index(slots_[j].key);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        slots_[i] = slots_[j];
        i = j;
      }
      slots_[i] = Slot{};
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
    template <class F>
    void for_each(F& f) const {
      for (const Slot& s : slots_)
        if (s.key != kEmpty) f(s.value);
    }
    void prefetch(std::uintptr_t key) const {
      if (!slots_.empty()) ACCELKIT_PREFETCH(&slots_[index(key)]);
    }

   private:
    static constexpr std::uintptr_t kEmpty = 0;
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
    std::size_t next(std::size_t i) const { return (i + 1) & (slots_.size() - 1); }
    std::size_t index(std::uintptr_t key) const {
      std::uint64_t h = static_cast<std::uint64_t>(key >> 9) * 0xC2B2AE3D27D4EB4Full;
      return static_cast<std::size_t>(h >> 32) & (slots_.size() - 1);
    }
    std::size_t locate(std::uintptr_t key) const {
      std::size_t i = index(key);
      while (slots_[i].key != kEmpty) {
        if (slots_[i].key == key) return i;
        i = next(i);
      }
      return npos;
    }
    // Allocates first, so that a failure leaves the table as it was.
    void grow() {
      std::vector<Slot> bigger(slots_.empty() ? 16 : slots_.size() * 2, Slot{});
      bigger.swap(slots_);
      size_ = 0;
      for (const Slot& s : bigger)  // the old slots
        if (s.key != kEmpty) insert(s.key, s.value);  // cannot grow again
    }

    std::vector<Slot> slots_;
    std::size_t size_ = 0;
  };

  struct alignas(64) Shard {
    SpinLock lock;
    Table table;
  };

  Shard& shard(const void* key) {
    auto k = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key) >> 9);
    return shards_[(k * 0x9E3779B97F4A7C15ull) >> (64 - ShardBits)];  // the top bits
  }

  Shard shards_[kShards];
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
