// The Trainer's checkpoint policy over checkpoint/ (format, tensors).
#include "paratrain/train/checkpointing.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/optim/optimizer.h>

#include "paratrain/core/error.h"
#include "paratrain/data/fashion_mnist.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/checkpoint/async_saver.h"
#include "paratrain/checkpoint/checkpoint_access.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/registry.h"

namespace paratrain::train {
namespace {

// The scaler's state rides in the checkpoint's string metadata: two numbers,
// the same on every rank, printed so they parse back exactly.
constexpr const char* kScaleKey = "loss_scaler.scale";
constexpr const char* kConsumedKey = "loader.consumed_positions";
constexpr const char* kGrowthKey = "loss_scaler.growth_tracker";
constexpr const char* kSharesKey = "loader.batch_shares";

void restore_scaler(const std::filesystem::path& path, const checkpoint::TrainingState& state, optim::GradScaler& scaler) {
  const auto scale = state.extra.find(kScaleKey);
  const auto growth = state.extra.find(kGrowthKey);
  if (scale == state.extra.end() || growth == state.extra.end()) {
    spdlog::info("checkpoint {} has no loss-scaler state (saved without one); the scale starts at {}",
                 path.string(), scaler.get_scale());
    return;
  }
  double value = 0;
  int64_t tracker = 0;
  try {
    value = std::stod(scale->second);
    tracker = std::stoll(growth->second);
  } catch (const std::exception&) {
    throw CheckpointError(fmt::format("checkpoint {}: {} = \"{}\" / {} = \"{}\" are not numbers; the metadata is "
                                      "damaged: resume from another checkpoint",
                                      path.string(), kScaleKey, scale->second, kGrowthKey, growth->second));
  }
  scaler.load_state({{"scale", torch::tensor({value}, torch::kDouble)},
                     {"growth_tracker", torch::tensor({tracker}, torch::kLong)}});
}

}  // namespace

std::vector<std::pair<std::string, std::string>> preprocessing_metadata(const TrainConfig& config) {
  if (config.data.dataset == "fashion_mnist") {
    return {{"data.input_shape", "[1, 28, 28]"},
            {"data.normalize", fmt::format("(x / 255 - {}) / {}", data::kFashionMnistMean, data::kFashionMnistStd)},
            {"data.mean", fmt::format("{}", data::kFashionMnistMean)},
            {"data.std", fmt::format("{}", data::kFashionMnistStd)}};
  }
  if (find_dataset(config.data.dataset)) {
    return {{"data.normalize", fmt::format("as the program's registered dataset \"{}\" gives it", config.data.dataset)}};
  }
  return {{"data.input_shape", fmt::format("[{}, {}, {}]", config.data.synthetic_channels,
                                           config.data.synthetic_image_size, config.data.synthetic_image_size)},
          {"data.normalize", "none (synthetic inputs are used as generated)"}};
}

namespace {

checkpoint::CheckpointContents training_contents(const TrainConfig& config, Strategy& strategy,
                                     torch::optim::Optimizer& optimizer, const LoopPosition& position,
                                     const optim::GradScaler* scaler) {
  CheckpointSlots& slots = checkpoint_slots(strategy);
  checkpoint::CheckpointContents contents;
  contents.model = slots.model_slots();
  contents.optimizer = &optimizer;
  contents.optimizer_slots = slots.optimizer_slots();
  contents.strategy_state = slots.state_slots();
  auto& state = contents.state;
  state.step = position.step;
  state.epoch = position.epoch;
  state.batch_in_epoch = position.next_batch;
  state.sampler_seed = static_cast<uint64_t>(config.run.seed);
  state.config = to_json(config);
  state.extra["strategy"] = strategy.name();
  if (position.consumed_positions > 0) state.extra[kConsumedKey] = std::to_string(position.consumed_positions);
  if (!position.batch_shares.empty()) state.extra[kSharesKey] = nlohmann::json(position.batch_shares).dump();
  for (auto& [k, v] : slots.checkpoint_metadata()) state.extra[k] = v;
  for (auto& [k, v] : preprocessing_metadata(config)) state.extra[k] = v;
  // The frozen set (informative: a resume freezes what its own config says,
  // so a changed freeze.modules unfreezes or freezes more).
  if (!config.freeze.modules.empty()) state.extra["freeze.modules"] = nlohmann::json(config.freeze.modules).dump();
  if (scaler != nullptr) {
    state.extra[kScaleKey] = fmt::format("{:.17g}", scaler->get_scale());
    state.extra[kGrowthKey] = fmt::format("{}", scaler->growth_tracker());
  }
  return contents;
}

}  // namespace

std::filesystem::path save_training_checkpoint(const std::filesystem::path& run_dir, const TrainConfig& config,
                                               comm::ProcessGroup& world, Strategy& strategy,
                                               torch::optim::Optimizer& optimizer, const LoopPosition& position,
                                               const optim::GradScaler* scaler) {
  auto dir = checkpoint::checkpoint_dir(run_dir, position.step);
  checkpoint::save_sharded_checkpoint(dir, world, training_contents(config, strategy, optimizer, position, scaler));
  return dir;
}

TrainingCheckpointer::TrainingCheckpointer(const TrainConfig& config, comm::ProcessGroup& world) : world_(world) {
  if (config.train.async_checkpoint) async_ = std::make_unique<checkpoint::AsyncCheckpointSaver>(world);
}

TrainingCheckpointer::~TrainingCheckpointer() = default;

std::optional<SavedCheckpoint> TrainingCheckpointer::save(const std::filesystem::path& run_dir,
                                                          const TrainConfig& config, Strategy& strategy,
                                                          torch::optim::Optimizer& optimizer,
                                                          const LoopPosition& position,
                                                          const optim::GradScaler* scaler, std::string why) {
  SavedCheckpoint next{checkpoint::checkpoint_dir(run_dir, position.step), position.step, std::move(why)};
  if (!async_) {
    save_training_checkpoint(run_dir, config, world_, strategy, optimizer, position, scaler);
    return next;
  }
  std::optional<SavedCheckpoint> done = finish();
  async_->save(next.dir, training_contents(config, strategy, optimizer, position, scaler));
  in_flight_ = std::move(next);
  return done;
}

std::optional<SavedCheckpoint> TrainingCheckpointer::finish() {
  if (!async_ || !in_flight_) return std::nullopt;
  std::optional<SavedCheckpoint> done = std::move(in_flight_);
  in_flight_.reset();
  async_->wait();
  return done;
}

LoopPosition load_training_checkpoint(const std::filesystem::path& path, Strategy& strategy,
                                      torch::optim::Optimizer& optimizer, optim::GradScaler* scaler) {
  CheckpointSlots& slots = checkpoint_slots(strategy);
  checkpoint::CheckpointContents contents;
  contents.model = slots.model_slots();
  contents.optimizer = &optimizer;
  contents.optimizer_slots = slots.optimizer_slots();
  contents.strategy_state = slots.state_slots();
  auto state = checkpoint::load_sharded_checkpoint(path, contents);
  slots.after_load();
  slots.state_loaded(state.missing_state);
  if (scaler != nullptr) restore_scaler(path, state, *scaler);
  LoopPosition position;
  position.step = state.step;
  position.epoch = state.epoch;
  position.next_batch = state.batch_in_epoch;
  if (auto consumed = state.extra.find(kConsumedKey); consumed != state.extra.end()) {
    try {
      position.consumed_positions = std::stoll(consumed->second);
    } catch (const std::exception&) {
      throw CheckpointError(fmt::format("checkpoint {}: {} = '{}' is not a count", path.string(), kConsumedKey,
                                        consumed->second));
    }
  }
  if (auto shares = state.extra.find(kSharesKey); shares != state.extra.end()) {
    try {
      position.batch_shares = nlohmann::json::parse(shares->second).get<std::vector<int64_t>>();
    } catch (const std::exception&) {
      throw CheckpointError(fmt::format("checkpoint {}: {} = '{}' is not a list of batch sizes", path.string(),
                                        kSharesKey, shares->second));
    }
  }
  return position;
}

std::vector<std::filesystem::path> resume_candidates(const TrainConfig& config, const std::filesystem::path& run_dir) {
  const auto& resume = config.train.resume;
  if (resume.empty()) return {};
  if (resume == "auto") {
    // Every committed one, damaged or not: the caller's load tells, and a
    // damaged one is moved aside there instead of being left for the
    // continued run to save over (Note [Damaged checkpoints move aside]).
    std::vector<std::filesystem::path> out;
    for (const checkpoint::CheckpointEntry& e : checkpoint::list_checkpoints(run_dir)) out.push_back(e.path);
    return out;
  }
  std::error_code ec;
  const bool there = std::filesystem::exists(resume, ec);
  if (ec && checkpoint::is_permission_error(ec)) throw checkpoint::checkpoint_access_error(resume, ec);
  if (!there) {
    throw CheckpointError(fmt::format("train.resume = \"{}\": no such checkpoint. Give a checkpoint directory "
                                      "(checkpoints/step_N), \"auto\" (latest in {}) or \"\"",
                                      resume, (run_dir / "checkpoints").string()));
  }
  return {resume};
}

// Note [Damaged checkpoints move aside]
// With train.resume = auto every committed checkpoint is a candidate, newest
// first, and the load decides: a truncated, emptied or missing shard, an
// index.json that does not parse or validate, a checksum that fails, NaN or
// inf values (Note [Non-finite checkpoints] in checkpoint/sharded_reader.cpp)
// all fail it. Skipping such a checkpoint but leaving it in place would let
// the continued run save the same step over it, losing the evidence without
// a word; so once every rank is past it, rank 0 renames it to
// step_N.unreadable and logs that. A checkpoint that could not be read for
// lack of permission is not damaged (Note [Unreadable is not damaged] in
// checkpoint/checkpoint_access.cpp): the resume stops instead. An explicit
// train.resume path is never moved.
void quarantine_checkpoint(const std::filesystem::path& path) {
  auto target = path;
  target += ".unreadable";
  for (int n = 1; std::filesystem::exists(target); ++n) {
    target = path;
    target += fmt::format(".unreadable.{}", n);
  }
  std::error_code ec;
  std::filesystem::rename(path, target, ec);
  if (ec) {
    throw CheckpointError(fmt::format("cannot move the unreadable checkpoint {} aside to {}: {}; move or delete it "
                                      "by hand before resuming",
                                      path.string(), target.string(), ec.message()));
  }
  spdlog::warn("moved the unreadable checkpoint {} to {}", path.string(), target.string());
}

CheckpointSlots& checkpoint_slots(Strategy& strategy) {
  if (auto* slots = facet<CheckpointSlots>(strategy)) return *slots;
  throw Error(fmt::format("strategy {} has no checkpoint slots (Strategy facet CheckpointSlots): it cannot save "
                          "or load checkpoints",
                          strategy.name()));
}

}  // namespace paratrain::train
