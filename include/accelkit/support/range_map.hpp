// accelkit/support: address ranges that do not overlap, each with a value,
// and the range that holds an address or a span: what a runtime keeps of its
// allocations to check that a copy's memory is allocated, or to find the
// allocation under a pointer into its middle (a tensor's view).
//
//   RangeMap<Allocation> allocations;
//   allocations.insert(ptr, bytes, Allocation{...});
//   if (auto hit = allocations.find(p, n))        // [p, p + n) in one range
//     use(hit.value, hit.offset);                 // p == hit.base + hit.offset
//
// A sorted map: insert, erase and find cost O(log n). Not synchronized: the
// runtime holds its own lock around it (usually the lock that guards the
// values too). AddressSpace (address_space.hpp) is the thread-safe
// allocator of fake addresses built on it.
#pragma once

#include <accelkit/config.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <utility>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

template <class T>
class RangeMap {
 public:
  // What find() found: the range [base, base + bytes) and its value, and
  // the offset of the address asked for; empty (false) when none.
  template <class V>
  struct Found {
    std::uintptr_t base = 0;
    std::size_t bytes = 0;
    std::size_t offset = 0;
    V* value = nullptr;
    explicit operator bool() const noexcept { return value != nullptr; }
    char* pointer() const noexcept { return reinterpret_cast<char*>(base); }
  };

  // Adds [base, base + bytes) with `value`. False, adding nothing, for an
  // empty range, one that wraps past the end of the address space, or one
  // that overlaps a range of the map.
  bool insert(const void* base, std::size_t bytes, T value) {
    std::uintptr_t b = address(base);
    if (bytes == 0 || bytes - 1 > UINTPTR_MAX - b) return false;
    auto next = ranges_.lower_bound(b);
    if (next != ranges_.end() && next->first - b < bytes) return false;
    if (next != ranges_.begin()) {
      auto prev = std::prev(next);
      if (b - prev->first < prev->second.bytes) return false;
    }
    ranges_.emplace_hint(next, b, Entry{bytes, std::move(value)});
    return true;
  }

  // The range that starts exactly at `base`.
  Found<T> at(const void* base) { return found<T>(ranges_.find(address(base)), 0); }
  Found<const T> at(const void* base) const {
    return found<const T>(ranges_.find(address(base)), 0);
  }

  // Removes the range that starts exactly at `base` and returns its value;
  // nothing when no range starts there (an address inside one included).
  std::optional<T> erase(const void* base) {
    auto it = ranges_.find(address(base));
    if (it == ranges_.end()) return std::nullopt;
    std::optional<T> value(std::move(it->second.value));
    ranges_.erase(it);
    return value;
  }

  // The range that holds all of [p, p + bytes); bytes = 1 asks for the range
  // under one address, bytes = 0 accepts a range's end too (an empty span
  // at the end of an allocation).
  Found<T> find(const void* p, std::size_t bytes = 1) {
    auto [it, offset] = holder(address(p), bytes);
    return found<T>(it, offset);
  }
  Found<const T> find(const void* p, std::size_t bytes = 1) const {
    auto [it, offset] = holder(address(p), bytes);
    return found<const T>(it, offset);
  }

  std::size_t size() const noexcept { return ranges_.size(); }
  bool empty() const noexcept { return ranges_.empty(); }
  // f(base, bytes, value) for each range, by address.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& [b, e] : ranges_) f(b, e.bytes, e.value);
  }

 private:
  struct Entry {
    std::size_t bytes;
    T value;
  };
  using Map = std::map<std::uintptr_t, Entry>;

  static std::uintptr_t address(const void* p) noexcept {
    return reinterpret_cast<std::uintptr_t>(p);
  }

  // The range holding [p, p + bytes) and p's offset in it, or end().
  std::pair<typename Map::const_iterator, std::size_t> holder(std::uintptr_t p,
                                                              std::size_t bytes) const {
    auto it = ranges_.upper_bound(p);
    if (it == ranges_.begin()) return {ranges_.end(), 0};
    --it;
    std::size_t offset = p - it->first;  // the range starts at or below p
    std::size_t size = it->second.bytes;
    if (offset > size || bytes > size - offset) return {ranges_.end(), 0};
    return {it, offset};
  }

  template <class V, class It>
  Found<V> found(It it, std::size_t offset) const {
    if (it == ranges_.end()) return {};
    // The map's values are not const; const is the caller's view.
    auto& value = const_cast<T&>(it->second.value);
    return Found<V>{it->first, it->second.bytes, offset, &value};
  }

  Map ranges_;
};

}  // namespace support
ACCELKIT_END_NAMESPACE
