// safetensors reading and writing (format and guarantees: treadle/serialize.hpp). Reading never
// trusts the file: every length, offset and shape is checked against the bytes actually present
// before anything is allocated or copied, and tensors are only returned once the checksum matched.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <tuple>

#include "nn/json.hpp"
#include "nn/serialize_common.hpp"
#include "treadle/error.hpp"
#include "treadle/serialize.hpp"

static_assert(std::endian::native == std::endian::little,
              "treadle's safetensors I/O copies tensor bytes as they are and assumes a little-endian host");

namespace treadle {

const char* serialize_version() { return "0.1.0"; }

const Tensor* TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors)
    if (n == name) return &t;
  return nullptr;
}

namespace serialize_detail {

const char* safetensors_code(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f64: return "F64";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    default: throw_type_error("safetensors: dtype ", dtype_name(t), " cannot be written (F32, F64, I32, I64 only)");
  }
}

[[noreturn]] void throw_io_error(int err, const std::string& what) {
  throw std::system_error(err, std::generic_category(), what);
}

}  // namespace serialize_detail

using namespace serialize_detail;

namespace {

constexpr const char* kChecksumKey = "treadle.checksum";
constexpr const char* kChecksumPrefix = "fnv1a64:";

std::optional<DType> dtype_from_code(std::string_view code) {
  if (code == "F32") return DType::f32;
  if (code == "F64") return DType::f64;
  if (code == "I32") return DType::i32;
  if (code == "I64") return DType::i64;
  return std::nullopt;
}

bool is_other_safetensors_code(std::string_view code) {
  static constexpr std::string_view kOther[] = {"BOOL", "U8", "I8", "U16", "I16", "F16", "BF16", "U32",
                                                "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "F6_E2M3",
                                                "F6_E3M2", "C64"};
  return std::find(std::begin(kOther), std::end(kOther), code) != std::end(kOther);
}

class Fnv1a {
 public:
  void update(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    uint64_t h = h_;
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
    h_ = h;
  }
  void field(std::string_view s) {
    update(s.data(), s.size());
    update("", 1);  // the NUL separator
  }
  std::string hex() const {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h_));
    return std::string(kChecksumPrefix) + buf;
  }

 private:
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0, end = 0;
};

std::string dims_text(const Shape& s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out;
}

// The canonical header (see serialize.hpp); entries must be in payload order.
Fnv1a hash_header(const Metadata& meta, const std::vector<Entry>& entries) {
  Fnv1a h;
  for (const auto& [k, v] : meta) {
    if (k == kChecksumKey) continue;
    h.field(k);
    h.field(v);
  }
  for (const Entry& e : entries) {
    h.field(e.name);
    h.field(safetensors_code(e.dtype));
    h.field(dims_text(e.shape));
    h.field(std::to_string(e.begin));
    h.field(std::to_string(e.end));
  }
  return h;
}

void sort_payload_order(std::vector<Entry>& entries) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
}

// ---- reading ---------------------------------------------------------------------------------

struct Index {
  std::vector<Entry> entries;  // payload order
  Metadata metadata;
};

Shape parse_shape(const json::Value& v, const std::string& where, uint64_t elem, uint64_t* bytes) {
  if (v.kind != json::Kind::array) throw_value_error(where, ": shape is ", json::kind_name(v.kind), ", not an array");
  if (v.items.size() > 64) throw_value_error(where, ": shape has ", v.items.size(), " dimensions (at most 64)");
  Shape shape;
  uint64_t n = elem;
  for (const json::Value& d : v.items) {
    auto x = json::as_uint(d);
    if (!x || *x > (uint64_t{1} << 62)) throw_value_error(where, ": shape entries must be non-negative integers");
    if (__builtin_mul_overflow(n, *x, &n)) throw_value_error(where, ": shape has more elements than fit in memory");
    shape.push_back(static_cast<int64_t>(*x));
  }
  *bytes = n;
  return shape;
}

