// The training loop. Per step: train.accumulate micro-batches of
// strategy.forward_backward (forward, loss, backward; the last one with the
// strategy's gradient reduction), strategy.optimizer_step (clip, step,
// re-gather). Per epoch: evaluate, log, checkpoint. Everything about data and
// metrics goes over the data-parallel group.
#include "paratrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <mutex>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor_watchdog.h"
#include "paratrain/comm/recording_group.h"
#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/models/model.h"
#include "paratrain/optim/lr_schedule.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/batch_items.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/checkpoint/checkpoint_files.h"
#include "paratrain/train/checkpoint/sharded.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/device_placement.h"
#include "paratrain/train/in_job.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/metrics.h"
#include "paratrain/train/objective.h"
#include "paratrain/train/precision.h"
#include "paratrain/train/progress.h"
#include "paratrain/train/run_dir.h"
#include "paratrain/train/strategy_registry.h"
#include "paratrain/train/tensorboard.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

using Clock = std::chrono::steady_clock;

namespace {

// Thrown by the fit loop's redo_on_failure when an in-job recovery inside an
// evaluation or a checkpoint save rolled the survivors back to a checkpoint:
// the epoch loop catches it and goes on from the restored position.
struct RollbackCaught {};

// Rank 0 picks the run's version folder (run_dir.h) and tells the others,
// so every rank writes into the same one even without a shared filesystem
// listing. Collective over `world`.
std::filesystem::path prepare_run_dir(const TrainConfig& config, comm::ProcessGroup& world,
                                      std::chrono::milliseconds timeout) {
  std::filesystem::path dir;
  std::string error;
  int64_t version = -1;
  if (world.rank() == 0) {
    try {
      dir = create_run_dir(config);
      version = *parse_version_name(dir.filename().string());
    } catch (const ConfigError& e) {
      error = e.what();
    }
  }
  if (world.size() > 1) {
    auto t = torch::tensor({version}, torch::kLong);
    world.broadcast(t, 0)->wait(timeout);
    version = t.item<int64_t>();
  }
  if (world.rank() == 0 && !error.empty()) throw ConfigError(error);
  if (version < 0) {
    throw ConfigError(fmt::format("rank {}: rank 0 could not create the run directory under {}; see its log",
                                  world.rank(), config.run.output_dir));
  }
  return version_dir(std::filesystem::path(config.run.output_dir) / config.run.name, version);
}

// Every rank must start from the same position, or they would issue
// different numbers of collectives and hang: catches ranks that resumed from
// different checkpoints (no shared filesystem) or none. Collective.
void check_ranks_agree_on_position(comm::ProcessGroup& world, int64_t step, const data::LoaderState& loader,
                                   std::chrono::milliseconds timeout) {
  if (world.size() == 1) return;
  auto mine = torch::tensor({static_cast<double>(step), static_cast<double>(loader.epoch),
                             static_cast<double>(loader.next_batch)}, torch::kDouble);
  auto lo = mine.clone();
  auto hi = mine.clone();
  world.all_reduce(lo, comm::ReduceOp::kMin)->wait(timeout);
  world.all_reduce(hi, comm::ReduceOp::kMax)->wait(timeout);
  if (!torch::equal(lo, hi)) {
    throw CheckpointError(fmt::format(
        "rank {}: ranks start from different positions (step {} to {}); every rank must resume from the "
        "same checkpoint: put the run directory on a shared filesystem or pass train.resume=<path> "
        "readable by all ranks",
        world.rank(), lo[0].item<int64_t>(), hi[0].item<int64_t>()));
  }
}

// True on every rank when `ok` is true on every rank. Collective.
bool all_ranks(comm::ProcessGroup& world, bool ok, std::chrono::milliseconds timeout) {
  auto flag = torch::tensor({ok ? 1 : 0}, torch::kInt);
  world.all_reduce(flag, comm::ReduceOp::kMin)->wait(timeout);
  return flag.item<int>() == 1;
}

// Optimizer steps of the whole run: whole steps per epoch (an incomplete
// accumulation group is dropped, Note [Accumulation]) over train.epochs,
// capped by train.max_steps.
int64_t planned_steps(const TrainConfig& c, int64_t steps_per_epoch) {
  const int64_t all = steps_per_epoch * c.train.epochs;
  return c.train.max_steps > 0 ? std::min(c.train.max_steps, all) : all;
}

bool parameters_finite(Strategy& strategy) {
  torch::NoGradGuard no_grad;
  for (const auto& slot : strategy.model_slots()) {
    if (at::isFloatingType(slot.local.scalar_type()) && !slot.local.isfinite().all().item<bool>()) return false;
  }
  return true;
}

// Loads the first candidate that every rank can load (train.resume = "auto"
// falls back from a corrupt newest checkpoint to the previous one); a
// checkpoint that some rank cannot read is skipped by all ranks together.
// Returns the position, or nullopt when there was nothing to resume.
std::optional<LoopPosition> resume(Trainer::State& s) {
  const auto candidates = resume_candidates(s.config, s.run_dir);
  if (candidates.empty()) {
    if (s.config.train.resume == "auto" && s.is_main()) {
      spdlog::info("train.resume = auto: no complete checkpoint in {}; starting fresh",
                   (s.run_dir / "checkpoints").string());
    }
    return std::nullopt;
  }
  std::string last_error;
  for (const auto& path : candidates) {
    std::optional<LoopPosition> position;
    try {
      position = load_training_checkpoint(path, *s.strategy, *s.optimizer, s.scaler.get());
    } catch (const CheckpointError& e) {
      last_error = e.what();
    }
    if (!all_ranks(*s.world, position.has_value(), s.timeout())) {
      if (s.config.train.resume != "auto") {
        throw CheckpointError(last_error.empty()
                                  ? fmt::format("rank {}: another rank could not load {}; see its log",
                                                s.world->rank(), path.string())
                                  : last_error);
      }
      spdlog::warn("rank {}: skipping checkpoint {}: {}", s.world->rank(), path.string(),
                   last_error.empty() ? "another rank could not load it" : last_error);
      // Every rank is past reading it (the collective above). Keep it for a
      // post-mortem, out of the way of the step the continued run will save.
      if (s.is_main()) quarantine_checkpoint(path);
      continue;
    }
    if (!all_ranks(*s.world, parameters_finite(*s.strategy), s.timeout())) {
      throw CheckpointError(fmt::format(
          "checkpoint {} holds non-finite (NaN or inf) parameters: training from it cannot recover. "
          "Resume from an earlier checkpoint (train.resume=<path>) or lower the learning rate",
          path.string()));
    }
    if (s.is_main()) {
      spdlog::info("resumed from {} at epoch {}, batch {}, step {}", path.string(), position->epoch + 1,
                   position->next_batch, position->step);
    }
    return position;
  }
  throw CheckpointError(fmt::format("train.resume = auto: no checkpoint in {} could be loaded (last error: {}); "
                                    "set train.resume = \"\" and pick another run.name to start fresh",
                                    (s.run_dir / "checkpoints").string(), last_error));
}

// The callbacks the config asks for (callbacks.h), in the order they run.
void add_builtin_callbacks(Trainer::State& s) {
  const auto& t = s.config.train;
  if (!t.monitor.empty()) {
    s.callbacks.push_back(std::make_shared<BestCheckpoint>(t.monitor, t.mode, t.min_delta));
    if (t.patience > 0) s.callbacks.push_back(std::make_shared<EarlyStopping>(t.monitor, t.mode, t.patience, t.min_delta));
  }
  if (s.config.log.tensorboard) s.callbacks.push_back(std::make_shared<TensorBoardLogger>());
  s.progress_bar = progress_bar_wanted(s.config.log, s.world->rank());
  if (s.progress_bar) s.callbacks.push_back(std::make_shared<ProgressBar>());
}

std::string host_name() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return host;
}

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

