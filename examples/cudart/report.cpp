// Prints the device and capability report of the cudart backend: the text
// summary, then (or, with --json, only) the JSON report. With no GPU or no
// driver it reports 0 devices and CUDA's error (exit status 1).
#include "cudart_runtime.hpp"

#include <cstdio>
#include <cstring>

int main(int argc, char** argv) {
  bool json_only = argc > 1 && std::strcmp(argv[1], "--json") == 0;
  auto& backend = accelkit::Backend<cudart::CudaRuntime>::instance();
  if (!json_only) std::fputs(accelkit::report_text(backend).c_str(), stdout);
  if (!json_only) std::puts("\nJSON report:");
  std::puts(accelkit::report_json(backend).c_str());
  return backend.device_count() > 0 ? 0 : 1;
}
