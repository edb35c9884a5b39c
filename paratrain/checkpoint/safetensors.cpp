// safetensors writer (atomic: temp file, fsync, rename, fsync folder) and a
// reader that trusts nothing in the file. The format is the one documented by
// the safetensors project; this is our own implementation of it.
#include "paratrain/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checksum.h"

namespace paratrain::checkpoint {
namespace {

// The format stores little-endian data and so does every machine we target;
// a big-endian port would byte-swap in write_safetensors/parse_safetensors.
static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes a little-endian host");

// The reference implementation's cap: larger headers mean a corrupt length.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeInfo {
  std::string_view name;
  at::ScalarType type;
};
constexpr DtypeInfo kDtypes[] = {
    {"BOOL", at::kBool},  {"U8", at::kByte},  {"I8", at::kChar},      {"I16", at::kShort},
    {"I32", at::kInt},    {"I64", at::kLong}, {"F16", at::kHalf},     {"BF16", at::kBFloat16},
    {"F32", at::kFloat},  {"F64", at::kDouble},
};
// Valid safetensors dtypes that LibTorch 1.13 cannot hold.
constexpr std::string_view kUnsupportedDtypes[] = {"U16", "U32", "U64", "F8_E4M3", "F8_E5M2"};

struct Entry {
  std::string name;
  at::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct Header {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};

Header parse_header(std::string_view json_text, uint64_t data_size, std::string_view file);
uint64_t read_header_length(const uint8_t* first8);
void write_all(int fd, const void* data, size_t size, const std::string& tmp, const std::filesystem::path& path);
void sync_folder(const std::filesystem::path& path);

[[noreturn]] void fail(std::string_view file, const std::string& what) {
  throw CheckpointError(fmt::format("checkpoint '{}' is invalid: {}", file, what));
}

// Removes the temporary file unless the rename went through.
struct TempFile {
  std::string path;
  int fd = -1;
  bool renamed = false;
  ~TempFile() {
    if (fd >= 0) ::close(fd);
    if (!renamed) ::unlink(path.c_str());
  }
};

}  // namespace

// A checkpoint file has a size known in advance; reading a device, a FIFO
// or /dev/zero "to its end" never ends (issue 23: `checkpoint inspect
// /dev/zero` hung growing memory), so anything but a regular file is refused
// before the first read. A missing path is left to the open that follows,
// which names it.
void require_regular_file(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st) || fs::is_regular_file(st)) return;
  const char* kind = fs::is_directory(st)        ? "a directory"
                     : fs::is_character_file(st) ? "a character device"
                     : fs::is_block_file(st)     ? "a block device"
                     : fs::is_fifo(st)           ? "a FIFO (named pipe)"
                     : fs::is_socket(st)         ? "a socket"
                                                 : "not a file";
  throw CheckpointError(fmt::format("cannot read checkpoint '{}': it is {}, not a regular file; give a "
                                    "step_N checkpoint directory or a .safetensors file",
                                    path.string(), kind));
}

