// The Trainer: builds what a run needs from its config (mesh, strategy,
// model, optimizer, data, schedule), resumes (resume_run.h), records the
// run's status, evaluates; the loop itself is train/loop/fit_loop.h.
// Everything about data and metrics goes over the data-parallel group.
#include "paratrain/train/trainer.h"

#include "paratrain/models/gpt.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <tuple>
#include <utility>

#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/doctor_watchdog.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/atomic_file.h"
#include "paratrain/core/remove_tree.h"
#include "paratrain/core/error.h"
#include "paratrain/core/memory_meter.h"
#include "paratrain/core/phase.h"
#include "paratrain/core/process_state.h"
#include "paratrain/data/loader.h"
#include "paratrain/models/model.h"
#include "paratrain/optim/lr_schedule.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/device_placement.h"
#include "paratrain/train/loop/batch_shares.h"
#include "paratrain/train/loop/fit_loop.h"
#include "paratrain/train/loop/run_plan.h"
#include "paratrain/train/memory_plan.h"
#include "paratrain/train/run/metrics.h"
#include "paratrain/train/run/preemption.h"
#include "paratrain/train/task.h"
#include "paratrain/train/precision.h"
#include "paratrain/train/run/progress.h"
#include "paratrain/train/recovery/resume_run.h"
#include "paratrain/train/run/run_dir.h"
#include "paratrain/train/strategies/common.h"
#include "paratrain/train/strategies/strategy_registry.h"
#include "paratrain/train/run/tensorboard.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

namespace {

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

// The program's model's parameter count, from a copy drawn as the run drew
// its own (the same seed, so the global generator ends where it did).
int64_t program_model_size(Trainer::State& s) {
  int64_t n = 0;
  // A tied weight (a submodule registered twice) counts once.
  for (const auto& p : strategies::unique_parameters(*seeded_model_factory(s.config, c10::Device(c10::kCPU),
                                                                          s.model_builder)()))
    n += p.numel();
  return n;
}

// One training example's shape and dtype, where a pipeline cuts the model
// (and a staged teacher): the GPT's window of token ids, else the loaded
// data's example (a program's own data), else the config's built-in shape.
std::pair<std::vector<int64_t>, at::ScalarType> example_input(const Trainer::State& s) {
  const auto& c = s.config;
  if (builds_gpt(c) || !s.datasets.train.inputs.defined())
    return {model_input_shape(c), builds_gpt(c) ? at::kLong : at::kFloat};
  const auto& inputs = s.datasets.train.inputs;
  return {inputs.sizes().slice(1).vec(), inputs.scalar_type()};
}

// A program's own model is trained whole, cut into pipeline stages at a
// torch::nn::Sequential's children, or split by its tensor-parallel plan;
// context parallelism needs the GPT's ring attention.
void check_parts(const TrainConfig& c, const TrainerParts& parts) {
  const auto& p = c.parallel;
  if (parts.model && p.cp > 1) {
    throw ConfigError(fmt::format(
        "parallel.cp = {}: a program's own model (TrainerParts::model) has no ring attention to split the "
        "sequence with; context parallelism trains paratrain's GPT. Set parallel.cp = 1",
        p.cp));
  }
  // The config cannot tell a program's model from the built-in it names.
  if (!parts.model && p.megatron_sp && (c.model.kind == "mlp" || c.model.kind == "cnn")) {
    throw ConfigError(fmt::format("parallel.megatron_sp = true splits activations along a sequence, and "
                                  "model.kind = \"{}\" has none (its inputs are images): set "
                                  "parallel.megatron_sp = false",
                                  c.model.kind));
  }
  if (parts.model && p.tp > 1 && p.tp_plan.empty()) {
    throw ConfigError(fmt::format(
        "parallel.tp = {}: a program's own model (TrainerParts::model) is split by a plan: set parallel.tp_plan "
        "(\"PATTERN=STYLE\" entries naming its modules; docs/tensor-parallel-plans.md) and run its planned "
        "layers at their sites (paratrain/parallelize/sites.h), or set parallel.tp = 1",
        p.tp));
  }
}

}  // namespace

