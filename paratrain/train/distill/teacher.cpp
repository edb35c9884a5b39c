// find_teacher and Teacher (teacher.h).
#include "paratrain/train/distill/teacher.h"

#include <torch/torch.h>

#include <cstring>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/core/error.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/models/model.h"
#include "paratrain/models/parallel_gpt.h"
#include "paratrain/models/skeleton.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/stage.h"
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

// The checkpoint's key of the teacher's tensor `name`, checked to be there
// with the shape the teacher built from its config has.
std::string checked_key(const checkpoint::ShardedReader& reader, const TeacherSource& source,
                        const std::string& name, at::IntArrayRef shape) {
  const std::string key = "model/" + name;
  if (!reader.index().tensors.count(key)) {
    throw CheckpointError(fmt::format("distill.teacher: checkpoint {} has no tensor '{}' that the teacher model "
                                      "({}) needs",
                                      source.checkpoint.string(), key, source.config.model.kind));
  }
  const auto& saved = reader.tensor(key).shape;
  if (!std::equal(saved.begin(), saved.end(), shape.begin(), shape.end())) {
    throw CheckpointError(fmt::format("distill.teacher: '{}' is [{}] in checkpoint {} but [{}] in the teacher "
                                      "built from its config",
                                      key, fmt::join(saved, ", "), source.checkpoint.string(),
                                      fmt::join(shape, ", ")));
  }
  return key;
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

Teacher::Teacher(const TeacherSource& source, const TeacherPlacement& placement)
    : source_(source), placement_(placement) {
  const c10::Device device = placement.device;
  // Drawn as the Trainer draws models (builders.h): under the process-wide
  // lock and from its own seed, so building it never shifts another rank
  // thread's draws; the checkpoint's values replace what it drew.
  TrainConfig config = source.config;
  config.freeze = FreezeConfig{};  // the teacher's own frozen set does not matter here
  {
    CpuRngGuard keep_rng;
    // Sharded: a skeleton, each layer given up as it is made, so no rank
    // ever holds the teacher whole (Note [Skeleton models]).
    std::optional<models::SkeletonScope> skeleton;
    if (placement.shard) skeleton.emplace(device);
    model_ = seeded_model_factory(config, c10::Device(c10::kCPU))();
  }
  checkpoint::ShardedReader reader(source.checkpoint);
  if (placement.shard) {
    load_sharded(reader, placement);
    return;
  }
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor& t) {
    t.copy_(reader.read_whole(checked_key(reader, source, name, t.sizes())));
  };
  for (auto& item : model_->named_parameters()) {
    load(item.key(), item.value());
    parameter_count_ += item.value().numel();
  }
  for (auto& item : model_->named_buffers()) load(item.key(), item.value());
  model_->eval();
  if (!placement.shard && placement.pp != nullptr && placement.pp->size() > 1) {
    for (auto& p : model_->parameters()) p.set_requires_grad(false);
    cut_into_stages(placement);  // probes the stage boundaries on the CPU, then moves its stage
    return;
  }
  if (!device.is_cpu()) model_->to(device);
  if (!placement.shard && placement.tp != nullptr && placement.tp->size() > 1) {
    for (auto& p : model_->parameters()) p.set_requires_grad(false);
    split_over_tp(placement);
    return;
  }
  for (auto& p : model_->parameters()) p.set_requires_grad(false);
}

// Sharded over dp like a ZeRO-3 student: FSDP lays the skeleton's units out
// and shards them without reading them, then each rank reads only its
// pieces' ranges from the checkpoint (and the buffers whole). A program's
// own model is built whole (no skeleton) and goes the same way.
void Teacher::load_sharded(checkpoint::ShardedReader& reader, const TeacherPlacement& placement) {
  torch::NoGradGuard no_grad;
  auto entry = [&](const std::string& name, at::IntArrayRef shape) {
    return checked_key(reader, source_, name, shape);
  };
  for (const auto& item : model_->named_parameters()) {
    entry(item.key(), item.value().sizes());
    parameter_count_ += item.value().numel();
  }
  for (auto& item : model_->named_buffers()) {
    const at::Tensor value = reader.read_whole(entry(item.key(), item.value().sizes()));
    item.value().set_data(value.to(placement.device, item.value().scalar_type()));
  }
  model_->eval();
  // A program's own model is built whole, on the CPU: it moves as before.
  bool skeleton = false;
  for (const auto& p : model_->parameters()) skeleton = skeleton || models::is_placeholder(p);
  if (!skeleton && !placement.device.is_cpu()) model_->to(placement.device);
  fsdp::FsdpOptions options;
  options.timeout = placement.timeout;
  options.skeleton = true;
  // Its parameters keep requires_grad (FSDP shards trainable ones) but no
  // backward ever runs through them: logits() runs without grad mode.
  fsdp_ = std::make_unique<fsdp::FullyShardedDataParallel>(model_, *placement.dp, std::move(options));
  for (const TensorSlot& slot : fsdp_->parameter_slots()) {
    at::Tensor local = slot.local;
    local.copy_(reader.read_range("model/" + slot.name, slot.flat_offset, local.numel()).view(local.sizes()));
  }
  // Parameters that do not train (a program's model may have some) stay
  // whole outside FSDP's units: read whole.
  for (auto& item : model_->named_parameters()) {
    if (item.value().requires_grad()) continue;
    item.value().set_data(reader.read_whole("model/" + item.key()).to(placement.device, item.value().scalar_type()));
  }
}

