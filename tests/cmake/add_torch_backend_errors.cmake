# A wrong accelkit_add_torch_backend() call stops the configure with one
# message naming the call and the offending argument (CTest
# cmake.add_torch_backend.*: cmake -DCASE=<case> -P this file, the message
# matched). The checks come before any target is made, so script mode runs
# them.
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/accelkitTorchBackend.cmake")
if(CASE STREQUAL "bad_name")
  accelkit_add_torch_backend(Acme-1 RUNTIME r HEADER h.hpp CLASS acme::R)
elseif(CASE STREQUAL "missing_class")
  accelkit_add_torch_backend(acme RUNTIME r HEADER h.hpp)
elseif(CASE STREQUAL "unknown_argument")
  accelkit_add_torch_backend(acme RUNTIME r HEADER h.hpp CLASS acme::R LIBRARY x)
elseif(CASE STREQUAL "no_torch")
  accelkit_add_torch_backend(acme RUNTIME r HEADER h.hpp CLASS acme::R)
else()
  message(FATAL_ERROR "add_torch_backend_errors.cmake: unknown CASE ${CASE}")
endif()
