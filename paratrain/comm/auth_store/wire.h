// The authenticated store's wire format after the handshake, shared by the
// client (store.cpp) and the server (server.cpp): length-prefixed frames of
// little-endian integers and length-prefixed byte strings. Not here: the
// handshake (handshake.h) or any socket I/O.
//
// A frame: u32 body length | body. Request body: u8 Op | arguments.
// Reply body: u8 Status | results.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace paratrain::comm::auth {

// Frames above this are refused: the server would otherwise allocate
// whatever a (buggy or hostile) length prefix says. Store values are small
// (addresses, check-ins, heartbeats); 64 MiB leaves room for metadata blobs.
inline constexpr std::uint32_t kMaxFrameBytes = 64u << 20;

enum class Op : std::uint8_t {
  set = 1,          // key, value                 -> ok
  get = 2,          // key                        -> ok value | missing
  add = 3,          // key, i64                   -> ok i64 | error text
  compare_set = 4,  // key, expected, desired     -> ok value
  check = 5,        // u32 n, n keys              -> ok u8
  wait = 6,         // i64 timeout ms (0: none), u32 n, n keys -> ok | timeout
  erase = 7,        // key                        -> ok u8 (existed)
  num_keys = 8,     //                            -> ok i64
};

enum class Status : std::uint8_t { ok = 0, missing = 1, timeout = 2, error = 3 };

// Appends to a frame body.
class Writer {
 public:
  void u8(std::uint8_t v) { out_.push_back(v); }
  void u32(std::uint32_t v);
  void i64(std::int64_t v);
  void bytes(const void* data, std::size_t n);  // u32 length | data
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void vec(const std::vector<std::uint8_t>& v) { bytes(v.data(), v.size()); }
  // The body with its u32 length prefix in front.
  std::vector<std::uint8_t> frame() const;

 private:
  std::vector<std::uint8_t> out_;
};

// Reads a frame body; every read is bounds-checked and returns nullopt (never
// reads past the end) on a short or malformed body.
class Reader {
 public:
  Reader(const std::uint8_t* data, std::size_t n) : p_(data), end_(data + n) {}
  std::optional<std::uint8_t> u8();
  std::optional<std::uint32_t> u32();
  std::optional<std::int64_t> i64();
  std::optional<std::vector<std::uint8_t>> vec();
  std::optional<std::string> str();
  bool done() const { return p_ == end_; }

 private:
  const std::uint8_t* p_;
  const std::uint8_t* end_;
};

// Little-endian u32 at p (4 readable bytes).
std::uint32_t load_u32(const std::uint8_t* p);

}  // namespace paratrain::comm::auth
