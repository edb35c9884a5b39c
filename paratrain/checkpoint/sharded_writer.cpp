// save_sharded_checkpoint: each rank writes its chunks, rank 0 gathers the
// chunk lists and commits index.json. Reading and the whole-directory tools
// are in sharded_reader.cpp; the index format in checkpoint_index.h.
//
// A save is two halves: prepare_sharded_checkpoint takes this rank's part
// (the tensor list, optionally copied, and rank 0's metadata) on the training
// thread; write_prepared_checkpoint runs the protocol below, on the training
// thread (save_sharded_checkpoint) or on async_saver.h's background thread.
//
// Protocol (every step is collective, so no rank can be left waiting):
//   1. rank 0 clears <dir>; all learn whether that worked (all_reduce MAX).
//   2. each rank writes rank_<r>.safetensors (fsynced) and computes its CRC-32;
//      a failure is recorded, not thrown.
//   3. all_gather of each rank's report (JSON: its file, declared tensors,
//      chunks, or its error): lengths first, then the padded bytes.
//   4. rank 0 builds the index, validates it like a reader would, and writes
//      index.json atomically; all learn the outcome (all_reduce MAX).
#include "paratrain/checkpoint/sharded.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cstring>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/remove_tree.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/checkpoint_metadata.h"
#include "paratrain/checkpoint/checksum.h"
#include "paratrain/checkpoint/optimizer_state.h"
#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::checkpoint {
namespace {

// What one rank contributes: its file and the global tensors it knows of.
struct RankReport {
  SafetensorsContents contents;                       // the rank file
  nlohmann::json declared = nlohmann::json::object();  // name -> {dtype, shape}
  nlohmann::json chunks = nlohmann::json::array();     // [{tensor, key, offset, numel}]
};

std::string shape_str(const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

// Declares `name` (every rank holding a piece does, so rank 0 can tell a tensor
// nobody wrote from one that does not exist) and, when `write`, adds one chunk
// per run of the slot.
// With `copy`, the chunks are copies taken now, not views of `local`.
void add_piece(RankReport& r, const std::string& name, const std::vector<int64_t>& global_shape,
               const std::vector<SlotSegment>& runs, const at::Tensor& local, bool write, bool copy) {
  const auto dtype = safetensors_dtype_name(local.scalar_type());
  TORCH_CHECK(dtype.has_value(), "save_sharded_checkpoint: tensor '", name, "' has dtype ", local.scalar_type(),
              ", which safetensors cannot store");
  const int64_t numel = numel_of(global_shape);
  int64_t covered = 0;
  for (const SlotSegment& run : runs) {
    TORCH_CHECK(run.global_offset >= 0 && run.global_offset + run.numel <= numel && run.local_offset >= 0 &&
                    run.local_offset + run.numel <= local.numel(),
                "save_sharded_checkpoint: slot of '", name, "' maps local elements [", run.local_offset, ", ",
                run.local_offset + run.numel, ") of ", local.numel(), " to [", run.global_offset, ", ",
                run.global_offset + run.numel, ") but the global shape ", shape_str(global_shape), " has ", numel);
    covered += run.numel;
  }
  TORCH_CHECK(covered == local.numel(), "save_sharded_checkpoint: the runs of the slot of '", name, "' cover ",
              covered, " elements, its tensor has ", local.numel());
  r.declared[name] = {{"dtype", *dtype}, {"shape", global_shape}};
  if (!write || local.numel() == 0) return;
  const at::Tensor flat = local.detach().reshape(-1);
  for (const SlotSegment& run : runs) {
    if (run.numel == 0) continue;
    const std::string key = fmt::format("{}@{}", name, run.global_offset);
    at::Tensor chunk = flat.narrow(0, run.local_offset, run.numel);
    r.contents.tensors.emplace(key, copy ? chunk.clone() : chunk);
    r.chunks.push_back({{"tensor", name}, {"key", key}, {"offset", run.global_offset}, {"numel", run.numel}});
  }
}

// Scalar optimizer state (Adam's step) is one value per parameter: the rank
// holding global element 0 writes it (an empty slot holds no element 0).
bool holds_first_element(const TensorSlot& slot) {
  if (numel_of(slot.global_shape) == 0) return true;
  for (const SlotSegment& run : slot_segments(slot)) {
    if (run.global_offset == 0 && run.numel > 0) return true;
  }
  return false;
}

RankReport build_report(const CheckpointContents& c, int rank, const std::string& where, bool copy) {
  RankReport r;
  for (const TensorSlot& s : c.model)
    add_piece(r, std::string(kModelPrefix) + s.name, s.global_shape, slot_segments(s), s.local, s.write, copy);
  if (c.optimizer != nullptr) {
    const OptimizerStateIo& io = optimizer_state_io(*c.optimizer, where);
    for (const OptimizerSlot& os : c.optimizer_slots) {
      TORCH_CHECK(os.param.numel() == os.slot.local.numel(), "save_sharded_checkpoint: optimizer slot '",
                  os.slot.name, "' has a param of ", os.param.numel(), " elements but a slot of ",
                  os.slot.local.numel());
      auto it = c.optimizer->state().find(optimizer_state_key(os.param));
      if (it == c.optimizer->state().end()) continue;  // not stepped yet
      for (auto& [field, t] : io.save(*it->second)) {
        const std::string name = fmt::format("{}{}/{}", kOptimizerPrefix, os.slot.name, field);
        if (io.is_scalar_field(field)) {
          // One value per parameter: the rank writing element 0 writes it (an
          // empty slot at offset 0 holds no element 0).
          add_piece(r, name, t.sizes().vec(), {SlotSegment{0, 0, t.numel()}}, t,
                    os.slot.write && holds_first_element(os.slot), copy);
        } else {
          TORCH_CHECK(t.numel() == os.param.numel(), "save_sharded_checkpoint: optimizer state '", name, "' has ",
                      t.numel(), " elements, its param ", os.param.numel());
          add_piece(r, name, os.slot.global_shape, slot_segments(os.slot), t, os.slot.write, copy);
        }
      }
    }
  }
  for (const TensorSlot& s : c.strategy_state)
    add_piece(r, std::string(kStatePrefix) + s.name, s.global_shape, slot_segments(s), s.local, s.write, copy);
  if (c.save_rng && rank == 0) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    const at::Tensor state = gen.get_state();
    // get_state() is already a copy.
    add_piece(r, std::string(kRngKey), state.sizes().vec(), {SlotSegment{0, 0, state.numel()}}, state, true,
              false);
  }
  return r;
}

// True on every rank if `failed` on any.
bool any_rank(comm::ProcessGroup& group, bool failed) {
  at::Tensor flag = at::full({1}, failed ? 1 : 0, at::kInt);
  group.all_reduce(flag, comm::ReduceOp::kMax)->wait();
  return flag.item<int>() != 0;
}

std::vector<nlohmann::json> all_gather_json(comm::ProcessGroup& group, const nlohmann::json& mine) {
  const std::string text = mine.dump();
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  at::Tensor lengths = at::empty({group.size()}, at::kLong);
  group.all_gather(lengths, length)->wait();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor padded = at::zeros({longest}, at::kByte);
  std::memcpy(padded.data_ptr(), text.data(), text.size());
  at::Tensor all = at::empty({group.size() * longest}, at::kByte);
  group.all_gather(all, padded)->wait();
  std::vector<nlohmann::json> out;
  for (int r = 0; r < group.size(); ++r) {
    const char* p = static_cast<const char*>(all.data_ptr()) + r * longest;
    out.push_back(nlohmann::json::parse(std::string(p, static_cast<size_t>(lengths[r].item<int64_t>()))));
  }
  return out;
}

// Rank 0: merges the reports into an index; throws CheckpointError on
// disagreement or incomplete coverage (via index_from_json's checks).
CheckpointIndex build_index(const std::vector<nlohmann::json>& reports,
                            const std::map<std::string, std::string>& metadata, const std::string& where) {
  nlohmann::json tensors = nlohmann::json::object();
  nlohmann::json files = nlohmann::json::array();
  for (size_t rank = 0; rank < reports.size(); ++rank) {
    const auto& rep = reports[rank];
    files.push_back(rep["file"]);
    for (const auto& [name, d] : rep["declared"].items()) {
      if (!tensors.contains(name)) tensors[name] = {{"dtype", d["dtype"]}, {"shape", d["shape"]}, {"chunks", nlohmann::json::array()}, {"by", rank}};
      const auto& t = tensors[name];
      if (t["dtype"] != d["dtype"] || t["shape"] != d["shape"])
        throw CheckpointError(fmt::format("cannot save checkpoint '{}': ranks disagree on tensor '{}': rank {} has {} "
                                          "{}, rank {} has {} {}",
                                          where, name, t["by"].get<size_t>(), t["dtype"].get<std::string>(),
                                          t["shape"].dump(), rank, d["dtype"].get<std::string>(), d["shape"].dump()));
    }
    for (const auto& ch : rep["chunks"])
      tensors[ch["tensor"].get<std::string>()]["chunks"].push_back(
          {{"file", rep["file"]["file"]}, {"key", ch["key"]}, {"offset", ch["offset"]}, {"numel", ch["numel"]}});
  }
  for (auto it = tensors.begin(); it != tensors.end(); ++it) it->erase("by");
  CheckpointIndex draft;
  draft.world_size = static_cast<int>(reports.size());
  draft.metadata = metadata;
  nlohmann::json j = index_to_json(draft);
  j["files"] = files;
  j["tensors"] = tensors;
  // The reader's own validation: what we commit is what a resume accepts.
  return index_from_json(j, (std::filesystem::path(where) / kIndexFileName).string());
}

}  // namespace

