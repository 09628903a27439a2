#pragma once
// Symbol visibility: the shared library exports only what is marked TREADLE_API.
#if defined(_WIN32)
#define TREADLE_API
#else
#define TREADLE_API __attribute__((visibility("default")))
#endif