// The teacher split as a student of its kind would be (it was read whole to
// get here, as the student is drawn whole before it is split): a GPT by its
// own plan, another model by the parallel.tp_plan of its saved config. The
// region's seed does not matter: the teacher runs in eval mode.
void Teacher::split_over_tp(const TeacherPlacement& placement) {
  const TrainConfig& t = source_.config;
  parallelize::TpPlan plan;
  if (t.model.kind == "gpt") {
    if (t.model.heads % placement.tp->size() != 0 || 256 % placement.tp->size() != 0) {
      throw ConfigError(fmt::format("distill.teacher: the teacher GPT's {} heads (and 256-token vocabulary) do not "
                                    "split over parallel.tp = {}; pick a tp dividing both",
                                    t.model.heads, placement.tp->size()));
    }
    plan = models::gpt_tp_plan(false, t.model.moe_experts == 0 || t.model.moe_every > 1);
    gather_vocabulary_ = true;
  } else if (!t.parallel.tp_plan.empty()) {
    plan = tp_plan_of(t);
    plan.sequence_parallel = false;
  } else {
    return;  // no plan: whole on every rank
  }
  try {
    parallelize::parallelize_module(*model_, plan, {.tp = {placement.tp, placement.timeout}});
  } catch (const ConfigError&) {
    throw;
  } catch (const Error& e) {
    throw ConfigError(fmt::format("distill.teacher: {} does not split over parallel.tp = {}: {}",
                                  source_.checkpoint.string(), placement.tp->size(), e.what()));
  }
  tp_split_ = placement.tp->size();
}

// The teacher's layers balanced by parameters over the stages, this rank
// keeping its own between steps (it was read whole to get here, as the
// student is drawn whole before it is cut). A layer that reads an earlier
// stage's weight (the GPT's head reads the embedding) keeps a copy of it on
// its stage, read-only: no gradient sum is needed. Under the student's tp a
// GPT teacher is also split over tp (Note [A teacher in stages split over
// tp]).
void Teacher::cut_into_stages(const TeacherPlacement& placement) {
  comm::ProcessGroup& pp = *placement.pp;
  const int p = pp.size();
  const auto whole_layers = model_->layers();
  if (static_cast<int>(whole_layers.size()) < p) {
    throw ConfigError(fmt::format("distill.teacher: the teacher model ({}) has {} layers to cut into the student's "
                                  "{} pipeline stages; a teacher needs at least parallel.pp layers (or distill with "
                                  "parallel.pp = 1)",
                                  source_.config.model.kind, whole_layers.size(), p));
  }
  auto shapes = pipeline::infer_boundary_shapes(whole_layers, placement.example_shape, placement.input_dtype);
  const auto bounds = pipeline::balanced_partition(pipeline::layer_parameter_counts(whole_layers), p);
  output_shape_ = shapes.shapes.back();  // whole logits, as logits() gives them
  // Note [A teacher in stages split over tp]
  // The boundaries are probed on the whole model, with no collective (the
  // probe runs on the CPU, where a GPU's tp group could not reduce); then
  // the GPT is split by its own plan. Between its blocks a GPT without
  // Megatron-SP carries [b, S, d] whole on every tp rank, so only the last
  // boundary changes: the head gives this rank's vocabulary columns, which
  // logits() gathers over tp on the last stage. Other models stay whole in
  // their stages (a plan may leave any boundary split).
  if (placement.tp != nullptr && placement.tp->size() > 1 && source_.config.model.kind == "gpt") {
    split_over_tp(placement);
    for (auto& param : model_->parameters()) param.set_requires_grad(false);
    shapes.shapes.back().back() /= placement.tp->size();
    tp_layout_ = tensor_parallel::parameter_layout(*model_);
  }
  const auto layers = model_->layers();
  pipeline::LocalChunk chunk;
  chunk.module = std::make_shared<pipeline::StageModule>(
      std::vector<models::Layer>(layers.begin() + bounds[pp.rank()], layers.begin() + bounds[pp.rank() + 1]));
  chunk.model_chunk = pp.rank();
  chunk.input_shape = shapes.shapes[bounds[pp.rank()]];
  chunk.input_dtype = shapes.dtypes[bounds[pp.rank()]];
  chunk.output_shape = shapes.shapes[bounds[pp.rank() + 1]];
  chunk.output_dtype = shapes.dtypes[bounds[pp.rank() + 1]];
  // Named as in the whole model (the checkpoint's names), each by the first
  // stage that holds it (a weight two stages hold, listed once).
  std::set<std::string> listed;
  for (int stage = 0; stage <= pp.rank(); ++stage) {
    for (int j = bounds[stage]; j < bounds[stage + 1]; ++j) {
      for (const auto& [prefix, module] : layers[j].modules) {
        for (const auto& item : module->named_parameters()) {
          const std::string name = prefix + "." + item.key();
          if (listed.insert(name).second && stage == pp.rank()) stage_parameters_.emplace_back(name, item.value());
        }
      }
    }
  }
  if (!placement.device.is_cpu()) chunk.module->to(placement.device);
  pipeline::ExecutorOptions options;
  options.schedule = pipeline::ScheduleKind::kGpipe;
  options.shape.stages = p;
  options.shape.microbatches = 1;
  options.timeout = placement.timeout;
  std::vector<pipeline::LocalChunk> local{std::move(chunk)};
  stages_executor_ = std::make_unique<pipeline::Executor>(pp, std::move(local), options);
  stages_ = p;
  model_.reset();  // the other stages' layers go
}

