// Prints minimal's device report.
#include <minimal_runtime.hpp>

#include <cstdio>

int main() {
  auto& backend = accelkit::Backend<minimal::MinimalRuntime>::instance();
  std::fputs(accelkit::report_text(backend).c_str(), stdout);
}
