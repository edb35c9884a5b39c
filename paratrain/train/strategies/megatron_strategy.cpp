// The "megatron" strategy (model.kind = "gpt" with parallel.tp > 1 or
// parallel.cp > 1): the GPT with tensor parallelism over the tp group, ring
// self-attention over the cp group, optionally Megatron-SP, and DDP or
// ZeRO-1/2 over every replica of a rank's shards (the dp x cp ranks with its
// tp and pp coordinates: replica_sync.h), or FSDP over them (zero.stage = 3,
// no stages). With parallel.pp > 1 the GPT is
// also cut into pipeline stages run by pipeline/'s executor and schedules
// (megatron_stages.h): the full dp x tp x pp x cp mesh.
// docs/notes/megatron.md explains which gradient is reduced over which group
// and why the update equals one process on the global batch.
// Not here: the model (models/parallel_gpt.h), the layers and collectives
// (tensor_parallel/, sequence_parallel/).
#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <map>
#include <set>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/phase.h"
#include "paratrain/models/parallel_gpt.h"
#include "paratrain/models/recompute.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/sequence_parallel/megatron_sp.h"
#include "paratrain/sequence_parallel/ring_attention.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/distill/sequence_window.h"
#include "paratrain/train/task.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"
#include "paratrain/train/strategies/megatron_freeze.h"
#include "paratrain/train/strategies/megatron_layerwise.h"
#include "paratrain/train/strategies/megatron_logits.h"
#include "paratrain/train/strategies/megatron_planned.h"
#include "paratrain/train/strategies/megatron_stages.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/train/strategies/pipeline_parts.h"
#include "paratrain/train/strategies/replica_sync.h"

namespace paratrain::train::strategies {
namespace {

namespace tpl = tensor_parallel;
using topology::Axis;

constexpr int64_t kVocab = kGptVocab;

class MegatronStrategy final : public Strategy, public CheckpointSlots, public Telemetry {
 public:
  explicit MegatronStrategy(const StrategyContext& ctx)
      : config_(ctx.config),
        tp_(ctx.mesh.group(Axis::kTp)),
        cp_(ctx.mesh.group(Axis::kCp)),
        dp_(ctx.mesh.group(Axis::kDp)),
        pp_(ctx.mesh.group(Axis::kPp)),
        mesh_(ctx.mesh),
        timeout_(ctx.timeout) {
    if (!builds_gpt(config_) && config_.parallel.tp_plan.empty()) {
      throw ConfigError(fmt::format("the megatron strategy (parallel.tp / parallel.cp) trains model.kind = "
                                    "\"gpt\", or another model by its parallel.tp_plan; got \"{}\" without a plan",
                                    config_.model.kind));
    }
    if (pp_.size() > 1) shape_ = pipeline_shape(config_, pp_.size(), dp_.size());
    // Collective over the world, like the mesh's own groups.
    replicas_ = ctx.mesh.new_joint_group({Axis::kDp, Axis::kCp});
  }

  std::string name() const override {
    return fmt::format("megatron ({}tp {}, cp {}, dp {}{}{}{})", planned() ? "parallel.tp_plan, " : "", tp_.size(),
                       cp_.size(), dp_.size(),
                       config_.parallel.megatron_sp ? ", megatron_sp" : "",
                       config_.zero.stage > 0 ? fmt::format(", zero {}", config_.zero.stage) : "",
                       pp_.size() > 1 ? fmt::format(", pp {} {}, {} micro-batches", pp_.size(),
                                                    config_.pipeline.schedule, shape_.microbatches)
                                      : "");
  }

