// accelkit: the device and capability report, as JSON and as text.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/detail/json.hpp>
#include <accelkit/device/backend.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/device/visibility.hpp>

#include <fmt/format.h>

#include <exception>
#include <string>
#include <variant>

ACCELKIT_BEGIN_NAMESPACE

namespace detail {
inline void write_extra_value(JsonWriter& w, const ExtraValue& v) {
  std::visit([&w](const auto& x) { w.value(x); }, v);
}

inline void write_properties(JsonWriter& w, const DeviceProperties& p) {
  // What the runtime could not tell is null (Note [Derived UUID]).
  w.field("name", p.name).field("vendor", p.vendor).key("architecture");
  if (p.architecture.empty()) w.null(); else w.value(p.architecture);
  w.field("uuid", p.uuid).field("uuid_derived", p.uuid_derived).key("pci_bus_id");
  if (p.pci_bus_id.empty()) w.null(); else w.value(p.pci_bus_id);
  w.field("driver_version", p.driver_version.to_string())
      .field("runtime_version", p.runtime_version.to_string())
      .field("total_memory", p.total_memory)
      .field("max_allocation", p.max_allocation)
      .field("memory_alignment", p.memory_alignment)
      .key("compute_units");
  if (p.compute_units == 0) w.null(); else w.value(p.compute_units);
  w.field("subgroup_size", p.subgroup_size).key("clock_rate_khz");
  if (p.clock_rate_khz == 0) w.null(); else w.value(p.clock_rate_khz);
  w.field("l2_cache_bytes", p.l2_cache_bytes);
  w.key("dtypes").begin_array();
  for (DType t : p.dtypes.to_vector()) w.value(to_string(t));
  w.end_array();
  w.field("unified_memory", p.unified_memory)
      .field("host_access", to_string(p.host_access))
      .field("host_visible_memory", p.host_visible_memory);
  w.key("stream_priorities").begin_object()
      .field("lowest", p.stream_priorities.lowest)
      .field("highest", p.stream_priorities.highest)
      .field("levels", p.stream_priorities.levels())
      .field("pytorch_default", 0)
      .field("pytorch_most_urgent", -(p.stream_priorities.levels() - 1))
      .end_object();
  w.field("event_timing", p.event_timing).key("async_copy_engines");
  if (p.async_copy_engines) w.value(*p.async_copy_engines); else w.null();
  // DLPack's numbers, as consumers compare them (Note [DLPack device types]).
  w.field("dlpack_device_type", static_cast<std::int32_t>(p.dlpack_device_type))
      .field("dlpack_pinned_device_type", static_cast<std::int32_t>(p.dlpack_pinned_device_type));
  w.key("extras").begin_object();
  for (const Extra& e : p.extras) {
    w.key(e.key);
    write_extra_value(w, e.value);
  }
  w.end_object();
}
}  // namespace detail

// Every visible device of the backend with its full capability schema, live
// memory and the peer-access matrix. Never throws for a device problem: a
// device whose query fails is reported with its error, and a backend whose
// discovery failed reports 0 devices with the reason.
template <class R>
std::string report_json(Backend<R>& backend) {
  detail::JsonWriter w;
  w.begin_object();
  w.field("schema_version", properties_schema_version)
      .field("accelkit_version",
             fmt::format("{}.{}.{}", version.major, version.minor, version.patch))
      .field("backend", Backend<R>::name)
      .field("visible_devices_variable", visible_devices_variable(Backend<R>::name));
  int n = backend.device_count();
  w.field("device_count", n).key("init_error");
  std::string init_error = backend.init_error();
  if (init_error.empty()) w.null(); else w.value(init_error);
  std::vector<int> physical = backend.visible_devices();
  w.key("devices").begin_array();
  bool all_ok = true;
  for (int d = 0; d < n; ++d) {
    w.begin_object().field("index", d).field("physical_index", physical[static_cast<std::size_t>(d)]);
    try {
      const DeviceProperties& p = backend.properties(d);
      MemoryInfo mem = backend.memory_info(d);
      detail::write_properties(w, p);
      w.field("free_memory", mem.free);
      w.key("error").null();
    } catch (const std::exception& e) {
      all_ok = false;
      w.field("error", e.what());
    }
    w.end_object();
  }
  w.end_array();
  w.key("peer_access");
  if (all_ok && n > 0) {
    try {
      auto m = backend.peer_access_matrix();
      w.begin_array();
      for (const auto& row : m) {
        w.begin_array();
        for (bool b : row) w.value(b);
        w.end_array();
      }
      w.end_array();
    } catch (const std::exception& e) {
      w.value(e.what());
    }
  } else {
    w.null();
  }
  w.end_object();
  return w.str();
}

