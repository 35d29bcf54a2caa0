// A backend's registration translation unit, compiled by
// accelkit_add_torch_backend (cmake/accelkitTorchBackend.cmake) with
// ACCELKIT_BACKEND_HEADER (the runtime's header, quoted) and
// ACCELKIT_BACKEND_CLASS (the runtime class) defined.
//
// Note [One registration source for every build tree]
// This file is the same file in every build tree, and what differs between
// backends is on the command line: the translation unit that includes
// PyTorch's headers (minutes to compile) then has one path and one compile
// command wherever the SDK builds it, so a compiler cache hands one build's
// object to another (the wheel's build, the build-option tests, a second
// checkout), where a source generated into each build tree never matched.
// accelkit's torch headers come first (Note [CPU kernel stubs]).
#include <accelkit/torch/register.hpp>

#include ACCELKIT_BACKEND_HEADER

ACCELKIT_REGISTER_BACKEND(ACCELKIT_BACKEND_CLASS);
