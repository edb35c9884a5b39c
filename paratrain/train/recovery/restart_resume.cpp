// The restarted worker's choice of run version and checkpoint (restart_resume.h).
#include "paratrain/train/recovery/restart_resume.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/train/batch_size.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/core/error.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::train {
namespace {

namespace fs = std::filesystem;

bool usable(const std::string& launch_id) { return !launch_id.empty() && launch_id != "none"; }

// The launch id a version's run.json records, "" when none (or unreadable:
// a damaged status file only means the version is not recognised).
std::string recorded_launch_id(const fs::path& run_dir) {
  std::ifstream in(run_dir / "run.json");
  if (!in) return "";
  std::stringstream text;
  text << in.rdbuf();
  const auto status = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!status.is_object() || !status.contains(kLaunchIdKey) || !status[kLaunchIdKey].is_string()) return "";
  return status[kLaunchIdKey].get<std::string>();
}

nlohmann::json read_status(const fs::path& run_dir) {
  std::ifstream in(run_dir / "run.json");
  if (!in) return nlohmann::json::object();
  std::stringstream text;
  text << in.rdbuf();
  auto status = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  return status.is_object() ? status : nlohmann::json::object();
}

}  // namespace

RestartResume restart_resume(const TrainConfig& config, const std::string& launch_id, int restart_count) {
  RestartResume out;
  if (restart_count <= 0) return out;
  const fs::path root = fs::path(config.run.output_dir) / config.run.name;
  if (config.run.version >= 0) {
    out.overrides = {"train.resume=auto"};
    out.message = fmt::format("restart {}: continuing run.version {} from its latest complete checkpoint",
                              restart_count, config.run.version);
    return out;
  }
  if (!usable(launch_id)) {
    out.overrides = {"train.resume=auto"};
    out.message = fmt::format("restart {}: continuing the newest version under {} from its latest complete "
                              "checkpoint (no launch id to recognise this job's own version by: pass "
                              "--rdzv-id, or use `paratrain launch`)",
                              restart_count, root.string());
    return out;
  }
  const auto versions = list_versions(root);
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    const fs::path dir = version_dir(root, *v);
    if (recorded_launch_id(dir) != launch_id) continue;
    out.overrides = {fmt::format("run.version={}", *v)};
    const bool user_path = !config.train.resume.empty() && config.train.resume != "auto";
    if (user_path && checkpoint::list_checkpoints(dir).empty()) {
      // Not a word about "auto": the run has not checkpointed yet, so it
      // begins again where the user began it.
      out.message = fmt::format("restart {}: {} has no checkpoint yet; resuming again from train.resume = {}",
                                restart_count, dir.string(), config.train.resume);
      return out;
    }
    out.overrides.push_back("train.resume=auto");
    out.message = fmt::format("restart {}: continuing {} from its latest complete checkpoint", restart_count,
                              dir.string());
    return out;
  }
  out.message = fmt::format("restart {}: no run version of launch {} under {} yet (the first generation ended "
                            "before creating one); starting the run as configured",
                            restart_count, launch_id, root.string());
  return out;
}

void record_launch_id(const fs::path& run_dir, const std::string& launch_id, int world_size) {
  if (usable(launch_id)) update_run_status(run_dir, {{kLaunchIdKey, launch_id}});
  if (world_size > 0 && !read_status(run_dir).contains(kStartWorldSizeKey)) {
    update_run_status(run_dir, {{kStartWorldSizeKey, world_size}});
  }
}

std::optional<fs::path> continued_run_dir(const TrainConfig& config, const RestartResume& plan) {
  const fs::path root = fs::path(config.run.output_dir) / config.run.name;
  for (const auto& o : plan.overrides) {
    if (o.rfind("run.version=", 0) == 0) return version_dir(root, std::stoi(o.substr(12)));
  }
  if (config.run.version >= 0) return version_dir(root, config.run.version);
  return std::nullopt;
}