void write_safetensors(const std::filesystem::path& path, const SafetensorsContents& contents,
                       const SafetensorsWriteOptions& options) {
  auto error = [&](const std::string& what) {
    return CheckpointError(fmt::format("cannot write checkpoint '{}': {}", path.string(), what));
  };
  // Everything that can fail on the tensors fails before the file exists.
  std::vector<at::Tensor> cpu;
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& [name, tensor] : contents.tensors) {
    if (name == "__metadata__") throw error("'__metadata__' is reserved and cannot name a tensor");
    if (!tensor.defined()) throw error(fmt::format("tensor '{}' is undefined", name));
    auto it = std::find_if(std::begin(kDtypes), std::end(kDtypes),
                           [&](const DtypeInfo& d) { return d.type == tensor.scalar_type(); });
    if (it == std::end(kDtypes))
      throw error(fmt::format("tensor '{}' has dtype {}, which safetensors cannot store", name,
                              c10::toString(tensor.scalar_type())));
    at::Tensor t = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t bytes = t.numel() * t.element_size();
    header[name] = {{"dtype", it->name}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(t));
  }
  std::map<std::string, std::string> metadata = contents.metadata;
  if (options.data_checksum) {
    uint32_t crc = 0;
    for (const at::Tensor& t : cpu)
      crc = crc32_update(crc, {static_cast<const uint8_t*>(t.data_ptr()), size_t(t.numel() * t.element_size())});
    metadata[kDataChecksumKey] = crc32_hex(crc);
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw error(fmt::format("names and metadata must be valid UTF-8: {}", e.what()));
  }
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  uint8_t length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<uint8_t>(uint64_t(text.size()) >> (8 * i));

  TempFile tmp{fmt::format("{}.tmp.{}", path.string(), ::getpid())};
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0)
    throw error(fmt::format("open('{}') failed: {}; check that the folder exists and is writable",
                            tmp.path, std::strerror(errno)));
  write_all(tmp.fd, length, 8, tmp.path, path);
  write_all(tmp.fd, text.data(), text.size(), tmp.path, path);
  if (options.after_write) options.after_write("header");
  size_t i = 0;
  for (const auto& [name, tensor] : contents.tensors) {
    const at::Tensor& t = cpu[i++];
    write_all(tmp.fd, t.data_ptr(), t.numel() * t.element_size(), tmp.path, path);
    if (options.after_write) options.after_write(name);
  }
  if (options.sync && ::fsync(tmp.fd) != 0)
    throw error(fmt::format("fsync('{}') failed: {}", tmp.path, std::strerror(errno)));
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) throw error(fmt::format("close('{}') failed: {}", tmp.path, std::strerror(errno)));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    throw error(fmt::format("rename('{}' -> '{}') failed: {}", tmp.path, path.string(), std::strerror(errno)));
  tmp.renamed = true;
  if (options.sync) sync_folder(path);
}

