# Eigen comes from the cmeel-eigen wheel (<site-packages>/cmeel.prefix) or any Eigen3 CMake package.
find_package(Eigen3 3.4 CONFIG QUIET)
if(NOT Eigen3_FOUND)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_FOUND)
    execute_process(
      COMMAND ${Python3_EXECUTABLE} -c "import cmeel, pathlib; print(pathlib.Path(cmeel.__file__).parent.parent / 'cmeel.prefix')"
      OUTPUT_VARIABLE _treadle_cmeel_prefix OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    if(_treadle_cmeel_prefix)
      find_package(Eigen3 3.4 CONFIG REQUIRED PATHS ${_treadle_cmeel_prefix} NO_DEFAULT_PATH)
    endif()
  endif()
endif()
if(NOT Eigen3_FOUND)
  message(FATAL_ERROR "Eigen 3.4 not found: pip install cmeel-eigen, or set CMAKE_PREFIX_PATH to an Eigen install")
endif()
