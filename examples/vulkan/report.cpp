// Prints the device and capability report of the vkdev backend: the text
// summary, then (or, with --json, only) the JSON report.
#include "vkdev_runtime.hpp"

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  bool json_only = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  auto& backend = accelkit::Backend<vkdev::VulkanRuntime>::instance();
  if (!json_only) std::fputs(accelkit::report_text(backend).c_str(), stdout);
  if (!json_only) std::puts("\nJSON report:");
  std::puts(accelkit::report_json(backend).c_str());
  return backend.device_count() > 0 ? 0 : 1;
}
