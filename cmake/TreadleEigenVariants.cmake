# Run-time dispatch of the Eigen reference kernels in a portable build (TREADLE_NATIVE=OFF).
#
# The core is compiled for the x86-64 baseline, which leaves Eigen's kernels at SSE2. Their sources
# (cpp/src/backends/eigen/*_kernels.cpp) are compiled twice more, for x86-64-v3 (AVX2, FMA) and
# x86-64-v4 (AVX-512), and eigen_backend.cpp registers the widest set this CPU runs
# (eigen_backend.cpp, TREADLE_EIGEN_VARIANTS).
#
# The trap is the one-definition rule: every variant instantiates the same Eigen templates and our
# inline functions under the same names, with different instructions, and the linker would keep one
# copy of each for all callers (an AVX-512 copy reached from the baseline path is a SIGILL on an
# older CPU). So each variant's objects are merged into one relocatable object (ld -r), with its
# COMDAT groups resolved inside the variant and dissolved (--force-group-allocation: the final link
# deduplicates groups by name, whatever the symbols' binding), and its symbols are then made local
# (objcopy -G), except its entry point and the type-information objects that exceptions are caught
# by. Each variant thus keeps its own copies, reachable only through its entry.
include_guard(GLOBAL)

# treadle_add_eigen_variants(target src_root include_root): adds the variant objects to `target`.
function(treadle_add_eigen_variants target src_root include_root)
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64" OR NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    message(STATUS "treadle: Eigen kernel variants need GCC on x86-64; the portable build keeps one set")
    return()
  endif()
  find_program(TREADLE_OBJCOPY NAMES objcopy REQUIRED)
  file(GLOB sources CONFIGURE_DEPENDS ${src_root}/backends/eigen/*_kernels.cpp)
  get_target_property(defs ${target} COMPILE_DEFINITIONS)
  foreach(level v3 v4)
    set(obj treadle_eigen_${level})
    add_library(${obj} OBJECT ${sources} ${src_root}/backends/eigen/eigen_variant_entry.cpp)
    target_include_directories(${obj} PRIVATE ${include_root} ${CMAKE_CURRENT_BINARY_DIR}/include ${src_root})
    target_link_libraries(${obj} PRIVATE Eigen3::Eigen)
    target_compile_definitions(${obj} PRIVATE ${defs} TREADLE_EIGEN_VARIANT=${level})
    # -fno-gnu-unique: the static locals of inline functions become ordinary weak symbols, which
    # objcopy makes local like the rest (GNU_UNIQUE ones would stay global and clash at the link).
    target_compile_options(${obj} PRIVATE -march=x86-64-${level} -Wall -Wextra -Wno-unused-parameter
                                          -fno-math-errno -fno-gnu-unique)
    set_target_properties(${obj} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    set(merged ${CMAKE_CURRENT_BINARY_DIR}/treadle_eigen_${level}_merged.o)
    set(local ${CMAKE_CURRENT_BINARY_DIR}/treadle_eigen_${level}.o)
    add_custom_command(
      OUTPUT ${local}
      COMMAND ${CMAKE_LINKER} -r --force-group-allocation -o ${merged} "$<TARGET_OBJECTS:${obj}>"
      COMMAND ${TREADLE_OBJCOPY} --wildcard -G treadle_register_eigen_kernels_${level}
              -G "_ZTI*" -G "_ZTS*" ${merged} ${local}
      DEPENDS "$<TARGET_OBJECTS:${obj}>"
      COMMAND_EXPAND_LISTS
      COMMENT "treadle: Eigen kernels for x86-64-${level}, symbols made local")
    set_source_files_properties(${local} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
    target_sources(${target} PRIVATE ${local})
  endforeach()
  target_compile_definitions(${target} PRIVATE TREADLE_EIGEN_VARIANTS)
  message(STATUS "treadle: Eigen kernels for the baseline, x86-64-v3 and x86-64-v4, chosen at run time")
endfunction()
