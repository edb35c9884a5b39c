// find_teacher and Teacher (teacher.h).
#include "paratrain/train/distill/teacher.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/core/error.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/rng_guard.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::train {
namespace {

std::filesystem::path newest_checkpoint(const std::string& spec) {
  const std::filesystem::path given(spec);
  std::error_code ec;
  if (std::filesystem::exists(given / "index.json", ec)) return given;
  if (!std::filesystem::is_directory(given, ec)) {
    throw ConfigError(fmt::format("distill.teacher = \"{}\": no such checkpoint or run folder; give a checkpoint "
                                  "(runs/NAME/version_N/checkpoints/step_N) or a run folder (runs/NAME)",
                                  spec));
  }
  const std::filesystem::path run = resolve_run_dir(given);
  const auto checkpoints = checkpoint::list_checkpoints(run);
  for (const auto& entry : checkpoints)
    if (std::filesystem::is_directory(entry.path, ec)) return entry.path;  // newest first
  throw ConfigError(fmt::format("distill.teacher = \"{}\": {} holds no committed checkpoint; train the teacher "
                                "first, or name one of its checkpoints",
                                spec, (run / "checkpoints").string()));
}

}  // namespace

TeacherSource find_teacher(const std::string& spec, const TrainConfig& student) {
  TeacherSource source;
  source.checkpoint = newest_checkpoint(spec);
  const auto index = checkpoint::read_index(source.checkpoint);
  const auto it = index.metadata.find("config");
  if (it == index.metadata.end() || it->second == "{}") {
    throw ConfigError(fmt::format("distill.teacher: checkpoint {} holds no config to build the teacher from (saved "
                                  "by a program of its own?); distill from a checkpoint of paratrain train",
                                  source.checkpoint.string()));
  }
  try {
    source.config = config_from_json(nlohmann::json::parse(it->second));
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("distill.teacher: the config saved with {} does not load: {}",
                                  source.checkpoint.string(), e.what()));
  }
  const TrainConfig& t = source.config;
  if (t.data.dataset != student.data.dataset) {
    throw ConfigError(fmt::format("distill.teacher: {} was trained on data.dataset = \"{}\", the student trains on "
                                  "\"{}\": the teacher must read the student's inputs",
                                  source.checkpoint.string(), t.data.dataset, student.data.dataset));
  }
  if (t.model.kind == "gpt" && student.model.kind == "gpt" && t.model.seq_len < student.model.seq_len) {
    throw ConfigError(fmt::format("distill.teacher: the teacher GPT reads windows of {} tokens, the student's are "
                                  "{}: set model.seq_len <= {}",
                                  t.model.seq_len, student.model.seq_len, t.model.seq_len));
  }
  return source;
}

Teacher::Teacher(const TeacherSource& source, c10::Device device, comm::ProcessGroup& dp, bool shard,
                 std::chrono::milliseconds timeout)
    : source_(source) {
  // Drawn as the Trainer draws models (builders.h): under the process-wide
  // lock and from its own seed, so building it never shifts another rank
  // thread's draws; the checkpoint's values replace what it drew.
  TrainConfig config = source.config;
  config.freeze = FreezeConfig{};  // the teacher's own frozen set does not matter here
  {
    CpuRngGuard keep_rng;
    model_ = seeded_model_factory(config, c10::Device(c10::kCPU))();
  }
  checkpoint::ShardedReader reader(source.checkpoint);
  const auto& tensors = reader.index().tensors;
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor& t) {
    const std::string key = "model/" + name;
    if (!tensors.count(key)) {
      throw CheckpointError(fmt::format("distill.teacher: checkpoint {} has no tensor '{}' that the teacher model "
                                        "({}) needs",
                                        source.checkpoint.string(), key, source.config.model.kind));
    }
    at::Tensor value = reader.read_whole(key);
    if (value.sizes() != t.sizes()) {
      throw CheckpointError(fmt::format("distill.teacher: '{}' is [{}] in checkpoint {} but [{}] in the teacher "
                                        "built from its config",
                                        key, fmt::join(value.sizes(), ", "), source.checkpoint.string(),
                                        fmt::join(t.sizes(), ", ")));
    }
    t.copy_(value);
  };
  for (auto& item : model_->named_parameters()) {
    load(item.key(), item.value());
    parameter_count_ += item.value().numel();
  }
  for (auto& item : model_->named_buffers()) load(item.key(), item.value());
  if (!device.is_cpu()) model_->to(device);
  model_->eval();
  if (shard) {
    fsdp::FsdpOptions options;
    options.timeout = timeout;
    // Its parameters keep requires_grad (FSDP shards trainable ones) but no
    // backward ever runs through them: logits() runs without grad mode.
    fsdp_ = std::make_unique<fsdp::FullyShardedDataParallel>(model_, dp, std::move(options));
  } else {
    for (auto& p : model_->parameters()) p.set_requires_grad(false);
  }
}

Teacher::~Teacher() = default;

at::Tensor Teacher::logits(const at::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  if (fsdp_) return fsdp_->forward([&] { return model_->forward(inputs); });
  return model_->forward(inputs);
}

std::vector<std::pair<std::string, at::Tensor>> Teacher::full_parameters() {
  if (fsdp_) return fsdp_->full_parameters();
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model_->named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

}  // namespace paratrain::train
