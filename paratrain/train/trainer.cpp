// The training loop. Per step: strategy.before_forward, forward, loss,
// backward (DDP reduces gradients inside it), strategy.after_backward,
// optimizer step. Per epoch: evaluate, log, checkpoint.
#include "paratrain/train/trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <mutex>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/data/loader.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/checkpoint/checkpoint.h"
#include "paratrain/train/checkpointing.h"
#include "paratrain/train/metrics.h"
#include "paratrain/train/strategy.h"

namespace paratrain::train {

using Clock = std::chrono::steady_clock;

struct Trainer::State {
  TrainConfig config;
  comm::ProcessGroup& world;
  std::filesystem::path run_dir;
  std::shared_ptr<models::Model> model;
  std::unique_ptr<GradientSync> sync;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  Datasets datasets;
  std::unique_ptr<data::Loader> loader;
  MetricsLog metrics;
  int64_t step = 0;
  int64_t start_step = 0;  // where this process started (after a resume)

  State(TrainConfig c, comm::ProcessGroup& w, std::filesystem::path dir)
      : config(std::move(c)), world(w), run_dir(std::move(dir)),
        metrics(w.rank() == 0 ? run_dir / "metrics.jsonl" : std::filesystem::path()) {}
  bool is_main() const { return world.rank() == 0; }
  std::chrono::milliseconds timeout() const { return std::chrono::seconds(config.world.timeout_s); }
};

namespace {

std::filesystem::path prepare_run_dir(const TrainConfig& config, int rank) {
  auto dir = std::filesystem::path(config.run.output_dir) / config.run.name;
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::create_directories(dir / "checkpoints", ec);
    if (ec) {
      throw ConfigError(fmt::format("cannot create the run directory {}: {}; set run.output_dir to a writable place",
                                    dir.string(), ec.message()));
    }
  }
  return dir;
}

// Mean over ranks of `values` (a small float64 tensor): one all-reduce.
at::Tensor mean_over_ranks(comm::ProcessGroup& world, at::Tensor values, std::chrono::milliseconds timeout) {
  world.all_reduce(values, comm::ReduceOp::kAvg)->wait(timeout);
  return values;
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

}  // namespace

Trainer::Trainer(TrainConfig config, comm::ProcessGroup& world) {
  validate_config(config);
  auto dir = prepare_run_dir(config, world.rank());
  s_ = std::make_unique<State>(std::move(config), world, std::move(dir));
  auto& s = *s_;
  const auto& c = s.config;

  // Same seed on every rank; DDP broadcasts rank 0's weights anyway, so the
  // seed also makes one run equal the single-process run with that seed.
  {
    // The generator is process-global; ranks that are threads of one process
    // (tests) must not reseed it in the middle of each other's init.
    static std::mutex init_mutex;
    std::lock_guard<std::mutex> lock(init_mutex);
    torch::manual_seed(static_cast<uint64_t>(c.run.seed));
    s.model = make_model(c);
  }
  s.sync = make_gradient_sync(c, s.model, world);
  s.optimizer = make_optimizer(c.optimizer, s.model->parameters());
  s.datasets = load_datasets(c);

  data::SamplerOptions sampler;
  sampler.num_replicas = world.size();
  sampler.rank = world.rank();
  sampler.shuffle = c.data.shuffle;
  sampler.seed = static_cast<uint64_t>(c.run.seed);
  sampler.drop_last = c.data.drop_last;
  data::LoaderOptions loader;
  loader.batch_size = c.data.batch_size;
  loader.drop_last = c.data.drop_last;
  loader.prefetch_depth = static_cast<int>(c.data.prefetch);
  s.loader = std::make_unique<data::Loader>(
      s.datasets.train, data::DistributedSampler(s.datasets.train.size(), sampler), loader);

  // Resume before writing anything: a bad checkpoint must fail the run
  // without touching the run directory.
  const auto from = resolve_resume(c, s.run_dir);
  if (!from.empty()) {
    auto position = load_training_checkpoint(from, *s.model, *s.optimizer);
    s.step = position.step;
    s.loader->load_state({position.epoch, position.next_batch});
    if (s.is_main()) {
      spdlog::info("resumed from {} at epoch {}, batch {}, step {}", from.string(), position.epoch + 1,
                   position.next_batch, position.step);
    }
  } else if (c.train.resume.empty() && find_latest_checkpoint(s.run_dir)) {
    throw ConfigError(fmt::format("the run directory {} already holds checkpoints of an earlier run; set "
                                  "train.resume=auto to continue it, or pick another run.name",
                                  s.run_dir.string()));
  }
  s.start_step = s.step;
  check_ranks_agree_on_position(world, s.step, s.loader->state(), s.timeout());

  if (s.is_main()) {
    write_text_atomically(s.run_dir / "config.toml", to_toml(c));
    spdlog::info("run {}: {} ranks, strategy {}, model {} ({} parameters), {} train / {} test items, "
                 "global batch {}", s.run_dir.string(), world.size(), s.sync->name(), c.model.kind,
                 [&] { int64_t n = 0; for (auto& p : s.model->parameters()) n += p.numel(); return n; }(),
                 s.datasets.train.size(), s.datasets.test.size(), c.data.batch_size * world.size());
  }
}

Trainer::~Trainer() = default;

std::shared_ptr<torch::nn::Module> Trainer::model() const { return s_->model; }

EvalResult Trainer::evaluate() {
  auto& s = *s_;
  torch::NoGradGuard no_grad;
  s.model->eval();
  const auto& test = s.datasets.test;
  // Strided share without padding, so every test item counts exactly once.
  auto rows = torch::arange(s.world.rank(), test.size(), s.world.size(), torch::kLong);
  double loss_sum = 0, correct = 0;
  const int64_t chunk = 1000;
  for (int64_t i = 0; i < rows.numel(); i += chunk) {
    auto idx = rows.slice(0, i, std::min(i + chunk, rows.numel()));
    auto batch = data::gather(test, idx);
    auto logits = s.model->forward(batch.inputs);
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, batch.targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                    .item<double>();
    correct += logits.argmax(1).eq(batch.targets).sum().item<double>();
  }
  auto totals = torch::tensor({loss_sum, correct, static_cast<double>(rows.numel())}, torch::kDouble);
  s.world.all_reduce(totals, comm::ReduceOp::kSum)->wait(s.timeout());
  s.model->train();
  EvalResult r;
  r.count = static_cast<int64_t>(totals[2].item<double>());
  r.loss = totals[0].item<double>() / std::max<int64_t>(r.count, 1);
  r.accuracy = totals[1].item<double>() / std::max<int64_t>(r.count, 1);
  return r;
}

TrainResult Trainer::fit() {
  auto& s = *s_;
  const auto& c = s.config;
  TrainResult result;
  result.run_dir = s.run_dir;

  auto save = [&](const std::string& why) {
    if (!s.is_main()) return;
    auto st = s.loader->state();
    result.last_checkpoint = save_training_checkpoint(
        s.run_dir, c, *s.model, *s.optimizer, {.step = s.step, .epoch = st.epoch, .next_batch = st.next_batch});
    spdlog::info("checkpoint {} ({})", result.last_checkpoint.string(), why);
  };

  const int64_t batches = s.loader->num_batches();
  const int64_t global_batch = c.data.batch_size * s.world.size();
  const int64_t planned_steps =
      c.train.max_steps > 0 ? std::min(c.train.max_steps, batches * c.train.epochs) : batches * c.train.epochs;
  const auto start = Clock::now();
  const int64_t first_step = s.step;
  double window_loss = 0;
  int64_t window_steps = 0;
  bool stop = s.step >= planned_steps;
  s.model->train();

  for (int64_t epoch = s.loader->state().epoch; epoch < c.train.epochs && !stop; ++epoch) {
    if (epoch != s.loader->state().epoch || s.loader->state().next_batch == 0) s.loader->set_epoch(epoch);
    while (auto batch = s.loader->next()) {
      s.sync->before_forward();
      auto logits = s.model->forward(batch->inputs);
      auto loss = torch::nn::functional::cross_entropy(logits, batch->targets);
      s.optimizer->zero_grad();
      loss.backward();
      s.sync->after_backward();
      s.optimizer->step();
      ++s.step;
      window_loss += loss.item<double>();
      ++window_steps;

      const bool last = s.step >= planned_steps;
      if ((c.run.log_every > 0 && s.step % c.run.log_every == 0) || last) {
        // A collective on every rank: all ranks log at the same steps.
        auto mean = mean_over_ranks(s.world, torch::tensor({window_loss / window_steps}, torch::kDouble), s.timeout());
        result.last_train_loss = mean[0].item<double>();
        const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
        const double rate = (s.step - first_step) * global_batch / std::max(elapsed, 1e-9);
        const double eta = (planned_steps - s.step) * global_batch / std::max(rate, 1e-9);
        if (s.is_main()) {
          auto st = s.sync->last_stats();
          spdlog::info("epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s ETA {}", epoch + 1, c.train.epochs,
                       s.step, planned_steps, result.last_train_loss, rate, format_duration(eta));
          s.metrics.write({{"kind", "train"}, {"epoch", epoch}, {"step", s.step},
                           {"loss", result.last_train_loss}, {"samples_per_s", rate},
                           {"lr", c.optimizer.lr}, {"comm_ms", st.comm_ms},
                           {"hidden_share", st.hidden_share}});
        }
        window_loss = 0;
        window_steps = 0;
      }
      if (c.train.checkpoint_every_steps > 0 && s.step % c.train.checkpoint_every_steps == 0) save("periodic");
      if (last) {
        stop = true;
        break;
      }
    }
    const bool epoch_done = s.loader->state().next_batch >= batches;
    if (epoch_done) result.epochs_completed = epoch + 1;
    if (c.train.eval_every_epochs > 0 && epoch_done && (epoch + 1) % c.train.eval_every_epochs == 0) {
      result.test = evaluate();
      if (s.is_main()) {
        spdlog::info("epoch {}/{} test loss {:.4f} accuracy {:.2f}% ({} items)", epoch + 1, c.train.epochs,
                     result.test.loss, 100 * result.test.accuracy, result.test.count);
        s.metrics.write({{"kind", "eval"}, {"epoch", epoch}, {"step", s.step}, {"test_loss", result.test.loss},
                         {"test_accuracy", result.test.accuracy}});
      }
    }
    if (epoch_done && epoch + 1 < c.train.epochs && !stop) s.loader->set_epoch(epoch + 1);
    save(epoch_done ? fmt::format("end of epoch {}", epoch + 1) : "stop");
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  result.steps = s.step;
  result.start_step = s.start_step;
  result.samples_per_second = (s.step - first_step) * global_batch / std::max(elapsed, 1e-9);
  return result;
}

}  // namespace paratrain::train
