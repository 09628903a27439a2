# Included at the end of project(treadle) by tools/sanitize.sh (CMAKE_PROJECT_treadle_INCLUDE), so the
# probes are compiled with exactly the sanitized tree's flags but exist in no other build.
add_executable(sanitize_probe ${CMAKE_CURRENT_LIST_DIR}/sanitize_probe.cpp)
target_compile_definitions(sanitize_probe PRIVATE TREADLE_SANITIZE_PROBE_MAIN)
add_library(sanitize_probe_module MODULE ${CMAKE_CURRENT_LIST_DIR}/sanitize_probe.cpp)
set_target_properties(sanitize_probe sanitize_probe_module PROPERTIES
  RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/probe
  LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/probe)
