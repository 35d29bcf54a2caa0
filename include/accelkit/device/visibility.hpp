// accelkit: parsing of the <NAME>_VISIBLE_DEVICES variable.
//
// Note [Visible devices]
// Problem: every backend needs CUDA_VISIBLE_DEVICES' selection and ordering
// of devices, and CUDA silently truncates the list at the first entry it
// cannot parse, which turns a typo into "fewer devices" or "no devices",
// discovered much later.
// Decision: each backend gets the same variable, named after it
// (SIMDEV_VISIBLE_DEVICES), with CUDA's syntax: a comma list of physical
// device indices or UUIDs (a unique prefix is enough), in the order the
// process should number them. "1,0" swaps two devices, "1" hides device 0,
// an empty value hides all, an unset variable shows all. Any malformed
// entry (a stray character, an empty entry, a negative or out-of-range
// index, an unknown or ambiguous UUID, a duplicate) is an error naming the
// variable, its value and the entry. The SDK applies the variable; the
// runtime numbers every physical device.
// Limits: read once per process, at discovery, as CUDA does: a value set
// later changes nothing in that process.
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/properties.hpp>
#include <accelkit/detail/strings.hpp>
#include <accelkit/error.hpp>

#include <fmt/format.h>

#include <cctype>
#include <string>
#include <string_view>
#include <vector>

ACCELKIT_BEGIN_NAMESPACE


// The variable's name for a backend: "simdev" -> "SIMDEV_VISIBLE_DEVICES".
inline std::string visible_devices_variable(std::string_view backend) {
  return detail::upper(backend) + "_VISIBLE_DEVICES";
}

// Parses `value` of `variable` against `physical_count` devices and returns
// the visible physical ordinals in logical order. `uuid_of(i)` gives the UUID
// of physical device i; it is called only when an entry is not an index.
// Throws ValueError naming the variable, its value and the bad entry.
template <class UuidOf>
std::vector<int> parse_visible_devices(std::string_view backend, std::string_view variable,
                                       std::string_view value, int physical_count,
                                       UuidOf&& uuid_of) {
  std::vector<int> out;

  auto fail = [&](std::string_view entry, const std::string& why) -> void {
    throw ValueError(backend, fmt::format("{}='{}': entry '{}' {}", variable, value, entry, why));
  };
  std::vector<std::string> uuids;  // fetched on first UUID entry
  for (std::string_view entry : detail::split_list(value)) {
    if (entry.empty()) fail(entry, "is empty (stray comma?)");

    int device = -1;
    bool digits = true;
    for (char c : entry) digits = digits && c >= '0' && c <= '9';
    if (digits) {
      long long v = 0;
      for (char c : entry) {
        v = v * 10 + (c - '0');
        if (v > 1'000'000) break;
      }
      if (v >= physical_count)
        fail(entry, fmt::format("is not a device: {} has {} device{} (indices 0..{})", backend,
                                physical_count, physical_count == 1 ? "" : "s",
                                physical_count - 1));
      device = static_cast<int>(v);
    } else {
      bool uuid_chars = entry.size() >= 4;
      for (char c : entry) uuid_chars = uuid_chars && (detail::is_hex(c) || c == '-');
      if (!uuid_chars)
        fail(entry, "is neither a device index (a non-negative integer) nor a device UUID "
                    "(at least 4 hex digits)");
      if (uuids.empty())
        for (int i = 0; i < physical_count; ++i) uuids.emplace_back(uuid_of(i));
      for (int i = 0; i < physical_count; ++i) {
        if (!detail::iequal_prefix(entry, uuids[static_cast<std::size_t>(i)])) continue;
        if (device >= 0)
          fail(entry, fmt::format("is ambiguous: it prefixes the UUIDs of devices {} and {}",
                                  device, i));
        device = i;
      }
      if (device < 0) fail(entry, "matches the UUID of no device");
    }
    for (int seen : out)
      if (seen == device) fail(entry, fmt::format("names device {} a second time", device));
    out.push_back(device);
  }
  return out;
}

ACCELKIT_END_NAMESPACE
