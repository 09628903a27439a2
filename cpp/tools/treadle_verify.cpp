// treadle-verify: the installation check for hosts without Python (the same as `python -m treadle
// verify`): every op of the catalog on every backend and dtype this build has and this machine runs.
// Exit status 0 when every check passes, 1 when one fails, 2 for a usage error.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

#include "treadle/error.hpp"
#include "treadle/verify.hpp"

namespace {

const char* const kUsage =
    "usage: treadle-verify [--quick] [--ops OP[,OP...]] [--backend NAME[,NAME...]] [--json PATH] [--seed N]\n"
    "  --quick    central differences on 6 elements per input instead of all\n"
    "  --ops      only these ops (default: every op in the catalog)\n"
    "  --backend  only these backends (default: every usable one)\n"
    "  --json     also write the report as JSON\n"
    "  --seed     seed of the random inputs (default 0)\n";

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t end = std::min(text.find(',', start), text.size());
    if (end > start) items.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return items;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "treadle-verify: %s\n%s", message.c_str(), kUsage);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  treadle::VerifyOptions options;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool takes_value = arg == "--ops" || arg == "--backend" || arg == "--json" || arg == "--seed";
    if (takes_value && i + 1 >= argc) return usage_error(arg + " needs a value");
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (arg == "--quick") {
      options.quick = true;
    } else if (arg == "--ops") {
      options.ops = split(argv[++i]);
    } else if (arg == "--backend") {
      options.backends = split(argv[++i]);
    } else if (arg == "--json") {
      json_path = argv[++i];
    } else if (arg == "--seed") {
      char* end = nullptr;
      options.seed = std::strtoull(argv[++i], &end, 10);
      if (!end || *end) return usage_error(std::string("--seed takes a non-negative integer, got '") + argv[i] + "'");
    } else {
      return usage_error("unknown argument '" + arg + "'");
    }
  }
  options.progress = [](int done, int total) {
    std::fprintf(stderr, "\rverify: %d/%d cases%s", done, total, done == total ? "\n" : "");
  };
  try {
    const treadle::VerifyReport report = treadle::verify(options);
    std::fputs(report.text().c_str(), stdout);
    if (!json_path.empty()) {
      std::ofstream file(json_path);
      file << report.json();
      if (!file.flush()) {
        std::fprintf(stderr, "treadle-verify: cannot write %s\n", json_path.c_str());
        return 2;
      }
    }
    return report.passed() ? 0 : 1;
  } catch (const treadle::ValueError& e) {
    return usage_error(e.what());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "treadle-verify: %s\n", e.what());
    return 1;
  }
}
