#include <cstdio>
#include "backends/cuda/cuda_stream.hpp"
int main() { std::printf("devices %d\n", treadle::cuda::device_count()); }
