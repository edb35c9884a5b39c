// Checkpoints written in the background (train.async_checkpoint): the
// training thread copies its part of the state and goes on; a thread writes
// the rank files and commits index.json, over a process group of its own so
// its collectives never interleave with the training's. Still atomic: the
// index is written last, and a crash mid-write leaves a directory no resume
// picks. At most one save is in flight: the next one (or wait) waits for it,
// which bounds the memory the copies take to one checkpoint.
#pragma once

#include <filesystem>
#include <future>
#include <memory>
#include <optional>

#include "paratrain/checkpoint/sharded.h"

namespace paratrain::checkpoint {

class AsyncCheckpointSaver {
 public:
  // Collective over `world` (builds the saver's group: world.new_subgroup of
  // every rank), so every rank constructs it at the same point.
  explicit AsyncCheckpointSaver(comm::ProcessGroup& world);
  // Waits for the save in flight; logs its error, which nobody can catch now.
  ~AsyncCheckpointSaver();
  AsyncCheckpointSaver(const AsyncCheckpointSaver&) = delete;
  AsyncCheckpointSaver& operator=(const AsyncCheckpointSaver&) = delete;

  // Collective (every rank saves the same checkpoints in the same order).
  // Waits for the previous save and rethrows its CheckpointError (on every
  // rank, as save_sharded_checkpoint does); then copies this rank's part of
  // `contents` and returns. The write and commit run in the background.
  void save(const std::filesystem::path& dir, const CheckpointContents& contents,
            const ShardedSaveOptions& options = {});

  // Waits for the save in flight and returns its directory (nullopt when
  // none was in flight); rethrows its error.
  std::optional<std::filesystem::path> wait();

  // True while a save is being written.
  bool busy() const;

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  std::future<void> in_flight_;
  std::filesystem::path in_flight_dir_;
};

}  // namespace paratrain::checkpoint
