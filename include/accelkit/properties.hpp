// accelkit: the capability schema every backend fills.
//
// Note [One capability schema]
// Vendors report device properties in structs of their own shape: XPU has no
// multi_processor_count, NPU fills CUDA-named fields with None, nobody reports
// float8 support, and PyTorch's dtype capability claims every dtype by
// default. accelkit fixes one versioned struct. A runtime returns it from
// `properties(device)`; the SDK validates it once per device (so a vendor bug
// surfaces at the first query with every inconsistency listed, not as a wrong
// number deep in user code), adds the live and derived fields (free memory,
// peer access, event timing), and reports it the same way on every backend.
// Limits: fields are added, never renamed or repurposed, and
// `schema_version` counts the additions (and the fields that became "may be
// unknown", JSON null) so that readers of the JSON report can tell what to
// expect; what the schema has no field for goes into `extras`, under keys
// namespaced by the backend's name.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE

inline constexpr int properties_schema_version = 5;

// Element types, named as in `torch.<name>`.
enum class DType : std::uint8_t {
  float64,
  float32,
  float16,
  bfloat16,
  float8_e4m3fn,
  float8_e5m2,
  float8_e4m3fnuz,
  float8_e5m2fnuz,
  float8_e8m0fnu,
  complex32,
  complex64,
  complex128,
  int8,
  int16,
  int32,
  int64,
  uint8,
  uint16,
  uint32,
  uint64,
  bool_,
};
inline constexpr std::size_t dtype_count = static_cast<std::size_t>(DType::bool_) + 1;

constexpr std::string_view to_string(DType t) noexcept {
  constexpr std::array<std::string_view, dtype_count> names = {
      "float64",         "float32",         "float16",        "bfloat16",  "float8_e4m3fn",
      "float8_e5m2",     "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu", "complex32",
      "complex64",       "complex128",      "int8",           "int16",     "int32",
      "int64",           "uint8",           "uint16",         "uint32",    "uint64",
      "bool"};
  return names[static_cast<std::size_t>(t)];
}

// A set of dtypes, usable in constant expressions.
class DTypeSet {
 public:
  constexpr DTypeSet() noexcept = default;
  constexpr DTypeSet(std::initializer_list<DType> types) noexcept {
    for (DType t : types) bits_ |= bit(t);
  }
  static constexpr DTypeSet all() noexcept {
    DTypeSet s;
    s.bits_ = (std::uint32_t{1} << dtype_count) - 1;
    return s;
  }
  constexpr bool contains(DType t) const noexcept { return (bits_ & bit(t)) != 0; }
  constexpr bool empty() const noexcept { return bits_ == 0; }
  constexpr DTypeSet& add(DType t) noexcept {
    bits_ |= bit(t);
    return *this;
  }
  constexpr DTypeSet& remove(DType t) noexcept {
    bits_ &= ~bit(t);
    return *this;
  }
  constexpr std::uint32_t bits() const noexcept { return bits_; }
  friend constexpr DTypeSet operator|(DTypeSet a, DTypeSet b) noexcept {
    DTypeSet s;
    s.bits_ = a.bits_ | b.bits_;
    return s;
  }
  friend constexpr bool operator==(DTypeSet a, DTypeSet b) noexcept { return a.bits_ == b.bits_; }
  friend constexpr bool operator!=(DTypeSet a, DTypeSet b) noexcept { return a.bits_ != b.bits_; }

  std::vector<DType> to_vector() const {
    std::vector<DType> v;
    for (std::size_t i = 0; i < dtype_count; ++i)
      if (bits_ & (std::uint32_t{1} << i)) v.push_back(static_cast<DType>(i));
    return v;
  }

 private:
  static constexpr std::uint32_t bit(DType t) noexcept {
    return std::uint32_t{1} << static_cast<unsigned>(t);
  }
  std::uint32_t bits_ = 0;
};

