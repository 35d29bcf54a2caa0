# Compiles SOURCE with -D${DEFINE} and checks the outcome.
#   EXPECT empty: the compile must succeed (the control case).
#   otherwise:    the compile must fail, its output must contain EXPECT, and
#                 exactly one accelkit static_assert may fire.
# Arguments: CXX, STD, SOURCE, INCLUDES (;-list), DEFINE, EXPECT.
set(args -std=c++${STD} -fsyntax-only)
foreach(dir IN LISTS INCLUDES)
  list(APPEND args -I${dir})
endforeach()
if(DEFINE)
  list(APPEND args -D${DEFINE})
endif()
execute_process(COMMAND ${CXX} ${args} ${SOURCE}
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
string(REGEX MATCHALL "static assertion failed: accelkit:[^\n]*" fired "${out}")
list(LENGTH fired count)
if(NOT EXPECT)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "the complete runtime failed to compile:\n${out}")
  endif()
  message(STATUS "compiled, as expected")
  return()
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "compiled, but the contract should have rejected -D${DEFINE}")
endif()
string(FIND "${out}" "${EXPECT}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the diagnostic '${EXPECT}' did not fire; compiler said:\n${out}")
endif()
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected exactly one accelkit diagnostic, got ${count}:\n${fired}")
endif()
message(STATUS "rejected with: ${fired}")
