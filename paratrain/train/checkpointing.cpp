// The Trainer's checkpoint policy over train/checkpoint/ (format, tensors).
#include "paratrain/train/checkpointing.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/checkpoint/checkpoint.h"

namespace paratrain::train {

std::filesystem::path save_training_checkpoint(const std::filesystem::path& run_dir, const TrainConfig& config,
                                               torch::nn::Module& model, torch::optim::Optimizer& optimizer,
                                               const LoopPosition& position) {
  TrainingState state;
  state.step = position.step;
  state.epoch = position.epoch;
  state.batch_in_epoch = position.next_batch;
  state.sampler_seed = static_cast<uint64_t>(config.run.seed);
  state.config = to_json(config);
  auto path = checkpoint_path(run_dir, position.step);
  save_checkpoint(path, model, optimizer, state);
  return path;
}

LoopPosition load_training_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                                      torch::optim::Optimizer& optimizer) {
  auto state = load_checkpoint(path, model, optimizer);
  return {state.step, state.epoch, state.batch_in_epoch};
}

std::filesystem::path resolve_resume(const TrainConfig& config, const std::filesystem::path& run_dir) {
  const auto& resume = config.train.resume;
  if (resume.empty()) return {};
  if (resume == "auto") return find_latest_checkpoint(run_dir).value_or(std::filesystem::path());
  if (!std::filesystem::exists(resume)) {
    throw CheckpointError(fmt::format("train.resume = \"{}\": no such file. Give a checkpoint path, \"auto\" "
                                      "(latest in {}) or \"\"", resume, (run_dir / "checkpoints").string()));
  }
  return resume;
}

void write_text_atomically(const std::filesystem::path& path, const std::string& text) {
  auto tmp = path;
  tmp += fmt::format(".tmp.{}", getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    out.flush();
    if (!out) throw Error(fmt::format("cannot write {}; check free space and permissions", tmp.string()));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error(fmt::format("cannot replace {}: {}", path.string(), ec.message()));
  }
}

}  // namespace paratrain::train
