// simdev as a PyTorch backend: the one registration line a vendor writes.
#include <accelkit/torch/register.hpp>

#include "simdev_runtime.hpp"

ACCELKIT_REGISTER_BACKEND(simdev::SimRuntime);

// The simulated driver's fault knob, for tests from Python:
// torch.ops.simdev_driver.inject_fault("memcpy_async", 2) makes the second
// memcpy_async from now on fail once, as SIMDEV_INJECT_FAULT does from the
// start. Not part of the backend a vendor generates.
TORCH_LIBRARY(simdev_driver, m) {
  m.def("inject_fault(str member, int nth=1) -> ()", [](std::string member, int64_t nth) {
    TORCH_CHECK_VALUE(nth >= 1, "simdev: inject_fault: nth must be at least 1, got ", nth);
    accelkit::Backend<simdev::SimRuntime>::instance().runtime().inject_fault(member,
                                                                             static_cast<int>(nth));
  });
}
