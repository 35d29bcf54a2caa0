// accelkit: byte counts for messages ("1.50 GiB").
#pragma once

#include <accelkit/config.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <string>

ACCELKIT_BEGIN_NAMESPACE
namespace detail {

inline std::string format_bytes(std::uint64_t n) {
  constexpr const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (n < 1024) return fmt::format("{} bytes", n);
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  return fmt::format("{:.2f} {}", v, units[u]);
}

}  // namespace detail
ACCELKIT_END_NAMESPACE
