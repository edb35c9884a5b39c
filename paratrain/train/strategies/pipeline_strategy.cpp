// The "pipeline" strategy (parallel.pp > 1): the model's layers are cut into
// pp * virtual_stages chunks, each rank builds only its own, and a schedule
// (pipeline.schedule) runs micro-batches through them. With dp > 1 each chunk
// is wrapped in DDP (or ZeRO-1/2: zero.stage) over the dp axis, reducing only
// in the chunk's last backward of the step. Loss and evaluation logits are broadcast from the
// last stage, so the Trainer's logging and evaluation see them on every rank.
// A tensor two stages share (the GPT's tied embedding) has a copy on each,
// their gradients summed over the mesh's stage group (pipeline/tied.h).
// With parallel.ep the MoE layers of a stage split their experts over ep
// groups of the stage's dp replicas (moe/expert_parallel.h, Note [Experts
// in pipeline stages]).
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/module_sync.h"
#include "paratrain/data_parallel/ddp/naive.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/moe/expert_parallel.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/pipeline/tied.h"
#include "paratrain/pipeline/timeline.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/task.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"
#include "paratrain/train/strategies/pipeline_parts.h"

namespace paratrain::train::strategies {
namespace {

using topology::Axis;

class PipelineStrategy final : public Strategy, public CheckpointSlots, public Telemetry {
 public:
  explicit PipelineStrategy(const StrategyContext& ctx)
      : config_(ctx.config),
        input_shape_(ctx.input_shape),
        input_dtype_(ctx.input_dtype),
        mesh_(ctx.mesh),
        pp_(ctx.mesh.group(Axis::kPp)),
        dp_(ctx.mesh.group(Axis::kDp)),
        timeout_(ctx.timeout),
        run_dir_(ctx.run_dir),
        kind_(pipeline::parse_schedule(config_.pipeline.schedule)) {
    for (Axis axis : {Axis::kTp, Axis::kCp}) {
      if (mesh_.size(axis) != 1) {
        throw ConfigError(fmt::format("the pipeline strategy runs on pp x dp; parallel.{} = {} is not supported "
                                      "with it yet: set parallel.{} = 1",
                                      topology::to_string(axis), mesh_.size(axis), topology::to_string(axis)));
      }
    }
    if (config_.zero.stage == 3) {
      throw ConfigError(fmt::format("zero.stage = 3 with parallel.pp = {}: stage 3 gathers parameters around "
                                    "each forward, which a pipeline stage keeps whole; use zero.stage = 1 or 2 "
                                    "(optimizer state and gradients sharded over the dp replicas of each stage)",
                                    pp_.size()));
    }
    if (config_.model.sync_batchnorm) {
      throw ConfigError(fmt::format("model.sync_batchnorm = true with parallel.pp = {}: the pipeline does not "
                                    "convert BatchNorm layers yet; set model.sync_batchnorm = false or "
                                    "parallel.pp = 1",
                                    pp_.size()));
    }
    if (config_.zero.stage > 0) check_bucketed_mode(config_, "zero");
    if (config_.ddp.mode == "none" && dp_.size() != 1) {
      throw ConfigError(fmt::format("ddp.mode = \"none\" with {} pipeline replicas (dp) would train each on its "
                                    "own; use \"bucketed\" or \"naive\"",
                                    dp_.size()));
    }
    shape_ = pipeline_shape(config_, pp_.size(), dp_.size());
  }

  std::string name() const override {
    return fmt::format("pipeline ({}, {} stages, {} micro-batches{}{}{})", pipeline::schedule_name(kind_),
                       shape_.stages, shape_.microbatches,
                       shape_.virtual_stages > 1 ? fmt::format(", {} chunks per rank", shape_.virtual_stages) : "",
                       config_.pipeline.checkpoint_activations ? ", recomputing activations" : "",
                       config_.zero.stage > 0 ? fmt::format(", ZeRO-{} over dp", config_.zero.stage) : "");
  }

