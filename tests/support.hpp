// What the core tests share: a substring test, the driver code of what a
// call throws, and the simdev configuration most tests run on.
#pragma once

#include <accelkit/error.hpp>

#include "simdev_runtime.hpp"

#include <cstdint>
#include <string>

namespace accelkit_tests {

inline bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// The driver code of the DriverError f throws, or 0 when it throws none.
template <class F>
std::int64_t driver_code(F&& f) {
  try {
    f();
  } catch (const accelkit::DriverError& e) {
    return e.code();
  }
  return 0;
}

// simdev with `devices` devices of `mib` MiB each.
inline simdev::Config sim(int devices = 2, std::uint64_t mib = 64) {
  simdev::Config c;
  c.device_count = devices;
  c.memory_bytes = {mib << 20};
  return c;
}

}  // namespace accelkit_tests