Entry parse_entry(const std::string& name, const json::Value& v, uint64_t payload, const std::string& who) {
  const std::string where = who + ": tensor '" + name + "'";
  if (name.empty()) throw_value_error(who, ": a tensor has an empty name");
  if (v.kind != json::Kind::object) throw_value_error(where, " is described by ", json::kind_name(v.kind));
  const json::Value *dt = v.find("dtype"), *shape = v.find("shape"), *offs = v.find("data_offsets");
  if (!dt || !shape || !offs || v.members.size() != 3)
    throw_value_error(where, ": expected exactly the fields dtype, shape and data_offsets");
  if (dt->kind != json::Kind::string) throw_value_error(where, ": dtype is not a string");
  auto dtype = dtype_from_code(dt->text);
  if (!dtype) {
    if (is_other_safetensors_code(dt->text))
      throw_value_error(where, ": dtype ", dt->text, " is not supported (treadle reads F32, F64, I32, I64)");
    throw_value_error(where, ": unknown dtype '", dt->text, "'");
  }
  Entry e{name, *dtype, {}, 0, 0};
  uint64_t bytes = 0;
  e.shape = parse_shape(*shape, where, dtype_size(*dtype), &bytes);
  if (offs->kind != json::Kind::array || offs->items.size() != 2)
    throw_value_error(where, ": data_offsets must be an array [begin, end]");
  auto b = json::as_uint(offs->items[0]), en = json::as_uint(offs->items[1]);
  if (!b || !en || *b > *en) throw_value_error(where, ": data_offsets must be integers with begin <= end");
  if (*en > payload)
    throw_value_error(where, ": data_offsets [", *b, ", ", *en, "] exceed the ", payload,
                      "-byte payload (truncated file?)");
  if (*en - *b != bytes)
    throw_value_error(where, ": shape ", shape_str(e.shape), " of ", dt->text, " needs ", bytes,
                      " bytes but data_offsets [", *b, ", ", *en, "] span ", *en - *b);
  e.begin = *b;
  e.end = *en;
  return e;
}

Metadata parse_metadata(const json::Value& v, const std::string& who) {
  if (v.kind != json::Kind::object) throw_value_error(who, ": __metadata__ is ", json::kind_name(v.kind));
  Metadata m;
  for (const auto& [k, val] : v.members) {
    if (val.kind != json::Kind::string)
      throw_value_error(who, ": __metadata__ value of '", k, "' is ", json::kind_name(val.kind), ", not a string");
    m.emplace(k, val.text);
  }
  return m;
}

Index parse_index(std::string_view header, uint64_t payload, const std::string& who) {
  json::Value root = json::parse(header, who + ": header");
  if (root.kind != json::Kind::object)
    throw_value_error(who, ": header is ", json::kind_name(root.kind), ", not a JSON object");
  Index idx;
  for (const auto& [name, v] : root.members) {
    if (name == "__metadata__") idx.metadata = parse_metadata(v, who);
    else idx.entries.push_back(parse_entry(name, v, payload, who));
  }
  sort_payload_order(idx.entries);
  uint64_t pos = 0;
  for (const Entry& e : idx.entries) {
    if (e.begin != pos)
      throw_value_error(who, ": tensor '", e.name, "' starts at byte ", e.begin, " of the payload, expected ", pos,
                        " (tensors must tile the payload without gaps or overlaps)");
    pos = e.end;
  }
  if (pos != payload)
    throw_value_error(who, ": the tensors cover ", pos, " bytes but the payload after the header has ", payload,
                      " (truncated or corrupt file)");
  return idx;
}

// Where the bytes come from: memory (fuzzing, tests) or a file read with pread.
class Source {
 public:
  virtual ~Source() = default;
  virtual uint64_t size() const = 0;
  virtual void read(uint64_t offset, void* dst, std::size_t n) = 0;  // offset + n <= size()
};

