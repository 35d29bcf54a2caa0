// A backend's registration translation unit, compiled by
// accelkit_add_torch_backend (cmake/accelkitTorchBackend.cmake) with
// ACCELKIT_BACKEND_HEADER (the runtime's header, quoted) and
// ACCELKIT_BACKEND_CLASS (the runtime class) defined.
//
// It includes no PyTorch header: the torch adapters are the SDK's library
// part, compiled once (accelkit_torch_adapters.cpp beside this file, Note [Backend
// interface]); this unit builds the runtime's core objects and binds them.
//
// Note [One registration source for every build tree]
// This file, and the library part's sources beside it, are the same files
// in every build tree, and what differs between backends is on the command
// line: each unit then has one path and one compile command wherever the
// SDK builds it, so a compiler cache hands one build's object to another
// (the wheel's build, the build-option tests, a second checkout), where a
// source generated into each build tree never matched. accelkit's headers
// come first (Note [CPU kernel stubs]: a runtime header that includes
// accelkit's torch headers still includes them before PyTorch's).
#include <accelkit/torch/register.hpp>

#include ACCELKIT_BACKEND_HEADER

ACCELKIT_REGISTER_BACKEND(ACCELKIT_BACKEND_CLASS);