  void build_model(const ModelFactory& factory) override {
    // The single-process GPT from the run's seed, then this rank's shards of
    // it: the same initial weights as one process.
    const auto full = factory();
    const std::set<std::string> frozen = frozen_names(*full);
    if (planned()) return build_planned(full, frozen);
    models::ParallelGptOptions o;
    o.gpt = {.vocab = kVocab,
             .seq_len = config_.model.seq_len,
             .layers = config_.model.layers,
             .d_model = config_.model.d_model,
             .heads = config_.model.heads,
             .dropout = config_.model.dropout,
             .moe_experts = config_.model.moe_experts,
             .moe_top_k = config_.model.moe_top_k,
             .moe_capacity_factor = config_.model.moe_capacity_factor,
             .moe_every = config_.model.moe_every};
    o.tp = tp_context();
    o.cp = &cp_;
    o.megatron_sp = config_.parallel.megatron_sp;
    o.seed = static_cast<uint64_t>(config_.run.seed);
    o.recompute = recompute_policy(config_);
    // The GPT as built (activation checkpointing is the ParallelGpt's own),
    // sharded in place: the shards stay on world.device.
    std::shared_ptr<models::Model> gpt = full;
    if (auto* recomputed = dynamic_cast<models::RecomputedModel*>(full.get())) gpt = recomputed->inner();
    gpt_ = std::make_shared<models::ParallelGpt>(gpt, o);
    keep_frozen(*gpt_, frozen);
    model_ = gpt_;
    layout_ = tpl::parameter_layout(*model_);
    module_ = model_;
    sp_params_ = trainable(gpt_->sequence_parallel_params());
    std::vector<std::shared_ptr<torch::nn::Module>> modules{model_};
    // parallel.ep on the whole model, the same on every rank (below, a stage
    // splits only its own layers).
    if (config_.parallel.ep > 1) moe::check_expert_parallel(*model_, dp_.size(), static_cast<int>(config_.parallel.ep));
    if (pp_.size() > 1) {
      stages_ = std::make_unique<MegatronStages>(config_, *gpt_, mesh_, shape_, timeout_);
      module_ = stages_->module();
      modules = stages_->chunks();
      // Megatron-SP: only this stage's LayerNorms and row-parallel biases.
      std::set<const void*> mine;
      for (const auto& p : module_->parameters()) mine.insert(p.unsafeGetTensorImpl());
      std::erase_if(sp_params_, [&](const at::Tensor& t) { return !mine.count(t.unsafeGetTensorImpl()); });
      model_.reset();  // the other stages' layers go
      gpt_.reset();
    }
    // parallel.ep: the MoE layers (whole on every tp rank) split their
    // experts over ep groups of dp (moe/expert_parallel.h); DDP leaves them
    // to it. In stages, those of this stage (Note [Experts in pipeline
    // stages] in pipeline_strategy.cpp); a stage without any splits nothing.
    if (config_.parallel.ep > 1 && (pp_.size() == 1 || !moe::find_moe_layers(*module_).empty())) {
      experts_ = std::make_unique<moe::ExpertParallel>(*module_, dp_, static_cast<int>(config_.parallel.ep), timeout_);
      for (const auto& item : module_->named_parameters()) {
        if (experts_->holds(item.value())) expert_names_.insert(item.key());
      }
    }
    sync_ = std::make_unique<ReplicaSync>(config_, modules, *replicas_, timeout_, experts_.get());
    name_sequence_parallel_params();
  }

  std::shared_ptr<torch::nn::Module> module() const override { return module_; }
  std::vector<at::Tensor> optimizer_params() override { return sync_->optimizer_params(); }
  // tp and cp peers read the same sequences: the sampler shards over dp only.
  DataShard data_shard() const override { return {dp_.rank(), dp_.size()}; }

