// accelkit: the memory pools' configuration: PyTorch's allocator settings.
//
// Note [Allocator configuration]
// The settings use PyTorch's syntax, key names and meanings (PYTORCH_ALLOC_CONF,
// c10/core/AllocatorConfig.h, c10/cuda/CUDAAllocatorConfig.h):
// comma-separated `key:value` pairs, lists in brackets, e.g.
//   SIMDEV_ALLOC_CONF="max_split_size_mb:128,garbage_collection_threshold:0.6"
// Sources, each applied over the one before, key by key (a key a later source
// does not name keeps its value):
//   1. PYTORCH_ALLOC_CONF, or, only where it is unset, its older name
//      PYTORCH_CUDA_ALLOC_CONF (or, where that is unset too, ROCm's
//      PYTORCH_HIP_ALLOC_CONF). c10 2.13 itself reads the older names first
//      when several are set; PyTorch documents the new one as preferred;
//   2. <NAME>_ALLOC_CONF (e.g. SIMDEV_ALLOC_CONF), for this backend only;
//   3. at run time, torch._C._accelerator_setAllocatorSettings(s) (and
//      torch.<name>.memory._set_allocator_settings(s)): `s` over the current
//      settings of every allocator of the process, and of those made later
//      (AllocatorSettings below; torch/allocator_settings.hpp). CUDA instead
//      returns max_split_size_mb, roundup_power2_divisions and
//      garbage_collection_threshold to their defaults when `s` omits them.
// Keys of the device pool (memory/caching_allocator.hpp):
//   max_split_size_mb             blocks this large or larger are never split;
//                                 at least large_segment_size_mb; default unlimited
//   max_non_split_rounding_mb     how much larger than the request such an
//                                 unsplittable block may be (c10 wants at least
//                                 large_segment_size_mb; any size is taken
//                                 here); default 20
//   large_segment_size_mb         largest segment made for 1-10 MiB requests
//                                 (Note [Segment sizes]); above 10; default 20
//   garbage_collection_threshold  in (0, 1): before asking the driver for
//                                 more, return the least recently freed unused
//                                 segments until reserved memory is below this
//                                 fraction of the limit; default off
//   roundup_power2_divisions      N (a power of two) or [1:N,2:N,...,>:N] keyed
//                                 by size in MiB (N 0 or a power of two; the
//                                 first entry also covers smaller sizes): round
//                                 requests up to one of N steps between powers
//                                 of two; default off
//   per_process_memory_fraction   in (0, 1]: cap on reserved memory as a
//                                 fraction of the device's total, as
//                                 set_per_process_memory_fraction; default 1
//   expandable_segments           True: large requests come from segments that
//                                 grow in place (runtimes with the virtual-memory
//                                 members only); default False
//   backend                       native only (CUDA's cudaMallocAsync has no
//                                 counterpart)
// Keys of the pinned host pool (memory/host_allocator.hpp):
//   pinned_use_background_threads True: a thread of the pool returns freed
//                                 blocks whose copies completed to the cache,
//                                 instead of the allocations; default False
//   pinned_max_round_threshold_mb requests above this are not rounded up to a
//                                 power of two; default unlimited
//   pinned_max_cached_size_mb     freed blocks above this go back to the driver,
//                                 and requests above it are not rounded;
//                                 default unlimited
// CUDA's other keys are accepted at the value that describes what the pools
// do here and refused otherwise, saying why: release_lock_on_cudamalloc True
// (no pool lock is held while the driver allocates),
// pinned_use_cuda_host_register False, pinned_num_register_threads (never:
// it serves host registration), graph_capture_record_stream_reuse False,
// pinned_reserve_segment_size_mb 0, pinned_free_catch_all False,
// throw_on_cudamalloc_oom False (and the HIP spellings).
// A separate switch, <NAME>_NO_MEMORY_CACHING=1 (like
// PYTORCH_NO_CUDA_MEMORY_CACHING), turns caching off: every allocation goes
// to the driver, every free returns to it. Unlike c10, which skips what it
// does not know where no device has registered its keys, any unknown key or
// malformed value is a ValueError that names the variable, the key and the
// value, so a typo cannot silently leave the default in force; a key given
// twice in one string is refused too. Every field is a relaxed atomic
// (detail::Relaxed), so a live allocator's settings can change while other
// threads allocate without a lock on the hot path; a request running
// meanwhile sees each field old or new. Limits: caching is fixed for an
// allocator's life; a later source can change a key but not unset it.
// Evidence: bench/memory_bench.cpp's hit path, unchanged by the relaxed fields.
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
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
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
  // The pinned host pool's (HostAllocator).
  Field<bool> pinned_use_background_threads = false;
  Field<std::size_t> pinned_max_round_threshold = std::numeric_limits<std::size_t>::max();
  Field<std::size_t> pinned_max_cached_size = std::numeric_limits<std::size_t>::max();

  // The sources of Note [Allocator configuration] read from `env`:
  // PYTORCH_ALLOC_CONF (or PYTORCH_CUDA_ALLOC_CONF), <NAME>_ALLOC_CONF over
  // it, and <NAME>_NO_MEMORY_CACHING.
  static AllocatorConfig from_environment(std::string_view backend, const Environment& env);
  // Parses a configuration string over `base`; `variable` names it in errors.
  static AllocatorConfig parse(std::string_view backend, std::string_view variable,
                               std::string_view text, AllocatorConfig base);
  static AllocatorConfig parse(std::string_view backend, std::string_view variable,
                               std::string_view text) {
    return parse(backend, variable, text, AllocatorConfig{});
  }
  // Whether `text` sets `key` (its syntax is not checked).
  static bool names(std::string_view text, std::string_view key);
  // The keys parse() knows that c10's AcceleratorAllocatorConfig may not.
  static constexpr std::array<std::string_view, 13> kCudaKeys = {
      "per_process_memory_fraction",   "backend",
      "release_lock_on_cudamalloc",    "release_lock_on_hipmalloc",
      "pinned_use_cuda_host_register", "pinned_use_hip_host_register",
      "pinned_num_register_threads",   "graph_capture_record_stream_reuse",
      "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
      "throw_on_cudamalloc_oom",       "pinned_max_round_threshold_mb",
      "pinned_max_cached_size_mb"};

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
  std::size_t max_split_mb = 0;  // checked once every key is read
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::string key = t[i];
    if (key == "," && i + 1 < t.size()) continue;
    if (key == "," || key == ":" || key == "[" || key == "]")
      fail(fmt::format("unexpected '{}'", key));
    constexpr std::string_view known[] = {
        "max_split_size_mb",          "max_non_split_rounding_mb",
        "large_segment_size_mb",      "garbage_collection_threshold",
        "roundup_power2_divisions",   "per_process_memory_fraction",
        "expandable_segments",        "backend",
        "pinned_use_background_threads", "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",  "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",  "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register", "pinned_num_register_threads",
        "graph_capture_record_stream_reuse", "pinned_reserve_segment_size_mb",
        "pinned_free_catch_all",      "throw_on_cudamalloc_oom"};
    if (std::find(std::begin(known), std::end(known), key) == std::end(known))
      fail(fmt::format("unknown key '{}' (known: {})", key, fmt::join(known, ", ")));
    if (std::find(seen.begin(), seen.end(), key) != seen.end())
      fail(fmt::format("key '{}' is given twice", key));
    seen.push_back(key);
    expect(i + 1, ":", key);
    i += 2;
    const std::string& v = token(i, key + ":");
    // A CUDA key accepted only at the value that says what the pools here do.
    auto only = [&](bool accepted, std::string_view why) {
      if (boolean(key, v) != accepted) fail(fmt::format("{}:{} is refused: {}", key, v, why));
    };
    constexpr std::uint64_t kMaxMiB = std::uint64_t{1} << 30;  // 1 PiB
    if (key == "max_split_size_mb") {
      max_split_mb = static_cast<std::size_t>(whole(key, v, 1, kMaxMiB));
      c.max_split_size = max_split_mb * kMiB;
    } else if (key == "max_non_split_rounding_mb") {
      c.max_non_split_rounding = whole(key, v, 0, kMaxMiB) * kMiB;
    } else if (key == "large_segment_size_mb") {
      c.large_segment_size = whole(key, v, kMinLargeAlloc / kMiB + 1, kMaxMiB) * kMiB;
    } else if (key == "garbage_collection_threshold") {
      c.garbage_collection_threshold = real(key, v, 0.0, Bound::open, 1.0, Bound::open);
    } else if (key == "per_process_memory_fraction") {
      c.memory_fraction = real(key, v, 0.0, Bound::open, 1.0, Bound::closed);
    } else if (key == "expandable_segments") {
      c.expandable_segments = boolean(key, v);
    } else if (key == "pinned_use_background_threads") {
      c.pinned_use_background_threads = boolean(key, v);
    } else if (key == "pinned_max_round_threshold_mb") {
      c.pinned_max_round_threshold = whole(key, v, 0, kMaxMiB) * kMiB;
    } else if (key == "pinned_max_cached_size_mb") {
      c.pinned_max_cached_size = whole(key, v, 0, kMaxMiB) * kMiB;
    } else if (key == "backend") {
      if (v != "native")
        fail(fmt::format("backend:{} is refused: the native caching allocator is the only one "
                         "here (cudaMallocAsync is CUDA's driver allocator)",
                         v));
    } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc") {
      only(true, "the pool never holds a lock while the driver allocates");
    } else if (key == "pinned_use_cuda_host_register" || key == "pinned_use_hip_host_register") {
      only(false, "pinned memory comes from the runtime's host_malloc; there is no "
                    "registration of pageable memory");
    } else if (key == "pinned_num_register_threads") {
      whole(key, v, 1, 128);
      fail(fmt::format("{}:{} is refused: it sets the threads of CUDA's host registration "
                       "(pinned_use_cuda_host_register), which does not exist here",
                       key, v));
    } else if (key == "graph_capture_record_stream_reuse") {
      only(false, "a block freed during a capture after use on another stream is not "
                    "reused within it (Note [Frees during capture])");
    } else if (key == "pinned_reserve_segment_size_mb") {
      if (whole(key, v, 0, kMaxMiB) != 0)
        fail(fmt::format("{}:{} is refused: the pinned pool serves each request from a block "
                         "of its own; it reserves no segment to carve",
                         key, v));
    } else if (key == "pinned_free_catch_all") {
      only(false, "it selects a mode of CUDA's pinned-memory frees that this pool does not "
                    "have");
    } else if (key == "throw_on_cudamalloc_oom") {
      only(false, "the pool asks the driver and reports its out-of-memory as such");
    } else if (key == "roundup_power2_divisions") {
      auto divisions = [&](const std::string& d, std::uint64_t lo) {
        std::uint64_t n = whole(key, d, lo, 1024);
        if ((n & (n - 1)) != 0)
          fail(fmt::format("roundup_power2_divisions: {} is not a power of two", d));
        return static_cast<std::size_t>(n);
      };
      if (v != "[") {
        c.roundup_power2_divisions.fill(divisions(v, 1));
      } else {
        std::size_t last_interval = 0;
        bool first = true;
        while (true) {
          const std::string& bound = token(++i, "roundup_power2_divisions:[");
          if (bound == "]") break;
          if (bound == "," && !first) continue;
          expect(i + 1, ":", bound);
          std::size_t n = divisions(token(i + 2, bound + ":"), 0);
          i += 2;
          if (bound == ">") {
            for (std::size_t k = first ? 0 : last_interval; k < kRoundupIntervals; ++k)
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
            // As c10: the first interval given also covers the sizes below it.
            for (std::size_t j = first ? 0 : k; j <= k; ++j) c.roundup_power2_divisions[j] = n;
            last_interval = k + 1;
          }
          first = false;
        }
      }
    }
    if (i + 1 < t.size() && t[i + 1] != ",")
      fail(fmt::format("expected ',' after the value of {}, got '{}'", key, t[i + 1]));
  }
  // As c10: blocks of a segment's size stay splittable.
  std::size_t segment_mb = c.large_segment_size / kMiB;
  if (max_split_mb && max_split_mb < segment_mb)
    fail(fmt::format("max_split_size_mb must be at least large_segment_size_mb ({}), got '{}'",
                     segment_mb, max_split_mb));
  return c;
}

