// Reading and writing the safetensors format: an 8-byte little-endian header
// length N, N bytes of JSON (space-padded to 8-byte alignment) describing each
// tensor's dtype, shape and byte range, then the raw little-endian data.
// Files are written atomically; reads validate every field. No training
// semantics here: checkpoint.h maps models and optimizers onto this.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

namespace paratrain::checkpoint {

// Tensors by name plus free-form string metadata ("__metadata__").
// std::map: names are written in sorted order, so equal contents give
// byte-identical files.
struct SafetensorsContents {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

struct SafetensorsWriteOptions {
  // fsync the file before the rename and the folder after it. Off only for
  // scratch files: without it a power loss can leave an empty file behind the
  // new name even though rename() itself is atomic.
  bool sync = true;
  // Test hook: called after the header and after each tensor's bytes reach the
  // temporary file; a throw here behaves like a crash mid-write (the target
  // is untouched, the temporary file is removed).
  std::function<void(std::string_view written_so_far)> after_write;
  // Store the CRC-32 of the data section as metadata "data_crc32" (8 hex
  // digits), which the readers here verify, so a bit flip in tensor data is an
  // error instead of silently wrong weights. Costs one pass over the data;
  // other safetensors readers (Python's) ignore the key.
  bool data_checksum = true;
};

// Metadata key of the data-section checksum (see data_checksum).
inline constexpr const char* kDataChecksumKey = "data_crc32";

// Writes `contents` to `path` atomically: into `<path>.tmp.<pid>`, fsync,
// rename over `path`, fsync the folder. Tensors may be on any device and of
// any layout (they are copied to contiguous CPU memory); supported dtypes:
// BOOL, U8, I8, I16, I32, I64, F16, BF16, F32, F64. Throws CheckpointError
// naming the path and the failed system call.
void write_safetensors(const std::filesystem::path& path, const SafetensorsContents& contents,
                       const SafetensorsWriteOptions& options = {});

// Reads and validates a whole file: header length vs file size, JSON,
// dtypes, shapes vs byte lengths, offsets inside the data and covering it
// without holes or overlaps, and the data checksum when the file has one. Throws CheckpointError naming the file and the
// problem ("truncated: header says 1234 bytes of data, file has 1000").
SafetensorsContents read_safetensors(const std::filesystem::path& path);

// The same on bytes in memory; `name` stands for the file in errors. For
// fuzzers and tests; tensors are copies, not views of `bytes`.
SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes, std::string_view name);

// One tensor's place in a file: its bytes [begin, end) of the data section.
struct SafetensorsEntry {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

// A file's header: its tensors, its metadata, where the data section starts.
struct SafetensorsHeader {
  std::map<std::string, SafetensorsEntry> tensors;
  std::map<std::string, std::string> metadata;
  uint64_t data_offset = 0;  ///< 8 + the JSON's length
};

// Validates a header as read_safetensors does (the JSON, dtypes, shapes,
// the tensors tiling the data section of a file of `file_size` bytes)
// without the data: `json_length` is the file's first 8 bytes read as a
// length, `json` the bytes after them (at most that many). `name` stands
// for the file in errors.
SafetensorsHeader parse_safetensors_header(uint64_t json_length, std::string_view json, uint64_t file_size,
                                           std::string_view name);

// Only the metadata, after checking the header and the file size: cheap, for
// picking a checkpoint without reading its tensors.
std::map<std::string, std::string> read_safetensors_metadata(const std::filesystem::path& path);

// Writes `bytes` to `path` with the same atomic protocol as
// write_safetensors (temporary file, fsync when `sync`, rename, fsync folder).
void write_file_atomically(const std::filesystem::path& path, std::string_view bytes, bool sync = true);

// safetensors dtype names ("F32") for the dtypes above; nullopt otherwise.
std::optional<std::string> safetensors_dtype_name(at::ScalarType type);
std::optional<at::ScalarType> safetensors_dtype(std::string_view name);

}  // namespace paratrain::checkpoint
