// The vendor backend's registration with PyTorch: all a vendor writes.
#include <accelkit/torch/register.hpp>

#include "vendor_runtime.hpp"

ACCELKIT_REGISTER_BACKEND(vendor::VendorRuntime);
