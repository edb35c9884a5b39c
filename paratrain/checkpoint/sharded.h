// Sharded checkpoints: every rank saves the pieces of global tensors it holds
// (paratrain::TensorSlot) and any layout loads them back: 4 ranks of ZeRO-3
// resume as 2 ranks of ZeRO-1 or as one process. Also the whole-directory
// tools behind `paratrain checkpoint consolidate|inspect`. Not here: where
// checkpoints live in a run folder (checkpoint_files.h), what a strategy holds
// (the strategies build the slots).
//
// Note [Sharded checkpoint layout]
// <dir>/rank_<r>.safetensors  one per rank: 1-D chunks named
//                             "<global name>@<flat offset>", e.g.
//                             "model/fc0.weight@96", in row-major flat order
//                             of the global tensor.
// <dir>/index.json            written last, atomically: its presence is the
//                             commit marker. Per global tensor: dtype, shape,
//                             chunks [{file, key, offset, numel}] tiling it
//                             exactly; per file: rank, bytes, crc32; world
//                             size; the training metadata (the same keys as
//                             the single-file format: format, step, epoch,
//                             config, optimizer, extra.*, ...).
// Global names are those of the single-file format: model/<param or buffer>,
// optimizer/<param>/<field>, rng/cpu, and state/<name> for what strategies
// carry between steps besides (a comm hook's: PowerSGD's error feedback). Element-wise optimizer state
// (momentum_buffer, exp_avg, ...) is cut like its parameter; scalar state
// (Adam's step) is stored once, whole.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include "paratrain/core/tensor_slot.h"
#include "paratrain/checkpoint/checkpoint.h"

namespace paratrain::comm {
class ProcessGroup;
}

namespace paratrain::checkpoint {

// One tensor the optimizer steps, and which global parameter elements it is.
struct OptimizerSlot {
  // The optimizer's own param handle: its state is
  // optimizer.state()[optimizer_state_key(param)]. param.numel() ==
  // slot.local.numel(); any shape (a flat ZeRO shard is 1-D).
  at::Tensor param;
  // name = parameter name (no prefix), global_shape = the parameter's shape,
  // flat_offset; write as for model slots (replicas: one rank writes).
  TensorSlot slot;
};

struct CheckpointContents {
  // Parameters and buffers, saved as "model/<name>".
  std::vector<TensorSlot> model;
  // Optional: without it no optimizer state is saved or loaded.
  torch::optim::Optimizer* optimizer = nullptr;
  std::vector<OptimizerSlot> optimizer_slots;
  // Other state a strategy carries between steps, saved as "state/<name>"
  // (Strategy::state_slots). Optional on load: a slot the checkpoint lacks,
  // or holds at another shape or dtype (saved at another world size), is
  // left as it is and named in the returned TrainingState::missing_state.
  std::vector<TensorSlot> strategy_state;
  // step, epoch, batch_in_epoch, sampler_seed, config, extra: rank 0's is
  // written to the index (save) / filled from it (load returns it).
  TrainingState state;
  // Save rank 0's default CPU generator as the replicated "rng/cpu".
  bool save_rng = true;
};

struct ShardedSaveOptions {
  // fsync each rank file, index.json and the directory. Off only for scratch
  // checkpoints: without it a power loss can leave a committed index over
  // empty files.
  bool sync = true;
  // Test hook, passed to every rank file's write (see
  // SafetensorsWriteOptions::after_write): a throw there behaves like a crash
  // of that rank mid-write.
  std::function<void(std::string_view written_so_far)> after_write;
};

// Collective over `group`: every member calls it with its own slots. Each rank
// writes <dir>/rank_<r>.safetensors with its slots that have write == true;
// the chunk lists and file checksums reach rank 0, which checks that the
// chunks tile every tensor exactly and writes <dir>/index.json last. An
// existing <dir> is replaced (its index removed first). Every rank returns
// normally or every rank throws CheckpointError (naming the failing rank's
// error when it is known), so a failed save cannot hang the group; a crash
// before index.json leaves a directory that find_latest_checkpoint ignores.
// Assumes <dir> is on a file system every rank sees (shared across nodes).
void save_sharded_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group,
                             const CheckpointContents& contents, const ShardedSaveOptions& options = {});

// The two halves of save_sharded_checkpoint, for saving in the background
// (async_saver.h). prepare_sharded_checkpoint is not collective: it takes
// this rank's part of `contents` now (with `copy`, copies of the tensors, so
// training may change them as soon as it returns; without, views) and rank
// 0's index metadata; an error is kept for the write to report.
// write_prepared_checkpoint is the collective protocol, with the same
// guarantees as save_sharded_checkpoint; it may run on another thread than
// the training's, on a group no other thread uses at the same time.
struct PreparedShard;
std::shared_ptr<PreparedShard> prepare_sharded_checkpoint(const std::filesystem::path& dir,
                                                          const CheckpointContents& contents, int rank, bool copy);
void write_prepared_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group,
                               const PreparedShard& shard, const ShardedSaveOptions& options = {});

// Not collective: each rank reads what it needs. Fills every model slot's
// local in place (copy_) from the chunks covering its runs of its global
// tensor ([flat_offset, flat_offset + numel), or its segments), written or not; rebuilds the optimizer state of
// every OptimizerSlot (element-wise fields by range, scalar fields whole) and
// drops state of params not listed; restores the RNG if saved and
// options.restore_rng. Everything is read and validated (file sizes and
// checksums, shapes, dtypes, coverage, optimizer kind) before anything is
// changed. Throws CheckpointError naming the file or tensor. `checkpoint` may
// also be a single-file checkpoint (save_checkpoint's or a consolidated one).
TrainingState load_sharded_checkpoint(const std::filesystem::path& checkpoint, const CheckpointContents& contents,
                                      const LoadCheckpointOptions& options = {});

// Writes one plain safetensors file with whole tensors under the same names
// and metadata as save_checkpoint, so load_checkpoint / load_model_weights and
// Python's safetensors read it. Verifies every shard first. Refuses (before
// reading anything) an `out_file` that is `dir` or inside it. Tensors holding
// NaN or inf are copied as they are, each logged as a warning; returns their
// names (Note [Non-finite checkpoints] in sharded_reader.cpp).
std::vector<std::string> consolidate_checkpoint(const std::filesystem::path& dir,
                                                const std::filesystem::path& out_file);

// Human-readable layout for `paratrain checkpoint inspect`: format, step,
// world size, each file's size and checksum, each tensor's dtype, shape and
// chunks. Reads only the index (and for a single file, the file).
std::string describe_checkpoint(const std::filesystem::path& checkpoint);

// Reads every file of the checkpoint and compares it with the size and
// checksum its index records (a single file: its own data checksum). Returns
// one line per damaged file, empty when all are sound; throws CheckpointError
// when the index itself (or a single file) is unreadable or invalid.
std::vector<std::string> verify_checkpoint_files(const std::filesystem::path& checkpoint);

}  // namespace paratrain::checkpoint