  void build_model(const ModelFactory& factory) override {
    // Every rank builds the whole model from the same seed, so its chunk
    // starts from the single-process weights, then keeps only its layers.
    auto full = factory();
    const auto layers = full->layers();
    if (layers.empty()) {
      throw ConfigError(fmt::format(
          "the model ({}) cannot be cut into pipeline stages: it lists no layers (models::Model::layers(); a "
          "program's torch::nn::Sequential is cut at its children); use parallel.pp = 1",
          full->name()));
    }
    for (const auto& layer : layers) {
      // A tied weight would need its gradient summed across stages.
      if (!layer.reads.empty()) {
        throw ConfigError(fmt::format("model.kind = \"{}\" cannot be cut into pipeline stages: layer {} reads the "
                                      "parameters of {} (a tied weight); use parallel.pp = 1",
                                      config_.model.kind, layer.name, layer.reads.front().first));
      }
    }
    // parallel.ep: judged on the whole model, the same on every rank (a
    // stage's own check would fail some ranks and leave the others waiting).
    if (config_.parallel.ep > 1) moe::check_expert_parallel(*full, dp_.size(), static_cast<int>(config_.parallel.ep));
    const int chunks = shape_.stages * shape_.virtual_stages;
    // A GPT reads token ids (model_input_shape: one window); other models
    // the loaded data's examples (a program's own data and module).
    const bool from_data = !builds_gpt(config_) && input_shape_.has_value();
    const auto shapes = pipeline::infer_boundary_shapes(layers, from_data ? *input_shape_ : model_input_shape(config_),
                                                        builds_gpt(config_) ? at::kLong : from_data ? input_dtype_ : at::kFloat);
    if (config_.pipeline.split.empty()) {
      const auto costs = config_.pipeline.balance == "parameters"
                             ? pipeline::layer_parameter_counts(layers)
                             : measured_layer_costs(config_, layers, shapes, dp_.size(), mesh_.world(), timeout_,
                                                    &own_model_seconds_);
      const double slow = config_.profile.test_slow_rank == mesh_.world().rank() ? config_.profile.test_slow_factor : 1.0;
      const auto scales = config_.pipeline.balance == "rank_speed"
                              ? rank_speed_scales(own_model_seconds_ * slow, chunks, dp_, pp_, timeout_,
                                                  /*log=*/mesh_.world().rank() == 0)
                              : std::vector<double>{};
      bounds_ = pipeline::balanced_partition(costs, chunks, scales);
    } else {
      bounds_ = pipeline::explicit_partition(config_.pipeline.split, static_cast<int>(layers.size()), chunks);
    }
    layout_ = stage_layout(layers, bounds_, shape_.stages);
    refuse_tensors_shared_by_chunks(config_, layers, bounds_, shape_.stages, dp_.size());
    const auto tied = pipeline::find_tied_parameters(layers, bounds_, shape_.stages);
    // ZeRO-1 keeps the reduced gradients whole, so the copies are summed
    // after it (its pieces alias .grad); ZeRO-2 keeps only its piece.
    if (!tied.empty() && config_.zero.stage > 1) {
      throw ConfigError(fmt::format("zero.stage = {} with parallel.pp = {}: {} is shared by stages {} (a tied "
                                    "embedding), whose copies' gradients are summed as whole tensors, which "
                                    "ZeRO-2 does not keep; use zero.stage = 0 or 1",
                                    config_.zero.stage, pp_.size(), tied.front().name,
                                    fmt::join(tied.front().stages, " and ")));
    }

    auto local = local_chunks(layers, shapes, bounds_, shape_, pp_.rank(), recompute_policy(config_));
    for (const auto& c : local) modules_.push_back(c.module);
    output_shape_ = shapes.shapes.back();
    module_ = pipeline::merge_chunks(modules_);
    full.reset();
    // Collective over the world (the mesh builds the stage groups).
    tied_ = std::make_unique<pipeline::TiedGradients>(mesh_, tied, *module_, timeout_);
    tied_->broadcast_from_first();
    // What trains is judged before the experts are split: a replica holding
    // only frozen experts of a chunk must still wrap it as its peers do.
    const int frozen_chunks = frozen_prefix_chunks(layers, bounds_);
    std::vector<bool> trains;
    for (const auto& chunk : modules_) trains.push_back(trains_anything(*chunk));
    split_experts();  // before the wrappers, which leave the experts alone
    wrap_replicas(trains);

    pipeline::ExecutorOptions options = executor_options(config_, shape_, timeout_);
    const ProfileConfig& slow = config_.profile;
    if (slow.test_slow_factor > 1 && slow.test_slow_rank == mesh_.world().rank())
      options.compute_slowdown = slow.test_slow_factor;  // inside the schedule (the loop leaves pipelines alone)
    options.frozen_chunks = frozen_chunks;
    executor_ = std::make_unique<pipeline::Executor>(pp_, std::move(local), options);
    if (config_.pipeline.trace_steps > 0) {
      const int rank = mesh_.world().rank();
      pipeline::TimelineOptions options;
      options.path = pipeline::timeline_path(run_dir_, rank);
      options.max_steps = config_.pipeline.trace_steps;
      options.stage = pp_.rank();
      options.dp = dp_.rank();
      timeline_ = std::make_unique<pipeline::Timeline>(rank, options);
    }
  }