struct PreparedShard {
  int rank = 0;
  RankReport report;
  // Rank 0's index metadata, taken with the tensors (the optimizer's options
  // may change before a background write commits).
  std::map<std::string, std::string> metadata;
  // What went wrong preparing; reported collectively by the write.
  std::string error;
};

std::shared_ptr<PreparedShard> prepare_sharded_checkpoint(const std::filesystem::path& dir,
                                                          const CheckpointContents& contents, int rank, bool copy) {
  auto shard = std::make_shared<PreparedShard>();
  shard->rank = rank;
  const std::string where = dir.string();
  try {
    shard->report = build_report(contents, rank, where, copy);
    if (rank == 0) {
      const OptimizerStateIo* io = contents.optimizer ? &optimizer_state_io(*contents.optimizer, where) : nullptr;
      shard->metadata = training_metadata(contents.state, io, contents.optimizer);
    }
  } catch (const std::exception& e) {
    shard->error = e.what();
  }
  return shard;
}

void save_sharded_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group,
                             const CheckpointContents& contents, const ShardedSaveOptions& options) {
  write_prepared_checkpoint(dir, group, *prepare_sharded_checkpoint(dir, contents, group.rank(), false), options);
}

void write_prepared_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group,
                               const PreparedShard& shard, const ShardedSaveOptions& options) {
  const int rank = group.rank();
  TORCH_CHECK(shard.rank == rank, "write_prepared_checkpoint: the shard was prepared for rank ", shard.rank,
              " but this is rank ", rank);
  const std::string where = dir.string();
  std::string error;
  // 1. A fresh directory; the index goes first so a crash from here on
  //    leaves an uncommitted directory, never a mix of old and new shards.
  if (rank == 0) {
    try {
      std::error_code ec;
      std::filesystem::remove(dir / kIndexFileName, ec);
      core::remove_tree(dir, ec);
      std::filesystem::create_directories(dir);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (any_rank(group, !error.empty()))
    throw CheckpointError(fmt::format("cannot save checkpoint '{}': rank 0 could not create the directory{}", where,
                                      error.empty() ? " (see rank 0's error)" : ": " + error));

  // 2. This rank's file.
  const std::string file = fmt::format("rank_{}.safetensors", rank);
  nlohmann::json report;
  try {
    std::filesystem::create_directories(dir);  // no-op on a shared file system
    if (!shard.error.empty()) throw std::runtime_error(shard.error);
    RankReport r = shard.report;  // shares the tensors; only the metadata below is added
    r.contents.metadata = {{"format", "paratrain-shard/1"},
                           {"rank", std::to_string(rank)},
                           {"world_size", std::to_string(group.size())}};
    SafetensorsWriteOptions write;
    write.sync = options.sync;
    write.after_write = options.after_write;
    write_safetensors(dir / file, r.contents, write);
    report = {{"file",
               {{"rank", rank},
                {"file", file},
                {"bytes", std::filesystem::file_size(dir / file)},
                {"crc32", crc32_hex(file_crc32(dir / file))}}},
              {"declared", r.declared},
              {"chunks", r.chunks}};
  } catch (const std::exception& e) {
    report = {{"error", fmt::format("rank {}: {}", rank, e.what())}};
  }

  // 3. Everyone learns everyone's report.
  const std::vector<nlohmann::json> reports = all_gather_json(group, report);
  std::vector<std::string> errors;
  for (const auto& r : reports)
    if (r.contains("error")) errors.push_back(r["error"].get<std::string>());
  if (!errors.empty())
    throw CheckpointError(fmt::format("cannot save checkpoint '{}' (no index written, it will not be resumed "
                                      "from): {}",
                                      where, fmt::join(errors, "; ")));

  // 4. Commit.
  if (rank == 0) {
    try {
      const CheckpointIndex index = build_index(reports, shard.metadata, where);
      write_file_atomically(dir / kIndexFileName, index_to_json(index).dump(1), options.sync);
    } catch (const std::exception& e) {
      error = fmt::format("cannot save checkpoint '{}' (no index written): {}", where, e.what());
    }
  }
  if (any_rank(group, !error.empty()))
    throw CheckpointError(error.empty()
                              ? fmt::format("cannot save checkpoint '{}': rank 0 could not commit index.json (see "
                                            "rank 0's error)",
                                            where)
                              : error);
}

}  // namespace paratrain::checkpoint
