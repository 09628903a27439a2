# The CUDA backend's build: the CUDA language (nvcc), the CUDA runtime from the toolkit (linked
# statically, so nothing of the toolkit is needed at run time besides the driver), and cuBLAS /
# cuBLASLt / cuDNN 9 from the NVIDIA PyPI wheels (nvidia-cublas, nvidia-cudnn-cu13), which install
# into <site-packages>/nvidia/<name>/{lib,include}. Libraries found elsewhere (a full toolkit under
# /usr/local/cuda, or paths given with -DTREADLE_CUBLAS_LIBRARY=...) work as well.
#
# Include at file scope, in the highest directory whose targets use CUDA: enable_language() may not
# run inside a function. Defines
#   treadle_cuda_libs               INTERFACE target: the libraries to link, nothing else
#   treadle_cuda_deps               INTERFACE target: headers, libraries, TREADLE_WITH_CUDA
#   TREADLE_CUDA_RPATH              the directories of the shared libraries found (for INSTALL_RPATH)
#   treadle_add_cuda_library(name src_root include_root)
#                                   an OBJECT library of the kernel layer: <src_root>/backends/cuda/*.cu
#                                   and *.cpp except the core's side of the backend (cuda_backend*.cpp)
#   treadle_add_cuda_backend(target src_root)
#                                   the core's side (CudaBackend, the device half of Context and Plan)
#                                   into the core library `target`, which then compiles and exports
#                                   with TREADLE_WITH_CUDA
include_guard(GLOBAL)

# nvcc from the toolkit at its usual place unless the caller chose one (-DCMAKE_CUDA_COMPILER or CUDACXX).
if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# sm_90 machine code (H100/H200) plus compute_90 PTX, which newer GPUs compile at load time. Builds
# for other GPUs pass -DCMAKE_CUDA_ARCHITECTURES="80;90" (each entry: SASS + PTX) or "native".
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
enable_language(CUDA)
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
find_package(CUDAToolkit REQUIRED)