  std::shared_ptr<torch::nn::Module> module() const override { return module_; }
  // ZeRO: this rank's shard pieces of every local chunk, chunk by chunk.
  std::vector<at::Tensor> optimizer_params() override {
    std::vector<at::Tensor> out;
    if (zero_.empty()) {
      for (const auto& p : unique_parameters(*module_))
        if (p.requires_grad()) out.push_back(p);  // frozen ones never step
      return out;
    }
    for (const auto& z : zero_) {
      if (z) out.insert(out.end(), z->optimizer_params().begin(), z->optimizer_params().end());
    }
    return out;
  }
  DataShard data_shard() const override { return {dp_.rank(), dp_.size()}; }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss, bool sync) override {
    pipeline::ExecutorHooks hooks;
    // A chunk with nothing to train has no replica wrapper (null).
    hooks.before_forward = [this](int chunk) {
      if (!ddp_.empty() && ddp_[chunk]) ddp_[chunk]->prepare_forward();
      if (!naive_.empty() && naive_[chunk]) naive_[chunk]->prepare_forward();
      if (!zero_.empty() && zero_[chunk]) zero_[chunk]->prepare_forward();
      sync_unwrapped_buffers(chunk);
    };
    // Replicas reduce a chunk's gradients once, in its last backward of the
    // step: the earlier micro-batches accumulate locally (no_sync).
    hooks.before_backward = [this, sync](int chunk, bool last) {
      if (!ddp_.empty() && ddp_[chunk]) ddp_[chunk]->reducer().set_sync_enabled(sync && last);
      if (!zero_.empty() && zero_[chunk]) zero_[chunk]->reducer().set_sync_enabled(sync && last);
    };
    hooks.after_backward = [this, sync](int chunk, bool last) {
      if (!(sync && last)) return;
      if (!ddp_.empty() && ddp_[chunk]) ddp_[chunk]->finish_backward();
      if (!naive_.empty() && naive_[chunk]) naive_[chunk]->sync_gradients();
      if (!zero_.empty() && zero_[chunk]) zero_[chunk]->finish_backward();
    };
    const auto report = executor_->train_step(batch.inputs, batch.targets, loss, hooks, timeline_.get(), steps_++);
    // The copies of a tied tensor each hold their stage's part of its
    // gradient (already averaged over dp): the sum is the whole gradient.
    if (sync) tied_->all_reduce_gradients();
    if (sync && experts_) experts_->reduce_gradients();
    peak_in_flight_ = report.peak_in_flight;
    peak_activation_bytes_ = report.peak_activation_bytes;
    // The loss lives on the last stage; every rank logs and checks it.
    return {from_last_stage(report.loss, {1}, pp_, timeout_, pipeline::stage_device(*module_)).reshape({})};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                      optim::GradScaler* scaler) override {
    // Stages hold different parameters and ZeRO replicas different shards:
    // the inf flag is agreed over dp and pp (over dp also without ZeRO, as
    // the ddp strategy does, though replicas then hold equal gradients).
    for (auto& z : zero_)
      if (z) z->finish_backward();
    const bool skip = unscale_found_inf(scaler, grads_of(optimizer_params()), {&dp_, &pp_}, timeout_);
    if (!skip) {
      if (clip_grad_norm > 0) clip_across_stages(clip_grad_norm);
      if (zero_.empty()) {
        optimizer.step();
      } else {
        // One optimizer over every chunk's shard: step it once, then each
        // chunk all-gathers its updated parameters.
        for (auto& z : zero_)
          if (z) z->begin_step();
        optimizer.step();
        for (auto& z : zero_)
          if (z) z->end_step();
      }
    }
    // A skipped ZeRO step needs no all-gather (parameters are unchanged);
    // the next prepare_forward() clears what the backward left.
    if (zero_.empty()) optimizer.zero_grad();
    if (scaler) scaler->update();
    return !skip;
  }

