# Configures and builds accelkit in BINARY with ACCELKIT_BUILD_TESTS=TESTS,
# ACCELKIT_BUILD_EXAMPLES=EXAMPLES and ACCELKIT_WITH_TORCH=TORCH (run by
# CTest: build.options.*). With this build's build type and compiler
# launcher, so that a compiler cache serves what this build (or another
# combination) already compiled: scripts/setup.sh sets CCACHE_NOHASHDIR, so
# that the build directory is not part of ccache's key for objects with debug
# information (Note [One registration source for every build tree]).
file(REMOVE_RECURSE "${BINARY}")
set(args -S "${SOURCE}" -B "${BINARY}" -G "${GENERATOR}"
    -DCMAKE_BUILD_TYPE=${BUILD_TYPE} -DCMAKE_CXX_COMPILER=${CXX}
    -DACCELKIT_BUILD_TESTS=${TESTS} -DACCELKIT_BUILD_EXAMPLES=${EXAMPLES}
    -DACCELKIT_WITH_TORCH=${TORCH} -DACCELKIT_WERROR=ON
    -DACCELKIT_SANITIZER_TESTS=OFF -DACCELKIT_BUILD_BENCHMARKS=OFF
    # Checked by the main build (tests/CMakeLists.txt: every header on its own).
    -DACCELKIT_HEADER_CHECKS=OFF
    # examples/cudart's nvcc and torch units are built by the main build;
    # left out here, where they would only add minutes.
    -DACCELKIT_WITH_CUDART=OFF
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
