// IDX reader. Format (http://yann.lecun.com/exdb/mnist/): a 4-byte magic
// number 0x00 0x00 <type> <rank>, then `rank` big-endian uint32 dimensions,
// then the elements in row-major order, big-endian. Nothing may follow.
#include "paratrain/data/idx.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "paratrain/core/error.h"

namespace paratrain::data {
namespace {

struct TypeInfo {
  at::ScalarType scalar;
  int64_t bytes;
  const char* name;
};

std::optional<TypeInfo> type_info(uint8_t code);
std::string describe(uint32_t magic);

// Owns a zlib gzFile. gzopen/gzread read plain files too (zlib's
// "transparent" mode), which is how uncompressed IDX files are accepted.
class GzReader {
 public:
  explicit GzReader(const std::string& path);
  ~GzReader() { gzclose(file_); }
  GzReader(const GzReader&) = delete;
  GzReader& operator=(const GzReader&) = delete;

  // Reads up to `size` bytes; returns how many were read (less at end of
  // file). Throws DataError on a corrupt gzip stream.
  int64_t read(void* dst, int64_t size);
  bool compressed() { return gzdirect(file_) == 0; }
  // zlib's message for a stream that ended early, or "" if it ended cleanly.
  std::string end_of_stream_error();

 private:
  // gzerror's text without the "path: " prefix zlib adds (we name the file).
  std::string zlib_message(int* code);