  at::Tensor eval_forward(const at::Tensor& inputs) override {
    for (auto& d : ddp_)
      if (d) d->sync_buffers();
    for (auto& n : naive_)
      if (n) n->prepare_forward();
    for (auto& z : zero_)
      if (z) z->prepare_forward();
    for (int chunk = 0; chunk < static_cast<int>(modules_.size()); ++chunk) sync_unwrapped_buffers(chunk);
    std::vector<int64_t> shape{inputs.size(0)};
    shape.insert(shape.end(), output_shape_.begin(), output_shape_.end());
    // Evaluation logits leave the executor as float32 (executor.h).
    return from_last_stage(executor_->forward_only(inputs), shape, pp_, timeout_, pipeline::stage_device(*module_));
  }

  // ZeRO: each dp rank writes its shard pieces of this stage's parameters
  // (disjoint), dp rank 0 the buffers; otherwise dp rank 0 writes all.
  std::vector<TensorSlot> model_slots() override {
    if (zero_.empty()) {
      auto slots = without_tied_copies(replicated_slots(*module_, dp_.rank() == 0));
      return experts_ ? experts_->checkpoint_slots(std::move(slots)) : slots;  // written by their holders
    }
    std::vector<TensorSlot> out;
    for (const auto& z : zero_) {
      if (!z) continue;
      auto pieces = without_tied_copies(z->parameter_slots());
      out.insert(out.end(), std::make_move_iterator(pieces.begin()), std::make_move_iterator(pieces.end()));
    }
    auto frozen = frozen_parameter_slots(*module_, dp_.rank() == 0);  // not sharded: every replica holds them
    out.insert(out.end(), std::make_move_iterator(frozen.begin()), std::make_move_iterator(frozen.end()));
    auto buffers = buffer_slots(*module_, dp_.rank() == 0);
    out.insert(out.end(), std::make_move_iterator(buffers.begin()), std::make_move_iterator(buffers.end()));
    return out;
  }
  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    if (zero_.empty()) {
      // A tied tensor's state lives under its first name in the model, on
      // every stage (as one process keys it); its holder writes it.
      auto out = replicated_optimizer_slots(*module_, dp_.rank() == 0);
      for (auto& o : out) {
        o.slot.write = o.slot.write && tied_->writes_optimizer_state(o.slot.name);
        o.slot.name = tied_->optimizer_name(o.slot.name);
        if (experts_) o.slot = experts_->checkpoint_slots({o.slot}).front();
      }
      return out;
    }
    std::vector<checkpoint::OptimizerSlot> out;
    for (const auto& z : zero_) {
      if (!z) continue;
      for (auto& [param, slot] : z->optimizer_param_slots()) {
        // A tied tensor's pieces as above: its state under its first name.
        checkpoint::OptimizerSlot o{param, slot};
        o.slot.write = o.slot.write && tied_->writes_optimizer_state(o.slot.name);
        o.slot.name = tied_->optimizer_name(o.slot.name);
        out.push_back(std::move(o));
      }
    }
    return out;
  }
  void after_load() override {
    for (auto& z : zero_)
      if (z) z->gather_parameters();
  }

  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override {
    return {{"pipeline.stages", std::to_string(shape_.stages)},
            {"pipeline.schedule", pipeline::schedule_name(kind_)},
            {"zero.stage", std::to_string(config_.zero.stage)},
            {"pipeline.layer_bounds", fmt::format("{}", fmt::join(bounds_, ","))}};
  }

