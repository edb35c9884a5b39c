// index.json (to and from JSON, with every field validated, since a resume
// trusts it to say where each element is) and ShardedReader's range reads.
// Writing the index and the rank files is sharded_writer.cpp's job.
#include "paratrain/checkpoint/checkpoint_index.h"

#include <atomic>

#include <torch/torch.h>

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/checkpoint/checksum.h"

namespace paratrain::checkpoint {
namespace {

[[noreturn]] void bad_index(const std::string& where, const std::string& what) {
  throw CheckpointError(fmt::format("checkpoint index '{}' is invalid: {}", where, what));
}

int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where, const std::string& what) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_number_integer() || j[key].get<int64_t>() < 0)
    bad_index(where, fmt::format("{}: '{}' must be a non-negative integer", what, key));
  return j[key].get<int64_t>();
}

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where, const std::string& what) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string())
    bad_index(where, fmt::format("{}: '{}' must be a string", what, key));
  return j[key].get<std::string>();
}

// Chunks sorted by offset must tile [0, numel) exactly: a gap means elements
// nobody saved, an overlap two ranks disagreeing about who owns them.
void check_coverage(const std::string& name, IndexTensor& t, const std::string& where) {
  std::sort(t.chunks.begin(), t.chunks.end(), [](const ChunkRef& a, const ChunkRef& b) { return a.offset < b.offset; });
  const int64_t numel = numel_of(t.shape);
  int64_t covered = 0;
  for (const ChunkRef& c : t.chunks) {
    if (c.offset != covered)
      bad_index(where, fmt::format("tensor '{}': chunk '{}' in '{}' starts at element {} but the chunks before it "
                                   "end at {} ({}); the checkpoint does not cover this tensor exactly",
                                   name, c.key, c.file, c.offset, covered, c.offset > covered ? "a gap" : "an overlap"));
    covered += c.numel;
  }
  if (covered != numel)
    bad_index(where, fmt::format("tensor '{}' of shape [{}] has {} elements but its chunks cover {}", name,
                                 fmt::join(t.shape, ", "), numel, covered));
}

}  // namespace

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const IndexFile* CheckpointIndex::find_file(const std::string& name) const {
  for (const IndexFile& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

nlohmann::json index_to_json(const CheckpointIndex& index) {
  nlohmann::json files = nlohmann::json::array();
  for (const IndexFile& f : index.files) {
    nlohmann::json e = {{"rank", f.rank}, {"file", f.name}, {"bytes", f.bytes}};
    if (f.crc32) e["crc32"] = crc32_hex(*f.crc32);
    files.push_back(std::move(e));
  }
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, t] : index.tensors) {
    nlohmann::json chunks = nlohmann::json::array();
    for (const ChunkRef& c : t.chunks)
      chunks.push_back({{"file", c.file}, {"key", c.key}, {"offset", c.offset}, {"numel", c.numel}});
    tensors[name] = {{"dtype", safetensors_dtype_name(t.dtype).value_or("?")}, {"shape", t.shape}, {"chunks", chunks}};
  }
  return {{"format", kIndexFormat}, {"checksum", kChecksumAlgorithm}, {"world_size", index.world_size},
          {"files", files}, {"tensors", tensors}, {"metadata", index.metadata}};
}

