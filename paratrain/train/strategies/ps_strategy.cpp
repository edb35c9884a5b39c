// The "ps" strategy (ps.servers > 0): parameter servers beside the SPMD loop.
// Every rank runs the Trainer's loop; on workers a step is forward, backward
// and a push/pull of the whole model, on servers it is one round of serving
// (param_server/server.h). Servers read no data and evaluate nothing
// (DataShard::computes), the global batch is split over the workers, and the
// servers' key ranges and optimizer state are what checkpoints hold.
// Pushes and replies travel as one message per bucket of a server's key
// ranges (Note [Parameter-server buckets] in param_server/bucket_plan.h).
// With ps.overlap each parameter's gradient hook hands its key ranges to
// their buckets as soon as backward has computed it and a complete bucket
// leaves at once (Note [Pushing from gradient hooks]), and the next forward
// waits for each layer's bucket just before the layer runs (Note [Pulling
// during the forward]). Under async the workers take the
// epoch's batches from a queue on server 0 (Note [Dynamic batches] in
// param_server/server.h; ps.dynamic_batches = false keeps fixed shares).
#include <torch/torch.h>

#include <chrono>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/phase.h"
#include "paratrain/models/model.h"
#include "paratrain/param_server/bucket_plan.h"
#include "paratrain/param_server/item_queue.h"
#include "paratrain/param_server/server.h"
#include "paratrain/param_server/straggler.h"
#include "paratrain/param_server/worker.h"
#include "paratrain/train/strategies/builtin.h"
#include "paratrain/train/strategies/common.h"
#include "paratrain/train/strategies/ps_layers.h"

namespace paratrain::train::strategies {
namespace {

namespace ps = paratrain::param_server;

class PsStrategy final : public DataParallelStrategy, public DynamicBatches {
 public:
  explicit PsStrategy(const StrategyContext& ctx)
      : DataParallelStrategy(ctx, "ps"), roles_(ps::Roles::for_world(dp_.size(), static_cast<int>(ctx.config.ps.servers))),
        mode_(ps::parse_mode(ctx.config.ps.mode)), push_dtype_(ps::parse_push_dtype(ctx.config.ps.push_dtype)) {
    const auto& c = config_.ps;
    if (c.slow_worker >= roles_.workers) {
      throw ConfigError(fmt::format("ps.slow_worker = {}: there are {} workers (ranks 0 to {}); pick one of them or "
                                    "-1",
                                    c.slow_worker, roles_.workers, roles_.workers - 1));
    }
    straggler_.pattern = ps::parse_slow_pattern(c.slow_pattern);
    if (straggler_.pattern == ps::SlowPattern::kRandom && c.slow_worker >= 0) {
      throw ConfigError(fmt::format("ps.slow_pattern = \"random\" slows every worker at random, but ps.slow_worker = "
                                    "{} names one: leave ps.slow_worker at -1, or use ps.slow_pattern = \"always\"",
                                    c.slow_worker));
    }
    straggler_.slow_worker = c.slow_worker;
    straggler_.slow_ms = c.slow_ms;
    straggler_.seed = static_cast<uint64_t>(config_.run.seed);
    straggler_.workers = roles_.workers;
  }

  std::string name() const override {
    return mode_ == ps::Mode::kSsp
               ? fmt::format("ps (ssp, staleness {}, {} servers, {} workers)", config_.ps.staleness, roles_.servers,
                             roles_.workers)
               : fmt::format("ps ({}, {} servers, {} workers)", ps::to_string(mode_), roles_.servers, roles_.workers);
  }