Trainer::Trainer(TrainConfig config, comm::ProcessGroup& world) {
  validate_config(config);
  auto dir = prepare_run_dir(config, world, std::chrono::seconds(config.world.timeout_s));
  // The hang doctor's dumps (SIGUSR1, a collective timeout, `paratrain
  // doctor --run`) land in the run: <run_dir>/doctor/rank-<r>.json.
  if (auto recorder = comm::recorder_of(world)) comm::announce_doctor_dir(*recorder, dir / "doctor");
  s_ = std::make_unique<State>(std::move(config), world, std::move(dir));
  auto& s = *s_;
  const auto& c = s.config;

  const auto dims = topology::ParallelDims::resolve(c.parallel.dp, c.parallel.tp, c.parallel.pp, c.parallel.cp,
                                                    world.size());
  s.mesh = std::make_unique<topology::DeviceMesh>(world, dims);
  s.device = training_device(c, train::strategy_name(c));
  s.strategy = make_strategy(train::strategy_name(c), StrategyContext{s.config, *s.mesh, s.timeout(), s.run_dir});

  // The same seed on every rank: each builds the single-process model's
  // initial weights (replicas are also broadcast from rank 0).
  s.strategy->build_model(seeded_model_factory(c, s.device));
  // LARS/LAMB: the full dims of sharded pieces and the reducer of their norms.
  const bool layerwise_kind = c.optimizer.kind == "lars" || c.optimizer.kind == "lamb";
  const LayerwiseParams layerwise = layerwise_kind ? s.strategy->layerwise_params() : LayerwiseParams{};
  s.optimizer = make_optimizer(c.optimizer, s.strategy->optimizer_params(), layerwise.full_dims,
                               layerwise.norm_reducer);
  s.scaler = make_grad_scaler(c.precision);
  s.datasets = load_datasets(c);

  const DataShard shard = s.strategy->data_shard();
  s.batch = resolve_batch_sizes(c, shard.size);
  data::SamplerOptions sampler;
  sampler.num_replicas = shard.size;
  sampler.rank = shard.rank;
  sampler.shuffle = c.data.shuffle;
  sampler.seed = static_cast<uint64_t>(c.run.seed);
  sampler.drop_last = c.data.drop_last;
  data::LoaderOptions loader;
  loader.batch_size = s.batch.per_rank;
  loader.drop_last = c.data.drop_last;
  loader.prefetch_depth = static_cast<int>(c.data.prefetch);
  s.loader = std::make_unique<data::Loader>(
      s.datasets.train, data::DistributedSampler(s.datasets.train.size(), sampler), loader);
  const int64_t steps_per_epoch = s.loader->num_batches() / s.batch.accumulate;
  check_batches_fit(c, s.batch, s.datasets.train.size(), steps_per_epoch);
  s.lr_schedule.emplace(make_lr_schedule(c, s.batch, steps_per_epoch, planned_steps(c, steps_per_epoch)));

  // Resume before writing anything: a bad checkpoint must fail the run
  // without touching the run directory.
  // Leftovers of an interrupted save are removed before any rank lists the
  // checkpoints (the barrier), and never while a save could be running.
  if (!c.train.resume.empty()) {
    if (s.is_main()) clean_interrupted_checkpoints(s.run_dir);
    world.barrier()->wait(s.timeout());
  }
  if (auto position = resume(s)) {
    s.step = position->step;
    // Note [Resuming at another world size]
    // A checkpoint records the epoch's consumed positions (the sampler's
    // permutation trained so far: first_position + next_batch x per-rank batch
    // x replicas). When this run's ranks and batch reach the same place in
    // whole batches, the batch count resumes as before; otherwise (a world
    // size or per-rank batch that changed since: an elastic restart at a new
    // size without elastic.keep_global_batch, or after an in-job recovery)
    // the loader starts the rest of the epoch at that position, split over
    // this run's ranks, so no sample is skipped or repeated.
    const int64_t per_step_now = s.loader->options().batch_size * s.loader->sampler().options().num_replicas;
    if (position->consumed_positions > 0 && position->consumed_positions != position->next_batch * per_step_now) {
      if (position->consumed_positions >= s.loader->sampler().dataset_size()) {
        // Saved at its epoch's end: end this split's epoch there too.
        s.loader->load_state({position->epoch, 0});
        s.loader->load_state({position->epoch, s.loader->num_batches()});
      } else {
        s.loader->load_state({position->epoch, 0, position->consumed_positions});
      }
    } else {
      s.loader->load_state({position->epoch, position->next_batch});
    }
  } else if (c.train.resume.empty() && !list_checkpoints(s.run_dir).empty()) {
    throw ConfigError(fmt::format("the run directory {} already holds checkpoints of an earlier run; set "
                                  "train.resume=auto to continue it, or run.version=-1 to start a new version",
                                  s.run_dir.string()));
  }
  s.start_step = s.step;
  check_ranks_agree_on_position(world, s.step, s.loader->state(), s.timeout());
  s.checkpointer = std::make_unique<TrainingCheckpointer>(c, world);  // collective with train.async_checkpoint

  if (s.is_main()) {
    write_file_atomically(s.run_dir / "config.toml", to_toml(c));
    // The whole model's count: a pipeline stage or a shard holds only part.
    const int64_t numel = parameter_count(c);
    spdlog::info("run {}: {} ranks = {}, strategy {} on {}, model {} ({} parameters), {} train / {} test items, "
                 "global batch {} ({} per dp rank x {} dp x {} accumulated micro-batches)",
                 s.run_dir.string(), world.size(), dims.describe(), s.strategy->name(), s.device.str(), c.model.kind, numel,
                 s.datasets.train.size(), s.datasets.test.size(), s.batch.global, s.batch.per_rank, shard.size,
                 s.batch.accumulate);
    spdlog::info("{} (optimizer.lr = {:g} is the base rate; {} steps, {} per epoch)", s.lr_schedule->describe(),
                 c.optimizer.lr, planned_steps(c, steps_per_epoch), steps_per_epoch);
  }
  add_builtin_callbacks(s);
}

