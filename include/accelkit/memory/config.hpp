// accelkit: the memory pool's configuration, <NAME>_ALLOC_CONF.
//
// Note [Allocator configuration]
// The variable uses PyTorch's syntax and key names (PYTORCH_ALLOC_CONF,
// c10/core/AllocatorConfig.h): comma-separated `key:value` pairs, lists in
// brackets, e.g.
//   SIMDEV_ALLOC_CONF="max_split_size_mb:128,garbage_collection_threshold:0.6"
// Keys:
//   max_split_size_mb             blocks this large or larger are never split
//                                 (must exceed 20); default unlimited
//   max_non_split_rounding_mb     how much larger than the request such an
//                                 unsplittable block may be; default 20
//   large_segment_size_mb         segment size for 1-10 MiB requests; default 20
//   garbage_collection_threshold  in (0, 1): before asking the driver for
//                                 more, return the least recently freed unused
//                                 segments until reserved memory is below this
//                                 fraction of the limit; default off
//   roundup_power2_divisions      N (a power of two) or [1:N,2:N,...,>:N] keyed
//                                 by size in MiB: round requests up to one of
//                                 N steps between powers of two; default off
//   per_process_memory_fraction   in (0, 1]: cap on reserved memory as a
//                                 fraction of the device's total; default 1
//   expandable_segments           True: large requests come from segments that
//                                 grow in place (runtimes with the virtual-memory
//                                 members only); default False
//   pinned_use_background_threads False only (True: not supported)
// A separate switch, <NAME>_NO_MEMORY_CACHING=1 (like
// PYTORCH_NO_CUDA_MEMORY_CACHING), turns caching off: every allocation goes
// to the driver, every free returns to it. Unlike PyTorch, which skips what
// it does not know, any unknown key or malformed value is a ValueError that
// names the variable, the key and the value, so a typo cannot silently leave
// the default in force.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/environment.hpp>
#include <accelkit/detail/strings.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <iterator>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

namespace memory_constants {
inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kMinBlockSize = 512;          // every size is a multiple
inline constexpr std::size_t kSmallSize = kMiB;            // largest "small" request
inline constexpr std::size_t kSmallBuffer = 2 * kMiB;      // small segments
inline constexpr std::size_t kMinLargeAlloc = 10 * kMiB;   // below: large_segment_size segments
inline constexpr std::size_t kRoundLarge = 2 * kMiB;       // above: rounded to this
inline constexpr std::size_t kRoundupIntervals = 16;       // 1 MiB .. 32 GiB and above
}  // namespace memory_constants

namespace detail {
// A field of AllocatorConfig: a value read and written with relaxed atomic
// loads and stores (plain moves on common machines), so that a running
// allocator's settings may change while other threads read them without a
// lock (Note [Allocator configuration]). Copies copy the value.
template <class T>
class Relaxed {
 public:
  constexpr Relaxed() noexcept : v_(T{}) {}
  constexpr Relaxed(T v) noexcept : v_(v) {}  // NOLINT(google-explicit-constructor)
  Relaxed(const Relaxed& o) noexcept : v_(o.get()) {}
  Relaxed& operator=(const Relaxed& o) noexcept {
    set(o.get());
    return *this;
  }
  Relaxed& operator=(T v) noexcept {
    set(v);
    return *this;
  }
  operator T() const noexcept { return get(); }  // NOLINT(google-explicit-constructor)
  T get() const noexcept { return v_.load(std::memory_order_relaxed); }
  void set(T v) noexcept { v_.store(v, std::memory_order_relaxed); }

 private:
  std::atomic<T> v_;
};
}  // namespace detail

struct AllocatorConfig {
  template <class T>
  using Field = detail::Relaxed<T>;
  Field<bool> caching = true;  // fixed for an allocator's life
  Field<std::size_t> max_split_size = std::numeric_limits<std::size_t>::max();
  Field<std::size_t> max_non_split_rounding = 20 * memory_constants::kMiB;
  Field<std::size_t> large_segment_size = 20 * memory_constants::kMiB;
  Field<double> garbage_collection_threshold = 0.0;  // 0: off
  // Divisions per power-of-two interval; entry i covers sizes in
  // [2^i MiB, 2^(i+1) MiB), the first also smaller sizes, the last also larger.
  std::array<Field<std::size_t>, memory_constants::kRoundupIntervals> roundup_power2_divisions{};
  Field<double> memory_fraction = 1.0;
  // Large requests come from segments that grow in place (Note [Expandable
  // segments]); an allocator whose runtime has no virtual-memory members
  // refuses it.
  Field<bool> expandable_segments = false;

