// Prints skel's device report: what the SDK reads from properties().
#include "skel_runtime.hpp"

#include <cstdio>

int main() {
  auto& backend = accelkit::Backend<skel::SkelRuntime>::instance();
  std::fputs(accelkit::report_text(backend).c_str(), stdout);
  return 0;
}
