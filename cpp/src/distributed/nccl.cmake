# NCCL for treadle::distributed's device transport (included by CMakeLists.txt here when
# -DTREADLE_WITH_NCCL=ON). NCCL comes from the nvidia-nccl-cu13 wheel (<site-packages>/nvidia/nccl/
# {include,lib}), searched in the site-packages of the Python CMake finds (as cmake/TreadleCuda.cmake
# finds cuDNN), in TREADLE_CUDA_WHEEL_ROOT, then in the CUDA toolkit; -DTREADLE_NCCL_LIBRARY=... and
# -DTREADLE_NCCL_INCLUDE_DIR=... give it directly. The wheel's directory goes into the library's
# RPATH, so no LD_LIBRARY_PATH is needed. The CUDA runtime is linked statically, as libtreadle's:
# only the driver is needed at run time.
find_package(CUDAToolkit REQUIRED)
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_nccl_sites ${TREADLE_CUDA_WHEEL_ROOT})
if(Python3_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import site, sysconfig; print(';'.join([sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']] + site.getsitepackages()))"
    OUTPUT_VARIABLE _nccl_py_sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _nccl_sites ${_nccl_py_sites})
endif()
set(_nccl_lib_hints "")
set(_nccl_inc_hints "")
foreach(_site IN LISTS _nccl_sites)
  list(APPEND _nccl_lib_hints "${_site}/nvidia/nccl/lib")
  list(APPEND _nccl_inc_hints "${_site}/nvidia/nccl/include")
endforeach()
# The wheel ships only the versioned name (libnccl.so.2).
find_library(TREADLE_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${_nccl_lib_hints} ${CUDAToolkit_LIBRARY_DIR})
find_path(TREADLE_NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_inc_hints} ${CUDAToolkit_INCLUDE_DIRS})
if(NOT TREADLE_NCCL_LIBRARY OR NOT TREADLE_NCCL_INCLUDE_DIR)
  message(FATAL_ERROR "TREADLE_WITH_NCCL: NCCL not found (library: '${TREADLE_NCCL_LIBRARY}', header: "
    "'${TREADLE_NCCL_INCLUDE_DIR}'; searched ${_nccl_lib_hints} and the CUDA toolkit): pip install "
    "nvidia-nccl-cu13, or pass -DTREADLE_NCCL_LIBRARY=... -DTREADLE_NCCL_INCLUDE_DIR=...")
endif()
file(STRINGS "${TREADLE_NCCL_INCLUDE_DIR}/nccl.h" _nccl_version REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) [0-9]+")
string(REGEX REPLACE "[^0-9;]" "" _nccl_version "${_nccl_version}")
string(REPLACE ";" "." _nccl_version "${_nccl_version}")
message(STATUS "treadle::distributed: NCCL ${_nccl_version} (${TREADLE_NCCL_LIBRARY})")

target_sources(treadle_distributed PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/nccl_transport.cpp)
target_compile_definitions(treadle_distributed PRIVATE TREADLE_WITH_NCCL)
target_include_directories(treadle_distributed SYSTEM PRIVATE ${TREADLE_NCCL_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(treadle_distributed PRIVATE ${TREADLE_NCCL_LIBRARY} CUDA::cudart_static)
get_filename_component(_nccl_dir "${TREADLE_NCCL_LIBRARY}" DIRECTORY)
set_property(TARGET treadle_distributed APPEND PROPERTY BUILD_RPATH "${_nccl_dir}")
set_property(TARGET treadle_distributed APPEND PROPERTY INSTALL_RPATH "${_nccl_dir}")