  std::string path_;
  gzFile file_ = nullptr;
};

void byteswap_in_place(uint8_t* data, int64_t count, int64_t width);
std::string gzip_trailing_bytes(const std::string& path);

}  // namespace

uint32_t idx_magic(IdxType type, int rank) {
  return (static_cast<uint32_t>(type) << 8) | static_cast<uint32_t>(rank & 0xff);
}

at::Tensor read_idx(const std::string& path, const IdxReadOptions& options) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw DataError(fmt::format("IDX file {} does not exist", path));
  }
  if (fs::is_directory(path, ec)) {
    throw DataError(fmt::format("IDX file {} is a directory, not a file", path));
  }
  const auto file_size = static_cast<int64_t>(fs::file_size(path, ec));
  GzReader reader(path);

  uint8_t magic_bytes[4];
  const int64_t got_magic = reader.read(magic_bytes, 4);
  if (got_magic < 4) {
    throw DataError(fmt::format(
        "IDX file {} is truncated: expected a 4-byte magic number, found {} bytes", path, got_magic));
  }
  const uint32_t magic = (uint32_t{magic_bytes[0]} << 24) | (uint32_t{magic_bytes[1]} << 16) |
                         (uint32_t{magic_bytes[2]} << 8) | uint32_t{magic_bytes[3]};
  const auto info = type_info(magic_bytes[2]);
  const int rank = magic_bytes[3];
  if (magic_bytes[0] != 0 || magic_bytes[1] != 0 || !info || rank == 0) {
    throw DataError(fmt::format(
        "{} is not an IDX file: bad magic number 0x{:08x} (expected 0x0000TTRR with type TT in "
        "08,09,0B,0C,0D,0E and rank RR >= 1); is it the right file, or a corrupt download?",
        path, magic));
  }
  const bool type_ok = !options.type || static_cast<uint8_t>(*options.type) == magic_bytes[2];
  const bool rank_ok = !options.rank || *options.rank == rank;
  if (!type_ok || !rank_ok) {
    const auto want_type = options.type.value_or(static_cast<IdxType>(magic_bytes[2]));
    const uint32_t want = idx_magic(want_type, options.rank.value_or(rank));
    throw DataError(fmt::format("IDX file {} has bad magic number 0x{:08x} ({}); expected 0x{:08x} ({})",
                                path, magic, describe(magic), want, describe(want)));
  }

  std::vector<uint8_t> dim_bytes(4 * static_cast<size_t>(rank));
  const int64_t got_dims = reader.read(dim_bytes.data(), static_cast<int64_t>(dim_bytes.size()));
  if (got_dims < static_cast<int64_t>(dim_bytes.size())) {
    throw DataError(fmt::format(
        "IDX file {} is truncated in its header: rank {} needs {} bytes of dimensions, found {}",
        path, rank, dim_bytes.size(), got_dims));
  }
  std::vector<int64_t> dims(rank);
  for (int d = 0; d < rank; ++d) {
    const uint8_t* b = &dim_bytes[4 * d];
    dims[d] = (int64_t{b[0]} << 24) | (int64_t{b[1]} << 16) | (int64_t{b[2]} << 8) | int64_t{b[3]};
  }
  constexpr int64_t kMaxBytes = int64_t{1} << 46;  // 64 TiB: beyond any real file
  int64_t numel = 1;
  for (const int64_t dim : dims) {
    if (dim != 0 && numel > kMaxBytes / dim / info->bytes) {
      throw DataError(fmt::format("IDX file {} has an impossible shape [{}]: corrupt header", path,
                                  fmt::join(dims, ", ")));
    }
    numel *= dim;
  }
  const int64_t expected = numel * info->bytes;

  // Refuse before allocating when the file cannot possibly hold the body:
  // a plain file has exactly file_size - header bytes; deflate expands at
  // most ~1032:1, so a gzip file has at most ~1032 * file_size.
  const int64_t header_bytes = 4 + 4 * int64_t{rank};
  if (!reader.compressed() && expected > file_size - header_bytes) {
    throw DataError(fmt::format(
        "IDX file {} is truncated: the header (shape [{}], {}) needs {} bytes of data, found {}", path,
        fmt::join(dims, ", "), info->name, expected, file_size - header_bytes));
  }
  constexpr int64_t kMaxDeflateRatio = 1032;
  if (reader.compressed() && expected > kMaxDeflateRatio * file_size + 4096) {
    throw DataError(fmt::format(
        "IDX file {} is corrupt or truncated: the header (shape [{}], {}) needs {} bytes of data but a "
        "{}-byte gzip file holds at most ~{}",
        path, fmt::join(dims, ", "), info->name, expected, file_size, kMaxDeflateRatio * file_size));
  }

  at::Tensor data = at::empty({numel}, at::TensorOptions().dtype(info->scalar));
  auto* bytes = static_cast<uint8_t*>(data.data_ptr());
  const int64_t got = reader.read(bytes, expected);
  if (got < expected) {
    const std::string why = reader.end_of_stream_error();
    throw DataError(fmt::format(
        "IDX file {} is truncated: the header (shape [{}], {}) needs {} bytes of data, found {}{}", path,
        fmt::join(dims, ", "), info->name, expected, got, why.empty() ? "" : " (" + why + ")"));
  }
  // One more read both detects trailing bytes and makes zlib check the gzip
  // trailer (CRC and length), which it does only on reaching the stream end.
  uint8_t extra[64];
  const int64_t trailing = reader.read(extra, sizeof(extra));
  if (trailing > 0) {
    throw DataError(fmt::format(
        "IDX file {} has {}{} extra bytes after the {} bytes its header (shape [{}]) describes: "
        "corrupt file or wrong header",
        path, trailing == int64_t{sizeof(extra)} ? "at least " : "", trailing, expected,
        fmt::join(dims, ", ")));
  }
  if (const std::string why = reader.end_of_stream_error(); !why.empty()) {
    throw DataError(fmt::format("IDX file {} has a corrupt gzip stream: {}", path, why));
  }
  if (reader.compressed()) {
    if (const std::string why = gzip_trailing_bytes(path); !why.empty())
      throw DataError(fmt::format("IDX file {} {}: corrupt or appended-to file; download it again", path, why));
  }

  if constexpr (std::endian::native == std::endian::little) {
    if (info->bytes > 1) byteswap_in_place(bytes, numel, info->bytes);
  }
  return data.view(dims);
}