struct Version {
  int major = 0;
  int minor = 0;
  int patch = 0;
  std::string to_string() const { return fmt::format("{}.{}.{}", major, minor, patch); }
  friend constexpr bool operator==(const Version& a, const Version& b) noexcept {
    return a.major == b.major && a.minor == b.minor && a.patch == b.patch;
  }
};

// Stream priorities in the driver's own numbering. `lowest` is the least
// urgent priority (the one a default stream gets), `highest` the most urgent;
// either may be numerically larger. The SDK maps PyTorch's convention
// (0 = default, negative = more urgent, down to -(levels() - 1)) onto this
// range (Note [Stream priorities]); the report shows both.
//
// A driver whose priorities are named hints rather than numbers (OpenCL's
// queue priorities low, medium and high) gives them as levels:
// from_levels(n) is {0, n - 1}, and stream_create then receives the level, 0
// (the default) up to n - 1 (the most urgent), which the runtime maps to its
// hints. PyTorch has no priority below the default, as CUDA's range has none
// below its default either, so OpenCL's `low` has no level: an OpenCL
// runtime gives from_levels(2), 0 = medium, 1 = high.
struct StreamPriorityRange {
  int lowest = 0;
  int highest = 0;
  static constexpr StreamPriorityRange from_levels(int n) noexcept { return {0, n - 1}; }
  constexpr int levels() const noexcept {
    return (highest > lowest ? highest - lowest : lowest - highest) + 1;
  }
};

// Note [Host access levels]
// How the host may touch a device's memory (DeviceProperties::host_access):
//   none    only through copies (memcpy, memcpy_async);
//   mapped  only between host_map(device, ptr, bytes) and
//           host_unmap(device, ptr, bytes) of the range (optional runtime
//           members), at the host address host_map returns: ptr itself
//           where the driver maps in place (OpenCL's coarse-grained SVM
//           with clEnqueueSVMMap and clEnqueueSVMUnmap), an address of the
//           driver's choosing otherwise (Vulkan's vkMapMemory); never
//           while device work uses it;
//   direct  directly, at any time the device is not using it (fine-grained
//           SVM, CUDA's managed memory, simdev's host memory).
// The SDK's host paths (PyTorch's CPU kernels as host kernels, the
// zero-copy fallback) run on device memory at the mapped and direct levels;
// at the mapped level they open a map scope (Note [Map scopes] in
// device/host_maps.hpp) over what they touch, and reach it only at the
// addresses host_map returned (HostAccess::host_ptr). A runtime that reports
// mapped must implement host_map and host_unmap (a ValueError at the first
// properties query otherwise). host_visible_memory is derived from it.
enum class HostAccessLevel : std::uint8_t { none, mapped, direct };

constexpr std::string_view to_string(HostAccessLevel a) noexcept {
  switch (a) {
    case HostAccessLevel::none: return "none";
    case HostAccessLevel::mapped: return "mapped";
    default: return "direct";
  }
}

// Note [DLPack device types]
// DLPack names where a tensor's memory is by a device type of its own list
// (DLDeviceType in dlpack.h), which consumers (NumPy, JAX, CuPy, a vendor's
// kernel library) compare to decide whether they can read the memory.
// PyTorch gives every PrivateUse1 device kDLExtDev and every pinned CPU
// tensor kDLCUDAHost, which is true of neither an OpenCL device nor memory
// a non-CUDA driver pinned. So the schema carries both: the device type of
// the device's memory (DeviceProperties::dlpack_device_type, kDLExtDev
// unless DLPack has the vendor's own: kDLOpenCL for OpenCL, kDLCUDA for
// CUDA) and of the host memory the backend pins
// (dlpack_pinned_device_type, kDLCPU unless the driver's pinned memory is
// a kind of its own, as CUDA's kDLCUDAHost). The torch layer exports and
// imports tensors with these (Note [DLPack through the schema] in
// torch/dlpack.hpp). Numbered as in dlpack.h, which core headers do not
// include. Limits: device memory must name a device kind, pinned memory a
// host kind (kDLCPU, kDLCUDAHost or kDLROCMHost); the pinned type read is
// the first visible device's.
enum class DLPackDeviceType : std::int32_t {
  cpu = 1,
  cuda = 2,
  cuda_host = 3,
  opencl = 4,
  vulkan = 7,
  metal = 8,
  vpi = 9,
  rocm = 10,
  rocm_host = 11,
  ext_dev = 12,
  cuda_managed = 13,
  oneapi = 14,
  webgpu = 15,
  hexagon = 16,
  maia = 17,
  trn = 18,
};