class MemorySource final : public Source {
 public:
  MemorySource(const void* data, std::size_t n) : data_(static_cast<const char*>(data)), n_(n) {}
  uint64_t size() const override { return n_; }
  void read(uint64_t offset, void* dst, std::size_t n) override {
    if (n) std::memcpy(dst, data_ + offset, n);
  }

 private:
  const char* data_;
  std::size_t n_;
};

// A path is a C string for the kernel: an embedded NUL would silently cut it short.
// The message spells the NUL as \0: a C string (an exception's what()) would end there.
void refuse_nul(const std::string& path, const std::string& who) {
  if (path.find('\0') == std::string::npos) return;
  std::string shown;
  for (char c : who) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  throw_value_error(shown, ": the path contains a NUL byte");
}

class FileSource final : public Source {
 public:
  FileSource(const std::string& path, const std::string& who) : who_(who) {
    refuse_nul(path, who);
    // O_NONBLOCK: opening a FIFO for reading would wait for a writer forever; it is refused below
    // as not a regular file (for which the flag changes nothing).
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) throw_io_error(errno, who + ": cannot open the file");
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      throw_io_error(err, who + ": cannot stat the file");
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      throw_value_error(who, ": not a regular file");
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~FileSource() override { ::close(fd_); }
  uint64_t size() const override { return size_; }
  void read(uint64_t offset, void* dst, std::size_t n) override {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd_, p, std::min<std::size_t>(n, std::size_t{1} << 30), static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw_io_error(errno, who_ + ": read failed");
      if (r == 0) throw_value_error(who_, ": unexpected end of file (the file shrank while being read)");
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
  }