namespace {

std::optional<TypeInfo> type_info(uint8_t code) {
  switch (code) {
    case 0x08: return TypeInfo{at::kByte, 1, "uint8"};
    case 0x09: return TypeInfo{at::kChar, 1, "int8"};
    case 0x0B: return TypeInfo{at::kShort, 2, "int16"};
    case 0x0C: return TypeInfo{at::kInt, 4, "int32"};
    case 0x0D: return TypeInfo{at::kFloat, 4, "float32"};
    case 0x0E: return TypeInfo{at::kDouble, 8, "float64"};
    default: return std::nullopt;
  }
}

std::string describe(uint32_t magic) {
  const auto info = type_info(static_cast<uint8_t>(magic >> 8));
  return fmt::format("{}, rank {}", info ? info->name : "unknown type", magic & 0xff);
}

GzReader::GzReader(const std::string& path) : path_(path) {
  file_ = gzopen(path.c_str(), "rb");
  if (file_ == nullptr) {
    throw DataError(fmt::format("cannot open IDX file {}: {}", path,
                                errno != 0 ? std::strerror(errno) : "out of memory"));
  }
  gzbuffer(file_, 1 << 20);  // fewer syscalls for the 26 MB training images
}

int64_t GzReader::read(void* dst, int64_t size) {
  auto* out = static_cast<uint8_t*>(dst);
  int64_t total = 0;
  while (total < size) {
    // gzread takes an unsigned int length: read in chunks below 2^30.
    const auto chunk = static_cast<unsigned>(std::min<int64_t>(size - total, int64_t{1} << 30));
    const int n = gzread(file_, out + total, chunk);
    if (n < 0) {
      int code = 0;
      const std::string msg = zlib_message(&code);
      throw DataError(fmt::format("IDX file {} has a corrupt gzip stream: {}", path_,
                                  code == Z_ERRNO ? std::strerror(errno) : msg));
    }
    if (n == 0) break;
    total += n;
  }
  return total;
}

std::string GzReader::zlib_message(int* code) {
  std::string msg = gzerror(file_, code);
  const std::string prefix = path_ + ": ";
  if (msg.rfind(prefix, 0) == 0) msg.erase(0, prefix.size());
  return msg;
}

std::string GzReader::end_of_stream_error() {
  int code = Z_OK;
  const std::string msg = zlib_message(&code);
  if (code == Z_OK) return "";
  // Z_BUF_ERROR at the end means the deflate stream stopped mid-way.
  if (code == Z_BUF_ERROR) return fmt::format("gzip stream ends early: {}", msg);
  return msg;
}

// Note [Bytes after the gzip stream]
// zlib's gzread ignores whatever follows the last gzip member when it does
// not start another member, so a damaged or appended-to file read as fine.
// This second pass inflates the file member by member with the raw
// inflate API, which reports where each member ends, and names any bytes
// that are not a further member. It costs one more decompression of the
// file (~0.1 s for the 26 MB training images), once per load.
std::string gzip_trailing_bytes(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return "";  // the first pass read it; nothing new to say
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) {  // 16: gzip framing
    std::fclose(file);
    return "";
  }
  std::vector<uint8_t> in(1 << 16), out(1 << 16);
  int64_t consumed = 0;    // compressed bytes before z.next_in
  int64_t member_end = 0;  // where the last complete member ended
  int members = 0;
  std::string problem;
  bool at_member_start = true;
  while (problem.empty()) {
    if (z.avail_in == 0) {
      const size_t n = std::fread(in.data(), 1, in.size(), file);
      if (n == 0) break;
      z.next_in = in.data();
      z.avail_in = static_cast<uInt>(n);
    }
    if (at_member_start && members > 0 && z.next_in[0] != 0x1f) break;  // not a gzip member: reported below
    at_member_start = false;
    z.next_out = out.data();
    z.avail_out = static_cast<uInt>(out.size());
    const uInt before = z.avail_in;
    const int rc = inflate(&z, Z_NO_FLUSH);
    consumed += before - z.avail_in;
    if (rc == Z_STREAM_END) {
      inflateReset(&z);
      at_member_start = true;  // another member may follow, or nothing
      member_end = consumed;
      ++members;
    } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
      break;  // not a gzip member after all (the first one the first pass checked)
    }
  }
  // Anything but a clean end after a complete member: bytes that are no
  // further member, or one that stops part-way.
  const bool clean_end = at_member_start && z.avail_in == 0 && std::feof(file) != 0;
  if (members > 0 && !clean_end)
    problem = fmt::format("has bytes after its gzip stream (from byte {})", member_end);
  inflateEnd(&z);
  std::fclose(file);
  return problem;
}

void byteswap_in_place(uint8_t* data, int64_t count, int64_t width) {
  for (int64_t i = 0; i < count; ++i) std::reverse(data + i * width, data + (i + 1) * width);
}

}  // namespace
}  // namespace paratrain::data