  void build_model(const ModelFactory& factory) override {
    model_ = factory();  // the same seed everywhere: every rank holds the same initial weights
    std::set<const void*> seen;  // a tied weight is one key range, under its first name
    for (const auto& item : model_->named_parameters()) {
      if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
      // Frozen: no key range, never pushed or pulled; every rank holds it
      // as drawn from run.seed (Note [What freezing saves]).
      if (!item.value().requires_grad()) continue;
      names_.push_back(item.key());
      params_.push_back(item.value());
    }
    std::vector<int64_t> numel, element_bytes;
    for (const auto& p : params_) {
      numel.push_back(p.numel());
      element_bytes.push_back(static_cast<int64_t>(p.element_size()));
    }
    plan_ = ps::plan_key_ranges(numel, element_bytes, roles_.servers);
    // Every rank plans the same buckets: the same model, layers and cap.
    layers_ = model_->layers();
    layer_pulls_ = first_reads(layers_, params_);
    buckets_ = ps::plan_buckets(plan_, layer_of_param(layer_pulls_, params_.size()), element_bytes,
                                config_.ps.bucket_kb * 1024);
    const bool layerwise = config_.optimizer.kind == "lars" || config_.optimizer.kind == "lamb";
    if (layerwise) {
      // Collective over the world: every rank names the same members.
      std::vector<int> servers;
      for (int s = 0; s < roles_.servers; ++s) servers.push_back(roles_.server_rank(s));
      server_group_ = dp_.new_subgroup(servers);
    }
    if (is_server()) {
      ps::ServerOptions options;
      options.mode = mode_;
      options.staleness = config_.ps.staleness;
      options.timeout = timeout_;
      options.push_dtype = push_dtype_;
      options.staleness_aware_lr = config_.ps.staleness_aware_lr;
      server_ = std::make_unique<ps::Server>(dp_, roles_, plan_, buckets_, params_, options);
    } else {
      worker_ = std::make_unique<ps::Worker>(dp_, roles_, plan_, buckets_, params_,
                                             ps::WorkerOptions{timeout_, push_dtype_});
      if (config_.ps.overlap) register_push_hooks();
    }
  }

  std::vector<at::Tensor> optimizer_params() override { return server_ ? server_->pieces() : std::vector<at::Tensor>{}; }

  LayerwiseParams layerwise_params() override {
    if (!server_) return {};
    return sharded_layerwise_params(*server_group_, *model_, piece_slots());
  }

  DataShard data_shard() const override {
    // Servers follow worker 0's sampler but never use its batches.
    if (is_server()) return {0, roles_.workers, false};
    return {dp_.rank(), roles_.workers, true};
  }

  void begin_run(int64_t steps) override {
    // Dynamic batches: each window says how many pushes come (begin_window).
    if (server_ && !dynamic_batches()) server_->expect_pushes(steps);
  }

  bool dynamic_batches() const override { return mode_ == ps::Mode::kAsync && config_.ps.dynamic_batches; }

  void begin_window(int64_t first_step, int64_t steps) override {
    if (server_) {
      server_->begin_window(roles_.workers * first_step, steps);
      next_step_ = first_step;
      end_step_ = first_step + steps;
      return;
    }
    items_.begin_window(dp_.rank(), roles_.workers, first_step, steps);
  }

  int64_t next_item() override {
    if (server_) return next_step_ < end_step_ ? roles_.workers * next_step_++ : -1;
    // The answer to the last push names one more item, or none: its first
    // range says, the rest may still be on the wire during the forward.
    bool last = false;
    const int64_t item = items_.next(worker_->assigned_item(), last);
    worker_->set_last_push(last);
    return item;
  }

  StepOutput forward_backward(const data::Batch& batch, const LossFn& loss_fn, bool sync) override {
    if (server_) return {torch::zeros({})};
    if (ps::is_slowed(straggler_, dp_.rank(), forwards_++)) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(straggler_.slow_ms));
    }
    at::Tensor loss;
    {
      PhaseScope phase(kPhaseForward);
      at::Tensor output;
      if (worker_->pull_pending() && config_.ps.overlap && !layers_.empty()) {
        output = forward_pulling(batch.inputs);
      } else {
        finish_pull();
        output = model_->forward(batch.inputs);
      }
      // Backward's hooks post the next step's receives: this pull must be done.
      finish_pull();
      loss = loss_fn(output, batch.targets);
    }
    PhaseScope phase(kPhaseBackward);
    // Hooks push only on the micro-batch that completes the gradient.
    push_from_hooks_ = sync && config_.ps.overlap;
    try {
      loss.backward();
    } catch (...) {
      push_from_hooks_ = false;
      throw;
    }
    push_from_hooks_ = false;
    accumulating_ = !sync;
    return {loss.detach()};
  }

