// Text for language models: a corpus (a file, or a folder of text files) is
// tokenized once into a binary cache file of byte tokens, memory-mapped, and
// cut into windows of seq_len + 1 tokens: inputs are a window's first
// seq_len tokens, targets the same shifted by one. Rows of the datasets are
// windows, so the Loader and DistributedSampler shard and shuffle windows
// like any other items. Byte-level: token = byte value (vocabulary 256).
//
// Note [Token cache file]
// <cache_dir>/text-<16 hex digits>.tokens, the hex a hash of the format
// version and of every source file's path, size and modification time: a
// changed corpus gets a new name and is tokenized again. Layout, all
// integers little-endian:
//   bytes 0..7    magic "PTTOKEN1"
//   bytes 8..15   uint64 token count T
//   bytes 16..19  uint32 CRC-32 (zlib) of the T token bytes
//   bytes 20..23  uint32 bytes per token (1)
//   bytes 24..    the tokens
// Written to a temporary name and renamed (atomic: a reader never sees a
// half-written file; ranks that build it at once each rename a complete,
// identical file). A file whose size, magic or checksum disagrees is rebuilt
// when the sources are still readable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "paratrain/data/dataset.h"

namespace paratrain::data {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

// The text files of `source`: itself when it is a file; for a folder every
// regular file below it, recursively, sorted by path, skipping symbolic links
// (fortune's .u8 names are links to the same text) and binary files (a NUL
// byte in the first 8 KiB: fortune's .dat indexes). Throws DataError when
// `source` does not exist or holds no text file.
std::vector<std::filesystem::path> list_text_files(const std::filesystem::path& source);

// Where the cache file of `source` goes in `cache_dir` (see the Note).
std::filesystem::path token_cache_path(const std::filesystem::path& source, const std::filesystem::path& cache_dir);

// Returns the cache file for `source`, tokenizing the files into it (the
// bytes of each file in list order, nothing between them) unless a valid one
// exists. Creates `cache_dir`. Throws DataError naming the path on I/O errors.
std::filesystem::path build_token_cache(const std::filesystem::path& source, const std::filesystem::path& cache_dir);

// Memory-maps a cache file: uint8 [T], read-only pages shared with the page
// cache (writing to the tensor would fault: take views and copies). Verifies
// size, magic and checksum; throws DataError saying what is wrong otherwise.
at::Tensor map_token_file(const std::filesystem::path& file);

// Non-overlapping windows of `tokens` (1-D): row i holds inputs
// tokens[i*S, i*S + S) and targets tokens[i*S + 1, i*S + S + 1); (T - 1) / S
// rows, views of `tokens` (no copy). Both keep the tokens' dtype.
TensorDataset make_windows(const at::Tensor& tokens, int64_t seq_len);

struct TextOptions {
  std::filesystem::path source = kFortunesDir;  // a file or a folder
  std::filesystem::path cache_dir;              // where the token cache lives
  int64_t seq_len = 128;
  // The last part of the corpus (by tokens) held out for validation.
  double validation_fraction = 0.05;
};

struct TextDatasets {
  TensorDataset train;       // windows of the first (1 - fraction) of the tokens
  TensorDataset validation;  // windows of the rest
  int64_t tokens = 0;        // T, the whole corpus
  std::filesystem::path cache_file;
};

// Builds or reuses the cache, maps it, splits and windows it. Throws
// DataError when either split has no full window (corpus too small for
// seq_len) or as above.
TextDatasets load_text(const TextOptions& options);

}  // namespace paratrain::data
