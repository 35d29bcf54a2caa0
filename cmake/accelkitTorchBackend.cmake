# accelkit_add_torch_backend(): a vendor runtime as a PyTorch backend, in one
# call. Shipped beside accelkitConfig.cmake (and included by it) and used by
# accelkit's own examples.
#
#   accelkit_add_torch_backend(<name>
#     RUNTIME <target>        # the runtime's target (its include directories
#                             # hold HEADER; it links the driver)
#     HEADER <file>           # the header that defines CLASS, as #included
#     CLASS <type>            # the runtime class, accelkit::Runtime<CLASS>
#     [PACKAGE <module>]      # the Python package, default torch_<name>
#     [VERSION <x.y.z>]       # the wheel's version, default PROJECT_VERSION
#     [SOURCES <file>...]     # more sources of the library (e.g. test knobs)
#     [WHEEL_CMAKE_DEFINES <VAR=value>...])  # for the wheel's configure
#
# makes:
# - target <module>: the library _C, whose source is the one registration
#   line, ACCELKIT_REGISTER_BACKEND(CLASS) (src/accelkit_register_backend.cpp),
#   linked with the SDK's library part, the object library
#   accelkit_torch_adapters (the torch adapters, src/accelkit_torch_adapters.cpp,
#   compiled once per project: Note [Backend interface] in
#   accelkit/torch/backend_interface.hpp);
# - <build>/python/<module>/: an importable package (put <build>/python on
#   PYTHONPATH): _C, an __init__.py configured from torch_backend_init.py.in,
#   the SDK's Python package as <module>/_accelkit (Note [The SDK's
#   Python package in each wheel]) and testing.py, the conformance kit's
#   command for the wheel alone (`python -m <module>.testing`, --device
#   defaulting to <name>);
# - <build>/packages/<module>/pyproject.toml: a pip-installable package.
#   `pip install --no-build-isolation <build>/packages/<module>` builds its
#   wheel with scikit-build-core from this project's sources (Note [The
#   wheel's build]); the wheel declares an entry point in PyTorch's
#   `torch.backends` group, so that `import torch` loads the backend
#   (TORCH_DEVICE_BACKEND_AUTOLOAD=0 turns that off), and one in
#   `accelkit.backends`, so that with several accelkit backends installed
#   `import torch` loads one, the first or the one ACCELKIT_BACKEND names
#   (Note [Two backends in one environment] in python/accelkit/__init__.py).
#
# Note [The SDK's Python package in each wheel]
# The device module torch.<name> (python/accelkit) calls operators that
# the SDK's headers compiled into _C define: the two halves must come from
# one SDK version. Each backend's wheel therefore carries its own copy, as
# the private subpackage <module>/_accelkit, rather than depending on a
# separately installed `accelkit` distribution: nothing to publish beside
# the wheel, no version to keep in step, and two backends' wheels never
# overwrite each other's files (only one can be loaded in a process, as
# PyTorch has one PrivateUse1 slot: Note [Two backends in one environment]).
#
# Note [The wheel's build]
# The generated pyproject.toml points scikit-build-core at this project's
# top-level source directory (cmake.source-dir), configures it afresh in
# <build>/packages/<module>/build (kept, so a second `pip install` rebuilds
# only what changed) with the settings below, builds only target <module>
# and installs only its component, which exists only under scikit-build-core
# (SKBUILD), so `cmake --install` of the project does not install it. The
# wheel's configure gets this configure's compiler, compiler launcher,
# CMAKE_PREFIX_PATH, accelkit_DIR and ACCELKIT_SOURCE_DIR, BUILD_TESTING=OFF,
# and WHEEL_CMAKE_DEFINES; libtorch is found through the Python that runs
# pip (accelkit_find_torch), so the wheel is built against the torch it
# will run with. Build with --no-build-isolation: an isolated build
# environment would download its own torch (a CUDA build of several GB), and
# build-system.requires does not list torch for that reason. The wheel
# requires exactly the torch version it was built against (its C++ ABI).
include_guard(GLOBAL)

set(_accelkit_torch_backend_dir "${CMAKE_CURRENT_LIST_DIR}")
# The directory that holds the SDK's Python package `accelkit`: set by
# accelkitConfig.cmake for an installed or exported package; in a source
# tree, python/ beside this file's cmake/.
if(DEFINED accelkit_PYTHON_DIR)
  set(_accelkit_torch_backend_python "${accelkit_PYTHON_DIR}")