  bool optimizer_step(torch::optim::Optimizer& optimizer, double, optim::GradScaler*) override {
    if (server_) {
      server_->serve_round(optimizer);
    } else {
      // The ranges the hooks did not send; with ps.overlap the answers are
      // waited for when the parameters are next needed (finish_pull), so the
      // servers step while this worker loads its next batch.
      if (config_.ps.overlap) {
        worker_->push();
      } else {
        worker_->push_pull();
      }
      model_->zero_grad();
      accumulating_ = false;
    }
    stale_ = true;
    return true;
  }

  std::shared_ptr<torch::nn::Module> module() const override {
    finish_pull();  // whoever reads the model sees the pulled parameters
    return model_;
  }

  at::Tensor eval_forward(const at::Tensor& inputs) override {
    finish_pull();
    // async / ssp replicas may lag the servers; sync replicas are current.
    if (stale_ && mode_ != ps::Mode::kSync) refresh();
    stale_ = false;
    return model_->forward(inputs);
  }

  std::vector<TensorSlot> model_slots() override {
    finish_pull();
    std::vector<TensorSlot> out;
    if (server_) {
      for (auto& [piece, slot] : piece_slots()) out.push_back(slot);
    } else {
      // A replica that loading fills; the servers write the parameters.
      for (size_t i = 0; i < params_.size(); ++i) {
        out.push_back(TensorSlot{names_[i], params_[i].sizes().vec(), 0, params_[i], false});
      }
    }
    auto frozen = frozen_parameter_slots(*model_, dp_.rank() == 0);
    out.insert(out.end(), frozen.begin(), frozen.end());
    auto buffers = buffer_slots(*model_, dp_.rank() == 0);
    out.insert(out.end(), buffers.begin(), buffers.end());
    return out;
  }

  std::vector<checkpoint::OptimizerSlot> optimizer_slots() override {
    std::vector<checkpoint::OptimizerSlot> out;
    if (server_) {
      for (auto& [piece, slot] : piece_slots()) out.push_back(checkpoint::OptimizerSlot{piece, slot});
    }
    return out;
  }

  std::vector<std::pair<std::string, std::string>> checkpoint_metadata() const override {
    return {{"ps.servers", std::to_string(roles_.servers)}, {"ps.mode", std::string(ps::to_string(mode_))},
            {"ps.workers", std::to_string(roles_.workers)}};
  }

  std::vector<std::pair<std::string, at::Tensor>> full_parameters() override {
    refresh();
    return clone_parameters(*model_);
  }