// DLPack's own name of a device type ("kDLExtDev"); empty for a number
// DLPack does not define.
constexpr std::string_view to_string(DLPackDeviceType t) noexcept {
  switch (t) {
    case DLPackDeviceType::cpu: return "kDLCPU";
    case DLPackDeviceType::cuda: return "kDLCUDA";
    case DLPackDeviceType::cuda_host: return "kDLCUDAHost";
    case DLPackDeviceType::opencl: return "kDLOpenCL";
    case DLPackDeviceType::vulkan: return "kDLVulkan";
    case DLPackDeviceType::metal: return "kDLMetal";
    case DLPackDeviceType::vpi: return "kDLVPI";
    case DLPackDeviceType::rocm: return "kDLROCM";
    case DLPackDeviceType::rocm_host: return "kDLROCMHost";
    case DLPackDeviceType::ext_dev: return "kDLExtDev";
    case DLPackDeviceType::cuda_managed: return "kDLCUDAManaged";
    case DLPackDeviceType::oneapi: return "kDLOneAPI";
    case DLPackDeviceType::webgpu: return "kDLWebGPU";
    case DLPackDeviceType::hexagon: return "kDLHexagon";
    case DLPackDeviceType::maia: return "kDLMAIA";
    case DLPackDeviceType::trn: return "kDLTrn";
  }
  return {};
}

// Host memory: what a CPU consumer may read in place.
constexpr bool is_host_kind(DLPackDeviceType t) noexcept {
  return t == DLPackDeviceType::cpu || t == DLPackDeviceType::cuda_host ||
         t == DLPackDeviceType::rocm_host;
}

// A vendor-specific value, under a key namespaced by the backend's name:
// "acme.tensor_cores", "simdev.fault_injection".
using ExtraValue = std::variant<bool, std::int64_t, double, std::string>;
struct Extra {
  std::string key;
  ExtraValue value;
};

// The schema. The runtime fills every field; the SDK overwrites the fields
// marked "(SDK)" from the contract and live queries. Fields marked "may be
// unknown" are left empty (or 0) by a runtime whose driver cannot tell
// (OpenCL reports no UUID, no architecture, no copy engines; Vulkan no
// compute units and no clock rate): the report shows "unknown" (JSON null)
// and the SDK fills what it can (Note [Derived UUID]).
struct DeviceProperties {
  std::string name;          // marketing name, "Acme A1"
  std::string vendor;        // "Acme Corp"
  std::string architecture;  // "acme-gen2"; may be unknown (empty)
  // Canonical 8-4-4-4-12 hex, unique per device. May be unknown (empty): the
  // SDK then derives one (Note [Derived UUID]) and sets uuid_derived.
  std::string uuid;
  bool uuid_derived = false;  // (SDK) uuid was derived, not the driver's (version 2)
  std::string pci_bus_id;    // "dddd:bb:dd.f", or empty for a device not on PCI
  Version driver_version;
  Version runtime_version;
  std::uint64_t total_memory = 0;     // bytes
  std::uint64_t max_allocation = 0;   // largest single malloc, bytes
  // The alignment malloc's memory has at least, bytes: a power of two, at
  // least 128 (Note [Memory alignment]). Schema version 2.
  std::uint64_t memory_alignment = 256;
  // SMs, XE cores, AI cores...; may be unknown (0). Schema version 5.
  int compute_units = 0;
  int subgroup_size = 0;              // warp / wavefront / subgroup width
  int clock_rate_khz = 0;             // may be unknown (0). Schema version 5.
  std::uint64_t l2_cache_bytes = 0;   // 0 when there is none
  DTypeSet dtypes;                    // element types with native kernels
  // One address space with the host (a device pointer is a valid host
  // address for the same bytes): requires host_access direct.
  bool unified_memory = false;
  // How the host may touch device memory (Note [Host access levels]).
  // Schema version 3.
  HostAccessLevel host_access = HostAccessLevel::none;
  // (SDK) host_access is direct: the host may read and write device pointers
  // at any time. Set by the SDK from host_access; a runtime leaves it false.
  bool host_visible_memory = false;
  StreamPriorityRange stream_priorities;
  // (SDK) elapsed_time between timing events works on this device: true for
  // a runtime that has event_elapsed_time, which sets it false for a device
  // that cannot time; the SDK sets it false for a runtime without the member.
  bool event_timing = true;
  std::optional<int> async_copy_engines;  // copies that can overlap compute; may be unknown
  // DLPack's device type of the device's memory and of the host memory the
  // backend pins (Note [DLPack device types]). Schema version 4.
  DLPackDeviceType dlpack_device_type = DLPackDeviceType::ext_dev;
  DLPackDeviceType dlpack_pinned_device_type = DLPackDeviceType::cpu;
  std::vector<Extra> extras;

