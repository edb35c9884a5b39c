// The restarted worker's choice of run version and checkpoint (restart_resume.h).
#include "paratrain/train/restart_resume.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/train/checkpoint/checkpoint_files.h"
#include "paratrain/train/run_dir.h"

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
    if (user_path && list_checkpoints(dir).empty()) {
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

void record_launch_id(const fs::path& run_dir, const std::string& launch_id) {
  if (usable(launch_id)) update_run_status(run_dir, {{kLaunchIdKey, launch_id}});
}

}  // namespace paratrain::train