inline bool AllocatorConfig::names(std::string_view text, std::string_view key) {
  std::vector<std::string> t = detail::tokenize_alloc_conf(text);
  for (std::size_t i = 0; i + 1 < t.size(); ++i)
    if (t[i] == key && t[i + 1] == ":" && (i == 0 || t[i - 1] == ",")) return true;
  return false;
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
  // PyTorch's variable, or where unset its older names; then the backend's.
  if (auto v = env.get("PYTORCH_ALLOC_CONF"))
    c = parse(backend, "PYTORCH_ALLOC_CONF", *v, c);
  else if (auto old = env.get("PYTORCH_CUDA_ALLOC_CONF"))
    c = parse(backend, "PYTORCH_CUDA_ALLOC_CONF", *old, c);
  else if (auto hip = env.get("PYTORCH_HIP_ALLOC_CONF"))
    c = parse(backend, "PYTORCH_HIP_ALLOC_CONF", *hip, c);
  std::string variable = prefix + "_ALLOC_CONF";
  if (auto v = env.get(variable)) c = parse(backend, variable, *v, c);
  return c;
}

// Note [Run-time allocator settings]
// torch._C._accelerator_setAllocatorSettings(s) changes the allocator
// settings of a running process (Note [Allocator configuration], source 3).
// AllocatorSettings::process() keeps every string applied so far, in order,
// and the allocators listening to it (CachingAllocator<R> and
// HostAllocator<R>, from construction to destruction). apply(s) parses s
// (ValueError: nothing changes), asks every listener to prepare s over its
// current settings (a listener may refuse: nothing changes), then commits
// them all and keeps s. An allocator made later starts from its
// environment's settings with every kept string over them, in order.
// Limits: a string is checked against the allocators that exist when it is
// applied; one an allocator made later refuses (expandable_segments on a
// runtime without virtual memory) is refused when that allocator is made.
class AllocatorSettings {
 public:
  // Prepares one allocator's change: parses `text` over its current
  // settings, may throw, and returns what applies it (which should not).
  using Listener = std::function<std::function<void()>(std::string_view text)>;

