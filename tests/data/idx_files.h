// Test helper: writes IDX files byte by byte (big-endian header and body,
// gzip through zlib's gzwrite, or plain), so the reader is checked against
// bytes it did not produce. Not part of the library: paratrain only reads IDX.
#pragma once

#include <zlib.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace paratrain::data::testing {

using Bytes = std::vector<uint8_t>;

inline void append_be32(Bytes& out, uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(v >> shift));
}

// Header (magic 0x0000TTRR, then each dimension) followed by `body`.
inline Bytes idx_file(uint8_t type, const std::vector<uint32_t>& dims, const Bytes& body) {
  Bytes out = {0, 0, type, static_cast<uint8_t>(dims.size())};
  for (uint32_t d : dims) append_be32(out, d);
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Big-endian bytes of each value, whatever the host order.
template <typename T>
Bytes big_endian(const std::vector<T>& values) {
  Bytes out;
  for (const T& v : values) {
    uint8_t raw[sizeof(T)];
    std::memcpy(raw, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T); ++i) {
      out.push_back(std::endian::native == std::endian::little ? raw[sizeof(T) - 1 - i] : raw[i]);
    }
  }
  return out;
}

inline void write_plain(const std::string& path, const Bytes& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

inline void write_gz(const std::string& path, const Bytes& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path);
  if (!bytes.empty() && gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) <= 0) {
    gzclose(f);
    throw std::runtime_error("gzwrite failed for " + path);
  }
  if (gzclose(f) != Z_OK) throw std::runtime_error("gzclose failed for " + path);
}

inline Bytes read_plain(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

}  // namespace paratrain::data::testing
