// The verification report as JSON and as the text the command line prints.
#include <algorithm>
#include <cstdio>

#include "nn/json.hpp"
#include "treadle/verify.hpp"

namespace treadle {
namespace {

std::string number(double v, const char* format = "%.17g") {
  char buf[40];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

std::string quoted(const std::string& s) {
  std::string out;
  json::write_string(out, s);
  return out;
}

std::string cell_json(const VerifyCell& c) {
  switch (c.state) {
    case VerifyCell::State::not_listed: return "null";
    case VerifyCell::State::declined: return "{\"declined\": " + quoted(c.message) + "}";
    case VerifyCell::State::error: return quoted(c.message);
    case VerifyCell::State::measured: break;
  }
  return number(c.fraction);
}

std::string cell_text(const VerifyCell& c) {
  switch (c.state) {
    case VerifyCell::State::not_listed: return "-";
    case VerifyCell::State::declined: return "n/a";
    case VerifyCell::State::error: return "ERROR";
    case VerifyCell::State::measured: break;
  }
  return c.fraction <= 1.0 ? number(c.fraction, "%.2g") : "FAIL " + number(c.fraction, "%.3g");
}

std::string padded(const std::string& s, std::size_t width, bool right) {
  const std::string fill(width > s.size() ? width - s.size() : 0, ' ');
  return right ? fill + s : s + fill;
}

}  // namespace

int VerifyReport::checks() const {
  int n = 0;
  for (const VerifyRow& r : rows)
    for (const VerifyCell& c : r.cells)
      n += c.state == VerifyCell::State::measured || c.state == VerifyCell::State::error;
  return n;
}

std::string VerifyReport::json() const {
  std::string out = "{\"build\": {";
  for (std::size_t i = 0; i < build.size(); ++i) out += (i ? ", " : "") + quoted(build[i].key) + ": " + quoted(build[i].value);
  out += "},\n \"quick\": " + std::string(quick ? "true" : "false") + ", \"threads\": {\"before\": " +
         std::to_string(threads_before) + ", \"after\": " + std::to_string(threads_after) + "},\n \"columns\": [";
  for (std::size_t i = 0; i < columns.size(); ++i) out += (i ? ", " : "") + quoted(columns[i]);
  out += "],\n \"rows\": [";
  for (std::size_t r = 0; r < rows.size(); ++r) {
    out += std::string(r ? ",\n  " : "\n  ") + "{\"case\": " + quoted(rows[r].name) + ", \"op\": " + quoted(rows[r].op) +
           ", \"cells\": {";
    for (std::size_t k = 0; k < rows[r].cells.size(); ++k)
      out += (k ? ", " : "") + quoted(columns.at(k)) + ": " + cell_json(rows[r].cells[k]);
    out += "}}";
  }
  out += "],\n \"failures\": [";
  for (std::size_t i = 0; i < failures.size(); ++i) {
    const VerifyFailure& f = failures[i];
    out += std::string(i ? ",\n  " : "\n  ") + "{\"case\": " + quoted(f.case_name) + ", \"op\": " + quoted(f.op) +
           ", \"check\": " + quoted(f.check) + ", \"backend\": " + quoted(f.backend) + ", \"dtype\": " +
           quoted(f.dtype) + ", \"error\": " + quoted(f.error) + "}";
  }
  return out + "],\n \"seconds\": " + number(seconds, "%.2f") + "}\n";
}

std::string VerifyReport::text() const {
  std::string out, version, backends, rest;
  for (const BuildInfoEntry& e : build) {
    if (e.key == "version") version = e.value;
    else if (e.key == "backends") backends = e.value;
    else rest += "; " + e.key + " " + e.value;
  }
  out += "treadle " + version + ": backends " + backends + rest + "\n";
  out += "threads: " + std::to_string(threads_before) + " before, " + std::to_string(threads_after) + " after\n";
  out += "cells: worst error as a fraction of its tolerance (at most 1 passes); '-': the backend lists no kernel for "
         "the op; 'n/a': it declined these shapes on this machine (the JSON report says why)\n";
  std::size_t width = 4;
  for (const VerifyRow& r : rows) width = std::max(width, r.name.size());
  out += padded("case", width, false);
  for (const std::string& c : columns) out += "  " + padded(c, std::max<std::size_t>(c.size(), 8), true);
  out += "\n";
  for (const VerifyRow& r : rows) {
    out += padded(r.name, width, false);
    for (std::size_t k = 0; k < r.cells.size(); ++k)
      out += "  " + padded(cell_text(r.cells[k]), std::max<std::size_t>(columns[k].size(), 8), true);
    out += "\n";
  }
  const std::string took = " (" + number(seconds, "%.2f") + " s)\n";
  if (failures.empty()) return out + "\nall " + std::to_string(checks()) + " checks passed" + took;
  out += "\nFAILED: " + std::to_string(failures.size()) + " of " + std::to_string(checks()) + " checks" + took;
  for (const VerifyFailure& f : failures) out += "  " + f.case_name + " [" + f.check + "]: " + f.error + "\n";
  return out;
}

}  // namespace treadle