Trainer::~Trainer() = default;

std::shared_ptr<torch::nn::Module> Trainer::model() const { return s_->strategy->module(); }

std::vector<std::pair<std::string, at::Tensor>> Trainer::full_parameters() { return s_->strategy->full_parameters(); }

std::string Trainer::strategy_name() const { return s_->strategy->name(); }

torch::optim::Optimizer& Trainer::optimizer() { return *s_->optimizer; }

void Trainer::enable_in_job_recovery(std::shared_ptr<comm::Rejoiner> rejoiner) {
  s_->rejoiner = std::move(rejoiner);
}

void Trainer::add_callback(std::shared_ptr<Callback> callback) { s_->callbacks.push_back(std::move(callback)); }

std::filesystem::path Trainer::run_dir() const { return s_->run_dir; }

TrainResult Trainer::fit() {
  auto& s = *s_;
  if (s.config.elastic.in_job && !s.rejoiner) {
    throw ConfigError("elastic.in_job = true, but this Trainer has no store to re-form the world in: call "
                      "Trainer::enable_in_job_recovery() (paratrain train does), or set elastic.in_job = false");
  }
  if (s.is_main()) {
    update_run_status(s.run_dir, {{"status", "running"}, {"host", host_name()}, {"pid", ::getpid()},
                                  {"started", unix_time()}, {"world_size", s.world->size()},
                                  {"strategy", s.strategy->name()}, {"version", s.run_dir.filename().string()}});
  }
  try {
    TrainResult r = fit_loop();
    if (s.is_main()) {
      nlohmann::json done = {{"status", "finished"}, {"ended", unix_time()}, {"steps", r.steps},
                             {"stopped_early", r.stopped_early}};
      if (r.test.count > 0) done["test"] = {{"loss", r.test.loss}, {"accuracy", r.test.accuracy}};
      update_run_status(s.run_dir, done);
    }
    return r;
  } catch (const std::exception& e) {
    if (s.is_main()) {
      try {
        update_run_status(s.run_dir, {{"status", "failed"}, {"ended", unix_time()}, {"steps", s.step},
                                      {"error", e.what()}});
      } catch (const std::exception&) {
        // The original error matters more than a status file that failed too.
      }
    }
    throw;
  }
}