  // LARS/LAMB: Note [LARS and LAMB across tensor-parallel shards].
  LayerwiseParams layerwise_params() override {
    return tensor_parallel_layerwise_params(sync_->named_optimizer_params(), layout_,
                                            sync_->sharded() ? replicas_.get() : nullptr, tp_,
                                            pipeline::stage_device(*module_), timeout_);
  }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) override {
    if (stages_) return pipeline_forward_backward(batch, loss_fn, sync);
    sync_->prepare_forward(0);
    // Back on at the end, also when forward or backward throws.
    struct SyncAgain {
      ReplicaSync& sync;
      ~SyncAgain() { sync.set_sync(0, true); }
    } sync_again{*sync_};
    sync_->set_sync(0, sync);
    // This cp rank's chunk of every sequence; the model adds the chunk's
    // positions. Each rank's loss is the mean over its chunk's tokens: the
    // mean of the cp ranks' losses is the batch mean (equal chunks), which is
    // why DDP's average over dp x cp gives the single-process gradient.
    at::Tensor loss;
    if (planned()) {
      // The plan's output is whole on every tp rank (its last split layer
      // gathers or reduces): the Trainer's loss applies as is.
      PhaseScope phase(kPhaseForward);
      const at::Tensor out = model_->forward(batch.inputs);
      // Before the loss: a layer run off its site leaves a split output.
      check_first_output(out);
      loss = loss_fn(out, batch.targets);
    } else if (whole_logits_loss()) {
      // Note [Distilling under tensor parallelism]
      // The LossFn (distillation.h) compares the student's whole logits
      // with the teacher's, which the teacher gives whole on every rank
      // (split over tp itself: teacher.h). The student's vocabulary columns
      // are gathered over tp with a backward that keeps this rank's columns:
      // every tp rank computes the same loss, and each shard gets its part of
      // the one-process gradient. Otherwise the vocabulary-parallel
      // cross-entropy below needs no whole logits (a mixture-of-experts
      // GPT's load-balancing losses get their gradient inside its MoE
      // layers: Note [Aux losses in backward] in moe/moe.h).
      // Under cp the loss covers this rank's chunk of the sequences (Note
      // [A loss over a sequence chunk]).
      const at::Tensor inputs = sequence_parallel::sequence_chunk(batch.inputs, 1, cp_);
      const at::Tensor targets = sequence_parallel::sequence_chunk(batch.targets, 1, cp_).to(at::kLong);
      PhaseScope phase(kPhaseForward);
      const at::Tensor logits = tpl::gather_from_region(model_->forward(inputs).contiguous(), tp_context());
      const SequenceWindowScope window = chunk_window(batch.inputs.size(1));
      loss = loss_fn(logits, targets);
    } else {
      const at::Tensor inputs = sequence_parallel::sequence_chunk(batch.inputs, 1, cp_);
      const at::Tensor targets = sequence_parallel::sequence_chunk(batch.targets, 1, cp_).to(at::kLong);
      PhaseScope phase(kPhaseForward);
      const at::Tensor logits = model_->forward(inputs);
      const at::Tensor ce = tpl::vocab_parallel_cross_entropy(logits, targets, tp_context());
      loss = ce * loss_factor(loss_fn);
    }
    PhaseScope phase(kPhaseBackward);
    loss.backward();
    if (sync) sync_->finish_backward(0);
    if (sync && experts_) experts_->reduce_gradients();
    if (sync) sum_sequence_parallel_grads();
    return {mean_over_cp(loss)};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double clip_grad_norm,
                      optim::GradScaler* scaler) override {
    // After the reductions gradients differ across tp (shards) and pp
    // (stages), and under ZeRO across replicas (pieces).
    sync_->finish_all();
    const bool skip =
        unscale_found_inf(scaler, grads_of(sync_->optimizer_params()), {&tp_, replicas_.get(), &pp_}, timeout_);
    if (!skip) {
      if (clip_grad_norm > 0) clip_global_norm(clip_grad_norm);
      sync_->step(optimizer);
    }
    // ZeRO clears its full gradients itself; a skipped ZeRO step is cleared
    // by the next prepare_forward().
    sync_->clear_gradients(optimizer);
    if (scaler) scaler->update();
    return !skip;
  }

  // Full logits on every rank of the replica, for the Trainer's sums: the
  // vocabulary columns gathered over tp, the sequence chunks over cp.
  // Under FSDP through its forward (the units freed after, a failed gather
  // rethrown).
  at::Tensor eval_forward(const at::Tensor& inputs) override {
    return sync_->eval_forward([&] { return eval_logits(inputs); });
  }

  // An empty share (the Trainer's last round) is empty on every rank of
  // this replica's tp and cp groups alike (they share the dp rank): skip
  // the collectives together. Not under FSDP, whose units are gathered on
  // touch, a collective over the replicas: there an empty share runs the
  // forward too.
  at::Tensor eval_logits(const at::Tensor& inputs) {
    if (planned()) {  // whole on every tp rank
      at::Tensor out = model_->forward(inputs);
      check_first_output(out);
      return out;
    }
    // A MoE layer's forward is collective over dp (its routing counts), so a
    // MoE GPT runs even an empty share (moe.h takes an empty round).
    if (inputs.size(0) == 0 && config_.model.moe_experts == 0 && !sync_->fully_sharded())
      return at::zeros({0, inputs.size(1), kVocab}, at::TensorOptions().device(inputs.device()));
    const at::Tensor chunk = sequence_parallel::sequence_chunk(inputs, 1, cp_);
    if (stages_) {
      // The last stage gathers the logits over its tp and cp groups, then
      // hands them to the other stages.
      at::Tensor logits = stages_->forward_only(chunk);
      if (logits.defined()) logits = gather_logits(logits);
      return from_last_stage(logits, {inputs.size(0), inputs.size(1), kVocab}, pp_, timeout_, inputs.device());
    }
    return gather_logits(model_->forward(chunk));
  }