// The same report for people.
template <class R>
std::string report_text(Backend<R>& backend) {
  constexpr double mib = 1024.0 * 1024.0;
  std::string out;
  auto line = [&out](const auto&... args) {
    out += detail::format_list(args...);
    out += '\n';
  };
  int n = backend.device_count();
  line("backend {}: {} visible device{} (accelkit {}.{}.{}, capability schema v{})",
       Backend<R>::name, n, n == 1 ? "" : "s", version.major, version.minor, version.patch,
       properties_schema_version);
  if (std::string e = backend.init_error(); !e.empty()) line("  discovery failed: {}", e);
  for (int d = 0; d < n; ++d) {
    try {
      const DeviceProperties& p = backend.properties(d);
      MemoryInfo mem = backend.memory_info(d);
      line("  {}:{}  {} ({}, {}), uuid {}{}", Backend<R>::name, d, p.name, p.vendor,
           p.architecture.empty() ? "architecture unknown" : p.architecture, p.uuid,
           p.uuid_derived ? " (derived by accelkit)" : "");
      line("      memory {:.0f} MiB total, {:.0f} MiB free, max allocation {:.0f} MiB, aligned to "
           "{} B; {}{}",
           p.total_memory / mib, mem.free / mib, p.max_allocation / mib, p.memory_alignment,
           p.host_access == HostAccessLevel::direct   ? "host-visible"
           : p.host_access == HostAccessLevel::mapped ? "host-visible when mapped"
                                                      : "not host-visible",
           p.unified_memory ? ", unified" : "");
      line("      {} compute units, subgroup {}, {}, L2 {} KiB, {} copy engine{}",
           p.compute_units ? std::to_string(p.compute_units) : "unknown", p.subgroup_size,
           p.clock_rate_khz ? fmt::format("{} MHz", p.clock_rate_khz / 1000) : "clock unknown",
           p.l2_cache_bytes / 1024,
           p.async_copy_engines ? std::to_string(*p.async_copy_engines) : "unknown",
           p.async_copy_engines == 1 ? "" : "s");
      line("      driver {}, runtime {}, stream priorities {}..{} ({} levels), event timing {}",
           p.driver_version.to_string(), p.runtime_version.to_string(),
           p.stream_priorities.lowest, p.stream_priorities.highest, p.stream_priorities.levels(),
           p.event_timing ? "yes" : "no");
      line("      DLPack device type {} ({}), pinned host memory {} ({})",
           to_string(p.dlpack_device_type), static_cast<std::int32_t>(p.dlpack_device_type),
           to_string(p.dlpack_pinned_device_type),
           static_cast<std::int32_t>(p.dlpack_pinned_device_type));
      std::string dtypes;
      for (DType t : p.dtypes.to_vector()) {
        if (!dtypes.empty()) dtypes += ' ';
        dtypes += to_string(t);
      }
      line("      dtypes: {}", dtypes);
      for (const Extra& e : p.extras)
        line("      {} = {}", e.key,
             std::visit([](const auto& v) { return fmt::format("{}", v); }, e.value));
    } catch (const std::exception& e) {
      line("  {}:{}  error: {}", Backend<R>::name, d, e.what());
    }
  }
  if (n > 1) {
    try {
      auto m = backend.peer_access_matrix();
      line("  peer access (row can access column):");
      for (std::size_t i = 0; i < m.size(); ++i) {
        std::string row;
        for (bool b : m[i]) row += b ? " Y" : " .";
        line("    {}:{}", i, row);
      }
    } catch (const std::exception& e) {
      line("  peer access: error: {}", e.what());
    }
  }
  return out;
}

ACCELKIT_END_NAMESPACE
