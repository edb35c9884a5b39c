// Frame encoding for the authenticated store: see wire.h.
#include "paratrain/comm/auth_store/wire.h"

#include <cstring>

namespace paratrain::comm::auth {

void Writer::u32(std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}

void Writer::i64(std::int64_t v) {
  const auto u = static_cast<std::uint64_t>(v);
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<std::uint8_t>(u >> (8 * i)));
}

void Writer::bytes(const void* data, std::size_t n) {
  u32(static_cast<std::uint32_t>(n));
  const auto* b = static_cast<const std::uint8_t*>(data);
  out_.insert(out_.end(), b, b + n);
}

std::vector<std::uint8_t> Writer::frame() const {
  Writer w;
  w.u32(static_cast<std::uint32_t>(out_.size()));
  w.out_.insert(w.out_.end(), out_.begin(), out_.end());
  return std::move(w.out_);
}

std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}

std::optional<std::uint8_t> Reader::u8() {
  if (end_ - p_ < 1) return std::nullopt;
  return *p_++;
}

std::optional<std::uint32_t> Reader::u32() {
  if (end_ - p_ < 4) return std::nullopt;
  const auto v = load_u32(p_);
  p_ += 4;
  return v;
}

std::optional<std::int64_t> Reader::i64() {
  if (end_ - p_ < 8) return std::nullopt;
  std::uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= static_cast<std::uint64_t>(p_[i]) << (8 * i);
  p_ += 8;
  return static_cast<std::int64_t>(u);
}

std::optional<std::vector<std::uint8_t>> Reader::vec() {
  auto n = u32();
  if (!n || static_cast<std::size_t>(end_ - p_) < *n) return std::nullopt;
  std::vector<std::uint8_t> v(p_, p_ + *n);
  p_ += *n;
  return v;
}

std::optional<std::string> Reader::str() {
  auto v = vec();
  if (!v) return std::nullopt;
  return std::string(v->begin(), v->end());
}

}  // namespace paratrain::comm::auth
