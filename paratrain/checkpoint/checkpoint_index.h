// Internal to paratrain/checkpoint: index.json of a sharded checkpoint directory
// (which chunks of which global tensors each rank file holds, the files'
// sizes and checksums, the training metadata) and ShardedReader, which cuts any
// element range of a global tensor out of the chunks, verifying every file it
// opens. Public entry points are in sharded.h; the format in Note [Sharded
// checkpoint layout] in sharded.h.
#pragma once

#include <cstdint>
#include <filesystem>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/checkpoint/safetensors_file.h"

namespace paratrain::checkpoint {

inline constexpr const char* kIndexFormat = "paratrain-sharded-checkpoint/1";
inline constexpr const char* kIndexFileName = "index.json";

// Elements [offset, offset + numel) of a global tensor, stored as the 1-D
// tensor `key` of `file` (a name inside the checkpoint directory).
struct ChunkRef {
  std::string file;
  std::string key;
  int64_t offset = 0;
  int64_t numel = 0;
};

struct IndexTensor {
  at::ScalarType dtype = at::kFloat;
  std::vector<int64_t> shape;
  std::vector<ChunkRef> chunks;  // sorted by offset, tiling [0, numel(shape))
};

struct IndexFile {
  int rank = 0;
  std::string name;                // "rank_3.safetensors"
  uint64_t bytes = 0;              // exact size: a shorter file is truncated
  std::optional<uint32_t> crc32;   // of the whole file; nullopt for a single-file checkpoint read as one shard
};

struct CheckpointIndex {
  int world_size = 0;
  std::vector<IndexFile> files;  // by rank
  std::map<std::string, IndexTensor> tensors;
  std::map<std::string, std::string> metadata;  // training metadata, as in the single-file format

  const IndexFile* find_file(const std::string& name) const;
};

int64_t numel_of(const std::vector<int64_t>& shape);

nlohmann::json index_to_json(const CheckpointIndex& index);

// Parses and validates: structure and types, known dtypes, every chunk's file
// listed, chunks tiling each tensor (no gap, no overlap, nothing past the
// end). `where` names the index in errors (CheckpointError).
CheckpointIndex index_from_json(const nlohmann::json& j, const std::string& where);

// Reads <dir>/index.json; CheckpointError naming it when absent (an
// interrupted write) or invalid. Checks nothing in the rank files.
CheckpointIndex read_index(const std::filesystem::path& dir);

// Every file the index lists exists in `dir` with its recorded size (cheap:
// no data read); CheckpointError naming the first that does not.
void check_shard_files(const std::filesystem::path& dir, const CheckpointIndex& index);

// Reads global tensors out of a checkpoint directory, or out of a single-file
// checkpoint seen as a one-rank directory. Construction checks that every
// listed file exists with its size; each file is checked once when first
// needed (its checksum against the index, in one pass that keeps nothing:
// safetensors_file.h), and each range is read from the file when asked, so
// a reader holds what it was asked for, not the files.
// How many shard files a ShardedReader keeps open at most (default 32;
// Note [Open shard files] in checkpoint_index.cpp). Process-wide; for tests
// and tools that run under a low descriptor limit. n >= 1.
void set_max_open_shard_files(std::size_t n);

class ShardedReader {
 public:
  explicit ShardedReader(const std::filesystem::path& checkpoint);

  const CheckpointIndex& index() const { return index_; }
  // How errors name this checkpoint: the directory (or file) path.
  const std::string& where() const { return where_; }
  // The tensor's index entry; CheckpointError if the checkpoint lacks it.
  const IndexTensor& tensor(const std::string& name) const;
  // Elements [begin, begin + numel) of the flattened global tensor, 1-D.
  at::Tensor read_range(const std::string& name, int64_t begin, int64_t numel);
  // The whole tensor in its global shape.
  at::Tensor read_whole(const std::string& name);

 private:
  const SafetensorsFile& open(const std::string& file);
  // Elements [lo, lo + numel) of `chunk` (relative to the chunk's start).
  at::Tensor chunk_data(const std::string& tensor, const ChunkRef& chunk, int64_t lo, int64_t numel);

  std::filesystem::path dir_;
  std::string where_;
  CheckpointIndex index_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // verified files by name
  std::list<std::string> open_;  // files_ whose descriptor is open, least recently used first
};

}  // namespace paratrain::checkpoint
