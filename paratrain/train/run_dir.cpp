// Version folders of a run and its status file (see run_dir.h).
#include "paratrain/train/run_dir.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"

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
    const auto dir = version_dir(root, versions.empty() ? 0 : versions.back());
    create_layout(dir);
    return dir;
  }
  create_layout(root);
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
