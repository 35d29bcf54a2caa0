# Configures and builds accelkit in BINARY with ACCELKIT_BUILD_TESTS=TESTS,
# ACCELKIT_BUILD_EXAMPLES=EXAMPLES and ACCELKIT_WITH_TORCH=TORCH (run by
# CTest: build.options.*). Release, so that ccache serves what another
# combination already compiled.
file(REMOVE_RECURSE "${BINARY}")
set(args -S "${SOURCE}" -B "${BINARY}" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX}
    -DACCELKIT_BUILD_TESTS=${TESTS} -DACCELKIT_BUILD_EXAMPLES=${EXAMPLES}
    -DACCELKIT_WITH_TORCH=${TORCH} -DACCELKIT_WERROR=ON
    -DACCELKIT_SANITIZER_TESTS=OFF -DACCELKIT_BUILD_BENCHMARKS=OFF
    "-DCMAKE_PREFIX_PATH=${PREFIX}")
if(LAUNCHER)
  list(APPEND args -DCMAKE_CXX_COMPILER_LAUNCHER=${LAUNCHER})
endif()
if(PYTHON)
  list(APPEND args -DPython3_EXECUTABLE=${PYTHON})
endif()
execute_process(COMMAND ${CMAKE_COMMAND} ${args} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "configuring with tests=${TESTS} examples=${EXAMPLES} torch=${TORCH} failed")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build "${BINARY}" RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "building with tests=${TESTS} examples=${EXAMPLES} torch=${TORCH} failed")
endif()
file(REMOVE_RECURSE "${BINARY}")