 private:
  std::string who_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Header length and header, validated; returns the index and sets *payload_start.
Index read_index(Source& src, const std::string& who, uint64_t* payload_start) {
  const uint64_t size = src.size();
  if (size < 8)
    throw_value_error(who, ": the file has ", size, " bytes, too short for the 8-byte header length (truncated?)");
  unsigned char len_bytes[8];
  src.read(0, len_bytes, 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxSafetensorsHeader)
    throw_value_error(who, ": header length ", n, " exceeds the limit of ", kMaxSafetensorsHeader,
                      " bytes (corrupt file?)");
  if (n > size - 8)
    throw_value_error(who, ": header length ", n, " exceeds the ", size - 8,
                      " bytes that follow it (truncated or corrupt file)");
  if (n < 2) throw_value_error(who, ": header length ", n, " is too short for a JSON object");
  std::string header(static_cast<std::size_t>(n), '\0');
  src.read(8, header.data(), header.size());
  *payload_start = 8 + n;
  return parse_index(header, size - 8 - n, who);
}

// Bits by which the start of `s` differs from `prefix` (a large number when `s` is shorter).
int prefix_bit_distance(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return 1 << 20;
  int d = 0;
  for (std::size_t i = 0; i < prefix.size(); ++i)
    d += std::popcount(static_cast<unsigned>(static_cast<unsigned char>(s[i] ^ prefix[i])));
  return d;
}

// Whether the metadata shows that treadle wrote the file, so that its checksum must be present.
// A corrupted header must not pass for a foreign (unchecked) file: every "treadle." key and the
// checksum's "fnv1a64:" value are marks, each recognised with up to 2 flipped bits, so erasing
// all of them takes at least 3 flips per mark (9 or more in any treadle file).
bool carries_treadle_marks(const Metadata& m) {
  for (const auto& [k, v] : m)
    if (prefix_bit_distance(k, "treadle.") <= 2 || prefix_bit_distance(v, kChecksumPrefix) <= 2) return true;
  return false;
}

void verify_checksum(const Index& idx, const Fnv1a& h, const std::string& who) {
  auto it = idx.metadata.find(kChecksumKey);
  if (it == idx.metadata.end()) {
    if (carries_treadle_marks(idx.metadata))
      throw_value_error(who, ": the file was written by treadle but has no ", kChecksumKey,
                        " entry (corrupt header)");
    return;  // written by another tool: nothing to verify against
  }
  const std::string actual = h.hex();
  if (it->second != actual)
    throw_value_error(who, ": checksum mismatch: the header records '", it->second, "' but the contents hash to '",
                      actual, "' (the file is corrupt)");
}

TensorFile read_all(Source& src, const std::string& who, const std::string& source) {
  uint64_t start = 0;
  Index idx = read_index(src, who, &start);
  Fnv1a h = hash_header(idx.metadata, idx.entries);
  TensorFile f;
  f.source = source;
  f.tensors.reserve(idx.entries.size());
  for (const Entry& e : idx.entries) {
    Tensor t(e.shape, e.dtype);
    src.read(start + e.begin, t.data(), static_cast<std::size_t>(e.end - e.begin));
    h.update(t.data(), t.nbytes());
    f.tensors.emplace_back(e.name, std::move(t));
  }
  verify_checksum(idx, h, who);
  f.metadata = std::move(idx.metadata);
  return f;
}

std::string who_for(const char* fn, const std::string& path) { return std::string(fn) + "('" + path + "')"; }

// ---- writing ---------------------------------------------------------------------------------

struct Prepared {
  std::string head;             // length field + padded JSON header
  std::vector<Tensor> payload;  // contiguous tensors in payload order
};

Prepared prepare(const NamedTensors& tensors, const Metadata& user, const std::string& who) {
  Metadata meta = user;
  for (const char* k : {kChecksumKey, "treadle.version"})
    if (meta.count(k)) throw_value_error(who, ": metadata key '", k, "' is reserved");
  meta["treadle.version"] = serialize_version();
  Prepared p;
  std::vector<Entry> entries;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name.empty()) throw_value_error(who, ": a tensor has an empty name");
    if (name == "__metadata__") throw_value_error(who, ": '__metadata__' cannot name a tensor");
    for (const Entry& e : entries)
      if (e.name == name) throw_value_error(who, ": tensor name '", name, "' appears twice");
    if (!t.defined()) throw_value_error(who, ": tensor '", name, "' is undefined");
    if (!(t.device() == Device{})) throw_value_error(who, ": tensor '", name, "' is not on the CPU");
    safetensors_code(t.dtype());  // validates the dtype
    entries.push_back({name, t.dtype(), t.shape(), offset, offset + t.nbytes()});
    offset += t.nbytes();
    p.payload.push_back(t.is_contiguous() ? t : t.clone());
  }
  Fnv1a h = hash_header(meta, entries);
  for (const Tensor& t : p.payload) h.update(t.data(), t.nbytes());
  meta[kChecksumKey] = h.hex();

  std::string js = "{\"__metadata__\":{";
  bool first = true;
  for (const auto& [k, v] : meta) {
    js += first ? "" : ",";
    first = false;
    json::write_string(js, k);
    js += ':';
    json::write_string(js, v);
  }
  js += '}';
  for (const Entry& e : entries) {
    js += ',';
    json::write_string(js, e.name);
    js += std::string(":{\"dtype\":\"") + safetensors_code(e.dtype) + "\",\"shape\":[" + dims_text(e.shape) +
          "],\"data_offsets\":[" + std::to_string(e.begin) + "," + std::to_string(e.end) + "]}";
  }
  js += '}';
  js.append((8 - js.size() % 8) % 8, ' ');  // tensor data starts 8-byte aligned, as safetensors does
  if (js.size() > kMaxSafetensorsHeader) throw_value_error(who, ": the header would exceed ", kMaxSafetensorsHeader, " bytes");
  json::parse(js, who + ": tensor names and metadata must be valid UTF-8; header");  // what we write we can read
  uint64_t n = js.size();
  p.head.resize(8);
  for (int i = 0; i < 8; ++i) p.head[i] = static_cast<char>((n >> (8 * i)) & 0xFF);
  p.head += js;
  return p;
}

void write_all(int fd, const void* data, std::size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw_io_error(errno, what);
    p += w;
    n -= static_cast<std::size_t>(w);
  }
}