CheckpointIndex index_from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) bad_index(where, "not a JSON object");
  if (get_string(j, "format", where, "the index") != kIndexFormat)
    bad_index(where, fmt::format("format is '{}', this build reads '{}'", j["format"].get<std::string>(), kIndexFormat));
  if (get_string(j, "checksum", where, "the index") != kChecksumAlgorithm)
    bad_index(where, fmt::format("checksum algorithm '{}' is unknown (expected '{}')", j["checksum"].get<std::string>(),
                                 kChecksumAlgorithm));
  CheckpointIndex index;
  index.world_size = static_cast<int>(get_int(j, "world_size", where, "the index"));
  if (!j.contains("files") || !j["files"].is_array()) bad_index(where, "'files' must be an array");
  for (const auto& f : j["files"]) {
    IndexFile file;
    file.rank = static_cast<int>(get_int(f, "rank", where, "a files entry"));
    file.name = get_string(f, "file", where, "a files entry");
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name.starts_with("."))
      bad_index(where, fmt::format("file name '{}' must be a plain name inside the checkpoint directory", file.name));
    file.bytes = static_cast<uint64_t>(get_int(f, "bytes", where, "file '" + file.name + "'"));
    uint32_t crc = 0;
    if (!parse_crc32_hex(get_string(f, "crc32", where, "file '" + file.name + "'"), crc))
      bad_index(where, fmt::format("file '{}': crc32 must be 8 hex digits", file.name));
    file.crc32 = crc;
    if (index.find_file(file.name)) bad_index(where, fmt::format("file '{}' is listed twice", file.name));
    index.files.push_back(std::move(file));
  }
  if (!j.contains("tensors") || !j["tensors"].is_object()) bad_index(where, "'tensors' must be an object");
  for (const auto& [name, v] : j["tensors"].items()) {
    const std::string what = fmt::format("tensor '{}'", name);
    IndexTensor t;
    const auto dtype = safetensors_dtype(get_string(v, "dtype", where, what));
    if (!dtype) bad_index(where, fmt::format("{}: unknown dtype '{}'", what, v["dtype"].get<std::string>()));
    t.dtype = *dtype;
    if (!v.contains("shape") || !v["shape"].is_array()) bad_index(where, what + ": 'shape' must be an array");
    for (const auto& d : v["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > (int64_t(1) << 40))
        bad_index(where, fmt::format("{}: bad shape {}", what, v["shape"].dump()));
      t.shape.push_back(d.get<int64_t>());
    }
    if (!v.contains("chunks") || !v["chunks"].is_array()) bad_index(where, what + ": 'chunks' must be an array");
    for (const auto& c : v["chunks"]) {
      ChunkRef chunk{get_string(c, "file", where, what), get_string(c, "key", where, what),
                     get_int(c, "offset", where, what), get_int(c, "numel", where, what)};
      if (!index.find_file(chunk.file))
        bad_index(where, fmt::format("{}: chunk '{}' is in file '{}', which 'files' does not list", what, chunk.key,
                                     chunk.file));
      t.chunks.push_back(std::move(chunk));
    }
    check_coverage(name, t, where);
    index.tensors.emplace(name, std::move(t));
  }
  if (!j.contains("metadata") || !j["metadata"].is_object()) bad_index(where, "'metadata' must be an object");
  for (const auto& [k, v] : j["metadata"].items()) {
    if (!v.is_string()) bad_index(where, fmt::format("metadata '{}' must be a string", k));
    index.metadata.emplace(k, v.get<std::string>());
  }
  return index;
}

CheckpointIndex read_index(const std::filesystem::path& dir) {
  const auto path = dir / kIndexFileName;
  // Not allowed to look is not "no index" (Note [Unreadable is not damaged]).
  check_checkpoint_readable(dir);
  check_checkpoint_readable(path);
  std::ifstream in(path);
  if (!in) {
    std::error_code ec;
    const bool there = std::filesystem::exists(path, ec);
    throw CheckpointError(fmt::format("checkpoint '{}' has no readable {} (an interrupted save leaves none): {}",
                                      dir.string(), kIndexFileName,
                                      there ? "cannot open it" : (ec ? ec.message() : "no such file")));
  }
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    bad_index(path.string(), fmt::format("not valid JSON: {}", e.what()));
  }
  return index_from_json(j, path.string());
}

void check_shard_files(const std::filesystem::path& dir, const CheckpointIndex& index) {
  for (const IndexFile& f : index.files) {
    const auto path = dir / f.name;
    std::error_code ec;
    const auto size = std::filesystem::file_size(path, ec);
    if (ec && is_permission_error(ec)) throw checkpoint_access_error(path, ec);
    if (!ec) check_checkpoint_readable(path);
    if (ec)
      throw CheckpointError(fmt::format("checkpoint '{}': shard '{}' (rank {}) is missing or unreadable: {}",
                                        dir.string(), path.string(), f.rank, ec.message()));
    if (size != f.bytes)
      throw CheckpointError(fmt::format("checkpoint '{}': shard '{}' has {} bytes but the index records {} ({}); the "
                                        "checkpoint is damaged, resume from another one",
                                        dir.string(), path.string(), size, f.bytes,
                                        size < f.bytes ? "truncated" : "extra bytes"));
  }
}

ShardedReader::ShardedReader(const std::filesystem::path& checkpoint) : where_(checkpoint.string()) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(checkpoint, ec);
  if (ec && is_permission_error(ec)) throw checkpoint_access_error(checkpoint, ec);
  if (is_dir) {
    dir_ = checkpoint;
    index_ = read_index(checkpoint);
    check_shard_files(dir_, index_);
    return;
  }
  // A single-file checkpoint (today's save_checkpoint, or a consolidated one)
  // is a one-rank checkpoint whose chunks are whole tensors; its own
  // data_crc32 stands in for the index checksum.
  dir_ = checkpoint.parent_path();
  const std::string name = checkpoint.filename().string();
  check_checkpoint_readable(checkpoint);
  auto file = std::make_unique<SafetensorsFile>(checkpoint);
  index_.world_size = 1;
  index_.files.push_back({0, name, file->size(), std::nullopt});
  for (const auto& [key, e] : file->tensors())
    index_.tensors.emplace(key, IndexTensor{e.dtype, e.shape, {{name, key, 0, numel_of(e.shape)}}});
  index_.metadata = file->metadata();
  index_.metadata.erase(kDataChecksumKey);
  files_.emplace(name, std::move(file));
}

const IndexTensor& ShardedReader::tensor(const std::string& name) const {
  auto it = index_.tensors.find(name);
  if (it == index_.tensors.end())
    throw CheckpointError(fmt::format("checkpoint '{}' has no tensor '{}'", where_, name));
  return it->second;
}

