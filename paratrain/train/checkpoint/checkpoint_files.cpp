// Where checkpoints live in a run folder and which one to resume from:
// <run_dir>/checkpoints/step_<8 digits>.safetensors, newest = highest step.
// Leftover `*.tmp.<pid>` files from a crashed write never match the pattern.
#include <algorithm>
#include <regex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/train/checkpoint/checkpoint.h"
#include "paratrain/train/checkpoint/safetensors.h"

namespace paratrain::train {
namespace {

// (step, path) of every checkpoint file, highest step first.
std::vector<std::pair<int64_t, std::filesystem::path>> list_checkpoints(const std::filesystem::path& run_dir) {
  std::vector<std::pair<int64_t, std::filesystem::path>> out;
  const auto folder = run_dir / "checkpoints";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) return out;
  static const std::regex pattern(R"(step_(\d+)\.safetensors)");
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file(ec) && std::regex_match(name, m, pattern))
      out.emplace_back(std::stoll(m[1].str()), entry.path());
  }
  if (ec)
    throw CheckpointError(fmt::format("cannot list checkpoints in '{}': {}", folder.string(), ec.message()));
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  return out;
}

}  // namespace

std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step_{:08d}.safetensors", step);
}

std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& run_dir) {
  for (const auto& [step, path] : list_checkpoints(run_dir)) {
    try {
      read_safetensors_metadata(path);  // header and size only: cheap
      return path;
    } catch (const CheckpointError& e) {
      // Atomic writes make this rare (a disk error, a copy cut short); an
      // older checkpoint is still a valid place to resume from.
      spdlog::warn("skipping unreadable checkpoint: {}", e.what());
    }
  }
  return std::nullopt;
}

int prune_checkpoints(const std::filesystem::path& run_dir, int keep) {
  const auto all = list_checkpoints(run_dir);
  int removed = 0;
  for (size_t i = static_cast<size_t>(std::max(keep, 0)); i < all.size(); ++i) {
    std::error_code ec;
    if (std::filesystem::remove(all[i].second, ec)) ++removed;
    else if (ec) spdlog::warn("could not delete old checkpoint '{}': {}", all[i].second.string(), ec.message());
  }
  return removed;
}

}  // namespace paratrain::train
