// accelkit: ACCELKIT_REGISTER_BACKEND(R), the one line of a vendor's
// registration file that turns runtime R into a PyTorch backend. Includes
// no PyTorch header: the torch adapters are compiled once, in the SDK's
// library sources that accelkit_add_torch_backend links into the backend's
// module; this line binds them to R (Note [Backend interface]).
#pragma once

#include <accelkit/torch/bound_backend.hpp>

#include <string_view>

// Makes runtime R the backend of this module (a PyTorch extension or
// program linking the SDK's library part, the object library
// accelkit_torch_adapters): PrivateUse1, named R::name. Use once, at
// namespace scope, in one .cpp file of the module. A member of R that is
// missing or mistyped stops the build here, naming it (Backend<R>).
#define ACCELKIT_REGISTER_BACKEND(R)                                               \
  ACCELKIT_BEGIN_NAMESPACE                                                         \
  ACCELKIT_TORCH_NAMESPACE {                                                       \
  BackendInterface& backend() {                                                    \
    static BackendInterface* const bound = new BoundBackend<R>();                  \
    return *bound;                                                                 \
  }                                                                                \
  std::string_view backend_name() noexcept { return R::name; }                     \
  bool backend_host_kernels() noexcept { return detail::constant_host_kernels<R>; } \
  }                                                                                \
  ACCELKIT_END_NAMESPACE                                                           \
  static_assert(true, "ACCELKIT_REGISTER_BACKEND(R) ends with a semicolon")