  // Under FSDP the trainable parameters' slots are their pieces.
  std::vector<TensorSlot> model_slots() override { return sync_->model_slots(whole_slots(), writes_fn()); }

  // Under ZeRO each replica writes its pieces (disjoint) of what this tp
  // rank and stage writes: its shards, tp rank 0 the replicated tensors,
  // the first stage a tied tensor.
  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    return sync_->optimizer_slots(whole_slots(), writes_fn());
  }
  void after_load() override { sync_->after_load(); }

  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override {
    return {{"parallel.tp", std::to_string(tp_.size())},
            {"parallel.cp", std::to_string(cp_.size())},
            {"parallel.megatron_sp", config_.parallel.megatron_sp ? "true" : "false"},
            {"dp", std::to_string(dp_.size())},
            {"zero.stage", std::to_string(config_.zero.stage)},
            {"pipeline.stages", std::to_string(pp_.size())},
            {"pipeline.layer_bounds", stages_ ? fmt::format("{}", fmt::join(stages_->bounds(), ",")) : ""}};
  }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    if (pp_.size() == 1) {
      // This tp rank's tensors (FSDP: gathered over the replicas), then
      // gathered over tp.
      auto out = tpl::gather_full_tensors(sync_->module_parameters(), layout_, tp_context());
      return experts_ ? experts_->gather(out) : out;  // every expert, from the ep group
    }
    return staged_full_parameters();
  }

  SyncStats last_stats() const override { return sync_->stats(); }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    return sync_->memory({module_}, optimizer);
  }

 private:
  // The model's tensors whole (a tp shard with its segments), each
  // parameter's `local` the module's own.
  std::vector<TensorSlot> whole_slots() {
    std::vector<TensorSlot> out;
    // One rank of the replicas writes each shard, and tp rank 0 the tensors
    // every tp rank holds in full.
    const bool replica_writer = replicas_->rank() == 0;
    for (const auto& item : module_->named_parameters()) {
      const tpl::ShardSpec& spec = layout_[item.key()];
      // A tied copy (the last stage's wte) is written by the first stage;
      // an expert (parallel.ep) by its holder in ep group 0.
      const bool writer = expert_names_.count(item.key()) ? experts_->writes()
                                                          : replica_writer && !is_tied_copy(item.key());
      TensorSlot slot{item.key(), spec.full_shape, 0, item.value(), writer};
      if (spec.replicated()) {
        slot.write = writer && tp_.rank() == 0;
      } else {
        slot.segments = tpl::slot_segments(spec, tp_.rank(), tp_.size());
      }
      out.push_back(std::move(slot));
    }
    auto buffers = buffer_slots(*module_, replica_writer && tp_.rank() == 0);
    out.insert(out.end(), buffers.begin(), buffers.end());
    return out;
  }

  // What this tp rank and stage writes of a tensor (its replicas split
  // that further): its shards, tp rank 0 the replicated tensors, the first
  // stage a tied tensor.
  std::function<bool(const std::string&)> writes_fn() {
    return [this](const std::string& name) {
      return !is_tied_copy(name) && (!layout_[name].replicated() || tp_.rank() == 0);
    };
  }

  // In the single-process order, each from the first stage holding it
  // (this stage's experts first gathered over the ep group).
  std::vector<std::pair<std::string, at::Tensor>> staged_full_parameters() {
    std::map<std::string, at::Tensor> held;
    for (const auto& item : tpl::gather_full_parameters(*module_, tp_context())) held[item.key()] = item.value();
    if (experts_) {
      for (auto& [name, t] : experts_->gather(std::vector<std::pair<std::string, at::Tensor>>(held.begin(), held.end())))
        held[name] = t;
    }
    std::vector<StageParam> layout;
    for (const auto& [name, owner] : stages_->stage_of()) layout.push_back({name, layout_[name].full_shape, owner});
    return broadcast_stage_parameters(layout, held, pp_, timeout_);
  }

  // Megatron-SP under FSDP: the pieces are found by these names.
  void name_sequence_parallel_params() {
    std::set<const void*> sp;
    for (const auto& t : sp_params_) sp.insert(t.unsafeGetTensorImpl());
    for (const auto& item : module_->named_parameters())
      if (sp.count(item.value().unsafeGetTensorImpl())) sp_names_.insert(item.key());
  }

  tpl::TpContext tp_context() const { return {&tp_, timeout_}; }
  // A model other than the GPT, split by parallel.tp_plan.
  bool planned() const { return !config_.parallel.tp_plan.empty(); }
  // distill.teacher (teacher.h lays the teacher out: in stages at pp > 1,
  // else split over tp; whole sequences on every cp rank).
  bool distilling() const { return !config_.distill.teacher.empty(); }
  // This cp rank's positions of sequences `seq_len` long.
  SequenceWindowScope chunk_window(int64_t seq_len) const {
    return {sequence_parallel::chunk_offset(seq_len, cp_.rank(), cp_.size()), seq_len / cp_.size()};
  }
  // The Trainer's LossFn on gathered logits (Note [Distilling under tensor
  // parallelism]): it is more than the cross-entropy times a factor.
  bool whole_logits_loss() const { return distilling(); }

  // Note [A planned model's output] (megatron_planned.cpp), after the
  // first forward.
  void check_first_output(const at::Tensor& out) {
    if (sites_checked_) return;
    sites_checked_ = true;
    check_planned_output(*model_, out, tp_, timeout_);
  }

  void build_planned(const std::shared_ptr<models::Model>& full, const std::set<std::string>& frozen) {
    PlannedModel planned = plan_model(config_, full, frozen, tp_context());
    layout_ = std::move(planned.layout);
    sp_params_ = std::move(planned.sequence_parallel_params);
    model_ = std::move(planned.model);
    module_ = model_;
    sync_ = std::make_unique<ReplicaSync>(config_, std::vector<std::shared_ptr<torch::nn::Module>>{model_}, *replicas_,
                                          timeout_);
    name_sequence_parallel_params();
  }

  // clip_grad_norm_ over the whole model: squared norms of sharded gradients
  // are summed over tp, those of tensors every tp rank holds in full counted
  // once; gradients are the same on every replica after the reduction (under
  // ZeRO each replica holds disjoint pieces: summed over the replicas). With
  // pp, each stage's sum is added over pp, a tied copy counted once.
  void clip_global_norm(double max_norm) {
    at::NoGradGuard no_grad;
    // On the model's device: the gradients' squares add into it there, and
    // every rank's collectives below then agree on the device.
    at::Tensor sums = torch::zeros({2}, torch::TensorOptions().dtype(torch::kDouble).device(
                                            pipeline::stage_device(*module_)));  // sharded, replicated
    for (const auto& [name, g] : sync_->named_grads()) {
      if (!g.defined() || is_tied_copy(name) || expert_names_.count(name)) continue;
      sums[layout_[name].replicated() ? 1 : 0] += g.to(at::kDouble).pow(2).sum();
    }
    if (sync_->sharded() && replicas_->size() > 1) replicas_->all_reduce(sums, comm::ReduceOp::kSum)->wait(timeout_);
    at::Tensor total = sums.narrow(0, 0, 1).clone();
    if (tp_.size() > 1) tp_.all_reduce(total, comm::ReduceOp::kSum)->wait(timeout_);
    total += sums[1];
    // Each expert once: summed over its ep group, the same on every tp rank.
    if (experts_) total += experts_->grad_square_sum();
    if (pp_.size() > 1) pp_.all_reduce(total, comm::ReduceOp::kSum)->wait(timeout_);
    const double norm = std::sqrt(total.item<double>());
    // As torch::nn::utils::clip_grad_norm_: scale only when above the bound.
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1) sync_->scale_gradients(coef);
  }

  bool is_tied_copy(const std::string& name) const { return stages_ && stages_->is_copy(name); }

  // Megatron-SP: LayerNorms and row-parallel biases saw a part of the
  // sequence on each tp rank: their gradient is the sum over tp (after the
  // average over replicas; both are linear, so the order does not matter).
  // In place, so ZeRO-1's pieces (views of the full .grad) see the sums.
  // Under ZeRO-2 and FSDP the whole reduced gradients are gone: summed on
  // the pieces, which every tp rank cuts alike (Note [FSDP over
  // tensor-parallel shards]); ZeRO-1's pieces are views of the whole ones.
  void sum_sequence_parallel_grads() {
    if (!config_.parallel.megatron_sp) return;
    const bool on_pieces = sync_->fully_sharded() || config_.zero.stage == 2;
    const std::vector<at::Tensor> parts = on_pieces ? sync_->stepped_parts(sp_names_) : sp_params_;
    sequence_parallel::sync_sequence_parallel_grads(parts, {.group = &tp_, .seq_dim = 1, .timeout = timeout_});
  }

  // Reported: the mean over the whole sequences, as one process reports.
  at::Tensor mean_over_cp(const at::Tensor& loss) { return strategies::mean_over_cp(loss, cp_, timeout_); }
  at::Tensor gather_logits(const at::Tensor& part) { return strategies::gather_logits(part, tp_context(), cp_, timeout_); }

  // Note [The Trainer's loss under tensor parallelism] applies per
  // micro-batch: the last stage's loss is the vocab-parallel cross-entropy
  // of its logit columns times the LossFn's factor.
  // With cp, every stage takes this cp rank's chunk of the sequences (only
  // the first stage reads the tokens, only the last the targets).
  StepOutput pipeline_forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) {
    pipeline::MicrobatchLoss loss;
    if (whole_logits_loss()) {
      // The last stage's logits gathered over tp for the Trainer's loss, as
      // without stages (Note [Distilling under tensor parallelism]).
      loss = [this, &loss_fn](const at::Tensor& logits, const at::Tensor& targets) {
        return loss_fn(tpl::gather_from_region(logits.contiguous(), tp_context()), targets.to(at::kLong));
      };
    } else {
      const double factor = loss_factor(loss_fn);
      loss = [this, factor](const at::Tensor& logits, const at::Tensor& targets) {
        return tpl::vocab_parallel_cross_entropy(logits, targets.to(at::kLong), tp_context()) * factor;
      };
    }
    const at::Tensor inputs = sequence_parallel::sequence_chunk(batch.inputs, 1, cp_);
    const at::Tensor targets = sequence_parallel::sequence_chunk(batch.targets, 1, cp_);
    const SequenceWindowScope window = chunk_window(batch.inputs.size(1));
    const auto report = stages_->train_step(inputs, targets, loss, sync_->hooks(sync));
    // After the replicas' average (all three are sums: order is free).
    if (sync) {
      stages_->sum_tied_gradients();
      sum_sequence_parallel_grads();
      if (experts_) experts_->reduce_gradients();
    }
    // Reported with the factor, as without pp.
    return {mean_over_cp(from_last_stage(report.loss, {1}, pp_, timeout_, pipeline::stage_device(*module_)))};
  }

  TrainConfig config_;
  comm::ProcessGroup& tp_;
  comm::ProcessGroup& cp_;
  comm::ProcessGroup& dp_;
  comm::ProcessGroup& pp_;
  topology::DeviceMesh& mesh_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<comm::ProcessGroup> replicas_;  // dp x cp: the ranks holding this rank's shards
  std::shared_ptr<models::Model> model_;        // the GPT or the planned model (pp = 1)
  std::shared_ptr<models::ParallelGpt> gpt_;    // the GPT (pp = 1)
  bool sites_checked_ = false;                  // planned: check_sites_ran after the first forward
  torch::OrderedDict<std::string, tpl::ShardSpec> layout_;
  std::shared_ptr<torch::nn::Module> module_;  // the model, or this rank's stages (pp > 1)
  std::vector<at::Tensor> sp_params_;           // Megatron-SP: this rank's, summed over tp
  std::set<std::string> sp_names_;              // their names (FSDP sums their pieces)
  std::unique_ptr<ReplicaSync> sync_;          // DDP or ZeRO over replicas_
  std::unique_ptr<moe::ExpertParallel> experts_;  // parallel.ep > 1
  std::set<std::string> expert_names_;            // experts_'s parameters
  pipeline::ScheduleOptions shape_;             // pp > 1
  std::unique_ptr<MegatronStages> stages_;      // pp > 1
};

}  // namespace

std::unique_ptr<Strategy> make_megatron_strategy(const StrategyContext& context) {
  return std::make_unique<MegatronStrategy>(context);
}

}  // namespace paratrain::train::strategies
