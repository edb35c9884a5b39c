// Version folders of a run and its status file (see run_dir.h).
#include "paratrain/train/run/run_dir.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_files.h"

namespace paratrain::train {

namespace fs = std::filesystem;

namespace {

constexpr std::string_view kVersionPrefix = "version_";

// Creates <dir>/checkpoints too, so a run folder always has the same shape.
void create_layout(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir / "checkpoints", ec);
  if (ec) {
    throw ConfigError(fmt::format("cannot create the run directory {}: {}; set run.output_dir to a writable place",
                                  dir.string(), ec.message()));
  }
}

// Note [Resuming the newest version with a checkpoint]
// train.resume = auto continues the newest version that holds a committed
// checkpoint, not merely the newest version: a start that failed before its
// first save (a bad data.dir, a batch larger than the dataset, a killed
// first generation of an elastic job) leaves a version with none, and
// continuing that one would start from step 0 while an older version holds
// the progress. A version whose checkpoints cannot even be listed counts as
// holding some, so that the resume names the problem instead of passing it
// over. With no checkpoint anywhere, the newest version is continued.
int64_t version_to_resume(const fs::path& root, const std::vector<int64_t>& versions) {
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    bool holds = true;
    try {
      holds = !checkpoint::list_checkpoints(version_dir(root, *v)).empty();
    } catch (const CheckpointError&) {
    }
    if (!holds) continue;
    if (*v != versions.back()) {
      const auto newer = static_cast<size_t>(v - versions.rbegin());
      spdlog::info("train.resume = auto: continuing {}, the newest version with a checkpoint; {} newer version{} "
                   "(up to version_{}) hold{} none: run{} that ended before {} first save",
                   version_dir(root, *v).string(), newer, newer == 1 ? "" : "s", versions.back(),
                   newer == 1 ? "s" : "", newer == 1 ? "" : "s", newer == 1 ? "its" : "their");
    }
    return *v;
  }
  return versions.back();
}

}  // namespace

std::optional<int64_t> parse_version_name(const std::string& name) {
  if (name.size() <= kVersionPrefix.size() || name.compare(0, kVersionPrefix.size(), kVersionPrefix) != 0)
    return std::nullopt;
  const std::string digits = name.substr(kVersionPrefix.size());
  // At most 9 digits: any real count fits, and stoll cannot overflow.
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

std::vector<int64_t> list_versions(const fs::path& root) {
  std::vector<int64_t> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    std::error_code ignored;
    if (!entry.is_directory(ignored)) continue;
    if (auto v = parse_version_name(entry.path().filename().string())) out.push_back(*v);
  }
  std::sort(out.begin(), out.end());
  return out;
}

fs::path version_dir(const fs::path& root, int64_t version) {
  return root / fmt::format("{}{}", kVersionPrefix, version);
}

fs::path create_run_dir(const TrainConfig& config) {
  const fs::path root = fs::path(config.run.output_dir) / config.run.name;
  if (config.run.version >= 0) {
    const auto dir = version_dir(root, config.run.version);
    create_layout(dir);
    return dir;
  }
  const auto versions = list_versions(root);
  if (config.train.resume == "auto") {
    const auto dir = version_dir(root, versions.empty() ? 0 : version_to_resume(root, versions));
    create_layout(dir);
    return dir;
  }
  // The run folder holds versions only (no checkpoints/ of its own).
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    throw ConfigError(fmt::format("cannot create the run directory {}: {}; set run.output_dir to a writable place",
                                  root.string(), ec.message()));
  }
  // create_directory is atomic: of two jobs started at the same moment with
  // the same name, one gets version N and the other moves on to N+1.
  for (int64_t v = versions.empty() ? 0 : versions.back() + 1;; ++v) {
    const auto dir = version_dir(root, v);
    std::error_code ec;
    if (fs::create_directory(dir, ec)) {
      create_layout(dir);
      return dir;
    }
    if (ec) {
      throw ConfigError(fmt::format("cannot create the run directory {}: {}; set run.output_dir to a writable place",
                                    dir.string(), ec.message()));
    }
  }
}

fs::path resolve_run_dir(const fs::path& given) {
  std::error_code ec;
  // A version folder (or a run of the layout before versions) is used as is.
  if (fs::exists(given / "config.toml", ec) || fs::exists(given / "metrics.jsonl", ec)) return given;
  const auto versions = list_versions(given);
  return versions.empty() ? given : version_dir(given, versions.back());
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void update_run_status(const fs::path& run_dir, const nlohmann::json& update) {
  const auto path = run_dir / "run.json";
  nlohmann::json status = nlohmann::json::object();
  std::ifstream in(path);
  if (in) {
    std::stringstream text;
    text << in.rdbuf();
    // A damaged status file is replaced: it only describes the run.
    status = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
    if (!status.is_object()) status = nlohmann::json::object();
  }
  status.update(update);
  // Not fsynced: a status lost in a power cut is rewritten by the next run.
  write_file_atomically(path, status.dump(2) + "\n", {.sync = false});
}

}  // namespace paratrain::train
