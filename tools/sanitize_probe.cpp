// Deliberate memory errors and undefined behaviour, built only into the sanitized tree
// (tools/sanitize_probe.cmake) so that tests/test_sanitize.py can show the sanitizer step reports
// them, both in a plain executable and in a library loaded into Python. Never part of libtreadle.
//
//   sanitize_probe <kind>          kinds: clean, heap-overflow, use-after-free, signed-overflow
//   ctypes.CDLL(<module>).treadle_sanitize_probe(b"<kind>")
#include <climits>
#include <cstdio>
#include <cstring>

namespace {

// volatile keeps the optimiser from proving the access dead or folding the arithmetic: the
// instrumented load/store or add must happen at run time. The run-time size also keeps UBSan's
// object-size check out of it, so it is ASan that reports the overflow.
int heap_overflow() {
  volatile int n = 4;
  volatile int* p = new int[n];
  p[n] = 1;  // one past the end
  int r = p[0];
  delete[] p;
  return r;
}

int use_after_free() {
  volatile int* p = new int[4];
  p[0] = 7;
  delete[] p;
  return p[0];
}

int signed_overflow() {
  volatile int big = INT_MAX;
  volatile int one = 1;
  return big + one;
}

}  // namespace

// Returns 0 for "clean" and 2 for an unknown kind; the other kinds never return when the sanitizers
// work (they halt the process with a report).
extern "C" __attribute__((visibility("default"))) int treadle_sanitize_probe(const char* kind) {
  if (std::strcmp(kind, "clean") == 0) return 0;
  if (std::strcmp(kind, "heap-overflow") == 0) return heap_overflow() == 12345 ? 3 : 1;
  if (std::strcmp(kind, "use-after-free") == 0) return use_after_free() == 12345 ? 3 : 1;
  if (std::strcmp(kind, "signed-overflow") == 0) return signed_overflow() == 12345 ? 3 : 1;
  std::fprintf(stderr, "sanitize_probe: unknown kind '%s'\n", kind);
  return 2;
}

#ifdef TREADLE_SANITIZE_PROBE_MAIN
int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: sanitize_probe clean|heap-overflow|use-after-free|signed-overflow\n");
    return 2;
  }
  return treadle_sanitize_probe(argv[1]);
}
#endif
