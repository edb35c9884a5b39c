#include "paratrain/checkpoint/async_saver.h"

#include <chrono>
#include <numeric>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"

namespace paratrain::checkpoint {

AsyncCheckpointSaver::AsyncCheckpointSaver(comm::ProcessGroup& world) {
  std::vector<int> everyone(static_cast<size_t>(world.size()));
  std::iota(everyone.begin(), everyone.end(), 0);
  group_ = world.new_subgroup(everyone);
  if (!group_)
    throw CommError(fmt::format("rank {}: could not build the background checkpoint writer's group", world.rank()));
}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    spdlog::error("the background checkpoint save of {} failed: {}", in_flight_dir_.string(), e.what());
  }
}

void AsyncCheckpointSaver::save(const std::filesystem::path& dir, const CheckpointContents& contents,
                                const ShardedSaveOptions& options) {
  wait();
  // Copies now: the caller's next optimizer step may change every tensor.
  std::shared_ptr<PreparedShard> shard = prepare_sharded_checkpoint(dir, contents, group_->rank(), true);
  in_flight_dir_ = dir;
  in_flight_ = std::async(std::launch::async, [group = group_, dir, shard = std::move(shard), options] {
    write_prepared_checkpoint(dir, *group, *shard, options);
  });
}

std::optional<std::filesystem::path> AsyncCheckpointSaver::wait() {
  if (!in_flight_.valid()) return std::nullopt;
  in_flight_.get();  // invalidates the future, also when it throws
  return in_flight_dir_;
}

bool AsyncCheckpointSaver::busy() const {
  return in_flight_.valid() && in_flight_.wait_for(std::chrono::seconds(0)) != std::future_status::ready;
}

}  // namespace paratrain::checkpoint
