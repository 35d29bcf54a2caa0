// simdev as a PyTorch backend: the one registration line a vendor writes.
#include <accelkit/torch/register.hpp>

#include "simdev_runtime.hpp"

ACCELKIT_REGISTER_BACKEND(simdev::SimRuntime);
