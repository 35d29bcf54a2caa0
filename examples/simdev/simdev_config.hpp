// simdev's configuration: its driver error codes and the SIMDEV_* variables
// that shape the simulated devices (simdev_runtime.hpp).
//
// Configuration, read at the first device_count() (each a clear error when
// malformed):
//   SIMDEV_DEVICE_COUNT   number of devices (default 2, 0..64)
//   SIMDEV_MEMORY_MB      capacity per device in MiB (default 1024, at least 2):
//                         one value for all devices, or a comma list, one per
//                         device
//   SIMDEV_HOST_VISIBLE   1 (default), 0 or mapped: the host may touch device
//                         memory directly (host_access direct), only through
//                         copies (none), or only between host_map and
//                         host_unmap (mapped: Note [simdev mapped memory])
//   SIMDEV_ALIGNMENT      the alignment malloc declares and gives (a power of
//                         two in 128..4096): when set, addresses are aligned
//                         to it and never to twice it, so an SDK that assumes
//                         more fails (Note [Memory alignment]); unset, 256 is
//                         declared and memory is page-aligned
//   SIMDEV_INJECT_FAULT   comma list of member[@n][:async|:refuse]: that
//                         member throws a driver error on its n-th call
//                         (default 1), once; with :async its queued work
//                         fails instead (Note [simdev strictness]); with
//                         :refuse (malloc, vm_create) it returns nullptr (a
//                         null handle) with memory free, as a driver refusing
//                         an alignment or size
//   SIMDEV_STICKY_FAULTS  1 or 0 (default): a failure of a device's queued
//                         work (an :async fault, work on freed memory) loses
//                         the device, as CUDA's sticky errors and Vulkan's
//                         VK_ERROR_DEVICE_LOST do: reported once as a
//                         DeviceLostError, every later call that would run
//                         work on it fails so too (Note [simdev sticky
//                         faults]; the SDK's side: Note [Lost devices])
//   SIMDEV_EVENT_CREATE_NS what creating an event costs (default 2000 ns, as
//                         real drivers' event creation does; busy-waited)
//   SIMDEV_UNKNOWN_PROPERTIES 1 or 0 (default): properties() leaves the UUID,
//                         the architecture and the copy engines unknown, as an
//                         OpenCL driver does (Note [Derived UUID]), and the
//                         compute units and clock rate (0), as Vulkan does
//   SIMDEV_PRIORITY_LEVELS n in 1..8: stream priorities given as levels
//                         (StreamPriorityRange::from_levels(n), as an OpenCL
//                         runtime gives its hints); unset, CUDA's style 0..-2
//   SIMDEV_DISCOVERY_THREAD 1 or 0 (default): device_count() starts a driver
//                         thread, as PoCL does at its first device query; a
//                         process forked after that finds the thread gone,
//                         and every driver call there fails loudly (a real
//                         driver would hang). simdev still declares
//                         fork_safe_discovery true, so the knob shows what a
//                         runtime that starts threads must declare
//   SIMDEV_EVENT_TIMING   1 (default) or 0: whether properties() reports
//                         event timing (0 plays a device without timestamps;
//                         event_elapsed_time then refuses, as the SDK says)
#pragma once

#include <accelkit/accelkit.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace simdev {

// Driver error codes, as a real driver would define them.
enum ErrorCode : int {
  kInvalidValue = 1,
  kInvalidDevice = 101,
  kInvalidHandle = 400,
  kNotReady = 600,
  kIllegalAddress = 700,
  kLaunchFailure = 719,
  kNotPermitted = 800,
  kCaptureUnsupported = 900,  // a call a capture cannot hold; the capture is invalidated
  kCaptureInvalidated = 901,  // ending a capture that was invalidated
  kInjectedFault = 999,
};

