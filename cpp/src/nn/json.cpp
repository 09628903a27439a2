#include "nn/json.hpp"

#include <cstdio>
#include <string>
#include <unordered_set>

#include "treadle/error.hpp"

namespace treadle::json {

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::null: return "null";
    case Kind::boolean: return "a boolean";
    case Kind::number: return "a number";
    case Kind::string: return "a string";
    case Kind::array: return "an array";
    case Kind::object: return "an object";
  }
  return "?";
}

const Value* Value::find(std::string_view key) const {
  for (const auto& [k, v] : members)
    if (k == key) return &v;
  return nullptr;
}

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Recursive descent over a string_view; every read is bounds-checked through peek()/at_end().
class Parser {
 public:
  Parser(std::string_view s, const std::string& who, int max_depth) : s_(s), who_(who), max_depth_(max_depth) {}

  Value parse_document() {
    skip_ws();
    Value v = parse_value(0);
    skip_ws();
    if (!at_end()) fail("unexpected data after the JSON value");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw_value_error(who_, ": ", what, " at byte ", pos_); }
  bool at_end() const { return pos_ >= s_.size(); }
  char peek() const { return at_end() ? '\0' : s_[pos_]; }
  void skip_ws() {
    while (!at_end() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r')) ++pos_;
  }
  void expect_literal(std::string_view lit) {
    if (s_.substr(pos_, lit.size()) != lit) fail("invalid literal");
    pos_ += lit.size();
  }

  Value parse_value(int depth) {
    if (depth > max_depth_) fail("nesting deeper than " + std::to_string(max_depth_) + " levels");
    if (at_end()) fail("unexpected end of input");
    Value v;
    switch (peek()) {
      case '{': parse_object(v, depth); break;
      case '[': parse_array(v, depth); break;
      case '"': v.kind = Kind::string; v.text = parse_string(); break;
      case 't': expect_literal("true"); v.kind = Kind::boolean; v.boolean = true; break;
      case 'f': expect_literal("false"); v.kind = Kind::boolean; break;
      case 'n': expect_literal("null"); break;
      default: v.kind = Kind::number; v.text = parse_number(); break;
    }
    return v;
  }

  void parse_object(Value& v, int depth) {
    v.kind = Kind::object;
    ++pos_;  // '{'
    skip_ws();
    if (peek() == '}') { ++pos_; return; }
    std::unordered_set<std::string> keys;  // duplicates found in linear time: headers are untrusted
    for (;;) {
      skip_ws();
      if (peek() != '"') fail("expected a string key");
      std::string key = parse_string();
      if (!keys.insert(key).second) fail("duplicate key \"" + key + "\"");
      skip_ws();
      if (peek() != ':') fail("expected ':'");
      ++pos_;
      skip_ws();
      v.members.emplace_back(std::move(key), parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') { ++pos_; continue; }
      if (peek() == '}') { ++pos_; return; }
      fail("expected ',' or '}'");
    }
  }

  void parse_array(Value& v, int depth) {
    v.kind = Kind::array;
    ++pos_;  // '['
    skip_ws();
    if (peek() == ']') { ++pos_; return; }
    for (;;) {
      skip_ws();
      v.items.push_back(parse_value(depth + 1));
      skip_ws();
      if (peek() == ',') { ++pos_; continue; }
      if (peek() == ']') { ++pos_; return; }
      fail("expected ',' or ']'");
    }
  }

  std::string parse_number() {
    const std::size_t start = pos_;
    auto digits = [&] {
      const std::size_t d = pos_;
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
      return pos_ - d;
    };
    if (peek() == '-') ++pos_;
    if (peek() == '0') ++pos_;
    else if (digits() == 0) fail("invalid value");
    if (peek() == '.') {
      ++pos_;
      if (digits() == 0) fail("invalid number");
    }
    if (peek() == 'e' || peek() == 'E') {
      ++pos_;
      if (peek() == '+' || peek() == '-') ++pos_;
      if (digits() == 0) fail("invalid number");
    }
    return std::string(s_.substr(start, pos_ - start));
  }

  uint32_t parse_hex4() {
    if (s_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t cp = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      cp <<= 4;
      if (c >= '0' && c <= '9') cp |= static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f') cp |= static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') cp |= static_cast<uint32_t>(c - 'A' + 10);
      else fail("invalid \\u escape");
    }
    return cp;
  }

  void parse_escape(std::string& out) {
    if (at_end()) fail("unterminated string");
    const char c = s_[pos_++];
    switch (c) {
      case '"': out += '"'; return;
      case '\\': out += '\\'; return;
      case '/': out += '/'; return;
      case 'b': out += '\b'; return;
      case 'f': out += '\f'; return;
      case 'n': out += '\n'; return;
      case 'r': out += '\r'; return;
      case 't': out += '\t'; return;
      case 'u': break;
      default: fail("invalid escape");
    }
    uint32_t cp = parse_hex4();
    if (cp >= 0xDC00 && cp <= 0xDFFF) fail("unpaired surrogate in \\u escape");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      if (s_.substr(pos_, 2) != "\\u") fail("unpaired surrogate in \\u escape");
      pos_ += 2;
      const uint32_t lo = parse_hex4();
      if (lo < 0xDC00 || lo > 0xDFFF) fail("unpaired surrogate in \\u escape");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    append_utf8(out, cp);
  }

  // One UTF-8 sequence starting at pos_ (its lead byte >= 0x80), checked for overlong forms,
  // surrogates and range, appended as is.
  void copy_utf8(std::string& out) {
    const auto b0 = static_cast<unsigned char>(s_[pos_]);
    int n;
    uint32_t cp;
    if (b0 >= 0xC2 && b0 <= 0xDF) { n = 1; cp = b0 & 0x1F; }
    else if (b0 >= 0xE0 && b0 <= 0xEF) { n = 2; cp = b0 & 0x0F; }
    else if (b0 >= 0xF0 && b0 <= 0xF4) { n = 3; cp = b0 & 0x07; }
    else fail("invalid UTF-8");
    if (s_.size() - pos_ <= static_cast<std::size_t>(n)) fail("invalid UTF-8");
    for (int i = 1; i <= n; ++i) {
      const auto b = static_cast<unsigned char>(s_[pos_ + i]);
      if ((b & 0xC0) != 0x80) fail("invalid UTF-8");
      cp = (cp << 6) | (b & 0x3F);
    }
    const uint32_t min_cp = n == 1 ? 0x80 : n == 2 ? 0x800 : 0x10000;
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) fail("invalid UTF-8");
    out.append(s_.substr(pos_, n + 1));
    pos_ += n + 1;
  }

  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (at_end()) fail("unterminated string");
      const auto c = static_cast<unsigned char>(s_[pos_]);
      if (c == '"') { ++pos_; return out; }
      if (c == '\\') { ++pos_; parse_escape(out); }
      else if (c < 0x20) fail("control character in string");
      else if (c >= 0x80) copy_utf8(out);
      else { out += static_cast<char>(c); ++pos_; }
    }
  }

  std::string_view s_;
  const std::string& who_;
  int max_depth_;
  std::size_t pos_ = 0;
};

}  // namespace

Value parse(std::string_view text, const std::string& who, int max_depth) {
  return Parser(text, who, max_depth).parse_document();
}

std::optional<uint64_t> as_uint(const Value& v) {
  if (v.kind != Kind::number || v.text.empty() || v.text.size() > 20) return std::nullopt;
  uint64_t x = 0;
  for (char c : v.text) {
    if (c < '0' || c > '9') return std::nullopt;
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (x > (UINT64_MAX - d) / 10) return std::nullopt;
    x = x * 10 + d;
  }
  return x;
}

void write_string(std::string& out, std::string_view s) {
  out += '"';
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  out += '"';
}

}  // namespace treadle::json