# Where pip put the wheels: the site-packages of the Python that CMake finds (pass
# -DPython3_EXECUTABLE=... to choose), plus any TREADLE_CUDA_WHEEL_ROOT given by the caller.
set(TREADLE_CUDA_WHEEL_ROOT "" CACHE PATH "A site-packages directory holding nvidia/*/lib (cuBLAS, cuDNN wheels)")
find_package(Python3 COMPONENTS Interpreter QUIET)
set(_treadle_site_dirs ${TREADLE_CUDA_WHEEL_ROOT})
if(Python3_FOUND)
  execute_process(
    COMMAND ${Python3_EXECUTABLE} -c
      "import site, sysconfig; print(';'.join([sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']] + site.getsitepackages()))"
    OUTPUT_VARIABLE _treadle_py_sites OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  list(APPEND _treadle_site_dirs ${_treadle_py_sites})
endif()
set(_treadle_wheel_libdirs "")
set(_treadle_wheel_incdirs "")
foreach(_site IN LISTS _treadle_site_dirs)
  file(GLOB _libs LIST_DIRECTORIES true "${_site}/nvidia/*/lib")
  file(GLOB _incs LIST_DIRECTORIES true "${_site}/nvidia/*/include")
  list(APPEND _treadle_wheel_libdirs ${_libs})
  list(APPEND _treadle_wheel_incdirs ${_incs})
endforeach()
list(REMOVE_DUPLICATES _treadle_wheel_libdirs)
list(REMOVE_DUPLICATES _treadle_wheel_incdirs)

# The wheels ship only versioned names (libcublas.so.13), hence the explicit file names.
set(_treadle_cuda_hints ${_treadle_wheel_libdirs} ${CUDAToolkit_LIBRARY_DIR})
find_library(TREADLE_CUBLAS_LIBRARY NAMES cublas libcublas.so.13 libcublas.so.12 HINTS ${_treadle_cuda_hints})
find_library(TREADLE_CUBLASLT_LIBRARY NAMES cublasLt libcublasLt.so.13 libcublasLt.so.12 HINTS ${_treadle_cuda_hints})
find_library(TREADLE_CUDNN_LIBRARY NAMES cudnn libcudnn.so.9 HINTS ${_treadle_cuda_hints})
find_path(TREADLE_CUBLAS_INCLUDE_DIR cublasLt.h HINTS ${_treadle_wheel_incdirs} ${CUDAToolkit_INCLUDE_DIRS})
find_path(TREADLE_CUDNN_INCLUDE_DIR cudnn_version.h HINTS ${_treadle_wheel_incdirs} ${CUDAToolkit_INCLUDE_DIRS})
foreach(_var TREADLE_CUBLAS_LIBRARY TREADLE_CUBLASLT_LIBRARY TREADLE_CUDNN_LIBRARY
             TREADLE_CUBLAS_INCLUDE_DIR TREADLE_CUDNN_INCLUDE_DIR)
  if(NOT ${_var})
    message(FATAL_ERROR "TREADLE_WITH_CUDA: ${_var} not found (searched ${_treadle_wheel_libdirs} "
      "${_treadle_wheel_incdirs} and the CUDA toolkit); pip install nvidia-cublas nvidia-cudnn-cu13, "
      "or pass -D${_var}=<path>")
  endif()
endforeach()
file(STRINGS "${TREADLE_CUDNN_INCLUDE_DIR}/cudnn_version.h" _cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
string(REGEX MATCH "[0-9]+" _cudnn_major "${_cudnn_major}")
if(NOT _cudnn_major STREQUAL "9")
  message(FATAL_ERROR "TREADLE_WITH_CUDA: cuDNN 9 required, found major version '${_cudnn_major}' in "
    "${TREADLE_CUDNN_INCLUDE_DIR}")
endif()

set(TREADLE_CUDA_RPATH "")
foreach(_lib ${TREADLE_CUBLAS_LIBRARY} ${TREADLE_CUBLASLT_LIBRARY} ${TREADLE_CUDNN_LIBRARY})
  get_filename_component(_dir "${_lib}" DIRECTORY)
  list(APPEND TREADLE_CUDA_RPATH "${_dir}")
endforeach()
list(REMOVE_DUPLICATES TREADLE_CUDA_RPATH)

if(NOT TARGET treadle_cuda_deps)
  # Link-only: what libtreadle needs from the NVIDIA libraries without changing how its other sources
  # compile (no include paths, no definitions), so those stay ccache hits of a CPU-only build.
  # The runtime statically: only the driver (libcuda.so.1, loaded at first use) is needed at run time.
  add_library(treadle_cuda_libs INTERFACE)
  target_link_libraries(treadle_cuda_libs INTERFACE $<LINK_ONLY:CUDA::cudart_static>
    ${TREADLE_CUBLASLT_LIBRARY} ${TREADLE_CUBLAS_LIBRARY} ${TREADLE_CUDNN_LIBRARY})
  # What the CUDA sources compile with.
  add_library(treadle_cuda_deps INTERFACE)
  target_include_directories(treadle_cuda_deps SYSTEM INTERFACE
    ${TREADLE_CUBLAS_INCLUDE_DIR} ${TREADLE_CUDNN_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
  target_link_libraries(treadle_cuda_deps INTERFACE treadle_cuda_libs)
  target_compile_definitions(treadle_cuda_deps INTERFACE TREADLE_WITH_CUDA)
endif()
message(STATUS "treadle: CUDA ${CUDAToolkit_VERSION} (${CMAKE_CUDA_COMPILER}), architectures "
  "${CMAKE_CUDA_ARCHITECTURES}; cuBLAS ${TREADLE_CUBLAS_LIBRARY}; cuDNN ${TREADLE_CUDNN_LIBRARY}")

# The backend's own sources as an OBJECT library: every object goes into libtreadle (a static
# library would drop objects nothing references yet) and the same objects into the test program.
# Its sources see TREADLE_WITH_CUDA and the CUDA headers; consumers that link the target get them too.
function(treadle_add_cuda_library name src_root include_root)
  file(GLOB _srcs CONFIGURE_DEPENDS ${src_root}/backends/cuda/*.cu ${src_root}/backends/cuda/*.cpp)
  # The backend's core side needs the core (plans, the op registry): not part of the kernel layer,
  # which the standalone test project builds without the core.
  list(FILTER _srcs EXCLUDE REGEX "/cuda_backend[^/]*\\.cpp$")
  add_library(${name} OBJECT ${_srcs})
  target_include_directories(${name} PUBLIC ${include_root} ${src_root})
  target_link_libraries(${name} PUBLIC treadle_cuda_deps)
  set_target_properties(${name} PROPERTIES
    POSITION_INDEPENDENT_CODE ON
    CXX_VISIBILITY_PRESET hidden CUDA_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  # Precise math (no --use_fast_math): kernels are checked against a float64 reference at ~1e-5.
  # -lineinfo lets profilers map time to source lines at no run-time cost.
  target_compile_options(${name} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>)
endfunction()

# The backend's core side, compiled with the core's own flags plus the CUDA headers. The definition
# is PUBLIC for treadle/cuda.hpp (the device-memory helpers a binding or host uses); the core's
# classes do not depend on it (the core reaches the device through DeviceRuntime).
function(treadle_add_cuda_backend target src_root)
  file(GLOB _srcs CONFIGURE_DEPENDS ${src_root}/backends/cuda/cuda_backend*.cpp)
  target_sources(${target} PRIVATE ${_srcs})
  target_compile_definitions(${target} PUBLIC TREADLE_WITH_CUDA)
  target_include_directories(${target} SYSTEM PRIVATE
    ${TREADLE_CUBLAS_INCLUDE_DIR} ${TREADLE_CUDNN_INCLUDE_DIR} ${CUDAToolkit_INCLUDE_DIRS})
endfunction()
