// A vendor program built against accelkit from outside its tree.
#include <accelkit/accelkit.hpp>

#include "simdev_runtime.hpp"

#include <cstdio>

int main() {
  static_assert(accelkit::is_runtime_v<simdev::SimRuntime>);
  static_assert(ACCELKIT_VERSION >= 100);
  accelkit::Backend<simdev::SimRuntime> backend(
      accelkit::Environment::fixed({{"SIMDEV_VISIBLE_DEVICES", "1"}}),
      simdev::Config{});
  if (backend.device_count() != 1) {
    std::printf("consumer: expected 1 visible device, got %d\n", backend.device_count());
    return 1;
  }
  std::fputs(accelkit::report_text(backend).c_str(), stdout);
  std::puts("consumer: ok");
  return 0;
}