// Members whose work is queued, so that they can fail asynchronously.
inline bool queues_work(std::string_view member) {
  for (std::string_view m : {"memcpy_async", "memset_async", "memcpy_peer_async", "event_record",
                             "stream_wait_event", "stream_wait_peer_event", "stream_wait_signal",
                             "graph_launch"})
    if (member == m) return true;
  return false;
}

struct Config {
  int device_count = 2;
  std::vector<std::uint64_t> memory_bytes{1024ull << 20};  // one entry, or one per device
  accelkit::HostAccessLevel host_access = accelkit::HostAccessLevel::direct;
  bool discovery_thread = false;  // SIMDEV_DISCOVERY_THREAD
  int priority_levels = 0;    // 0: CUDA-style 0..-2 (SIMDEV_PRIORITY_LEVELS)
  std::size_t alignment = 0;  // 0: 256 declared, pages given (SIMDEV_ALIGNMENT)
  struct Fault {
    int nth = 1;          // the call that fails
    bool async = false;   // its queued work fails instead of the call
    bool refuse = false;  // (malloc, vm_create) nullptr / a null handle with memory free
  };
  std::map<std::string, Fault> faults;  // member -> the fault to inject
  bool sticky_faults = false;           // SIMDEV_STICKY_FAULTS
  long event_create_ns = 2000;
  bool event_timing = true;
  bool unknown_properties = false;  // SIMDEV_UNKNOWN_PROPERTIES

  std::uint64_t capacity(int device) const {
    return memory_bytes.size() == 1 ? memory_bytes[0]
                                    : memory_bytes[static_cast<std::size_t>(device)];
  }