  // Typed lookup of a vendor extra: nullopt when absent; ValueError when the
  // key holds another type.
  template <class T>
  std::optional<T> extra(std::string_view key) const;
};

// The canonical text (8-4-4-4-12 lower-case hex digits) of a UUID's 16 bytes,
// as drivers report them (cudaDeviceProp::uuid, CL_DEVICE_UUID_KHR).
inline std::string uuid_from_bytes(const unsigned char* bytes) {
  std::string s;
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) s += '-';
    s += fmt::format("{:02x}", bytes[i]);
  }
  return s;
}

namespace detail {
template <class T>
constexpr std::string_view extra_type_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "integer";
  else if constexpr (std::is_same_v<T, double>) return "float";
  else return "string";
}
inline std::string_view extra_type_name(const ExtraValue& v) {
  switch (v.index()) {
    case 0: return "bool";
    case 1: return "integer";
    case 2: return "float";
    default: return "string";
  }
}

// fmt::format over a format string that is only known to be constant at the
// call site: for small local helpers that collect formatted lines.
template <class... Args>
std::string format_list(fmt::string_view format, const Args&... args) {
  return fmt::vformat(format, fmt::make_format_args(args...));
}

inline bool is_hex(char c) noexcept {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
// 8-4-4-4-12 hex digits.
inline bool is_canonical_uuid(std::string_view s) noexcept {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? s[i] != '-' : !is_hex(s[i])) return false;
  }
  return true;
}
// dddd:bb:dd.f (domain, bus, device, function), hex.
inline bool is_pci_bus_id(std::string_view s) noexcept {
  if (s.size() != 12) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    char want = i == 4 || i == 7 ? ':' : i == 10 ? '.' : 0;
    if (want ? s[i] != want : !is_hex(s[i])) return false;
  }
  return true;
}
inline bool is_identifier_part(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (char c : s)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}
}  // namespace detail

template <class T>
std::optional<T> DeviceProperties::extra(std::string_view key) const {
  static_assert(std::is_same_v<T, bool> || std::is_same_v<T, std::int64_t> ||
                    std::is_same_v<T, double> || std::is_same_v<T, std::string>,
                "extra<T>: T must be bool, std::int64_t, double or std::string");
  for (const Extra& e : extras) {
    if (e.key != key) continue;
    if (const T* v = std::get_if<T>(&e.value)) return *v;
    throw ValueError("", fmt::format("device extra '{}' is of type {}, not {}", key,
                                     detail::extra_type_name(e.value),
                                     detail::extra_type_name<T>()));
  }
  return std::nullopt;
}