void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, bool sync) {
  auto error = [&](const std::string& what) {
    return CheckpointError(fmt::format("cannot write '{}': {}", path.string(), what));
  };
  TempFile tmp{fmt::format("{}.tmp.{}", path.string(), ::getpid())};
  tmp.fd = ::open(tmp.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (tmp.fd < 0)
    throw error(fmt::format("open('{}') failed: {}; check that the folder exists and is writable", tmp.path,
                            std::strerror(errno)));
  write_all(tmp.fd, bytes.data(), bytes.size(), tmp.path, path);
  if (sync && ::fsync(tmp.fd) != 0) throw error(fmt::format("fsync('{}') failed: {}", tmp.path, std::strerror(errno)));
  const int fd = tmp.fd;
  tmp.fd = -1;
  if (::close(fd) != 0) throw error(fmt::format("close('{}') failed: {}", tmp.path, std::strerror(errno)));
  if (::rename(tmp.path.c_str(), path.c_str()) != 0)
    throw error(fmt::format("rename('{}' -> '{}') failed: {}", tmp.path, path.string(), std::strerror(errno)));
  tmp.renamed = true;
  if (sync) sync_folder(path);
}

std::optional<std::string> safetensors_dtype_name(at::ScalarType type) {
  for (const DtypeInfo& d : kDtypes)
    if (d.type == type) return std::string(d.name);
  return std::nullopt;
}

std::optional<at::ScalarType> safetensors_dtype(std::string_view name) {
  for (const DtypeInfo& d : kDtypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

SafetensorsContents read_safetensors(const std::filesystem::path& path) {
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", path.string(),
                                      std::filesystem::exists(path) ? std::strerror(errno) : "no such file"));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw CheckpointError(fmt::format("cannot read checkpoint '{}': I/O error", path.string()));
  return parse_safetensors(bytes, path.string());
}

SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, std::string_view name) {
  if (bytes.size() < 8)
    fail(name, fmt::format("truncated: the file has {} bytes, fewer than the 8-byte header length", bytes.size()));
  const uint64_t n = read_header_length(bytes.data());
  if (n > kMaxHeaderBytes || n > bytes.size() - 8)
    fail(name, fmt::format("truncated or corrupt header length: it says {} bytes of JSON, the file has {} "
                           "bytes after the length field",
                           n, bytes.size() - 8));
  const std::string_view json(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  const Header header = parse_header(json, bytes.size() - 8 - n, name);
  SafetensorsContents out;
  out.metadata = header.metadata;
  const uint8_t* data = bytes.data() + 8 + n;
  if (auto it = out.metadata.find(kDataChecksumKey); it != out.metadata.end()) {
    uint32_t expected = 0;
    if (!parse_crc32_hex(it->second, expected))
      fail(name, fmt::format("metadata '{}' = '{}' is not 8 hex digits", kDataChecksumKey, it->second));
    const uint32_t actual = crc32_update(0, {data, static_cast<size_t>(bytes.size() - 8 - n)});
    if (actual != expected)
      fail(name, fmt::format("tensor data checksum mismatch ({} {} recorded, {} computed): the file is corrupt "
                             "(a bit flip on disk or in transfer); use another checkpoint",
                             kChecksumAlgorithm, it->second, crc32_hex(actual)));
  }
  for (const Entry& e : header.entries) {
    at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.type));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), data + e.begin, e.end - e.begin);
    out.tensors.emplace(e.name, std::move(t));
  }
  return out;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::filesystem::path& path) {
  const std::string name = path.string();
  require_regular_file(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw CheckpointError(fmt::format("cannot read checkpoint '{}': {}", name, std::strerror(errno)));
  const uint64_t size = std::filesystem::file_size(path);
  uint8_t first8[8];
  if (size < 8 || !in.read(reinterpret_cast<char*>(first8), 8))
    fail(name, fmt::format("truncated: the file has {} bytes, fewer than the 8-byte header length", size));
  const uint64_t n = read_header_length(first8);
  if (n > kMaxHeaderBytes || n > size - 8)
    fail(name, fmt::format("truncated or corrupt header length: it says {} bytes of JSON, the file has {} "
                           "bytes after the length field",
                           n, size - 8));
  std::string json(n, '\0');
  if (!in.read(json.data(), static_cast<std::streamsize>(n))) fail(name, "could not read the header");
  return parse_header(json, size - 8 - n, name).metadata;
}

SafetensorsHeader parse_safetensors_header(uint64_t json_length, std::string_view json, uint64_t file_size,
                                           std::string_view name) {
  if (file_size < 8)
    fail(name, fmt::format("truncated: the file has {} bytes, fewer than the 8-byte header length", file_size));
  if (json_length > kMaxHeaderBytes || json_length > file_size - 8 || json.size() != json_length)
    fail(name, fmt::format("truncated or corrupt header length: it says {} bytes of JSON, the file has {} "
                           "bytes after the length field",
                           json_length, file_size - 8));
  Header h = parse_header(json, file_size - 8 - json_length, name);
  SafetensorsHeader out;
  out.metadata = std::move(h.metadata);
  out.data_offset = 8 + json_length;
  for (Entry& e : h.entries) out.tensors.emplace(e.name, SafetensorsEntry{e.type, std::move(e.shape), e.begin, e.end});
  return out;
}

namespace {

uint64_t read_header_length(const uint8_t* first8) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  return n;
}

uint64_t as_u64(const nlohmann::json& j, std::string_view file, const std::string& what) {
  if (!j.is_number_unsigned() && !(j.is_number_integer() && j.get<int64_t>() >= 0))
    fail(file, fmt::format("{} must be a non-negative integer, got {}", what, j.dump()));
  return j.get<uint64_t>();
}

// Parses and checks the JSON header against the size of the data section:
// every entry well-formed, its byte length matching shape x dtype size, and
// the entries tiling [0, data_size) exactly (no holes, overlaps or tail).
Header parse_header(std::string_view json_text, uint64_t data_size, std::string_view file) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::parse_error& e) {
    fail(file, fmt::format("the header is not valid JSON: {}", e.what()));
  }
  if (!j.is_object()) fail(file, "the header must be a JSON object of tensor entries");
  Header h;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(file, "__metadata__ must be an object of string values");
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string()) fail(file, fmt::format("__metadata__['{}'] must be a string, got {}", k, s.dump()));
        h.metadata.emplace(k, s.get<std::string>());
      }
      continue;
    }
    const std::string where = fmt::format("tensor '{}'", name);
    if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets") || v.size() != 3)
      fail(file, fmt::format("{} must have exactly dtype, shape and data_offsets, got {}", where, v.dump()));
    Entry e;
    e.name = name;
    const auto& dtype = v["dtype"];
    if (!dtype.is_string()) fail(file, fmt::format("{}: dtype must be a string", where));
    const std::string dt = dtype.get<std::string>();
    auto it = std::find_if(std::begin(kDtypes), std::end(kDtypes), [&](const DtypeInfo& d) { return d.name == dt; });
    if (it == std::end(kDtypes)) {
      const bool valid = std::find(std::begin(kUnsupportedDtypes), std::end(kUnsupportedDtypes), dt) !=
                         std::end(kUnsupportedDtypes);
      fail(file, valid ? fmt::format("{}: dtype {} has no LibTorch equivalent", where, dt)
                       : fmt::format("{}: unknown dtype '{}'", where, dt));
    }
    e.type = it->type;
    if (!v["shape"].is_array()) fail(file, fmt::format("{}: shape must be an array", where));
    uint64_t numel = 1;
    for (const auto& d : v["shape"]) {
      const uint64_t dim = as_u64(d, file, where + " shape entries");
      if (dim > uint64_t(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel))
        fail(file, fmt::format("{}: shape {} overflows", where, v["shape"].dump()));
      e.shape.push_back(static_cast<int64_t>(dim));
    }
    const auto& off = v["data_offsets"];
    if (!off.is_array() || off.size() != 2) fail(file, fmt::format("{}: data_offsets must be [begin, end]", where));
    e.begin = as_u64(off[0], file, where + " data_offsets");
    e.end = as_u64(off[1], file, where + " data_offsets");
    if (e.begin > e.end) fail(file, fmt::format("{}: data_offsets [{}, {}] end before they begin", where, e.begin, e.end));
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(numel, uint64_t(c10::elementSize(e.type)), &bytes) || bytes != e.end - e.begin)
      fail(file, fmt::format("{}: shape {} of {} needs {} bytes, data_offsets [{}, {}] give {}", where,
                             v["shape"].dump(), dt, bytes, e.begin, e.end, e.end - e.begin));
    h.entries.push_back(std::move(e));
  }
  uint64_t needed = 0;
  for (const Entry& e : h.entries) needed = std::max(needed, e.end);
  if (needed > data_size)
    fail(file, fmt::format("truncated: header says {} bytes of data, file has {}", needed, data_size));
  std::vector<const Entry*> by_offset;
  for (const Entry& e : h.entries) by_offset.push_back(&e);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const Entry* a, const Entry* b) { return std::tie(a->begin, a->end) < std::tie(b->begin, b->end); });
  uint64_t covered = 0;
  for (const Entry* e : by_offset) {
    if (e->begin != covered)
      fail(file, fmt::format("tensor '{}' starts at byte {} of the data but the previous tensor ends at {} "
                             "(overlapping or a hole)",
                             e->name, e->begin, covered));
    covered = e->end;
  }
  if (covered != data_size)
    fail(file, fmt::format("{} trailing bytes after the last tensor (header accounts for {} bytes of data, "
                           "file has {})",
                           data_size - covered, covered, data_size));
  return h;
}

void write_all(int fd, const void* data, size_t size, const std::string& tmp, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw CheckpointError(fmt::format("cannot write checkpoint '{}': write('{}') failed: {}", path.string(),
                                        tmp, std::strerror(errno)));
    p += n;
    size -= static_cast<size_t>(n);
  }
}

// A rename is durable only once the folder holding the new name is synced.
void sync_folder(const std::filesystem::path& path) {
  const std::filesystem::path folder = path.has_parent_path() ? path.parent_path() : ".";
  const int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    const int err = errno;
    if (fd >= 0) ::close(fd);
    throw CheckpointError(fmt::format("checkpoint '{}' was written but syncing folder '{}' failed: {}",
                                      path.string(), folder.string(), std::strerror(err)));
  }
  ::close(fd);
}

}  // namespace
}  // namespace paratrain::checkpoint
