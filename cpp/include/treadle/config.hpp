#pragma once
// How this libtreadle was built, for programs compiled against its headers. The public classes
// have one layout in every build (a device backend's state hangs off opaque pointers); what the
// build decides is whether treadle/cuda.hpp declares the device-memory helpers of a CUDA build.
// find_package(treadle) passes TREADLE_WITH_CUDA on, and build_config.hpp (generated at configure
// time, installed beside this header) defines it for a compiler invoked by hand.
#if __has_include("treadle/build_config.hpp")
#include "treadle/build_config.hpp"
#endif
