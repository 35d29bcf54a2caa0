// accelkit/support: what properties() reads out of a driver's own text and
// numbers: the name of a PCI (or Khronos) vendor id, and the version in a
// driver's version string.
//
//   p.vendor = pci_vendor_name(props.vendorID);             // "NVIDIA", "Mesa"
//   p.driver_version = parse_version(driver_info);          // "Mesa 22.3.6 (LLVM 15.0.6)": 22.3.6
#pragma once

#include <accelkit/config.hpp>
#include <accelkit/properties.hpp>

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

ACCELKIT_BEGIN_NAMESPACE
namespace support {

// The vendor of a PCI vendor id, or of a Khronos vendor id (0x10001 up, which
// Vulkan and OpenCL give drivers without one); "vendor 0x...." otherwise.
inline std::string pci_vendor_name(std::uint32_t id) {
  switch (id) {
    case 0x1002: return "AMD";
    case 0x1022: return "AMD";
    case 0x10DE: return "NVIDIA";
    case 0x8086: return "Intel";
    case 0x13B5: return "Arm";
    case 0x5143: return "Qualcomm";
    case 0x106B: return "Apple";
    case 0x1010: return "Imagination";
    case 0x14E4: return "Broadcom";
    case 0x1AE0: return "Google";
    case 0x10001: return "Vivante";
    case 0x10002: return "VeriSilicon";
    case 0x10003: return "Kazan";
    case 0x10004: return "Codeplay";
    case 0x10005: return "Mesa";
    case 0x10006: return "PoCL";
    default: return fmt::format("vendor {:#x}", id);
  }
}

// The first "a.b" or "a.b.c" in `s` ("OpenCL 3.0 PoCL 4.0": 3.0.0; "Mesa
// 22.3.6 (LLVM 15.0.6)": 22.3.6); a lone number is skipped; {} when there
// is none. Parts stop growing at 100000.
inline Version parse_version(std::string_view s) {
  auto digit = [&](std::size_t i) { return i < s.size() && s[i] >= '0' && s[i] <= '9'; };
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (!digit(i)) continue;
    int parts[3] = {0, 0, 0};
    int n = 0;
    std::size_t j = i;
    while (n < 3 && digit(j)) {
      int v = 0;
      while (digit(j)) {
        if (v < 100000) v = v * 10 + (s[j] - '0');
        ++j;
      }
      parts[n++] = v;
      if (j < s.size() && s[j] == '.' && digit(j + 1)) ++j;
      else break;
    }
    if (n >= 2) return {parts[0], parts[1], parts[2]};
    i = j;
  }
  return {};
}

}  // namespace support
ACCELKIT_END_NAMESPACE