  // Reads SIMDEV_* from `env`; throws accelkit::ValueError naming the variable
  // and value when one is malformed.
  static Config from_environment(const accelkit::Environment& env) {
    Config c;
    auto bad = [](const std::string& var, const std::string& value, const std::string& why) {
      return accelkit::ValueError("simdev", fmt::format("{}='{}': {}", var, value, why));
    };
    auto parse_int = [&](const std::string& var, const std::string& text, long long lo,
                         long long hi) -> long long {
      std::string_view t = accelkit::detail::trim(text);
      if (t.empty() || t.size() > 12 ||
          !std::all_of(t.begin(), t.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
        throw bad(var, text, "expected a non-negative integer");
      long long v = std::stoll(std::string(t));
      if (v < lo || v > hi) throw bad(var, text, fmt::format("must be in {}..{}", lo, hi));
      return v;
    };
    if (auto v = env.get("SIMDEV_DEVICE_COUNT"))
      c.device_count = static_cast<int>(parse_int("SIMDEV_DEVICE_COUNT", *v, 0, 64));
    if (auto v = env.get("SIMDEV_MEMORY_MB")) {
      c.memory_bytes.clear();
      for (std::string_view item : accelkit::detail::split_list(*v)) {
        long long mb = 0;
        try {
          mb = parse_int("SIMDEV_MEMORY_MB", std::string(item), 2, 1 << 20);
        } catch (const accelkit::ValueError&) {
          // 2 MiB at least: the caching allocator serves small tensors from
          // 2 MiB segments, so a smaller device could hold no tensor at all.
          throw bad("SIMDEV_MEMORY_MB", *v,
                    fmt::format("entry '{}' is not a capacity in MiB (2..{})", item, 1 << 20));
        }
        c.memory_bytes.push_back(static_cast<std::uint64_t>(mb) << 20);
      }
      if (c.memory_bytes.size() != 1 &&
          c.memory_bytes.size() != static_cast<std::size_t>(c.device_count))
        throw bad("SIMDEV_MEMORY_MB", *v,
                  fmt::format("gives {} capacities for {} devices (give one, or one per device)",
                              c.memory_bytes.size(), c.device_count));
    }
    if (auto v = env.get("SIMDEV_HOST_VISIBLE")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.host_access = accelkit::HostAccessLevel::direct;
      else if (t == "0") c.host_access = accelkit::HostAccessLevel::none;
      else if (t == "mapped") c.host_access = accelkit::HostAccessLevel::mapped;
      else throw bad("SIMDEV_HOST_VISIBLE", *v, "expected 0, 1 or mapped");
    }
    if (auto v = env.get("SIMDEV_ALIGNMENT")) {
      long long a = parse_int("SIMDEV_ALIGNMENT", *v, 128, 4096);
      if ((a & (a - 1)) != 0) throw bad("SIMDEV_ALIGNMENT", *v, "expected a power of two");
      c.alignment = static_cast<std::size_t>(a);
    }
    if (auto v = env.get("SIMDEV_UNKNOWN_PROPERTIES")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.unknown_properties = true;
      else if (t == "0") c.unknown_properties = false;
      else throw bad("SIMDEV_UNKNOWN_PROPERTIES", *v, "expected 0 or 1");
    }
    if (auto v = env.get("SIMDEV_PRIORITY_LEVELS"))
      c.priority_levels = static_cast<int>(parse_int("SIMDEV_PRIORITY_LEVELS", *v, 1, 8));
    if (auto v = env.get("SIMDEV_DISCOVERY_THREAD")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.discovery_thread = true;
      else if (t == "0") c.discovery_thread = false;
      else throw bad("SIMDEV_DISCOVERY_THREAD", *v, "expected 0 or 1");
    }
    if (auto v = env.get("SIMDEV_STICKY_FAULTS")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.sticky_faults = true;
      else if (t == "0") c.sticky_faults = false;
      else throw bad("SIMDEV_STICKY_FAULTS", *v, "expected 0 or 1");
    }
    if (auto v = env.get("SIMDEV_EVENT_TIMING")) {
      std::string_view t = accelkit::detail::trim(*v);
      if (t == "1") c.event_timing = true;
      else if (t == "0") c.event_timing = false;
      else throw bad("SIMDEV_EVENT_TIMING", *v, "expected 0 or 1");
    }
    if (auto v = env.get("SIMDEV_EVENT_CREATE_NS"))
      c.event_create_ns = static_cast<long>(parse_int("SIMDEV_EVENT_CREATE_NS", *v, 0, 1'000'000));
    if (auto v = env.get("SIMDEV_INJECT_FAULT")) {
      for (std::string_view item : accelkit::detail::split_list(*v)) {
        std::string entry(item);
        bool async = false, refuse = false;
        if (auto colon = entry.find(':'); colon != std::string::npos) {
          std::string mode = entry.substr(colon + 1);
          if (mode != "async" && mode != "refuse")
            throw bad("SIMDEV_INJECT_FAULT", *v,
                      fmt::format("entry '{}' is not member[@n][:async|:refuse]", entry));
          (mode == "async" ? async : refuse) = true;
          entry.resize(colon);
        }
        auto at = entry.find('@');
        std::string member = entry.substr(0, at);
        int nth = at == std::string::npos
                      ? 1
                      : static_cast<int>(parse_int("SIMDEV_INJECT_FAULT", entry.substr(at + 1),
                                                   1, 1'000'000'000));
        if (member.empty() || !accelkit::detail::is_identifier_part(member))
          throw bad("SIMDEV_INJECT_FAULT", *v,
                    fmt::format("entry '{}' is not member[@n][:async|:refuse]", entry));
        if (refuse && member != "malloc" && member != "vm_create")
          throw bad("SIMDEV_INJECT_FAULT", *v,
                    fmt::format("entry '{}': only malloc can refuse (and vm_create, "
                                "giving a null handle)",
                                entry));
        if (async && !queues_work(member))
          throw bad("SIMDEV_INJECT_FAULT", *v,
                    fmt::format("entry '{}': {} queues no work, so it cannot fail "
                                "asynchronously", entry, member));
        if (c.faults.count(member))
          throw bad("SIMDEV_INJECT_FAULT", *v,
                    fmt::format("member '{}' is named twice", member));
        c.faults[member] = Fault{nth, async, refuse};
      }
    }
    return c;
  }
};

}  // namespace simdev