else()
  get_filename_component(_accelkit_torch_backend_python "${CMAKE_CURRENT_LIST_DIR}/../python"
                         ABSOLUTE)
endif()
set_property(GLOBAL PROPERTY ACCELKIT_PYTHON_DIR "${_accelkit_torch_backend_python}")
set_property(GLOBAL PROPERTY ACCELKIT_BACKEND_INIT_TEMPLATE
             "${_accelkit_torch_backend_dir}/torch_backend_init.py.in")
# The SDK's C++ sources: src/ of a source tree, or src/ beside this file
# where accelkit is installed. Global, as the two above: a vendor's project
# that fetched accelkit calls accelkit_add_torch_backend from its own
# directory, where this directory's variables are not seen.
if(EXISTS "${_accelkit_torch_backend_dir}/src/accelkit_register_backend.cpp")
  set(_accelkit_torch_backend_src "${_accelkit_torch_backend_dir}/src")
else()
  get_filename_component(_accelkit_torch_backend_src "${_accelkit_torch_backend_dir}/../src"
                         ABSOLUTE)
endif()
set_property(GLOBAL PROPERTY ACCELKIT_REGISTER_SOURCE
             "${_accelkit_torch_backend_src}/accelkit_register_backend.cpp")
# One unit (its opening comment says why not more).
set_property(GLOBAL PROPERTY ACCELKIT_ADAPTER_SOURCES
             "${_accelkit_torch_backend_src}/accelkit_torch_adapters.cpp")