Teacher::~Teacher() = default;

at::Tensor Teacher::logits(const at::Tensor& inputs) {
  torch::NoGradGuard no_grad;
  if (stages_executor_) {
    // Defined on the last stage, whose tp ranks gather the columns together.
    const at::Tensor out = stages_executor_->forward_only(inputs);
    if (!out.defined() || !gather_vocabulary_) return out;
    return tensor_parallel::all_gather_last_dim(out.contiguous(), {placement_.tp, placement_.timeout});
  }
  if (fsdp_) return fsdp_->forward([&] { return model_->forward(inputs); });
  const at::Tensor out = model_->forward(inputs);
  if (!gather_vocabulary_) return out;
  return tensor_parallel::all_gather_last_dim(out.contiguous(), {placement_.tp, placement_.timeout});
}

at::Tensor Teacher::logits_everywhere(const at::Tensor& inputs) {
  at::Tensor out = logits(inputs);
  if (!stages_executor_) return out;
  comm::ProcessGroup& pp = *placement_.pp;
  std::vector<int64_t> shape{inputs.size(0)};
  shape.insert(shape.end(), output_shape_.begin(), output_shape_.end());
  at::Tensor all = out.defined() ? out.to(at::kFloat).reshape(shape).contiguous().clone()
                                 : at::empty(shape, at::TensorOptions().dtype(at::kFloat).device(inputs.device()));
  pp.broadcast(all, pp.size() - 1)->wait(placement_.timeout);
  return all;
}

std::vector<std::pair<std::string, at::Tensor>> Teacher::full_parameters() {
  if (fsdp_) return fsdp_->full_parameters();
  if (tp_split_ > 1 && !stages_executor_) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& item :
         tensor_parallel::gather_full_parameters(*model_, {placement_.tp, placement_.timeout}))
      out.emplace_back(item.key(), item.value());
    return out;
  }
  if (stages_executor_) {
    // Each stage's own (whole: gathered over tp when split), gathered over
    // pp in stage order (a weight two stages hold is listed by the first).
    comm::ProcessGroup& pp = *placement_.pp;
    std::vector<std::pair<std::string, at::Tensor>> mine;
    for (const auto& [name, t] : stage_parameters_) mine.emplace_back(name, t.detach().to(at::kCPU).contiguous());
    if (tp_split_ > 1) mine = tensor_parallel::gather_full_tensors(mine, tp_layout_, {placement_.tp, placement_.timeout});
    for (auto& item : mine) item.second = item.second.clone();
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (int stage = 0; stage < pp.size(); ++stage) {
      // Names and shapes first (as JSON bytes), then the values.
      std::string names;
      if (stage == pp.rank()) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto& [name, t] : mine) j.push_back({name, t.sizes().vec()});
        names = j.dump();
      }
      at::Tensor length = at::tensor({static_cast<int64_t>(names.size())}, at::kLong);
      pp.broadcast(length, stage)->wait(placement_.timeout);
      at::Tensor bytes = at::zeros({length.item<int64_t>()}, at::kByte);
      if (stage == pp.rank()) std::memcpy(bytes.data_ptr(), names.data(), names.size());
      pp.broadcast(bytes, stage)->wait(placement_.timeout);
      const auto listed = nlohmann::json::parse(std::string(reinterpret_cast<const char*>(bytes.data_ptr()),
                                                            static_cast<size_t>(bytes.numel())));
      for (size_t i = 0; i < listed.size(); ++i) {
        const auto shape = listed[i][1].get<std::vector<int64_t>>();
        at::Tensor t = stage == pp.rank() ? mine.at(i).second : at::empty(shape, at::kFloat);
        pp.broadcast(t, stage)->wait(placement_.timeout);
        out.emplace_back(listed[i][0].get<std::string>(), t);
      }
    }
    return out;
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model_->named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

}  // namespace paratrain::train