void fsync_directory(const std::filesystem::path& dir, const std::string& who) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw_io_error(errno, who + ": cannot open the directory to sync it");
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  if (rc != 0 && err != EINVAL && err != ENOTSUP) throw_io_error(err, who + ": fsync of the directory failed");
}

// A save killed mid-write (SIGKILL, power loss) leaves its temporary file behind. The next save to
// the same path removes those of processes no longer alive on this host, once they are a minute
// old (a shared file system may hold a live writer of another host with the same pid: it keeps
// its file fresh while it writes). Best effort: any error leaves the file where it is.
void remove_stale_temporaries(const std::filesystem::path& dir, const std::string& filename) {
  namespace fs = std::filesystem;
  const std::string prefix = "." + filename + ".tmp.";
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const std::size_t dot = rest.find('.');
    if (dot == 0 || dot == std::string::npos || rest.find_first_not_of("0123456789.") != std::string::npos) continue;
    const long pid = std::strtol(rest.substr(0, dot).c_str(), nullptr, 10);
    if (pid <= 0 || pid == ::getpid() || ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    std::error_code time_ec;
    const auto written = fs::last_write_time(it->path(), time_ec);
    if (time_ec || now - written < std::chrono::minutes(1)) continue;
    std::error_code remove_ec;
    fs::remove(it->path(), remove_ec);
  }
}

// Temporary file beside the destination -> write -> fsync -> close -> rename -> fsync directory.
void write_atomic(const std::string& path, const Prepared& p, const std::string& who) {
  namespace fs = std::filesystem;
  static std::atomic<uint64_t> counter{0};
  refuse_nul(path, who);
  const fs::path dest(path);
  if (!dest.has_filename()) throw_value_error(who, ": the path names a directory, not a file");
  const fs::path dir = dest.has_parent_path() ? dest.parent_path() : fs::path(".");
  remove_stale_temporaries(dir, dest.filename().string());
  const fs::path tmp = dir / ("." + dest.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                              std::to_string(counter++));
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd < 0) throw_io_error(errno, who + ": cannot create the temporary file '" + tmp.string() + "'");
  try {
    write_all(fd, p.head.data(), p.head.size(), who + ": write failed");
    for (const Tensor& t : p.payload) write_all(fd, t.data(), t.nbytes(), who + ": write failed");
    if (::fsync(fd) != 0) throw_io_error(errno, who + ": fsync failed");
    const int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw_io_error(errno, who + ": close failed");
    if (::rename(tmp.c_str(), dest.c_str()) != 0) throw_io_error(errno, who + ": cannot rename the temporary file");
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(dir, who);
}

}  // namespace

namespace serialize_detail {
void write_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata,
                       const std::string& who) {
  write_atomic(path, prepare(tensors, metadata, who), who);
}

TensorFile read_safetensors(const std::string& path, const std::string& who) {
  FileSource src(path, who);
  return read_all(src, who, path);
}
}  // namespace serialize_detail

void save_safetensors(const std::string& path, const NamedTensors& tensors, const Metadata& metadata) {
  const std::string who = who_for("save_safetensors", path);
  write_atomic(path, prepare(tensors, metadata, who), who);
}

std::string safetensors_bytes(const NamedTensors& tensors, const Metadata& metadata) {
  Prepared p = prepare(tensors, metadata, "safetensors_bytes");
  std::string out = std::move(p.head);
  for (const Tensor& t : p.payload) out.append(static_cast<const char*>(t.data()), t.nbytes());
  return out;
}

TensorFile load_safetensors(const std::string& path) {
  return read_safetensors(path, who_for("load_safetensors", path));
}

TensorFile parse_safetensors(const void* data, std::size_t size, const std::string& source) {
  MemorySource src(data, size);
  return read_all(src, who_for("parse_safetensors", source), source);
}

Metadata read_safetensors_metadata(const std::string& path) {
  const std::string who = who_for("read_safetensors_metadata", path);
  FileSource src(path, who);
  uint64_t start = 0;
  return read_index(src, who, &start).metadata;
}

}  // namespace treadle