  // Reads <NAME>_ALLOC_CONF and <NAME>_NO_MEMORY_CACHING from `env`.
  static AllocatorConfig from_environment(std::string_view backend, const Environment& env);
  // Parses a configuration string over `base`; `variable` names it in errors.
  static AllocatorConfig parse(std::string_view backend, std::string_view variable,
                               std::string_view text, AllocatorConfig base);
  static AllocatorConfig parse(std::string_view backend, std::string_view variable,
                               std::string_view text) {
    return parse(backend, variable, text, AllocatorConfig{});
  }

  // The size a request of `bytes` is rounded up to (at least kMinBlockSize).
  std::size_t round_size(std::size_t bytes) const noexcept;
};

namespace detail {

inline int floor_log2(std::uint64_t v) noexcept { return 63 - __builtin_clzll(v); }

// PyTorch's rounding to one of `divisions` steps between powers of two.
inline std::size_t roundup_power2_next_division(std::size_t size, std::size_t divisions) noexcept {
  if ((size & (size - 1)) == 0) return size;
  std::size_t power2_floor = std::size_t{1} << floor_log2(size);
  std::size_t step = power2_floor / divisions;
  if (step == 0) return power2_floor << 1;
  std::size_t floor = size & ~(step - 1);
  return floor == size ? size : floor + step;
}

// Tokens of PyTorch's allocator-configuration syntax: words and : , [ ].
inline std::vector<std::string> tokenize_alloc_conf(std::string_view text) {
  std::vector<std::string> out;
  std::string word;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!word.empty()) out.push_back(std::move(word));
      word.clear();
      out.emplace_back(1, c);
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      word += c;
    }
  }
  if (!word.empty()) out.push_back(std::move(word));
  return out;
}
}  // namespace detail