  // Listens while it lives.
  class Subscription {
   public:
    Subscription() = default;
    Subscription(AllocatorSettings* owner, std::uint64_t id) : owner_(owner), id_(id) {}
    Subscription(Subscription&& o) noexcept : owner_(o.owner_), id_(o.id_) { o.owner_ = nullptr; }
    Subscription& operator=(Subscription&& o) noexcept {
      if (this != &o) {
        reset();
        owner_ = o.owner_;
        id_ = o.id_;
        o.owner_ = nullptr;
      }
      return *this;
    }
    Subscription(const Subscription&) = delete;
    Subscription& operator=(const Subscription&) = delete;
    ~Subscription() { reset(); }
    void reset() noexcept {
      if (owner_) owner_->forget(id_);
      owner_ = nullptr;
    }

   private:
    AllocatorSettings* owner_ = nullptr;
    std::uint64_t id_ = 0;
  };

  // The process's (never destroyed: allocators may outlive static objects).
  static AllocatorSettings& process() {
    static AllocatorSettings* const settings = new AllocatorSettings();
    return *settings;
  }

  // Applies `text` (named `source` in errors) over the settings of every
  // listening allocator and keeps it for allocators made later.
  void apply(std::string_view backend, std::string_view source, std::string_view text) {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorConfig::parse(backend, source, text);  // malformed: nothing changes
    std::vector<std::function<void()>> commits;
    commits.reserve(listeners_.size());
    for (auto& [id, listener] : listeners_) commits.push_back(listener(text));
    for (auto& commit : commits) commit();
    applied_.push_back({std::string(source), std::string(text)});
  }