// Every inconsistency in `p`, one sentence each; empty when the properties are
// sound. `backend` is the runtime's name, which extras must be namespaced by.
inline std::vector<std::string> property_problems(const DeviceProperties& p,
                                                  std::string_view backend) {
  std::vector<std::string> out;
  auto problem = [&out](const auto&... args) { out.push_back(detail::format_list(args...)); };
  if (p.name.empty()) problem("name is empty");
  if (p.vendor.empty()) problem("vendor is empty");
  if (!detail::is_canonical_uuid(p.uuid))
    problem("uuid '{}' is not of the form xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", p.uuid);
  if (!p.pci_bus_id.empty() && !detail::is_pci_bus_id(p.pci_bus_id))
    problem("pci_bus_id '{}' is not of the form dddd:bb:dd.f (or empty)", p.pci_bus_id);
  if (p.driver_version == Version{}) problem("driver_version is 0.0.0 (unset)");
  if (p.runtime_version == Version{}) problem("runtime_version is 0.0.0 (unset)");
  if (p.total_memory == 0) problem("total_memory is 0");
  if (p.max_allocation == 0) problem("max_allocation is 0");
  if (p.max_allocation > p.total_memory)
    problem("max_allocation ({}) exceeds total_memory ({})", p.max_allocation, p.total_memory);
  if (p.memory_alignment < 128 || (p.memory_alignment & (p.memory_alignment - 1)) != 0)
    problem("memory_alignment is {} (must be a power of two, at least 128)", p.memory_alignment);
  if (p.compute_units < 0)
    problem("compute_units is {} (must be positive, or 0 when unknown)", p.compute_units);
  if (p.subgroup_size < 1 || (p.subgroup_size & (p.subgroup_size - 1)) != 0)
    problem("subgroup_size is {} (must be a power of two)", p.subgroup_size);
  if (p.clock_rate_khz < 0)
    problem("clock_rate_khz is {} (must be positive, or 0 when unknown)", p.clock_rate_khz);
  if (p.l2_cache_bytes > p.total_memory)
    problem("l2_cache_bytes ({}) exceeds total_memory ({})", p.l2_cache_bytes, p.total_memory);
  if (!p.dtypes.contains(DType::float32))
    problem("dtypes lacks float32, PyTorch's default dtype");
  struct Pair { DType complex, real; };
  for (Pair pr : {Pair{DType::complex32, DType::float16}, Pair{DType::complex64, DType::float32},
                  Pair{DType::complex128, DType::float64}})
    if (p.dtypes.contains(pr.complex) && !p.dtypes.contains(pr.real))
      problem("dtypes has {} but not its component type {}", to_string(pr.complex),
              to_string(pr.real));
  if (p.host_visible_memory)
    problem("host_visible_memory is set by the runtime; the SDK derives it from host_access "
            "(set host_access = HostAccessLevel::direct instead)");
  if (static_cast<unsigned>(p.host_access) > static_cast<unsigned>(HostAccessLevel::direct))
    problem("host_access is {} (not none, mapped or direct)", static_cast<unsigned>(p.host_access));
  if (p.unified_memory && p.host_access != HostAccessLevel::direct)
    problem("unified_memory is true but host_access is {}, not direct", to_string(p.host_access));
  auto dlpack_value = [](DLPackDeviceType t) {
    return fmt::format("{}{}", static_cast<std::int32_t>(t),
                       to_string(t).empty() ? "" : fmt::format(" ({})", to_string(t)));
  };
  if (to_string(p.dlpack_device_type).empty())
    problem("dlpack_device_type is {} (not a DLPack device type)", dlpack_value(p.dlpack_device_type));
  else if (is_host_kind(p.dlpack_device_type))
    problem("dlpack_device_type is {}, a host memory type (device memory needs a device's: "
            "kDLExtDev or the vendor's own)", dlpack_value(p.dlpack_device_type));
  if (to_string(p.dlpack_pinned_device_type).empty())
    problem("dlpack_pinned_device_type is {} (not a DLPack device type)",
            dlpack_value(p.dlpack_pinned_device_type));
  else if (!is_host_kind(p.dlpack_pinned_device_type))
    problem("dlpack_pinned_device_type is {}, not a host memory type (kDLCPU, kDLCUDAHost or "
            "kDLROCMHost)", dlpack_value(p.dlpack_pinned_device_type));
  if (p.async_copy_engines && *p.async_copy_engines < 0)
    problem("async_copy_engines is {} (must not be negative)", *p.async_copy_engines);
  for (std::size_t i = 0; i < p.extras.size(); ++i) {
    const std::string& key = p.extras[i].key;
    auto dot = key.find('.');
    bool ok = dot != std::string::npos && std::string_view(key).substr(0, dot) == backend;
    for (std::size_t start = 0; ok && start <= key.size();) {
      auto end = key.find('.', start);
      if (end == std::string::npos) end = key.size();
      ok = detail::is_identifier_part(std::string_view(key).substr(start, end - start));
      start = end + 1;
    }
    if (!ok)
      problem("extra key '{}' is not namespaced as '{}.<name>' with [a-z0-9_] parts", key, backend);
    for (std::size_t j = 0; j < i; ++j)
      if (p.extras[j].key == key) problem("extra key '{}' appears twice", key);
  }
  return out;
}

