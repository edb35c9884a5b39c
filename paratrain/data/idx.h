// Reader for the IDX format (the files of MNIST and Fashion-MNIST), gzip
// compressed or plain. Only reads: tests write their fixtures by hand so the
// reader is checked against bytes it did not produce.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

namespace paratrain::data {

// IDX element types: the third byte of the magic number.
enum class IdxType : uint8_t {
  kUInt8 = 0x08,
  kInt8 = 0x09,
  kInt16 = 0x0B,
  kInt32 = 0x0C,
  kFloat32 = 0x0D,
  kFloat64 = 0x0E,
};

struct IdxReadOptions {
  // What the caller expects; a file that disagrees is rejected with its magic
  // number and the expected one (e.g. 0x00000803 = uint8, rank 3, for image
  // files). Unset = accept whatever the header says.
  std::optional<IdxType> type;
  std::optional<int> rank;
};

// Reads `path` (gzip or uncompressed, detected by zlib) into a CPU tensor with
// the header's shape and element type, converted from big-endian to host
// order. Throws DataError naming the file on a missing file, a bad magic
// number, a truncated body (expected vs found bytes), trailing bytes after the
// body, or a corrupt gzip stream.
at::Tensor read_idx(const std::string& path, const IdxReadOptions& options = {});

// The magic number of (type, rank): 0x0000TTRR.
uint32_t idx_magic(IdxType type, int rank);

}  // namespace paratrain::data
