// Where checkpoints live in a run folder and which one to resume from:
// <run_dir>/checkpoints/step_<8 digits>/ (sharded, committed by index.json)
// or step_<8 digits>.safetensors (single file); newest = highest step.
#include "paratrain/checkpoint/checkpoint_files.h"

#include <algorithm>
#include <regex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/core/remove_tree.h"
#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/checkpoint_metadata.h"
#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::checkpoint {
namespace {

const std::regex& dir_pattern() {
  static const std::regex p(R"(step_(\d+))");
  return p;
}
const std::regex& file_pattern() {
  static const std::regex p(R"(step_(\d+)\.safetensors)");
  return p;
}

bool is_temporary(const std::string& name) { return name.find(".tmp.") != std::string::npos; }

void remove_entry(const std::filesystem::path& path, const char* why, int& removed) {
  std::error_code ec;
  core::remove_tree(path, ec);
  if (ec) {
    spdlog::warn("could not delete {} '{}': {}", why, path.string(), ec.message());
  } else {
    spdlog::info("deleted {} '{}'", why, path.string());
    ++removed;
  }
}

}  // namespace

std::filesystem::path checkpoint_dir(const std::filesystem::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step_{:08d}", step);
}

std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step) {
  return run_dir / "checkpoints" / fmt::format("step_{:08d}.safetensors", step);
}

std::vector<CheckpointEntry> list_checkpoints(const std::filesystem::path& run_dir) {
  std::vector<CheckpointEntry> out;
  const auto folder = run_dir / "checkpoints";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) return out;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if (entry.is_directory(ignored) && std::regex_match(name, m, dir_pattern())) {
      // One we may not look into is listed: it may be committed, and a
      // resume must name it instead of passing over it (Note [Unreadable is
      // not damaged] in checkpoint_access.cpp).
      std::error_code unknown;
      if (std::filesystem::exists(entry.path() / kIndexFileName, unknown) || unknown)
        out.push_back({std::stoll(m[1].str()), entry.path(), true, !unknown});
    } else if (entry.is_regular_file(ignored) && std::regex_match(name, m, file_pattern())) {
      out.push_back({std::stoll(m[1].str()), entry.path(), false, true});
    }
  }
  if (ec)
    throw CheckpointError(fmt::format("cannot list checkpoints in '{}': {}", folder.string(), ec.message()));
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) {
    return std::tie(a.step, a.sharded) > std::tie(b.step, b.sharded);
  });
  return out;
}

void check_checkpoint(const std::filesystem::path& checkpoint) {
  std::error_code ec;
  const bool is_dir = std::filesystem::is_directory(checkpoint, ec);
  if (ec && is_permission_error(ec)) throw checkpoint_access_error(checkpoint, ec);
  if (!is_dir) {
    check_checkpoint_readable(checkpoint);
    training_state_from_metadata(read_safetensors_metadata(checkpoint), checkpoint.string());
    return;
  }
  const CheckpointIndex index = read_index(checkpoint);
  training_state_from_metadata(index.metadata, (checkpoint / kIndexFileName).string());
  check_shard_files(checkpoint, index);
}

std::vector<std::filesystem::path> find_loadable_checkpoints(const std::filesystem::path& run_dir) {
  std::vector<std::filesystem::path> out;
  for (const CheckpointEntry& e : list_checkpoints(run_dir)) {
    try {
      check_checkpoint(e.path);
      out.push_back(e.path);
    } catch (const CheckpointAccessError&) {
      throw;  // not damaged: never passed over (Note [Unreadable is not damaged])
    } catch (const CheckpointError& err) {
      // A disk error or a copy cut short: an older checkpoint is still a
      // valid place to resume from.
      spdlog::warn("skipping damaged checkpoint of step {}: {}", e.step, err.what());
    }
  }
  return out;
}

std::optional<std::filesystem::path> find_latest_checkpoint(const std::filesystem::path& run_dir) {
  for (const CheckpointEntry& e : list_checkpoints(run_dir)) {
    try {
      check_checkpoint(e.path);
      return e.path;
    } catch (const CheckpointAccessError&) {
      throw;
    } catch (const CheckpointError& err) {
      spdlog::warn("skipping damaged checkpoint of step {}: {}", e.step, err.what());
    }
  }
  return std::nullopt;
}

int clean_interrupted_checkpoints(const std::filesystem::path& run_dir) {
  const auto folder = run_dir / "checkpoints";
  std::error_code ec;
  if (!std::filesystem::is_directory(folder, ec)) return 0;
  std::vector<std::pair<std::filesystem::path, const char*>> doomed;
  for (const auto& entry : std::filesystem::directory_iterator(folder, ec)) {
    const std::string name = entry.path().filename().string();
    std::error_code ignored;
    if (is_temporary(name)) {
      doomed.emplace_back(entry.path(), "temporary file of an interrupted checkpoint write");
    } else if (entry.is_directory(ignored) && std::regex_match(name, dir_pattern())) {
      std::error_code unknown;
      const bool committed = std::filesystem::exists(entry.path() / kIndexFileName, unknown);
      if (unknown) {
        // Never delete what could not be read (Note [Unreadable is not
        // damaged] in checkpoint_access.cpp): the resume names the problem.
        spdlog::warn("cannot tell whether checkpoint '{}' is complete: {}; left as it is", entry.path().string(),
                     unknown.message());
        continue;
      }
      if (!committed) {
        doomed.emplace_back(entry.path(), "uncommitted checkpoint directory (no index.json: an interrupted save)");
        continue;
      }
      for (const auto& inner : std::filesystem::directory_iterator(entry.path(), ignored))
        if (is_temporary(inner.path().filename().string()))
          doomed.emplace_back(inner.path(), "temporary file of an interrupted checkpoint write");
    }
  }
  if (ec) {
    // Rank 0 alone runs this: the listing error is left for every rank's
    // resume to report (list_checkpoints), with nothing deleted.
    spdlog::warn("cannot list checkpoints in '{}': {}; nothing cleaned up", folder.string(), ec.message());
    return 0;
  }
  int removed = 0;
  for (const auto& [path, why] : doomed) remove_entry(path, why, removed);
  return removed;
}

int prune_checkpoints(const std::filesystem::path& run_dir, int64_t keep) {
  if (keep <= 0) return 0;
  const auto all = list_checkpoints(run_dir);
  // The best checkpoint (train.monitor: checkpoints/best links to it) is
  // kept however old it is.
  std::error_code ec;
  const auto best = std::filesystem::read_symlink(run_dir / "checkpoints" / "best", ec).filename();
  int removed = 0;
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    if (!ec && all[i].path.filename() == best) continue;
    if (!all[i].readable) {
      spdlog::warn("not pruning old checkpoint '{}': this process may not read it", all[i].path.string());
      continue;
    }
    remove_entry(all[i].path, "old checkpoint", removed);
  }
  return removed;
}

}  // namespace paratrain::checkpoint
