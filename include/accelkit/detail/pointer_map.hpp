// accelkit: a sharded map from live pointers to their allocator records.
//
// Note [Pointer map]
// free(ptr) must find the block that ptr starts, from any thread. One map
// under one lock would serialize every thread on the device; node-based maps
// cost a heap allocation per insert. This map is split into shards (1024
// unless told otherwise) by a hash of the pointer, each an open-addressing
// table (linear probing, backward-shift deletion, no allocation except when
// it grows) under its own spinlock. Two threads contend only when their
// pointers hash to one shard; with the handful of hot blocks a thread cycles
// through, 64 shards made that happen in about a third of runs, 1024 make it
// rare. Limits: at most a few KiB per shard in use; the values are small
// trivially copyable records, and a value-initialized V means "absent".
// Evidence: bench/memory_bench.cpp, two threads (1.46x with 64 shards, 1.8x).
//
// Note [Reading the pointer map without a lock]
// Writers (insert, erase, update, modify) take the shard's lock; find()
// takes none. A lock is an atomic read-modify-write, and on the device
// pool's hit path the map is read once per free: two of them per pair were
// a third of a large block's hit path (bench/memory_bench.cpp, hit path:
// 40.8 ns with, 29.1 without).
// Each shard is a sequence lock: a writer makes its counter odd, changes the
// table, and makes it even again; a reader reads the counter, the slots, and
// the counter again, and retries when a writer came between. Every slot word
// is an atomic, written with release and read with acquire order (plain
// moves on x86-64, and no fences, which ThreadSanitizer does not model): a
// reader that reads a word a writer wrote then also sees the writer's odd
// counter, so a reader racing a writer reads words that may not belong
// together, but never a torn word, and throws them away. Limits: a table
// that grows is replaced, not freed: the slot arrays a reader may still be
// reading stay allocated until the map is destroyed (at most as many bytes
// as the current ones, as each is twice the last).
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/spinlock.hpp>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
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
    SpinGuard lock(s.lock);
    s.table.insert(reinterpret_cast<std::uintptr_t>(key), value, s.seq);
  }
  // Removes and returns the value of `key`, or V{} when absent.
  ACCELKIT_ALWAYS_INLINE V erase(const void* key) {
    Shard& s = shard(key);
    SpinGuard lock(s.lock);
    return s.table.erase(reinterpret_cast<std::uintptr_t>(key), s.seq);
  }
  // The value of `key`, or V{} when absent; takes no lock (Note [Reading the
  // pointer map without a lock]). What it returns was in the map at some
  // moment during the call.
  ACCELKIT_ALWAYS_INLINE V find(const void* key) const {
    const Shard& s = shard(key);
    auto k = reinterpret_cast<std::uintptr_t>(key);
    for (;;) {
      std::uint32_t before = s.seq.load(std::memory_order_acquire);
      if (before & 1) {
        cpu_relax();
        continue;
      }
      V v = s.table.find(k);  // acquire loads: the counter is read after them
      if (s.seq.load(std::memory_order_relaxed) == before) return v;
    }
  }
  // Calls f(V&) on the value of `key` under the shard's lock; false when
  // `key` is absent.
  template <class F>
  bool update(const void* key, F&& f) {
    return change(key, [&](V* v) {
      if (!v) return Change::none;
      f(*v);
      return Change::keep;
    });
  }
  // Calls f(V) on every value, each shard under its lock (for teardown and
  // reports: entries added or removed meanwhile may or may not be seen).
  template <class F>
  void for_each(F&& f) {
    for (Shard& s : shards_) {
      SpinGuard lock(s.lock);
      s.table.for_each(f);
    }
  }
  // Calls f(V&) under the shard's lock on the value of `key`, inserted
  // value-initialized if absent; erases `key` when f returns false.
  template <class F>
  void modify(const void* key, F&& f) {
    Shard& s = shard(key);
    SpinGuard lock(s.lock);
    auto k = reinterpret_cast<std::uintptr_t>(key);
    if (!s.table.contains(k)) s.table.insert(k, V{}, s.seq);  // may throw: nothing changed
    V v = s.table.find(k);
    if (f(v)) s.table.assign(k, v, s.seq);
    else s.table.erase(k, s.seq);
  }
  // The same for a key that is present (nothing happens otherwise); never
  // allocates.
  template <class F>
  void modify_existing(const void* key, F&& f) noexcept {
    (void)change(key, [&](V* v) {
      if (!v) return Change::none;
      return f(*v) ? Change::keep : Change::erase;
    });
  }
  // Starts loading the slot where `key` would go, so that an insert() that
  // follows other work finds it in cache. Takes no lock: a stale table only
  // makes the hint useless.
  void prefetch(const void* key) const {
    shard(key).table.prefetch(reinterpret_cast<std::uintptr_t>(key));
  }
  std::size_t size() {
    std::size_t n = 0;
    for (Shard& s : shards_) {
      SpinGuard lock(s.lock);
      n += s.table.size();
    }
    return n;
  }

 private:
  enum class Change { none, keep, erase };
  // Under the shard's lock: g(V*) on a copy of the value of `key` (nullptr
  // when absent); the copy is written back (keep) or the key erased.
  // Whether the key was present.
  template <class G>
  bool change(const void* key, G&& g) {
    Shard& s = shard(key);
    SpinGuard lock(s.lock);
    auto k = reinterpret_cast<std::uintptr_t>(key);
    bool present = s.table.contains(k);
    V v = s.table.find(k);
    switch (g(present ? &v : nullptr)) {
      case Change::none: break;
      case Change::keep: s.table.assign(k, v, s.seq); break;
      case Change::erase: s.table.erase(k, s.seq); break;
    }
    return present;
  }

  // Marks a write in progress for lock-free readers, for one scope.
  class Writing {
   public:
    // Odd: the slot words' release stores that follow publish it.
    explicit Writing(std::atomic<std::uint32_t>& seq) noexcept : seq_(seq) {
      seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    ~Writing() { seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release); }
    Writing(const Writing&) = delete;
    Writing& operator=(const Writing&) = delete;

   private:
    std::atomic<std::uint32_t>& seq_;
  };

  // Open addressing with linear probing; key 0 marks an empty slot (never a
  // valid allocation address). An erase shifts the entries after it back
  // instead of leaving a tombstone, so the table holds no dead slots and runs
  // at up to 70% load. Written under the shard's lock, read by find()
  // without it.
  class Table {
   public:
    ACCELKIT_ALWAYS_INLINE void insert(std::uintptr_t key, const V& value,
                                       std::atomic<std::uint32_t>& seq) {
      if ((size_ + 1) * 10 > capacity() * 7) grow(seq);
      Slots* t = current();
      std::size_t i = index(*t, key);
      while (true) {
        std::uintptr_t k = t->slot[i].key.load(std::memory_order_relaxed);
        if (k == key || k == kEmpty) {
          Writing w(seq);
          t->slot[i].put(key, value);
          if (k == kEmpty) ++size_;
          return;
        }
        i = (i + 1) & t->mask;
      }
    }
    // The value of a present key.
    void assign(std::uintptr_t key, const V& value, std::atomic<std::uint32_t>& seq) noexcept {
      Slots* t = current();
      std::size_t i = locate(*t, key);
      Writing w(seq);
      t->slot[i].put(key, value);
    }
    ACCELKIT_ALWAYS_INLINE V erase(std::uintptr_t key, std::atomic<std::uint32_t>& seq) {
      Slots* t = current();
      if (!t) return V{};
      std::size_t i = locate(*t, key);
      if (i == npos) return V{};
      V v = t->slot[i].value();
      Writing w(seq);
      // Backward-shift deletion: move later entries of the probe run into
      // the hole unless that would put them before their home slot.
      for (std::size_t j = (i + 1) & t->mask;; j = (j + 1) & t->mask) {
        std::uintptr_t kj = t->slot[j].key.load(std::memory_order_relaxed);
        if (kj == kEmpty) break;
        std::size_t home = index(*t, kj);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        t->slot[i].put(kj, t->slot[j].value());
        i = j;
      }
      t->slot[i].put(kEmpty, V{});
      --size_;
      return v;
    }
    // Safe against concurrent writers (what it returns may be garbage then;
    // find() checks the shard's sequence counter).
    ACCELKIT_ALWAYS_INLINE V find(std::uintptr_t key) const {
      const Slots* t = current();
      if (!t) return V{};
      std::size_t i = index(*t, key);
      for (std::size_t n = 0; n <= t->mask; ++n, i = (i + 1) & t->mask) {
        std::uintptr_t k = t->slot[i].key.load(std::memory_order_acquire);
        if (k == key) return t->slot[i].value();
        if (k == kEmpty) break;
      }
      return V{};
    }
    bool contains(std::uintptr_t key) const {
      const Slots* t = current();
      return t && locate(*t, key) != npos;
    }
    std::size_t size() const { return size_; }
    template <class F>
    void for_each(F& f) const {
      if (const Slots* t = current())
        for (std::size_t i = 0; i <= t->mask; ++i)
          if (t->slot[i].key.load(std::memory_order_relaxed) != kEmpty) f(t->slot[i].value());
    }
    void prefetch(std::uintptr_t key) const {
      if (const Slots* t = current()) ACCELKIT_PREFETCH(&t->slot[index(*t, key)]);
    }

   private:
    static constexpr std::uintptr_t kEmpty = 0;
    static constexpr std::size_t npos = static_cast<std::size_t>(-1);
    static constexpr std::size_t kWords = (sizeof(V) + 7) / 8;
    // A power-of-two size and alignment, so that no slot straddles two
    // cache lines.
    static constexpr std::size_t slot_align(std::size_t n) {
      std::size_t a = 1;
      while (a < n) a *= 2;
      return a;
    }
    struct alignas(slot_align(8 * (1 + kWords))) Slot {
      std::atomic<std::uintptr_t> key{kEmpty};
      std::atomic<std::uint64_t> word[kWords] = {};
      V value() const noexcept {
        std::uint64_t w[kWords];
        for (std::size_t i = 0; i < kWords; ++i) w[i] = word[i].load(std::memory_order_acquire);
        V v;
        std::memcpy(&v, w, sizeof(V));
        return v;
      }
      void put(std::uintptr_t k, const V& v) noexcept {
        std::uint64_t w[kWords] = {};
        std::memcpy(w, &v, sizeof(V));
        key.store(k, std::memory_order_release);
        for (std::size_t i = 0; i < kWords; ++i) word[i].store(w[i], std::memory_order_release);
      }
    };
    // One table's slots; replaced, never changed in size.
    struct Slots {
      std::size_t mask;
      std::unique_ptr<Slot[]> slot;
    };

    const Slots* current() const noexcept { return current_.load(std::memory_order_acquire); }
    Slots* current() noexcept { return current_.load(std::memory_order_relaxed); }
    std::size_t capacity() const noexcept {
      const Slots* t = current_.load(std::memory_order_relaxed);
      return t ? t->mask + 1 : 0;
    }
    static std::size_t index(const Slots& t, std::uintptr_t key) noexcept {
      std::uint64_t h = static_cast<std::uint64_t>(key >> 9) * 0xC2B2AE3D27D4EB4Full;
      return static_cast<std::size_t>(h >> 32) & t.mask;
    }
    static std::size_t locate(const Slots& t, std::uintptr_t key) noexcept {
      std::size_t i = index(t, key);
      while (true) {
        std::uintptr_t k = t.slot[i].key.load(std::memory_order_relaxed);
        if (k == key) return i;
        if (k == kEmpty) return npos;
        i = (i + 1) & t.mask;
      }
    }
    // Allocates first, so that a failure leaves the table as it was. The
    // old slots stay allocated (Note [Reading the pointer map without a
    // lock]).
    void grow(std::atomic<std::uint32_t>& seq) {
      std::size_t n = capacity() ? capacity() * 2 : 16;
      tables_.reserve(tables_.size() + 1);
      auto bigger = std::make_unique<Slots>(Slots{n - 1, std::make_unique<Slot[]>(n)});
      if (const Slots* old = current())
        for (std::size_t i = 0; i <= old->mask; ++i) {
          std::uintptr_t k = old->slot[i].key.load(std::memory_order_relaxed);
          if (k == kEmpty) continue;
          std::size_t j = index(*bigger, k);
          while (bigger->slot[j].key.load(std::memory_order_relaxed) != kEmpty)
            j = (j + 1) & bigger->mask;
          bigger->slot[j].put(k, old->slot[i].value());
        }
      Writing w(seq);
      current_.store(bigger.get(), std::memory_order_release);
      tables_.push_back(std::move(bigger));  // cannot throw: reserved
    }

    std::atomic<Slots*> current_{nullptr};
    std::vector<std::unique_ptr<Slots>> tables_;  // every table made, current_ last
    std::size_t size_ = 0;
  };

  struct alignas(64) Shard {
    SpinLock lock;
    std::atomic<std::uint32_t> seq{0};  // odd while a writer changes the table
    Table table;
  };

  static std::size_t shard_index(const void* key) noexcept {
    auto k = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(key) >> 9);
    return static_cast<std::size_t>((k * 0x9E3779B97F4A7C15ull) >> (64 - ShardBits));  // the top bits
  }
  Shard& shard(const void* key) noexcept { return shards_[shard_index(key)]; }
  const Shard& shard(const void* key) const noexcept { return shards_[shard_index(key)]; }

  Shard shards_[kShards];
};

}  // namespace detail
ACCELKIT_END_NAMESPACE
