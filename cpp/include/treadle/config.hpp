#pragma once
// How this libtreadle was built, for programs compiled against its headers. A CUDA build gives
// Context, Model, Optimizer, Trainer and TrainerOptions members that a CPU build lacks, so a program
// must see TREADLE_WITH_CUDA exactly when the library was built with it: find_package(treadle)
// passes the definition on, and build_config.hpp (generated at configure time, installed beside
// this header) defines it for a compiler invoked by hand.
#if __has_include("treadle/build_config.hpp")
#include "treadle/build_config.hpp"
#endif