# The SDK's library part (Note [Backend interface] in
# accelkit/torch/backend_interface.hpp):
# the torch adapters compiled once per project, into the object library
# accelkit_torch_adapters, which every backend's module (and any program
# that uses ACCELKIT_REGISTER_BACKEND itself) links. Made by the first call;
# sets <out> to the target's name.
function(accelkit_torch_adapters out)
  if(NOT TARGET accelkit_torch_adapters)
    if(NOT TARGET accelkit::torch)
      message(FATAL_ERROR "accelkit_torch_adapters: accelkit::torch is not available: libtorch "
                          "was not found")
    endif()
    get_property(sources GLOBAL PROPERTY ACCELKIT_ADAPTER_SOURCES)
    add_library(accelkit_torch_adapters OBJECT ${sources})
    target_link_libraries(accelkit_torch_adapters PUBLIC accelkit::torch)
    # Hidden, as namespace torch_adapter is: GCC gives the guard variables
    # of the adapters' function-local statics default visibility
    # (STB_GNU_UNIQUE) even where the function is hidden; compiled hidden
    # here, they are hidden in the module, whichever units also define them.
    set_target_properties(accelkit_torch_adapters PROPERTIES POSITION_INDEPENDENT_CODE ON
      CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  endif()
  set(${out} accelkit_torch_adapters PARENT_SCOPE)
endfunction()

# Finds libtorch (target `torch`) as find_package(Torch) does, and failing
# that through a Python interpreter that imports torch (Python_EXECUTABLE or
# Python3_EXECUTABLE: scikit-build-core sets both to the interpreter that
# runs pip), so that a wheel is built against the torch it will run with.
#
# The targets it imports are made global: when accelkit is a subproject
# (add_subdirectory, FetchContent), the vendor's targets that link
# accelkit::torch live in other directories, where targets imported here
# would not be seen ("Target torch_cpu not found").
macro(accelkit_find_torch)
  if(NOT TARGET torch)
    get_directory_property(_accelkit_imported_before IMPORTED_TARGETS)
    find_package(Torch QUIET)
    if(NOT Torch_FOUND)
      foreach(_accelkit_python IN ITEMS "${Python_EXECUTABLE}" "${Python3_EXECUTABLE}")
        if(_accelkit_python AND NOT Torch_FOUND)
          execute_process(
            COMMAND "${_accelkit_python}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
            OUTPUT_VARIABLE _accelkit_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE
            RESULT_VARIABLE _accelkit_torch_rc ERROR_QUIET)
          if(_accelkit_torch_rc EQUAL 0)
            find_package(Torch QUIET PATHS "${_accelkit_torch_prefix}" NO_DEFAULT_PATH)
          endif()
        endif()
      endforeach()
    endif()
    get_directory_property(_accelkit_imported IMPORTED_TARGETS)
    foreach(_accelkit_target IN LISTS _accelkit_imported)
      if(NOT _accelkit_target IN_LIST _accelkit_imported_before)
        set_property(TARGET ${_accelkit_target} PROPERTY IMPORTED_GLOBAL TRUE)
      endif()
    endforeach()
  endif()
endmacro()

function(accelkit_add_torch_backend name)
  set(fn "accelkit_add_torch_backend(${name})")
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "RUNTIME;HEADER;CLASS;PACKAGE;VERSION"
                        "SOURCES;WHEEL_CMAKE_DEFINES")
  if(arg_UNPARSED_ARGUMENTS)
    list(JOIN arg_UNPARSED_ARGUMENTS " " unknown)
    message(FATAL_ERROR "${fn}: unknown arguments: ${unknown}")
  endif()
  if(NOT name MATCHES "^[a-z_][a-z0-9_]*$")
    message(FATAL_ERROR "${fn}: the name must be a lower-case identifier (the device type "
                        "and the runtime's `name`)")
  endif()
  foreach(required RUNTIME HEADER CLASS)
    if(NOT arg_${required})
      message(FATAL_ERROR "${fn}: ${required} is required")
    endif()
  endforeach()
  if(NOT TARGET accelkit::torch)
    message(FATAL_ERROR "${fn}: accelkit::torch is not available: libtorch was not found "
                        "(set CMAKE_PREFIX_PATH to python -c 'import torch.utils; "
                        "print(torch.utils.cmake_prefix_path)', or Torch_DIR)")
  endif()
  if(NOT TARGET ${arg_RUNTIME})
    message(FATAL_ERROR "${fn}: RUNTIME ${arg_RUNTIME} is not a target")
  endif()
  set(package "torch_${name}")
  if(arg_PACKAGE)
    set(package "${arg_PACKAGE}")
  endif()
  if(NOT package MATCHES "^[A-Za-z_][A-Za-z0-9_]*$")
    message(FATAL_ERROR "${fn}: PACKAGE ${package} is not a Python identifier")
  endif()
  set(version "${PROJECT_VERSION}")
  if(arg_VERSION)
    set(version "${arg_VERSION}")
  endif()
  if(NOT version)
    set(version 0.0.0)
  endif()
  get_property(python_dir GLOBAL PROPERTY ACCELKIT_PYTHON_DIR)
  get_property(init_template GLOBAL PROPERTY ACCELKIT_BACKEND_INIT_TEMPLATE)
  get_property(register_source GLOBAL PROPERTY ACCELKIT_REGISTER_SOURCE)

  # The library: the registration source (Note [One registration source for
  # every build tree]) and the vendor's sources.
  set(package_dir "${PROJECT_BINARY_DIR}/python/${package}")
  accelkit_torch_adapters(adapters)
  add_library(${package} MODULE "${register_source}" ${arg_SOURCES})
  target_compile_definitions(${package} PRIVATE
    "ACCELKIT_BACKEND_HEADER=\"${arg_HEADER}\"" "ACCELKIT_BACKEND_CLASS=${arg_CLASS}")
  target_link_libraries(${package} PRIVATE ${arg_RUNTIME} accelkit::torch ${adapters})
  set_target_properties(${package} PROPERTIES
    PREFIX "" OUTPUT_NAME "_C" LIBRARY_OUTPUT_DIRECTORY "${package_dir}")

  # Its Python: the generated __init__.py and the SDK's package.
  set(ACCELKIT_BACKEND_NAME "${name}")
  set(ACCELKIT_BACKEND_PACKAGE "${package}")
  set(ACCELKIT_BACKEND_LIBRARY "_C${CMAKE_SHARED_MODULE_SUFFIX}")
  configure_file("${init_template}" "${package_dir}/__init__.py" @ONLY)
  file(GLOB_RECURSE sdk_files RELATIVE "${python_dir}/accelkit" CONFIGURE_DEPENDS
       "${python_dir}/accelkit/*.py")
  if(NOT sdk_files)
    message(FATAL_ERROR "${fn}: the SDK's Python package is not in ${python_dir}/accelkit")
  endif()
  foreach(py IN LISTS sdk_files)
    configure_file("${python_dir}/accelkit/${py}" "${package_dir}/_accelkit/${py}" COPYONLY)
  endforeach()
  # The conformance kit of the SDK it carries, from the wheel alone.
  file(CONFIGURE OUTPUT "${package_dir}/testing.py" @ONLY CONTENT [=["""python -m @package@.testing [--groups ...] [--known-differences FILE] [--help]:
accelkit's conformance kit (Python side) on @name@, from the copy of the SDK
this package carries (@package@._accelkit.testing), --device defaulting to
@name@ (generated by accelkit_add_torch_backend)."""
import sys

from ._accelkit.testing.__main__ import main

if __name__ == "__main__":
    sys.exit(main(prog="python -m @package@.testing"))
]=])

  if(SKBUILD)
    # In the wheel (Note [The wheel's build]).
    install(TARGETS ${package} LIBRARY DESTINATION ${package} COMPONENT ${package})
    install(DIRECTORY "${package_dir}/" DESTINATION ${package} COMPONENT ${package}
            FILES_MATCHING PATTERN "*.py" PATTERN "__pycache__" EXCLUDE)
    return()
  endif()

  # The pip-installable package.
  set(defines "BUILD_TESTING=OFF")
  foreach(var CMAKE_CXX_COMPILER CMAKE_CXX_COMPILER_LAUNCHER CMAKE_PREFIX_PATH accelkit_DIR
              ACCELKIT_SOURCE_DIR)
    if(${var})
      list(APPEND defines "${var}=${${var}}")
    endif()
  endforeach()
  list(APPEND defines ${arg_WHEEL_CMAKE_DEFINES})
  set(define_lines "")
  foreach(define IN LISTS defines)
    if(NOT define MATCHES "^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
      message(FATAL_ERROR "${fn}: WHEEL_CMAKE_DEFINES takes VAR=value, got ${define}")
    endif()
    string(APPEND define_lines "${CMAKE_MATCH_1} = '${CMAKE_MATCH_2}'\n")
  endforeach()
  # A list's ';' separates the values of one define, as on cmake's command line.
  set(torch_requirement "")
  if(Torch_VERSION)
    string(REGEX REPLACE "\\+.*" "" torch_version "${Torch_VERSION}")
    set(torch_requirement "'torch==${torch_version}'")
  endif()
  # The wheel is built as this project is (scikit-build-core's default is
  # Release): the same compile commands, which a compiler cache then serves
  # (Note [One registration source for every build tree]).
  set(build_type_line "")
  if(CMAKE_BUILD_TYPE)
    set(build_type_line "cmake.build-type = '${CMAKE_BUILD_TYPE}'\n")
  endif()
  string(REPLACE "_" "-" dist_name "${package}")
  set(wheel_dir "${PROJECT_BINARY_DIR}/packages/${package}")
  file(CONFIGURE OUTPUT "${wheel_dir}/pyproject.toml" @ONLY CONTENT
"# ${name} as a PyTorch backend, generated by accelkit_add_torch_backend: the
# wheel of ${package}, built from '${CMAKE_SOURCE_DIR}'.
#   pip install --no-build-isolation --no-deps '${wheel_dir}'
# (Note [The wheel's build] in accelkit's cmake/accelkitTorchBackend.cmake).
[build-system]
requires = ['scikit-build-core>=0.10']
build-backend = 'scikit_build_core.build'

[project]
name = '${dist_name}'
version = '${version}'
description = '${name} as a PyTorch device (an accelkit backend)'
requires-python = '>=3.9'
dependencies = [${torch_requirement}]

# `import torch` calls ${package}._autoload (TORCH_DEVICE_BACKEND_AUTOLOAD=0
# turns it off); accelkit.backends lists it among the accelkit backends,
# of which one is loaded (ACCELKIT_BACKEND chooses: Note [Two backends in
# one environment] in the SDK's python/accelkit/__init__.py).
[project.entry-points.'torch.backends']
${name} = '${package}:_autoload'

[project.entry-points.'accelkit.backends']
${name} = '${package}'

[tool.scikit-build]
cmake.source-dir = '${CMAKE_SOURCE_DIR}'
build-dir = 'build'
${build_type_line}build.targets = ['${package}']
install.components = ['${package}']
wheel.packages = []

[tool.scikit-build.cmake.define]
${define_lines}")
endfunction()