EvalResult Trainer::evaluate() {
  auto& s = *s_;
  torch::NoGradGuard no_grad;
  auto module = s.strategy->module();
  module->eval();
  const auto& test = s.datasets.test;
  const DataShard shard = s.strategy->data_shard();
  // Strided share without padding, so every test item counts exactly once.
  // A rank that trains no data (a parameter server) evaluates none either.
  auto rows = shard.computes ? torch::arange(shard.rank, test.size(), shard.size, torch::kLong)
                             : torch::empty({0}, torch::kLong);
  const Objective objective = Objective::for_config(s.config);
  EvalSums sums;
  const int64_t chunk = objective.eval_rows_per_chunk();
  // Every rank runs the same number of forwards: FSDP's forward is
  // collective, and strided shares differ by at most one row.
  const int64_t most_rows = (test.size() + shard.size - 1) / shard.size;
  const int64_t rounds = (most_rows + chunk - 1) / chunk;
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t i = r * chunk;
    auto idx = rows.slice(0, std::min(i, rows.numel()), std::min(i + chunk, rows.numel()));
    auto batch = to_device(data::gather(test, idx), s.device);
    auto logits = s.strategy->eval_forward(batch.inputs);
    if (idx.numel() == 0) continue;
    const EvalSums part = objective.eval_sums(logits, batch.targets);
    sums.loss += part.loss;
    sums.correct += part.correct;
    sums.count += part.count;
  }
  auto totals = torch::tensor({sums.loss, sums.correct, sums.count}, torch::kDouble);
  s.dp().all_reduce(totals, comm::ReduceOp::kSum)->wait(s.timeout());
  module->train();
  EvalResult r;
  r.count = static_cast<int64_t>(totals[2].item<double>());
  r.loss = totals[0].item<double>() / std::max<int64_t>(r.count, 1);
  r.accuracy = totals[1].item<double>() / std::max<int64_t>(r.count, 1);
  if (objective.language_model()) r.perplexity = std::exp(r.loss);
  return r;
}