  // Each parameter broadcast over pp from the stage that holds it (a
  // stage's experts first gathered over its ep group).
  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    torch::NoGradGuard no_grad;
    std::map<std::string, at::Tensor> mine;
    for (const auto& item : module_->named_parameters()) mine[item.key()] = item.value();
    if (experts_) {
      std::vector<std::pair<std::string, at::Tensor>> local(mine.begin(), mine.end());
      for (auto& [name, t] : experts_->gather(local)) mine[name] = t;
    }
    return broadcast_stage_parameters(layout_, mine, pp_, timeout_);
  }

  SyncStats last_stats() const override {
    for (const auto& z : zero_)
      if (z) return sync_stats(z->reducer().last_step());
    for (const auto& d : ddp_)
      if (d) return sync_stats(d->last_step_stats());
    return SyncStats{};
  }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    if (!zero_.empty()) return zero_chunks_memory(zero_, optimizer);
    std::vector<at::Tensor> grads;
    const std::vector<at::Tensor> params = unique_parameters(*module_);
    for (const auto& p : params) grads.push_back(p.grad());
    ModelStateBytes m;
    m.params = tensor_bytes(params);
    m.grads = tensor_bytes(grads);
    m.optimizer_state = tensor_bytes(optimizer_state_tensors(optimizer));
    return m;
  }

 private:
  // A tied copy is loaded like every slot but written by the first stage only.
  std::vector<TensorSlot> without_tied_copies(std::vector<TensorSlot> slots) const {
    for (auto& slot : slots) slot.write = slot.write && !tied_->is_copy(slot.name);
    return slots;
  }

  // A frozen chunk has no wrapper to bring its buffers (BatchNorm's running
  // statistics, which still move in training mode) in line across replicas:
  // broadcast from dp rank 0 before its forward, as the wrappers do.
  void sync_unwrapped_buffers(int chunk) {
    const bool wrapped = (!ddp_.empty() && ddp_[chunk]) || (!naive_.empty() && naive_[chunk]) ||
                         (!zero_.empty() && zero_[chunk]);
    if (wrapped || dp_.size() == 1 || !config_.ddp.broadcast_buffers || config_.ddp.mode == "none") return;
    std::vector<at::Tensor> buffers = modules_[chunk]->buffers();
    if (!buffers.empty()) ddp::broadcast_coalesced(dp_, buffers, /*root=*/0, timeout_);
  }

  // Note [Experts in pipeline stages]
  // The MoE layers of this rank's chunks split their experts over ep groups
  // of the stage's dp replicas and route over all of them (Note [Experts in
  // the data-parallel mesh]): the replicas of a stage run the same schedule,
  // so each micro-batch's all-to-alls meet in the same order on every ep
  // rank, recomputed forwards included. A stage without MoE layers splits
  // nothing. Each chunk's DDP leaves the experts alone; they are reduced
  // over their replicas once the step's backward is done, counted once in
  // the clipping norm, and written by their holders in ep group 0. The
  // megatron strategy's stages do the same, tensor parallelism inside.
  void split_experts() {
    if (config_.parallel.ep <= 1 || moe::find_moe_layers(*module_).empty()) return;
    experts_ = std::make_unique<moe::ExpertParallel>(*module_, dp_, static_cast<int>(config_.parallel.ep), timeout_);
    if (dp_.rank() == 0) {
      spdlog::info("expert parallelism on stage {}: its {} replicas in {} ep group(s) of {}; each holds 1/{} of "
                   "every MoE layer's experts on the stage",
                   pp_.rank(), dp_.size(), dp_.size() / experts_->ep(), experts_->ep(), experts_->ep());
    }
  }

  static bool trains_anything(torch::nn::Module& chunk) {
    for (const auto& p : chunk.parameters())
      if (p.requires_grad()) return true;
    return false;
  }

  // A chunk with nothing to train (frozen) gets no wrapper: a null entry,
  // so the vectors stay indexed by local chunk. Its values need no
  // broadcast: every rank drew the same model from run.seed.
  void wrap_replicas(const std::vector<bool>& trains) {
    if (config_.zero.stage > 0) {
      // Even at dp = 1: the optimizer state and checkpoint layout are the
      // ZeRO ones, as for the zero strategy on one rank.
      for (size_t i = 0; i < modules_.size(); ++i) {
        auto& chunk = modules_[i];
        zero_.push_back(trains[i] ? std::make_unique<zero::ZeroDataParallel>(
                                                      chunk, dp_, zero_options(config_, timeout_))
                                                : nullptr);
      }
      return;
    }
    if (dp_.size() == 1 || config_.ddp.mode == "none") return;
    for (size_t i = 0; i < modules_.size(); ++i) {
      auto& chunk = modules_[i];
      if (!trains[i]) {
        if (config_.ddp.mode == "bucketed") ddp_.push_back(nullptr);
        else naive_.push_back(nullptr);
        continue;
      }
      if (config_.ddp.mode == "bucketed") {
        ddp::DdpOptions options = ddp_options(config_, timeout_);
        if (experts_) options.local_parameters = experts_->local_parameters();
        ddp_.push_back(std::make_unique<ddp::DistributedDataParallel>(chunk, dp_, options));
      } else {
        ddp::NaiveOptions options;
        options.broadcast_buffers = config_.ddp.broadcast_buffers;
        options.timeout = timeout_;
        naive_.push_back(std::make_unique<ddp::NaiveDataParallel>(chunk, dp_, options));
      }
    }
  }

  // torch::nn::utils::clip_grad_norm_ over the whole model: the norm sums
  // every stage's squares (replicas hold equal gradients after the
  // reduction; ZeRO replicas hold disjoint shards, summed over dp too).
  void clip_across_stages(double max_norm) {
    torch::NoGradGuard no_grad;
    if (!zero_.empty()) {
      // This rank's pieces; a tied tensor's on the stage that counts it.
      double local = 0;
      for (auto& z : zero_) {
        if (!z) continue;
        for (const auto& [param, slot] : z->optimizer_param_slots())
          if (param.grad().defined() && !tied_->counted_on_an_earlier_stage(slot.name))
            local += param.grad().to(torch::kDouble).square().sum().item<double>();
      }
      at::Tensor total = torch::full({1}, local, torch::kDouble);
      dp_.all_reduce(total, comm::ReduceOp::kSum)->wait(timeout_);
      pp_.all_reduce(total, comm::ReduceOp::kSum)->wait(timeout_);
      const double coef = max_norm / (std::sqrt(total.item<double>()) + 1e-6);
      if (coef < 1) {
        for (auto& z : zero_)
          if (z) z->scale_gradients(coef);
      }
      return;
    }
    // Each tensor once (a tied one may be listed under two names here), and
    // a copy an earlier stage holds not at all.
    const std::vector<at::Tensor> params = unique_parameters(*module_);
    at::Tensor sq = torch::zeros({1}, torch::TensorOptions().dtype(torch::kDouble).device(pipeline::stage_device(*module_)));
    for (const auto& p : params) {
      if (tied_->counted_on_an_earlier_stage(p)) continue;  // counted on the first stage
      if (experts_ && experts_->holds(p)) continue;         // each expert once, below
      if (p.grad().defined()) sq += p.grad().to(torch::kDouble).pow(2).sum();
    }
    if (experts_) sq += experts_->grad_square_sum();
    pp_.all_reduce(sq, comm::ReduceOp::kSum)->wait(timeout_);
    const double norm = std::sqrt(sq.item<double>());
    const double coef = max_norm / (norm + 1e-6);
    if (coef >= 1) return;
    for (const auto& p : params) {
      if (p.grad().defined()) p.mutable_grad().mul_(coef);
    }
  }

  const TrainConfig config_;
  std::optional<std::vector<int64_t>> input_shape_;  // one example's, from the data (nullopt: model_input_shape)
  at::ScalarType input_dtype_;
  topology::DeviceMesh& mesh_;
  comm::ProcessGroup& pp_;
  comm::ProcessGroup& dp_;
  std::chrono::milliseconds timeout_;
  std::filesystem::path run_dir_;  // the run's version folder: traces go to <run_dir>/trace/
  pipeline::ScheduleKind kind_;
  pipeline::ScheduleOptions shape_;
  std::vector<int> bounds_;
  std::vector<StageParam> layout_;
  std::vector<std::shared_ptr<pipeline::StageModule>> modules_;
  std::shared_ptr<torch::nn::Module> module_;
  std::vector<int64_t> output_shape_;
  std::vector<std::unique_ptr<ddp::DistributedDataParallel>> ddp_;
  std::vector<std::unique_ptr<ddp::NaiveDataParallel>> naive_;
  std::vector<std::unique_ptr<zero::ZeroDataParallel>> zero_;
  std::unique_ptr<pipeline::TiedGradients> tied_;
  std::unique_ptr<moe::ExpertParallel> experts_;  // parallel.ep > 1 on a stage with MoE layers
  std::unique_ptr<pipeline::Executor> executor_;
  std::unique_ptr<pipeline::Timeline> timeline_;
  int64_t steps_ = 0;
  int peak_in_flight_ = 0;
  double own_model_seconds_ = 0;  // this rank's time for every layer (pipeline.balance = "time", "rank_speed")
  int64_t peak_activation_bytes_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_pipeline_strategy(const StrategyContext& context) {
  return std::make_unique<PipelineStrategy>(context);
}

}  // namespace paratrain::train::strategies