at::Tensor ShardedReader::read_range(const std::string& name, int64_t begin, int64_t numel) {
  const IndexTensor& t = tensor(name);
  TORCH_CHECK(begin >= 0 && numel >= 0 && begin + numel <= numel_of(t.shape), "read_range: elements [", begin, ", ",
              begin + numel, ") are outside tensor '", name, "' of ", numel_of(t.shape), " elements");
  std::vector<at::Tensor> pieces;
  const int64_t end = begin + numel;
  // Chunks tile the tensor in offset order (checked when the index was read).
  for (const ChunkRef& c : t.chunks) {
    const int64_t lo = std::max(begin, c.offset), hi = std::min(end, c.offset + c.numel);
    if (lo >= hi) continue;
    pieces.push_back(chunk_data(name, c, lo - c.offset, hi - lo));
  }
  if (pieces.empty()) return at::empty({0}, at::TensorOptions().dtype(t.dtype));
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces);
}

at::Tensor ShardedReader::read_whole(const std::string& name) {
  const IndexTensor& t = tensor(name);
  return read_range(name, 0, numel_of(t.shape)).reshape(t.shape);
}

// Note [Open shard files]
// A checkpoint of N ranks has N shard files, and consolidating it, or
// resuming at another world size, reads from many of them. Keeping each open
// once verified would hold N descriptors: past 1024 ranks that is over the
// usual per-process limit (ulimit -n), and the read would fail with "Too
// many open files" at the largest jobs only. So at most kMaxOpenShards stay
// open, the least recently used closed first; a closed file keeps its
// verified header and is reopened (checked against its verified size) when
// next read. Checkpoint files are written once and never rewritten in place.
// Reading from N files in turn (consolidation reads each tensor from every
// file that holds part of it) reopens each file per tensor when N is over
// the cap: an open(2) and an fstat(2) per chunk, cheap beside the read.
namespace {
std::atomic<std::size_t> max_open_shards{32};
}

void set_max_open_shard_files(std::size_t n) {
  TORCH_CHECK(n >= 1, "set_max_open_shard_files: n must be >= 1");
  max_open_shards.store(n);
}

const SafetensorsFile& ShardedReader::open(const std::string& file) {
  // open_: most recently used last; the oldest closes to make room.
  auto make_room = [this] {
    while (open_.size() >= max_open_shards.load()) {
      files_.at(open_.front())->close();
      open_.pop_front();
    }
  };
  if (auto it = files_.find(file); it != files_.end()) {
    open_.remove(file);
    if (!it->second->is_open()) make_room();  // read() reopens it
    open_.push_back(file);
    return *it->second;
  }
  make_room();
  const IndexFile* entry = index_.find_file(file);
  TORCH_INTERNAL_ASSERT(entry != nullptr, "index_from_json checks that chunk files are listed");
  const auto path = dir_ / file;
  check_checkpoint_readable(path);
  std::error_code ec;
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size != entry->bytes)
    throw CheckpointError(fmt::format("checkpoint '{}': cannot read shard '{}' ({} of {} bytes)", where_,
                                      path.string(), ec ? 0 : size, entry->bytes));
  auto check = [&](uint32_t crc) {
    if (entry->crc32 && crc != *entry->crc32)
      throw CheckpointError(fmt::format("checkpoint '{}': shard '{}' fails its checksum ({} {} in the index, {} "
                                        "computed): the file is corrupt; resume from another checkpoint",
                                        where_, path.string(), kChecksumAlgorithm, crc32_hex(*entry->crc32),
                                        crc32_hex(crc)));
  };
  const SafetensorsFile& opened = *files_.emplace(file, std::make_unique<SafetensorsFile>(path, check)).first->second;
  open_.push_back(file);
  return opened;
}

at::Tensor ShardedReader::chunk_data(const std::string& tensor_name, const ChunkRef& chunk, int64_t lo,
                                     int64_t numel) {
  const SafetensorsFile& contents = open(chunk.file);
  const std::string file = (dir_ / chunk.file).string();
  auto it = contents.tensors().find(chunk.key);
  if (it == contents.tensors().end())
    throw CheckpointError(fmt::format("checkpoint '{}': the index says shard '{}' holds '{}' (part of tensor '{}') "
                                      "but the file has no such tensor: index and shard do not match",
                                      where_, file, chunk.key, tensor_name));
  const SafetensorsEntry& t = it->second;
  const IndexTensor& entry = index_.tensors.at(tensor_name);
  if (numel_of(t.shape) != chunk.numel || t.dtype != entry.dtype)
    throw CheckpointError(fmt::format("checkpoint '{}': '{}' in shard '{}' is {} with {} elements but the index "
                                      "says {} with {}: index and shard do not match",
                                      where_, chunk.key, file, c10::toString(t.dtype), numel_of(t.shape),
                                      c10::toString(entry.dtype), chunk.numel));
  return contents.read(chunk.key, lo, numel);
}

}  // namespace paratrain::checkpoint