  // Each worker's staleness histogram: how many of its gradients were
  // computed on parameters that many optimizer steps old when applied.
  std::vector<nlohmann::json> final_metrics() override {
    // Fixed buckets so one all-gather carries every rank's (servers: zeros);
    // the last bucket counts everything at least that stale.
    finish_pull();  // its staleness is counted on arrival
    constexpr int64_t kBuckets = 64;
    // After the histogram's buckets: ranges pushed from hooks, after
    // backward, push bytes (what ps.overlap and ps.push_dtype did), forwards
    // that started with a pull due, ranges waited for after a layer ran, and
    // the same in messages (what ps.bucket_kb did): pushed from hooks, after
    // backward, replies received, replies waited for after a layer ran.
    constexpr int64_t kSlots = kBuckets + 9;
    auto mine = torch::zeros({kSlots}, torch::kLong);
    if (worker_) {
      for (const auto& [staleness, count] : worker_->staleness_histogram()) {
        mine[std::min(staleness, kBuckets - 1)] += count;
      }
      mine[kBuckets] = worker_->ranges_pushed_early();
      mine[kBuckets + 1] = worker_->ranges_pushed_late();
      mine[kBuckets + 2] = worker_->bytes_pushed();
      mine[kBuckets + 3] = forwards_pulling_;
      mine[kBuckets + 4] = ranges_pulled_in_forward_;
      mine[kBuckets + 5] = worker_->messages_pushed_early();
      mine[kBuckets + 6] = worker_->messages_pushed_late();
      mine[kBuckets + 7] = worker_->messages_pulled();
      mine[kBuckets + 8] = messages_pulled_in_forward_;
    }
    auto all = torch::empty({dp_.size() * kSlots}, torch::kLong);
    dp_.all_gather(all, mine)->wait(timeout_);
    std::vector<nlohmann::json> out;
    for (int w = 0; w < roles_.workers; ++w) {
      auto row = all.slice(0, w * kSlots, (w + 1) * kSlots);
      nlohmann::json histogram = nlohmann::json::object();
      int64_t n = 0, sum = 0, most = 0;
      for (int64_t b = 0; b < kBuckets; ++b) {
        const int64_t count = row[b].item<int64_t>();
        if (count == 0) continue;
        histogram[b == kBuckets - 1 ? fmt::format("{}+", b) : std::to_string(b)] = count;
        n += count;
        sum += b * count;
        most = b;
      }
      out.push_back({{"kind", "ps_staleness"}, {"worker", w}, {"rank", w}, {"mode", std::string(ps::to_string(mode_))},
                     {"staleness_bound", mode_ == ps::Mode::kSsp ? config_.ps.staleness : -1},
                     {"pushes", n}, {"mean", n > 0 ? static_cast<double>(sum) / n : 0.0}, {"max", most},
                     {"histogram", histogram}, {"ranges_pushed_in_backward", row[kBuckets].item<int64_t>()},
                     {"ranges_pushed_after_backward", row[kBuckets + 1].item<int64_t>()},
                     {"push_bytes", row[kBuckets + 2].item<int64_t>()}, {"push_dtype", config_.ps.push_dtype},
                     {"forwards_pulling", row[kBuckets + 3].item<int64_t>()},
                     {"ranges_pulled_in_forward", row[kBuckets + 4].item<int64_t>()},
                     {"bucket_kb", config_.ps.bucket_kb}, {"messages_per_step", buckets_.messages()},
                     {"push_messages_in_backward", row[kBuckets + 5].item<int64_t>()},
                     {"push_messages_after_backward", row[kBuckets + 6].item<int64_t>()},
                     {"pull_messages", row[kBuckets + 7].item<int64_t>()},
                     {"pull_messages_in_forward", row[kBuckets + 8].item<int64_t>()},
                     {"dynamic_batches", dynamic_batches()}});
    }
    return out;
  }

  ModelStateBytes memory(const torch::optim::Optimizer& optimizer) const override {
    ModelStateBytes m;
    m.params = tensor_bytes(server_ ? server_->pieces() : params_);
    m.grads = server_ ? 0 : tensor_bytes(grads_of(params_));
    m.optimizer_state = tensor_bytes(optimizer_state_tensors(optimizer));
    return m;
  }

 private:
  bool is_server() const { return roles_.is_server(dp_.rank()); }

  // Waits for the servers' answers to the last push, if still due. const
  // because module() is: the worker behind the pointer changes, as the
  // parameters it fills do.
  void finish_pull() const {
    if (worker_ && worker_->pull_pending()) worker_->pull();
  }