// Note [Keeping the global batch]
// A generation that runs at another world size than the run's first
// (`paratrain launch --nnodes MIN:MAX` lost or gained a node) would, with the
// per-rank data.batch_size unchanged, take a different global batch: other
// steps per epoch, another LR schedule in steps, another optimisation. With
// elastic.keep_global_batch the starting global batch
//   G = data.batch_size * dp_start * train.accumulate
// (dp_start from the world size run.json recorded at the start, divided by
// tp * pp * cp) is kept at the new dp:
// - the per-rank batch G / (dp * accumulate) when it divides: one optimizer
//   step is still one forward/backward per rank, the cheapest way;
// - else train.accumulate = G / (dp * batch_size): the per-rank batch kept
//   and the number of micro-batches per step changed, when the per-rank
//   batch cannot be split evenly (batch 2, accumulate 4 on 3 ranks: G = 24;
//   on 4 ranks 24 / (4 * 4) is not whole, accumulate 24 / (4 * 2) = 3 is);
// - else a ConfigError with the numbers.
// The steps per epoch, so an LR schedule in steps, stay; so does the sample
// order of each step's global batch (DistributedSampler strides the same
// permutation over the ranks). data.global_batch_size, when set, already
// fixes G: nothing to do.
RestartResume keep_global_batch(const TrainConfig& config, const fs::path& run_dir, int world_size) {
  RestartResume out;
  const auto status = read_status(run_dir);
  if (!status.contains(kStartWorldSizeKey) || !status[kStartWorldSizeKey].is_number_integer()) return out;
  const int start = status[kStartWorldSizeKey].get<int>();
  if (start == world_size) return out;
  if (!config.elastic.keep_global_batch) {
    // The checkpoint's epoch position counts batches of the old global
    // batch: with another one it lands elsewhere in the epoch (samples
    // skipped or seen twice), or past its end (a CheckpointError).
    if (config.data.global_batch_size == 0) {
      out.message = fmt::format("world size {} -> {} with elastic.keep_global_batch = false: the global batch "
                                "follows the world size, and the epoch position of the checkpoint (in batches) "
                                "no longer matches its samples; set elastic.keep_global_batch = true (or "
                                "data.global_batch_size) to continue the same optimisation",
                                start, world_size);
    }
    return out;
  }
  const int64_t model_parallel = int64_t{config.parallel.tp} * config.parallel.pp * config.parallel.cp;
  const int64_t dp_start = start / model_parallel, dp = world_size / model_parallel;
  if (config.ps.servers > 0 || dp_start < 1 || dp < 1) {
    throw ConfigError(fmt::format(
        "elastic.keep_global_batch = true: the run started with {} ranks and continues with {}; with "
        "tp * pp * cp = {} and ps.servers = {} there is no data-parallel size to keep the global batch over; set "
        "elastic.keep_global_batch = false",
        start, world_size, model_parallel, config.ps.servers));
  }
  if (config.data.global_batch_size > 0) {
    out.message = fmt::format("elastic.keep_global_batch: world size {} -> {}; data.global_batch_size = {} already "
                              "fixes the global batch",
                              start, world_size, config.data.global_batch_size);
    return out;
  }
  const int64_t acc = config.train.accumulate, batch = config.data.batch_size;
  const int64_t global = batch * dp_start * acc;
  const auto kept = keep_global_batch_over({batch, acc, global, {}}, dp);
  if (kept && kept->accumulate == acc) {
    out.overrides = {fmt::format("data.batch_size={}", kept->per_rank)};
    out.message = fmt::format("elastic.keep_global_batch: world size {} -> {} (dp {} -> {}): per-rank batch {} -> {} "
                              "(train.accumulate {}), global batch {} kept",
                              start, world_size, dp_start, dp, batch, kept->per_rank, acc, global);
  } else if (kept) {
    out.overrides = {fmt::format("train.accumulate={}", kept->accumulate)};
    out.message = fmt::format("elastic.keep_global_batch: world size {} -> {} (dp {} -> {}): the per-rank batch {} "
                              "cannot be split evenly, so train.accumulate {} -> {}; global batch {} kept",
                              start, world_size, dp_start, dp, batch, acc, kept->accumulate, global);
  } else {
    throw ConfigError(fmt::format(
        "elastic.keep_global_batch = true: the run started with global batch {} (data.batch_size {} * dp {} * "
        "train.accumulate {}) but it does not divide over dp {} (world size {}) with train.accumulate {} nor with "
        "data.batch_size {}; set data.global_batch_size to a multiple of every dp size the job may run at, or "
        "elastic.keep_global_batch = false",
        global, batch, dp_start, acc, dp, world_size, acc, batch));
  }
  return out;
}

}  // namespace paratrain::train
