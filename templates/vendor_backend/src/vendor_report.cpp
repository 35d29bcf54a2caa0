// Prints the device report of the vendor backend.
#include "vendor_runtime.hpp"

#include <cstdio>

int main() {
  static_assert(accelkit::is_runtime_v<vendor::VendorRuntime>);
  std::puts("vendor_report: contract satisfied");
  auto& backend = accelkit::Backend<vendor::VendorRuntime>::instance();
  std::fputs(accelkit::report_text(backend).c_str(), stdout);
  return 0;
}