  // Note [Pushing from gradient hooks]
  // A leaf's tensor hook runs when backward has summed that parameter's
  // gradient for this backward, just before it is accumulated into .grad;
  // the parameters of the last layers are ready first, so their pushes
  // travel while backward computes the earlier layers. The hook hands the
  // gradient to its buckets (Note [Parameter-server buckets]); the hook
  // that completes a bucket sends it, so buckets leave in the order
  // backward completes them. The value pushed is
  // what .grad will hold: the hook's gradient, plus .grad when earlier
  // micro-batches accumulated into it (train.accumulate). A parameter whose
  // hook did not run (unused this step) is pushed by push_pull after
  // backward, from .grad or zeros: the servers always get every range, and
  // the messages are those of ps.overlap = false, only sent sooner. The
  // answers are waited for in finish_pull(), called by everything that
  // reads the parameters, so the result is that of push_pull() at the end
  // of the step, bit for bit.
  void register_push_hooks() {
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].register_hook([this, i](const at::Tensor& grad) {
        if (!push_from_hooks_) return;
        const auto& p = params_[i];
        worker_->push_tensor(static_cast<int>(i), accumulating_ && p.grad().defined() ? p.grad() + grad : grad);
      });
    }
  }

  // Note [Pulling during the forward]
  // LibTorch's C++ modules have no forward pre-hooks, but models::Model can
  // list its layers (Model::layers(): MLP, CNN, GPT, a program's Sequential), whose composition is
  // its forward. With ps.overlap and a pull due, the forward runs them one by
  // one and waits, just before each, for the answers holding the key ranges
  // of the parameters it is the first to read (its modules' and the tied
  // ones it `reads`; parameters no layer names, before the first:
  // first_reads() in ps_layers.h), so the later layers' parameters travel
  // while the earlier layers compute. The answers are one message per
  // bucket, cut along these layers (Note [Parameter-server buckets]): a
  // layer waits for at most one message per server, and where neighbouring
  // layers share a bucket the first of them waits for the others'
  // parameters too. The same layers compute on the same pulled values as
  // model->forward() after a whole pull, so the step is that of ps.overlap
  // = false bit for bit. A model without layers() waits for the whole pull
  // before its forward.
  at::Tensor forward_pulling(const at::Tensor& inputs) {
    ++forwards_pulling_;
    at::Tensor h = inputs;
    for (size_t k = 0; k < layers_.size(); ++k) {
      const int64_t due = worker_->ranges_due(), messages = worker_->messages_due();
      for (int tensor : layer_pulls_[k]) worker_->pull_tensor(tensor);
      // Answers waited for once an earlier layer has run: what overlapped.
      if (k > 0) {
        ranges_pulled_in_forward_ += due - worker_->ranges_due();
        messages_pulled_in_forward_ += messages - worker_->messages_due();
      }
      h = layers_[k].forward(h);
    }
    return h;
  }

  // Every rank's model gets the servers' current parameters. Collective.
  void refresh() {
    finish_pull();  // a late answer must not overwrite what the refresh brings
    ps::refresh_parameters(dp_, roles_, plan_, params_, server_ ? server_->pieces() : std::vector<at::Tensor>{},
                           timeout_);
  }

  // This server's pieces with the global element range each one is.
  std::vector<std::pair<at::Tensor, TensorSlot>> piece_slots() const {
    std::vector<std::pair<at::Tensor, TensorSlot>> out;
    const auto& ranges = server_->ranges();
    for (size_t i = 0; i < ranges.size(); ++i) {
      const auto& r = ranges[i];
      const auto& piece = server_->pieces()[i];
      out.emplace_back(piece, TensorSlot{names_[r.tensor], params_[r.tensor].sizes().vec(), r.begin, piece, true});
    }
    return out;
  }

  ps::Roles roles_;
  ps::Mode mode_;
  ps::PushDtype push_dtype_;
  ps::StragglerOptions straggler_;  // ps.slow_*: which forwards sleep
  int64_t forwards_ = 0;            // this worker's forward passes so far
  // ps.overlap: the model's layers and, per layer, the params_ it is the
  // first to read (Note [Pulling during the forward]); empty: whole pulls.
  std::vector<models::Layer> layers_;
  std::vector<std::vector<int>> layer_pulls_;
  int64_t forwards_pulling_ = 0;           // forwards run layer by layer with a pull due
  int64_t ranges_pulled_in_forward_ = 0;  // ranges waited for after a layer had run
  int64_t messages_pulled_in_forward_ = 0;  // and their bucket messages
  bool push_from_hooks_ = false;  // during the backward whose gradients are pushed
  bool accumulating_ = false;     // .grad holds earlier micro-batches' gradients
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;  // model order, tied weights once
  ps::KeyRangePlan plan_;
  ps::BucketPlan buckets_;  // which ranges share a message (ps.bucket_kb)
  std::shared_ptr<comm::ProcessGroup> server_group_;  // LARS/LAMB: per-tensor norms over the servers
  std::unique_ptr<ps::Server> server_;
  std::unique_ptr<ps::Worker> worker_;
  bool stale_ = false;
  // Dynamic batches (async): a worker's items; a server's rounds in the window.
  ps::ItemQueue items_;
  int64_t next_step_ = 0, end_step_ = 0;
};

}  // namespace

std::unique_ptr<Strategy> make_ps_strategy(const StrategyContext& context) {
  return std::make_unique<PsStrategy>(context);
}

}  // namespace paratrain::train::strategies