void build_model_and_optimizer(Trainer::State& s) {
  const auto& c = s.config;
  StrategyContext context{s.config, *s.mesh, s.timeout(), s.run_dir};
  std::tie(context.input_shape, context.input_dtype) = example_input(s);
  s.strategy = make_strategy(train::strategy_name(c), context);
  // The same seed on every rank: each builds the single-process model's
  // initial weights (replicas are also broadcast from rank 0).
  s.strategy->build_model(seeded_model_factory(c, s.device, s.model_builder, &s.frozen));
  // LARS/LAMB: the full dims of sharded pieces and the reducer of their norms.
  const bool layerwise_kind = c.optimizer.kind == "lars" || c.optimizer.kind == "lamb";
  const LayerwiseParams layerwise = layerwise_kind ? s.strategy->layerwise_params() : LayerwiseParams{};
  s.optimizer = make_optimizer(c.optimizer, s.strategy->optimizer_params(), layerwise.full_dims,
                               layerwise.norm_reducer);
  // A rebuild (in-job rollback, adaptive freezing) resets the scaler in
  // place: the loop's scaled loss (FitLoop::micro_loss_) points at it.
  auto scaler = make_grad_scaler(c.precision);
  if (s.scaler && scaler) {
    *s.scaler = *scaler;
  } else {
    s.scaler = std::move(scaler);
  }
}

namespace {

// Everything a run needs after its folder exists: mesh, strategy, model,
// optimizer, data, schedule, resume, the config's callbacks.
void build_run(Trainer::State& s, TrainerParts& parts) {
  const auto& c = s.config;
  s.model_builder = std::move(parts.model);
  s.task = parts.task ? std::move(parts.task) : task_for_config(c);

  const auto dims = topology::ParallelDims::resolve(c.parallel.dp, c.parallel.tp, c.parallel.pp, c.parallel.cp,
                                                    s.world->size());
  s.mesh = std::make_unique<topology::DeviceMesh>(*s.world, dims);
  s.device = training_device(c);
  s.datasets = parts.data ? parts.data(c) : load_datasets(c);  // first: a pipeline cuts at the examples' shape
  // `paratrain plan --measure`: the peak counts from here, the data excluded.
  if (core::memory_meter_installed()) core::begin_memory_window();
  build_model_and_optimizer(s);
  // A mixture-of-experts GPT routes over the whole step's batch: its layers
  // count slots and balance load over the data-parallel group (with
  // parallel.ep the strategy set it when it split the experts).
  if (c.model.moe_experts > 0 && c.parallel.ep == 1) {  // the GPT's (a program's own Moe is the program's to configure)
    for (const auto& [name, layer] : models::moe_layers(*s.strategy->module())) {
      layer->set_token_group(&s.dp(), s.timeout());
    }
  }
  if (!c.distill.teacher.empty()) {
    // Laid out like the student: sharded under FSDP, in stages under
    // pipelines, split over tp under tensor parallelism, whole on every rank
    // otherwise.
    TeacherPlacement placement;
    placement.device = s.device;
    placement.shard = train::strategy_name(c) == "fsdp";
    placement.dp = &s.dp();
    placement.pp = &s.mesh->group(Axis::kPp);
    placement.tp = &s.mesh->group(Axis::kTp);
    std::tie(placement.example_shape, placement.input_dtype) = example_input(s);
    placement.timeout = s.timeout();
    s.teacher = std::make_unique<Teacher>(find_teacher(c.distill.teacher, c), placement);
  }

  const DataShard shard = s.strategy->data_shard();
  s.batch = resolve_batch_sizes(c, shard.size);
  s.batch.shares = resolve_batch_shares(c, s.batch.per_rank, shard.size);
  s.loader = make_train_loader(s);
  const int64_t steps_per_epoch = s.loader->num_batches() / s.batch.accumulate;
  check_batches_fit(c, s.batch, s.datasets.train.size(), steps_per_epoch);
  s.lr_schedule.emplace(make_lr_schedule(c, s.batch, steps_per_epoch, planned_steps(c, steps_per_epoch)));

  resume_or_start(s);
  s.checkpointer = std::make_unique<TrainingCheckpointer>(c, *s.world);  // collective with train.async_checkpoint

  if (s.is_main()) {
    write_file_atomically(s.run_dir / "config.toml", to_toml(c));
    // The whole model's count: a pipeline stage or a shard holds only part.
    const int64_t numel = s.model_builder ? program_model_size(s) : parameter_count(c);
    spdlog::info("run {}: {} ranks = {}, strategy {} on {}, model {} ({} parameters), {} train / {} test items, "
                 "global batch {} ({} x {} accumulated micro-batches{})",
                 s.run_dir.string(), s.world->size(), dims.describe(), s.strategy->name(), s.device.str(),
                 s.model_builder ? "(the program's own)" : c.model.kind, numel,
                 s.datasets.train.size(), s.datasets.test.size(), s.batch.global,
                 s.batch.shares.empty()
                     ? fmt::format("{} per dp rank x {} dp", s.batch.per_rank, shard.size)
                     : fmt::format("dp ranks' shares [{}]", fmt::join(s.batch.shares, ", ")),
                 s.batch.accumulate, c.data.auto_shares() ? "; shares rebalanced by speed" : "");
    spdlog::info("{} (optimizer.lr = {:g} is the base rate; {} steps, {} per epoch)", s.lr_schedule->describe(),
                 c.optimizer.lr, planned_steps(c, steps_per_epoch), steps_per_epoch);
    if (s.teacher) {
      spdlog::info("distill: teacher {} ({}, {} parameters), distill.temperature = {:g}, distill.alpha = {:g}",
                   s.teacher->source().checkpoint.string(), s.teacher->source().config.model.kind,
                   s.teacher->parameter_count(), c.distill.temperature, c.distill.alpha);
    }
    if (c.train.activation_checkpointing != "none") {
      spdlog::info("activation checkpointing \"{}\"{}: {} keep only their inputs and run their forward again in "
                   "backward (gradients unchanged)",
                   c.train.activation_checkpointing,
                   c.train.activation_checkpointing == "every_k"
                       ? fmt::format(" (segments of {} layers)", c.train.checkpoint_every_k)
                       : "",
                   c.train.checkpoint_layers.empty()
                       ? std::string("every layer but the last")
                       : fmt::format("the layers matching [{}]", fmt::join(c.train.checkpoint_layers, ", ")));
    }
    if (!s.frozen.modules.empty()) {
      spdlog::info("freeze: [{}] frozen: {} parameter tensors, {} of {} elements ({:.1f}%) train no more",
                   fmt::join(s.frozen.modules, ", "), s.frozen.parameters.size(), s.frozen.frozen_numel,
                   s.frozen.total_numel, 100.0 * s.frozen.fraction());
    }
  }
  add_builtin_callbacks(s);
}

// A start that failed leaves no version folder behind when it wrote nothing
// worth keeping there: no checkpoint, no metric, only the bookkeeping every
// start makes (an empty metrics.jsonl, the hang doctor's doctor/rank-N.pid).
// Such a folder never hides an older one from train.resume = "auto" (Note
// [Resuming the newest version with a checkpoint] in run_dir.cpp), but
// `paratrain runs` would list it. Best effort: the start's error is what the
// user needs.
void remove_if_nothing_kept(const std::filesystem::path& dir) {
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    if (it->is_directory(ec)) continue;
    const auto rel = it->path().lexically_relative(dir);
    const bool empty_metrics = rel == "metrics.jsonl" && it->file_size(ec) == 0;
    const bool pid_file = rel.parent_path() == "doctor" && rel.extension() == ".pid";
    if (!empty_metrics && !pid_file) return;
  }
  if (ec) return;
  core::remove_tree(dir, ec);
}