// Note [Derived UUID]
// A device's UUID names it in <NAME>_VISIBLE_DEVICES and in reports, so it
// must be the same in every process and every run. A runtime whose driver
// gives none (OpenCL has no UUID query) leaves it empty, and the SDK derives
// one from what identifies the device on this machine and does not change
// between runs: the backend's name, the vendor, the device's name, its PCI
// bus id when known, and its physical ordinal among the runtime's devices
// (so identical devices differ). Not the driver version (an upgrade would
// rename every device) nor anything of the process. Two FNV-1a 64-bit hashes
// of those, with the version nibble 8 and the RFC 9562 variant, make the
// UUID; properties().uuid_derived says it was derived. It stays stable as
// long as the driver enumerates the devices in the same order.
inline std::string derived_uuid(std::string_view backend, const DeviceProperties& p,
                                int physical) {
  auto fnv = [&](std::uint64_t h) {
    auto mix = [&h](std::string_view s) {
      for (unsigned char c : s) {
        h ^= c;
        h *= 0x100000001b3ull;
      }
      h ^= 0xff;  // field separator
      h *= 0x100000001b3ull;
    };
    mix(backend);
    mix(p.vendor);
    mix(p.name);
    mix(p.pci_bus_id);
    mix(std::to_string(physical));
    return h;
  };
  std::uint64_t hi = fnv(0xcbf29ce484222325ull), lo = fnv(0x84222325cbf29ce4ull);
  hi = (hi & ~0xf000ull) | 0x8000ull;                              // version 8
  lo = (lo & ~(0xc0ull << 56)) | (0x80ull << 56);                  // variant 10
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", hi >> 32, (hi >> 16) & 0xffff,
                     hi & 0xffff, lo >> 48, lo & 0xffffffffffffull);
}

// Fills the UUID of a runtime that gave none (Note [Derived UUID]).
inline void fill_unknown(DeviceProperties& p, std::string_view backend, int physical) {
  if (!p.uuid.empty()) return;
  p.uuid = derived_uuid(backend, p, physical);
  p.uuid_derived = true;
}

// Throws ValueError listing every inconsistency.
inline void validate_properties(const DeviceProperties& p, std::string_view backend,
                                int device) {
  auto problems = property_problems(p, backend);
  if (problems.empty()) return;
  throw ValueError(backend, fmt::format("device {} reports inconsistent properties: {}", device,
                                        fmt::join(problems, "; ")));
}

ACCELKIT_END_NAMESPACE
