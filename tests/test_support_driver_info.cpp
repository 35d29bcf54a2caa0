// support/driver_info.hpp: vendor names of PCI and Khronos ids, and the
// version in a driver's text.
#include "catch.hpp"

#include <accelkit/support/driver_info.hpp>

using accelkit::Version;
using accelkit::support::parse_version;
using accelkit::support::pci_vendor_name;

TEST_CASE("support: pci_vendor_name names PCI and Khronos vendor ids, and an unknown id by number") {
  CHECK(pci_vendor_name(0x10DE) == "NVIDIA");
  CHECK(pci_vendor_name(0x1002) == "AMD");
  CHECK(pci_vendor_name(0x8086) == "Intel");
  CHECK(pci_vendor_name(0x10005) == "Mesa");
  CHECK(pci_vendor_name(0x10006) == "PoCL");
  CHECK(pci_vendor_name(0xABCD) == "vendor 0xabcd");
}

TEST_CASE("support: parse_version finds the first a.b[.c] of a driver's text") {
  CHECK(parse_version("Mesa 22.3.6 (LLVM 15.0.6)") == Version{22, 3, 6});
  CHECK(parse_version("OpenCL 3.0 PoCL 4.0") == Version{3, 0, 0});
  CHECK(parse_version("3.1+debian") == Version{3, 1, 0});
  CHECK(parse_version("1.2.3.4") == Version{1, 2, 3});
  CHECK(parse_version("build 7, version 2.5") == Version{2, 5, 0});  // a lone number is skipped
  CHECK(parse_version("v. 1.") == Version{});
  CHECK(parse_version("") == Version{});
  CHECK(parse_version("99999999999.1") == Version{999999, 1, 0});
}