// profile.* reads each step's collectives from the hang doctor's flight
// recorder, and data.batch_shares (and profile.test_slow_factor) the time
// spent in them (comm::thread_collective_seconds). A world without one
// (world.doctor_records = 0, a program's own group) gets one of its own
// before the strategy cuts its groups from it.
void record_collectives_for_profiling(Trainer::State& s) {
  const auto& c = s.config;
  const bool needed =
      profile_step_range(c.profile) || !c.data.batch_shares.empty() || c.profile.test_slow_factor > 1 ||
      c.profile.test_example_ms > 0;
  if (!needed || comm::recorder_of(*s.world)) return;
  auto recorder = std::make_shared<comm::FlightRecorder>(s.world->rank(), 1 << 16);
  comm::RecordingOptions options;
  options.timeout = s.timeout();
  options.dump_on_timeout = false;
  // Not owned: the caller's world outlives the Trainer.
  std::shared_ptr<comm::ProcessGroup> world(std::shared_ptr<comm::ProcessGroup>(), s.world);
  s.owned_world = comm::record_collectives(std::move(world), std::move(recorder), options);
  s.world = s.owned_world.get();
}

}  // namespace

Trainer::Trainer(TrainConfig config, comm::ProcessGroup& world, TrainerParts parts) {
  validate_config(config);
  check_parts(config, parts);
  auto dir = prepare_run_dir(config, world, std::chrono::seconds(config.world.timeout_s));
  const auto version = dir;
  // The hang doctor's dumps (SIGUSR1, a collective timeout, `paratrain
  // doctor --run`) land in the run: <run_dir>/doctor/rank-<r>.json.
  if (auto recorder = comm::recorder_of(world)) comm::announce_doctor_dir(*recorder, dir / "doctor");
  s_ = std::make_unique<State>(std::move(config), world, std::move(dir));
  record_collectives_for_profiling(*s_);
  try {
    build_run(*s_, parts);
  } catch (...) {
    s_.reset();
    if (world.rank() == 0) remove_if_nothing_kept(version);
    throw;
  }
}

