// CRC-32 helpers over zlib's crc32() (zlib is already a dependency of
// paratrain/data). Streaming, so checking a multi-GB shard needs no copy.
#include "paratrain/checkpoint/checksum.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::checkpoint {

uint32_t crc32_update(uint32_t crc, std::span<const uint8_t> bytes) {
  uLong c = crc;
  while (!bytes.empty()) {
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    c = ::crc32(c, bytes.data(), static_cast<uInt>(n));
    bytes = bytes.subspan(n);
  }
  return static_cast<uint32_t>(c);
}

uint32_t file_crc32(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw CheckpointError(fmt::format("cannot read checkpoint file '{}' to check its checksum: {}", path.string(),
                                      std::filesystem::exists(path) ? std::strerror(errno) : "no such file"));
  std::vector<uint8_t> block(1 << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(block.data()), static_cast<std::streamsize>(block.size()));
    crc = crc32_update(crc, std::span<const uint8_t>(block.data(), static_cast<size_t>(in.gcount())));
  }
  if (in.bad()) throw CheckpointError(fmt::format("cannot read checkpoint file '{}': I/O error", path.string()));
  return crc;
}

std::string crc32_hex(uint32_t crc) { return fmt::format("{:08x}", crc); }

bool parse_crc32_hex(const std::string& text, uint32_t& crc) {
  if (text.size() != 8) return false;
  uint32_t v = 0;
  for (char ch : text) {
    int d;
    if (ch >= '0' && ch <= '9') d = ch - '0';
    else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
    else return false;
    v = (v << 4) | static_cast<uint32_t>(d);
  }
  crc = v;
  return true;
}

}  // namespace paratrain::checkpoint