TrainResult Trainer::fit_loop() {
  auto& s = *s_;
  const auto& c = s.config;
  TrainResult result;
  result.run_dir = s.run_dir;
  result.global_batch = s.batch.global;

  // A resumed run does not rewrite the checkpoint it started from.
  int64_t saved_step = s.start_step > 0 ? s.start_step : -1;
  // With train.async_checkpoint a checkpoint is complete only when the next
  // save (or the end of fit) has waited for its background write; what
  // needs it on disk (the log line, callbacks, pruning) runs then.
  auto committed = [&](const SavedCheckpoint& done) {
    result.last_checkpoint = done.dir;
    if (s.is_main()) spdlog::info("checkpoint {} ({})", done.dir.string(), done.why);
    // Before pruning: the best checkpoint's link must be in place to be spared.
    s.each_callback([&](Callback& cb) { cb.on_checkpoint(done.step, done.dir); });
    if (s.is_main() && c.train.keep_checkpoints > 0) prune_checkpoints(s.run_dir, c.train.keep_checkpoints);
  };
  // elastic.in_job: a CommError inside `op` (a rank died in an evaluation
  // or a synchronous save) re-forms the world and redoes `op` on it; set
  // below, once the loop's recount exists. Without it, `op` runs once.
  std::function<void(RecoveryPhase, const std::function<void()>&)> redo_on_failure =
      [](RecoveryPhase, const std::function<void()>& op) { op(); };
  auto save = [&](const std::string& why) {
    if (s.step == saved_step) return;
    saved_step = s.step;
    std::optional<SavedCheckpoint> done;
    // Redone at the new world size after a recovery: the failed attempt left
    // no index.json (written last), so it is never loaded, and rank 0 clears
    // its directory first (sharded_writer.cpp).
    redo_on_failure(RecoveryPhase::kCheckpoint, [&] {
      auto st = s.loader->state();
      done = s.checkpointer->save(s.run_dir, c, *s.strategy, *s.optimizer,
                                  {.step = s.step, .epoch = st.epoch, .next_batch = st.next_batch,
                                   .consumed_positions = consumed_positions(
                                       st, s.loader->options().batch_size, s.loader->sampler().options().num_replicas)},
                                  s.scaler.get(), why);
    });
    if (done) committed(*done);
  };
  const Objective objective = Objective::for_config(c);
  const LossFn loss_fn = scaled_loss(objective.loss(), s.scaler.get());

  // Note [Accumulation]
  // One optimizer step = k = train.accumulate micro-batches from the loader.
  // Each micro-batch loss is divided by k, so the summed gradients are the
  // mean over the k-times larger batch, and the last backward (sync) reduces
  // that sum across ranks: the step equals one step on the whole batch. An
  // epoch's last batches that do not fill a step are dropped, so every step
  // sees the same number of examples and the loader stands at a multiple of
  // k at every step boundary, where checkpoints are taken.
  // Not const: an in-job recovery with elastic.keep_global_batch may change it.
  int64_t k = s.batch.accumulate;
  const LossFn micro_loss = [&loss_fn, &k](const at::Tensor& o, const at::Tensor& t) {
    return k == 1 ? loss_fn(o, t) : loss_fn(o, t) / static_cast<double>(k);
  };
  // Not const: an in-job recovery changes the world size, and with it the
  // batches of an epoch, the global batch and the steps left.
  int64_t batches = s.loader->num_batches();
  int64_t steps_per_epoch = batches / k;
  int64_t global_batch = s.batch.global;
  int64_t total_steps = planned_steps(c, steps_per_epoch);
  // After an in-job recovery (or a resume from a checkpoint saved after one)
  // the loader splits the rest of the epoch over the survivors: recount the
  // batches, the global batch and the steps left from there.
  auto recount = [&](int64_t epoch) {
    k = s.batch.accumulate;
    batches = s.loader->num_batches();
    global_batch = s.batch.global;
    const int64_t full_epoch =  // the next epochs' batches at this size
        data::Loader(s.datasets.train, data::DistributedSampler(s.datasets.train.size(), s.loader->sampler().options()),
                     s.loader->options()).num_batches();
    steps_per_epoch = full_epoch / k;
    const int64_t planned = s.step + (batches - s.loader->state().next_batch) / k +
                            (c.train.epochs - epoch - 1) * steps_per_epoch;
    total_steps = c.train.max_steps > 0 ? std::min(c.train.max_steps, planned) : planned;
  };
  if (s.loader->state().first_position > 0) recount(s.loader->state().epoch);
  const auto start = Clock::now();
  const int64_t first_step = s.step;
  double window_loss = 0;
  int64_t window_steps = 0;
  bool stop = s.step >= total_steps;
  double applied_lr = s.lr_schedule->lr(s.step);
  s.strategy->module()->train();
  s.strategy->begin_run(std::max<int64_t>(total_steps - s.step, 0));
  const FitInfo fit_info{.run_dir = s.run_dir, .start_step = s.start_step, .total_steps = total_steps,
                         .steps_per_epoch = steps_per_epoch, .epochs = c.train.epochs,
                         .global_batch = global_batch, .is_main = s.is_main()};
  s.each_callback([&](Callback& cb) { cb.on_fit_start(fit_info); });

  // One "train" line and metrics.jsonl record (rank 0) for `info`.
  auto log_train = [&](const StepInfo& info) {
    auto st = s.strategy->last_stats();
    auto mem = s.strategy->memory(*s.optimizer);
    if (!s.progress_bar) {
      spdlog::info("epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s ETA {}", info.epoch + 1, c.train.epochs,
                   info.step, total_steps, info.loss, info.samples_per_s, format_duration(info.eta_s));
    }
    // samples and epoch_progress: the x axes of `paratrain plot`.
    const double progress = info.epoch + static_cast<double>(info.batch) / std::max<int64_t>(batches, 1);
    s.log_record({{"kind", "train"}, {"epoch", info.epoch}, {"step", info.step},
                  {"samples", info.step * global_batch}, {"epoch_progress", progress},
                  {"loss", info.loss}, {"samples_per_s", info.samples_per_s},
                  {"lr", info.lr}, {"comm_ms", st.comm_ms},
                  {"hidden_share", st.hidden_share}, {"param_bytes", mem.params},
                  {"grad_bytes", mem.grads}, {"optimizer_bytes", mem.optimizer_state}});
  };
  auto rate_and_eta = [&](StepInfo& info) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    info.samples_per_s = (info.step - first_step) * global_batch / std::max(elapsed, 1e-9);
    info.eta_s = (total_steps - info.step) * global_batch / std::max(info.samples_per_s, 1e-9);
  };

  // Note [Dynamic batch windows]
  // With Strategy::dynamic_batches (parameter servers, async) ranks take
  // different numbers of steps, so nothing may meet all ranks mid-epoch:
  // the epoch runs as windows ending where all ranks meet anyway (the
  // epoch's end, a checkpoint, train.max_steps). Inside a window each rank
  // trains the items the strategy hands it; a step's number is that of its
  // item (item / dp size), which every rank agrees on, and the learning
  // rate follows it. Mid-window log lines are rank 0's own loss (no
  // collective: a fast worker must not wait for a slowed one every
  // run.log_every steps); the window's end logs the mean over the ranks
  // that train. s.step and the loader's position jump to the window's end
  // on every rank, so evaluation, checkpoints and resume see the same
  // position as under fixed shares.
  const DataShard dp_shard = s.strategy->data_shard();
  const bool dynamic = s.strategy->dynamic_batches();
  auto run_dynamic_epoch = [&](int64_t epoch) {
    const EpochItems items(s.datasets.train.size(), s.loader->sampler().options(), epoch, s.batch.per_rank, k);
    const int64_t every = c.train.checkpoint_every_steps;
    while (batches - s.loader->state().next_batch >= k) {
      const int64_t first = s.loader->state().next_batch / k;  // steps of this epoch already taken
      int64_t steps = std::min(steps_per_epoch - first, total_steps - s.step);
      if (every > 0) steps = std::min(steps, every - s.step % every);
      s.strategy->begin_window(first, steps);
      const int64_t window_end = s.step + steps;
      double loss_sum = 0;
      int64_t own_steps = 0;
      int64_t logged_step = s.step;  // rank 0's last local line
      for (int64_t item = s.strategy->next_item(); item >= 0; item = s.strategy->next_item()) {
        const int64_t step_in_epoch = item / dp_shard.size;
        const int64_t step = s.step + step_in_epoch - first;  // from 0
        const double loss_scale = s.scaler ? s.scaler->get_scale() : 1.0;
        double step_loss = 0;
        for (int64_t i = 0; i < k; ++i) {
          // Servers train nothing: they get no rows.
          auto batch = dp_shard.computes ? to_device(data::gather(s.datasets.train, items.rows(item, i)), s.device)
                                         : data::Batch{};
          step_loss += s.strategy->forward_backward(batch, micro_loss, /*sync=*/i == k - 1).loss.item<double>();
        }
        applied_lr = s.lr_schedule->lr(step);
        optim::set_learning_rate(*s.optimizer, applied_lr);
        if (!s.strategy->optimizer_step(*s.optimizer, c.optimizer.clip_grad_norm, s.scaler.get())) {
          ++result.skipped_steps;
        }
        loss_sum += step_loss / loss_scale;
        ++own_steps;
        window_loss += step_loss / loss_scale;
        ++window_steps;
        StepInfo info{.step = step + 1, .total_steps = total_steps, .epoch = epoch, .epochs = c.train.epochs,
                      .batch = (step_in_epoch + 1) * k, .batches = batches, .lr = applied_lr};
        rate_and_eta(info);
        // The window's last step gets the line over all ranks below instead.
        if (s.is_main() && c.run.log_every > 0 && info.step >= logged_step + c.run.log_every &&
            info.step < window_end) {
          info.loss = window_loss / window_steps;
          log_train(info);
          logged_step = info.step;
          window_loss = 0;
          window_steps = 0;
        }
        s.each_callback([&](Callback& cb) { cb.on_train_batch_end(info); });
      }
      s.step += steps;
      s.loader->load_state({epoch, (first + steps) * k});
      auto mean = torch::tensor({dp_shard.computes ? loss_sum / std::max<int64_t>(own_steps, 1) : 0.0,
                                 dp_shard.computes ? 1.0 : 0.0}, torch::kDouble);
      s.dp().all_reduce(mean, comm::ReduceOp::kSum)->wait(s.timeout());
      result.last_train_loss = mean[0].item<double>() / mean[1].item<double>();
      if (!std::isfinite(result.last_train_loss)) {
        throw Error(fmt::format("rank {}: the training loss became {} by step {}: training diverged. Lower "
                                "optimizer.lr or set optimizer.clip_grad_norm; no checkpoint was written for this "
                                "state", s.world->rank(), result.last_train_loss, s.step));
      }
      StepInfo info{.step = s.step, .total_steps = total_steps, .epoch = epoch, .epochs = c.train.epochs,
                    .batch = s.loader->state().next_batch, .batches = batches, .lr = applied_lr,
                    .loss = result.last_train_loss};
      rate_and_eta(info);
      if (s.is_main()) log_train(info);
      window_loss = 0;
      window_steps = 0;
      if (every > 0 && s.step % every == 0) save("periodic");
      if (s.step >= total_steps) {
        stop = true;
        return;
      }
    }
  };

  // elastic.in_job: re-form the world without the dead rank and go on from
  // `resume_at` (in_job.h). True when the survivors rolled back to a
  // checkpoint (sharded strategies), which may lie in an earlier epoch:
  // `epoch` follows the loader.
  auto recover = [&](const data::LoaderState& resume_at, const CommError& e, int64_t& epoch,
                     RecoveryPhase phase = RecoveryPhase::kStep) {
    if (!s.rejoiner) throw;
    const Recovery r = recover_in_job(s, resume_at, e, phase);
    ++result.recoveries;
    if (r.rolled_back) saved_step = s.step;  // the redone steps' checkpoints are saved again
    epoch = s.loader->state().epoch;
    recount(epoch);
    window_loss = 0;
    window_steps = 0;
    return r.rolled_back;
  };
  // An evaluation is redone by the survivors rather than skipped: its figure
  // feeds train.monitor (best checkpoint, early stopping), and on a DDP
  // model it costs one pass over the test set. Both it and a save run at a
  // step boundary, so the loader's state is where every survivor stands.
  // After a rollback the operation belongs to undone steps: it is dropped,
  // and the epoch loop goes on from the restored checkpoint (RollbackCaught).
  redo_on_failure = [&](RecoveryPhase phase, const std::function<void()>& op) {
    for (;;) {
      try {
        op();
        return;
      } catch (const CommError& e) {
        int64_t at_epoch = s.loader->state().epoch;
        // Rethrows without elastic.in_job.
        if (recover(s.loader->state(), e, at_epoch, phase)) throw RollbackCaught{};
      }
    }
  };

  for (int64_t epoch = s.loader->state().epoch; epoch < c.train.epochs && !stop; ++epoch) {
    // A rollback inside an evaluation or a save (redo_on_failure) leaves the
    // loader at the restored checkpoint, maybe in an earlier epoch: go on there.
    try {
      if (epoch != s.loader->state().epoch ||
          (s.loader->state().next_batch == 0 && s.loader->state().first_position == 0)) {
        s.loader->set_epoch(epoch);
      }
      batches = s.loader->num_batches();
      if (dynamic) run_dynamic_epoch(epoch);
      while (!dynamic && batches - s.loader->state().next_batch >= k) {
        double step_loss = 0;  // the micro-batch losses are divided by k: their sum is the step's mean
        // The loss is scaled in backward (precision.loss_scale); logged unscaled.
        const double loss_scale = s.scaler ? s.scaler->get_scale() : 1.0;
        const data::LoaderState at_step = s.loader->state();
        try {
          for (int64_t i = 0; i < k; ++i) {
            auto batch = s.loader->next();
            if (!batch) {
              throw Error(fmt::format("rank {}: the loader ended epoch {} at batch {} of {}", s.world->rank(),
                                      epoch + 1, s.loader->state().next_batch, batches));
            }
            auto out = s.strategy->forward_backward(to_device(std::move(*batch), s.device), micro_loss,
                                                    /*sync=*/i == k - 1);
            step_loss += out.loss.item<double>();
          }
          applied_lr = s.lr_schedule->lr(s.step);  // steps count from 0
          optim::set_learning_rate(*s.optimizer, applied_lr);
          if (!s.strategy->optimizer_step(*s.optimizer, c.optimizer.clip_grad_norm, s.scaler.get())) {
            ++result.skipped_steps;
          }
        } catch (const CommError& e) {
          recover(at_step, e, epoch);  // rethrows without elastic.in_job
          continue;                    // redo the step
        }
        ++s.step;
        window_loss += step_loss / loss_scale;
        ++window_steps;

        const bool last = s.step >= total_steps;
        const bool checkpoint_now = c.train.checkpoint_every_steps > 0 && s.step % c.train.checkpoint_every_steps == 0;
        StepInfo info{.step = s.step, .total_steps = total_steps, .epoch = epoch, .epochs = c.train.epochs,
                      .batch = s.loader->state().next_batch, .batches = batches, .lr = applied_lr};
        rate_and_eta(info);
        if ((c.run.log_every > 0 && s.step % c.run.log_every == 0) || last || checkpoint_now) {
          // A collective on every dp rank: all ranks log at the same steps and
          // agree on whether the loss went non-finite.
          // Averaged over the ranks that train (not parameter servers).
          const bool computes = s.strategy->data_shard().computes;
          auto mean = torch::tensor({computes ? window_loss / window_steps : 0.0, computes ? 1.0 : 0.0},
                                    torch::kDouble);
          try {
            s.dp().all_reduce(mean, comm::ReduceOp::kSum)->wait(s.timeout());
          } catch (const CommError& e) {
            // Every survivor took this step (its gradient all-reduce needed
            // every rank): go on after it; this window's line is lost.
            const double own = window_loss / std::max<int64_t>(window_steps, 1);
            if (recover(s.loader->state(), e, epoch)) continue;  // rolled back: this step is undone
            mean = torch::tensor({own, 1.0}, torch::kDouble);
          }
          result.last_train_loss = mean[0].item<double>() / mean[1].item<double>();
          if (!std::isfinite(result.last_train_loss)) {
            throw Error(fmt::format(
                "rank {}: the training loss became {} by step {} (mean over steps {}..{}): training diverged. Lower "
                "optimizer.lr, set optimizer.clip_grad_norm, or resume from an earlier checkpoint; no checkpoint "
                "was written for this state",
                s.world->rank(), result.last_train_loss, s.step, s.step - window_steps + 1, s.step));
          }
          info.loss = result.last_train_loss;
          if (s.is_main()) log_train(info);
          window_loss = 0;
          window_steps = 0;
        }
        s.each_callback([&](Callback& cb) { cb.on_train_batch_end(info); });
        if (checkpoint_now) save("periodic");
        if (last) {
          stop = true;
          break;
        }
      }
      const bool epoch_done = batches - s.loader->state().next_batch < k;  // a partial step is dropped
      if (epoch_done) result.epochs_completed = epoch + 1;
      s.each_callback([&](Callback& cb) { cb.on_train_epoch_end(epoch); });
      bool evaluated = false;
      // A run that stops mid-epoch (train.max_steps) is evaluated too, so its
      // last state has a test figure.
      if (c.train.eval_every_epochs > 0 &&
          ((epoch_done && (epoch + 1) % c.train.eval_every_epochs == 0) || (stop && !epoch_done))) {
        redo_on_failure(RecoveryPhase::kEvaluation, [&] { result.test = evaluate(); });
        const double eval_progress =
            epoch + static_cast<double>(s.loader->state().next_batch) / std::max<int64_t>(batches, 1);
        if (s.is_main() && objective.language_model()) {
          spdlog::info("epoch {}/{} step {} val loss {:.4f} perplexity {:.2f} next-token accuracy {:.2f}% ({} tokens)",
                       epoch + 1, c.train.epochs, s.step, result.test.loss, result.test.perplexity,
                       100 * result.test.accuracy, result.test.count);
          s.log_record({{"kind", "eval"}, {"epoch", epoch}, {"step", s.step},
                        {"samples", s.step * global_batch}, {"epoch_progress", eval_progress},
                        {"test_loss", result.test.loss},
                        {"test_accuracy", result.test.accuracy}, {"perplexity", result.test.perplexity}});
        } else if (s.is_main()) {
          spdlog::info("epoch {}/{} test loss {:.4f} accuracy {:.2f}% ({} items)", epoch + 1, c.train.epochs,
                       result.test.loss, 100 * result.test.accuracy, result.test.count);
          s.log_record({{"kind", "eval"}, {"epoch", epoch}, {"step", s.step},
                        {"samples", s.step * global_batch}, {"epoch_progress", eval_progress},
                        {"test_loss", result.test.loss},
                        {"test_accuracy", result.test.accuracy}});
        }
        evaluated = true;
        EvalInfo eval{.step = s.step, .epoch = epoch,
                      .metrics = {{"test_loss", result.test.loss}, {"test_accuracy", result.test.accuracy},
                                  {"train_loss", result.last_train_loss}}};
        if (objective.language_model()) eval.metrics.emplace_back("perplexity", result.test.perplexity);
        s.each_callback([&](Callback& cb) { cb.on_validation_end(eval); });
      }
      // Callbacks decide on the same reduced values on every rank: no vote needed.
      bool stop_early = false;
      if (evaluated) s.each_callback([&](Callback& cb) { stop_early = stop_early || cb.should_stop(); });
      if (stop_early && !stop) {
        stop = true;
        result.stopped_early = true;
      }
      if (epoch_done && epoch + 1 < c.train.epochs && !stop) s.loader->set_epoch(epoch + 1);
      save(epoch_done ? fmt::format("end of epoch {}", epoch + 1) : "stop");
    } catch (const RollbackCaught&) {
      epoch = s.loader->state().epoch - 1;  // the loop's ++epoch lands on it
      stop = false;
    }
  }
  if (auto done = s.checkpointer->finish()) committed(*done);
  for (auto& record : s.strategy->final_metrics()) s.log_record(std::move(record));
  s.each_callback([&](Callback& cb) { cb.on_fit_end(s.step); });
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  result.steps = s.step;
  result.start_step = s.start_step;
  result.world_size = s.world->size();
  result.rank = s.world->rank();
  result.samples_per_second = (s.step - first_step) * global_batch / std::max(elapsed, 1e-9);
  result.loss_scale = s.scaler ? s.scaler->get_scale() : 1.0;
  return result;
}

}  // namespace paratrain::train