Trainer::~Trainer() = default;

std::shared_ptr<torch::nn::Module> Trainer::model() const { return s_->strategy->module(); }

std::vector<std::pair<std::string, at::Tensor>> Trainer::full_parameters() { return s_->strategy->full_parameters(); }

std::string Trainer::strategy_name() const { return s_->strategy->name(); }

std::vector<std::pair<std::string, at::Tensor>> Trainer::teacher_parameters() {
  if (!s_->teacher) return {};
  return s_->teacher->full_parameters();
}

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
    if (s.is_main() && r.preempted) {
      update_run_status(s.run_dir, {{"status", "preempted"}, {"ended", unix_time()}, {"steps", r.steps},
                                    {"signal", preempt_signal_name(r.preempt_signal)},
                                    {"checkpoint", r.last_checkpoint.string()}});
    } else if (s.is_main()) {
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
  PhaseScope phase(kPhaseEval);
  torch::NoGradGuard no_grad;
  auto module = s.strategy->module();
  module->eval();
  EvalResult r = evaluate_forward(s, [&](const at::Tensor& inputs) { return s.strategy->eval_forward(inputs); });
  module->train();
  return r;
}

EvalResult evaluate_forward(Trainer::State& s, const std::function<at::Tensor(const at::Tensor&)>& forward) {
  torch::NoGradGuard no_grad;
  const auto& test = s.datasets.test;
  const DataShard shard = s.strategy->data_shard();
  // Strided share without padding, so every test item counts exactly once.
  // A rank that trains no data (a parameter server) evaluates none either.
  // Under data.batch_shares, contiguous runs in proportion to the shares.
  int64_t most_rows = 0;
  auto rows = evaluation_rows(s.batch.shares, shard.rank, shard.size, test.size(), most_rows);
  if (!shard.computes) rows = torch::empty({0}, torch::kLong);
  EvalSums sums;
  const int64_t chunk = std::max<int64_t>(1, s.task->eval_rows_per_chunk());
  // Every rank runs the same number of forwards: FSDP's forward is collective.
  const int64_t rounds = std::max<int64_t>(1, (most_rows + chunk - 1) / chunk);
  for (int64_t r = 0; r < rounds; ++r) {
    const int64_t i = r * chunk;
    auto idx = rows.slice(0, std::min(i, rows.numel()), std::min(i + chunk, rows.numel()));
    auto batch = to_device(data::gather(test, idx), s.device);
    auto output = forward(batch.inputs);
    // A rank with no rows at all (a parameter server) still names the sums,
    // in the task's order, so every rank reduces the same vector: from the
    // empty chunk, with its values zeroed.
    if (idx.numel() == 0 && !(r + 1 == rounds && sums.sums.empty())) continue;
    EvalSums part = s.task->eval_sums(output, batch.targets);
    if (idx.numel() == 0) part.count = 0;
    for (auto& [name, v] : part.sums) sums.add(name, idx.numel() == 0 ? 0.0 : v);
    sums.count += part.count;
  }
  const bool has_loss =
      std::any_of(sums.sums.begin(), sums.sums.end(), [](const auto& kv) { return kv.first == "loss"; });
  if (!has_loss) {
    throw ConfigError(fmt::format("the task \"{}\" gave no \"loss\" among its evaluation sums: EvalSums must hold "
                                  "\"loss\" (test_loss drives checkpoints and early stopping)",
                                  s.task->name()));
  }
  std::vector<double> values{sums.count};
  for (const auto& [name, v] : sums.sums) values.push_back(v);
  auto totals = torch::tensor(values, torch::kDouble);
  s.dp().all_reduce(totals, comm::ReduceOp::kSum)->wait(s.timeout());
  EvalResult r;
  r.count = static_cast<int64_t>(totals[0].item<double>());
  const double n = static_cast<double>(std::max<int64_t>(r.count, 1));
  for (std::size_t k = 0; k < sums.sums.size(); ++k) {
    const double mean = totals[static_cast<int64_t>(k) + 1].item<double>() / n;
    const std::string& name = sums.sums[k].first;
    r.metrics.emplace_back("test_" + name, mean);
    if (name == "loss") r.loss = mean;
    if (name == "accuracy") r.accuracy = mean;
  }
  for (auto& [name, v] : s.task->derived(r.metrics)) {
    if (name == "perplexity") r.perplexity = v;
    r.metrics.emplace_back(std::move(name), v);
  }
  return r;
}

TrainResult Trainer::fit_loop() { return FitLoop(*this, *s_).run(); }

}  // namespace paratrain::train