  // `config` (an allocator's settings from its environment) with every kept
  // string over it; then `listener` hears every later one. Atomic with
  // respect to apply(): no string is missed or seen twice.
  Subscription listen(std::string_view backend, AllocatorConfig& config, Listener listener) {
    std::lock_guard<std::mutex> lock(mutex_);
    AllocatorConfig c = config;
    for (const auto& [source, text] : applied_) c = AllocatorConfig::parse(backend, source, text, c);
    config = c;
    std::uint64_t id = ++next_id_;
    listeners_.emplace_back(id, std::move(listener));
    return Subscription(this, id);
  }

  // The strings applied so far, in order.
  std::vector<std::string> applied() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> out;
    for (const auto& a : applied_) out.push_back(a.second);
    return out;
  }
  // Forgets the strings applied so far: allocators made later start from
  // their environment's settings again (the live ones keep theirs).
  void forget_applied() {
    std::lock_guard<std::mutex> lock(mutex_);
    applied_.clear();
  }

 private:
  void forget(std::uint64_t id) noexcept {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = listeners_.begin(); it != listeners_.end(); ++it)
      if (it->first == id) {
        listeners_.erase(it);
        return;
      }
  }

  mutable std::mutex mutex_;
  std::vector<std::pair<std::uint64_t, Listener>> listeners_;
  std::vector<std::pair<std::string, std::string>> applied_;  // source, text
  std::uint64_t next_id_ = 0;
};

ACCELKIT_END_NAMESPACE
