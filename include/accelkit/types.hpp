// accelkit: the small value types of the Runtime contract.
#pragma once

#include <accelkit/config.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE

// Note [Logical and physical indices]
// Users hide and reorder a backend's devices with <NAME>_VISIBLE_DEVICES
// (Note [Visible devices]), and a vendor's runtime should not have to know
// about it. So there are two numberings: users and PyTorch see logical
// ordinals, 0 .. the number of visible devices - 1; the runtime always sees
// physical ordinals, 0 .. runtime.device_count() - 1, all of its devices.
// Backend<R> validates a logical index and maps it to the physical one at
// the call into the runtime, and nowhere else. Limits: a driver that reads a
// visibility variable of its own must not be given the SDK's, or the two
// filters compose.
using device_index = int;  // a device ordinal: logical or physical by where it is used

enum class CopyKind : std::uint8_t {
  host_to_device,
  device_to_host,
  device_to_device,  // both pointers on the same device
};

constexpr std::string_view to_string(CopyKind kind) noexcept {
  switch (kind) {
    case CopyKind::host_to_device: return "host_to_device";
    case CopyKind::device_to_host: return "device_to_host";
    case CopyKind::device_to_device: return "device_to_device";
  }
  return "unknown";
}

namespace detail {
// An opaque driver handle: wide enough for a pointer (CUDA-style
// `cudaStream_t`) or an integer id. Tagged so a stream cannot be passed where
// an event is expected. Value 0 is the null handle (`!h`), which a member
// returns where it has none to give (vm_create out of memory); a stream's 0
// is the default stream.
template <class Tag>
struct handle {
  std::uintptr_t value = 0;

  constexpr explicit operator bool() const noexcept { return value != 0; }

  template <class T>
  static constexpr handle from_pointer(T* p) noexcept {
    return handle{reinterpret_cast<std::uintptr_t>(p)};
  }
  template <class T>
  T* as_pointer() const noexcept {
    return reinterpret_cast<T*>(value);
  }
  friend constexpr bool operator==(handle a, handle b) noexcept { return a.value == b.value; }
  friend constexpr bool operator!=(handle a, handle b) noexcept { return a.value != b.value; }
};
struct stream_tag;
struct event_tag;
struct signal_tag;
struct graph_tag;
struct graph_exec_tag;
struct physical_tag;
}  // namespace detail

using StreamHandle = detail::handle<detail::stream_tag>;
using EventHandle = detail::handle<detail::event_tag>;
// A host signal (Note [Host signals] in device/backend.hpp): set by the host,
// waited for by streams.
using SignalHandle = detail::handle<detail::signal_tag>;
// A graph: the work a stream queued while capturing (stream_end_capture),
// and its executable form (graph_instantiate), which graph_launch queues.
using GraphHandle = detail::handle<detail::graph_tag>;
using GraphExecHandle = detail::handle<detail::graph_exec_tag>;
// Physical device memory not bound to an address (vm_create), which vm_map
// maps into a range of addresses reserved by vm_reserve (Note [Virtual
// memory] in device/backend.hpp).
using PhysicalHandle = detail::handle<detail::physical_tag>;

// What a capture refuses on other threads while it is underway (CUDA's
// cudaStreamCaptureMode; PyTorch's capture_error_mode). The SDK enforces it
// for the calls that wait for or query device work (Note [Capture rules] in
// device/captures.hpp); a runtime may pass it to its driver.
enum class CaptureMode : std::uint8_t {
  global,      // such calls fail on every thread while the capture lasts
  per_thread,  // they fail on the thread that began the capture
  relaxed,     // they fail only where they touch the capturing stream itself
};

constexpr std::string_view to_string(CaptureMode mode) noexcept {
  switch (mode) {
    case CaptureMode::global: return "global";
    case CaptureMode::per_thread: return "thread_local";
    case CaptureMode::relaxed: return "relaxed";
  }
  return "unknown";
}

// A memory pool of the caching allocator, as PyTorch names one
// (c10::MempoolId_t): {0, 0} is the default pools; {n, 0} a graph's private
// pool; {0, n} a pool a user created (MemPool).
struct MempoolId {
  std::uint64_t first = 0;
  std::uint64_t second = 0;
  constexpr bool is_default() const noexcept { return first == 0 && second == 0; }
  friend constexpr bool operator==(MempoolId a, MempoolId b) noexcept {
    return a.first == b.first && a.second == b.second;
  }
  friend constexpr bool operator!=(MempoolId a, MempoolId b) noexcept { return !(a == b); }
};

// Flags for event_create; combine with |.
enum class EventFlags : unsigned {
  none = 0,
  timing = 1u << 0,         // the event records a timestamp (elapsed_time)
  blocking_sync = 1u << 1,  // event_synchronize may yield the CPU instead of spinning
  interprocess = 1u << 2,   // the event may be exported (ipc_event_export); never with timing
};
constexpr EventFlags operator|(EventFlags a, EventFlags b) noexcept {
  return static_cast<EventFlags>(static_cast<unsigned>(a) | static_cast<unsigned>(b));
}
constexpr EventFlags operator&(EventFlags a, EventFlags b) noexcept {
  return static_cast<EventFlags>(static_cast<unsigned>(a) & static_cast<unsigned>(b));
}
constexpr bool has_flag(EventFlags set, EventFlags flag) noexcept {
  return (static_cast<unsigned>(set) & static_cast<unsigned>(flag)) != 0;
}

// 64 opaque bytes naming device memory to another process (ipc_mem_export,
// Note [Inter-process memory] in device/backend.hpp), as CUDA's
// cudaIpcMemHandle_t and Level Zero's ze_ipc_mem_handle_t are: the runtime
// fills them, the SDK only carries them.
struct IpcMemHandle {
  std::array<std::uint8_t, 64> bytes{};
  friend bool operator==(const IpcMemHandle& a, const IpcMemHandle& b) noexcept {
    return a.bytes == b.bytes;
  }
  friend bool operator!=(const IpcMemHandle& a, const IpcMemHandle& b) noexcept {
    return !(a == b);
  }
};
// The same for an event made with EventFlags::interprocess (ipc_event_export),
// as CUDA's cudaIpcEventHandle_t.
struct IpcEventHandle {
  std::array<std::uint8_t, 64> bytes{};
  friend bool operator==(const IpcEventHandle& a, const IpcEventHandle& b) noexcept {
    return a.bytes == b.bytes;
  }
  friend bool operator!=(const IpcEventHandle& a, const IpcEventHandle& b) noexcept {
    return !(a == b);
  }
};

// Live memory figures of one device, in bytes.
struct MemoryInfo {
  std::uint64_t free = 0;
  std::uint64_t total = 0;
};

ACCELKIT_END_NAMESPACE