inline std::size_t AllocatorConfig::round_size(std::size_t bytes) const noexcept {
  using namespace memory_constants;
  if (bytes < kMinBlockSize) return kMinBlockSize;
  std::size_t mib = bytes / kMiB;
  std::size_t interval =
      mib == 0 ? 0 : std::min<std::size_t>(detail::floor_log2(mib), kRoundupIntervals - 1);
  std::size_t divisions = roundup_power2_divisions[interval];
  if (divisions > 1 && bytes > kMinBlockSize * divisions)
    return detail::roundup_power2_next_division(bytes, divisions);
  return (bytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

inline AllocatorConfig AllocatorConfig::parse(std::string_view backend, std::string_view variable,
                                              std::string_view text, AllocatorConfig base) {
  using namespace memory_constants;
  AllocatorConfig c = base;
  std::vector<std::string> t = detail::tokenize_alloc_conf(text);
  auto fail = [&](const std::string& why) -> void {
    throw ValueError(backend, fmt::format("{}='{}': {}", variable, text, why));
  };
  auto token = [&](std::size_t i, std::string_view after) -> const std::string& {
    if (i >= t.size()) fail(fmt::format("missing value after '{}'", after));
    return t[i];
  };
  auto expect = [&](std::size_t i, std::string_view sym, std::string_view after) {
    if (token(i, after) != sym) fail(fmt::format("expected '{}' after '{}', got '{}'", sym, after, t[i]));
  };
  auto whole = [&](const std::string& key, const std::string& v, std::uint64_t lo,
                   std::uint64_t hi) -> std::uint64_t {
    bool ok = !v.empty() && v.size() <= 12;
    for (char ch : v) ok = ok && ch >= '0' && ch <= '9';
    std::uint64_t n = ok ? std::stoull(v) : 0;
    if (!ok || n < lo || n > hi)
      fail(fmt::format("{} expects a whole number in {}..{}, got '{}'", key, lo, hi, v));
    return n;
  };
  enum class Bound : bool { closed, open };
  auto real = [&](const std::string& key, const std::string& v, double lo, Bound lo_bound,
                  double hi, Bound hi_bound) -> double {
    bool lo_open = lo_bound == Bound::open, hi_open = hi_bound == Bound::open;
    std::size_t used = 0;
    double d = 0;
    bool ok = !v.empty();
    try {
      d = std::stod(v, &used);
    } catch (const std::exception&) {
      ok = false;
    }
    ok = ok && used == v.size() && d == d && (lo_open ? d > lo : d >= lo) &&
         (hi_open ? d < hi : d <= hi);
    if (!ok)
      fail(fmt::format("{} expects a number in {}{}, {}{}, got '{}'", key, lo_open ? "(" : "[",
                       lo, hi, hi_open ? ")" : "]", v));
    return d;
  };
  auto boolean = [&](const std::string& key, const std::string& v) -> bool {
    if (v == "True" || v == "true") return true;
    if (v == "False" || v == "false") return false;
    fail(fmt::format("{} expects True or False, got '{}'", key, v));
    return false;
  };

  std::vector<std::string> seen;  // a key given twice is a mistake, not an override
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::string key = t[i];
    if (key == "," && i + 1 < t.size()) continue;
    if (key == "," || key == ":" || key == "[" || key == "]")
      fail(fmt::format("unexpected '{}'", key));
    constexpr std::string_view known[] = {
        "max_split_size_mb",        "max_non_split_rounding_mb",   "large_segment_size_mb",
        "garbage_collection_threshold", "roundup_power2_divisions", "per_process_memory_fraction",
        "expandable_segments",      "pinned_use_background_threads"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known))
      fail(fmt::format("unknown key '{}' (known: {})", key, fmt::join(known, ", ")));
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      fail(fmt::format("key '{}' is given twice", key));
    seen.push_back(key);
    expect(i + 1, ":", key);
    i += 2;
    const std::string& v = token(i, key + ":");
    if (key == "max_split_size_mb") {
      c.max_split_size = whole(key, v, 21, std::uint64_t{1} << 30) * kMiB;
    } else if (key == "max_non_split_rounding_mb") {
      c.max_non_split_rounding = whole(key, v, 0, std::uint64_t{1} << 30) * kMiB;
    } else if (key == "large_segment_size_mb") {
      c.large_segment_size = whole(key, v, 2, std::uint64_t{1} << 20) * kMiB;
    } else if (key == "garbage_collection_threshold") {
      c.garbage_collection_threshold = real(key, v, 0.0, Bound::open, 1.0, Bound::open);
    } else if (key == "per_process_memory_fraction") {
      c.memory_fraction = real(key, v, 0.0, Bound::open, 1.0, Bound::closed);
    } else if (key == "expandable_segments") {
      c.expandable_segments = boolean(key, v);
    } else if (key == "pinned_use_background_threads") {
      if (boolean(key, v))
        throw NotSupportedError(backend, fmt::format("{}='{}': {}:True is not supported by "
                                                     "accelkit's memory pool",
                                                     variable, text, key));
    } else if (key == "roundup_power2_divisions") {
      auto divisions = [&](const std::string& d) {
        std::uint64_t n = whole(key, d, 1, 1024);
        if ((n & (n - 1)) != 0)
          fail(fmt::format("roundup_power2_divisions: {} is not a power of two", d));
        return static_cast<std::size_t>(n);
      };
      if (v != "[") {
        c.roundup_power2_divisions.fill(divisions(v));
      } else {
        std::size_t last_interval = 0;
        bool first = true;
        while (true) {
          const std::string& bound = token(++i, "roundup_power2_divisions:[");
          if (bound == "]") break;
          if (bound == "," && !first) continue;
          expect(i + 1, ":", bound);
          std::size_t n = divisions(token(i + 2, bound + ":"));
          i += 2;
          if (bound == ">") {
            for (std::size_t k = last_interval; k < kRoundupIntervals; ++k)
              c.roundup_power2_divisions[k] = n;
          } else {
            std::uint64_t mib = whole("roundup_power2_divisions interval (MiB)", bound, 1,
                                      std::uint64_t{1} << 40);
            if ((mib & (mib - 1)) != 0)
              fail(fmt::format("roundup_power2_divisions: interval {} MiB is not a power of two",
                               bound));
            std::size_t k =
                std::min<std::size_t>(detail::floor_log2(mib), kRoundupIntervals - 1);
            if (!first && k < last_interval)
              fail("roundup_power2_divisions: intervals must increase");
            c.roundup_power2_divisions[k] = n;
            last_interval = k + 1;
          }
          first = false;
        }
      }
    }
    if (i + 1 < t.size() && t[i + 1] != ",")
      fail(fmt::format("expected ',' after the value of {}, got '{}'", key, t[i + 1]));
  }
  return c;
}

inline AllocatorConfig AllocatorConfig::from_environment(std::string_view backend,
                                                         const Environment& env) {
  AllocatorConfig c;
  std::string prefix = detail::upper(backend);
  std::string no_caching = prefix + "_NO_MEMORY_CACHING";
  if (auto v = env.get(no_caching)) {
    std::string_view s = detail::trim(*v);
    if (s == "1" || s == "true" || s == "True") c.caching = false;
    else if (!(s == "0" || s == "false" || s == "False" || s.empty()))
      throw ValueError(backend, fmt::format("{}='{}': expected 1 or 0", no_caching, *v));
  }
  std::string variable = prefix + "_ALLOC_CONF";
  if (auto v = env.get(variable)) c = parse(backend, variable, *v, c);
  return c;
}

ACCELKIT_END_NAMESPACE
