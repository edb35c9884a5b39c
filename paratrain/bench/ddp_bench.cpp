#include "paratrain/bench/ddp_bench.h"

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <vector>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/data/synthetic.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/naive.h"
#include "paratrain/data_parallel/ddp/powersgd.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/gpt.h"
#include "paratrain/models/mlp.h"

namespace paratrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Workload {
  std::shared_ptr<models::Model> model;
  std::vector<at::Tensor> inputs, targets;  // ready-made batches, cycled through
};

// --mode nocomm's "collective": finished before it starts.
class DoneWork final : public comm::Work {
 public:
  void wait(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
};

// Accumulated over the timed steps of this rank.
struct Totals {
  double forward_ms = 0, backward_ms = 0, sync_ms = 0, optimizer_ms = 0;
  // From DDP's StepStats (bucketed mode only).
  double hook_backward_ms = 0, wait_ms = 0, finalize_ms = 0, comm_ms = 0, hidden_ms = 0;
  size_t buckets = 0;
};

// The options as DdpOptions; mode nocomm replaces the all-reduce through the
// comm hook (the reducer still buckets, copies and pre-divides as usual).
ddp::DdpOptions ddp_options(const DdpBenchOptions& o, std::shared_ptr<ddp::PowerSgd>& powersgd) {
  ddp::DdpOptions d;
  d.reducer.buckets.bucket_cap_bytes = static_cast<int64_t>(o.bucket_cap_mb * 1024 * 1024);
  d.reducer.buckets.first_bucket_cap_bytes = static_cast<int64_t>(o.first_bucket_cap_mb * 1024 * 1024);
  d.reducer.gradient_as_bucket_view = o.gradient_as_bucket_view;
  d.reducer.symmetric_buffers = o.symmetric_buffers;
  if (o.compression == "fp16" || o.compression == "bf16") {
    const auto wire = o.compression == "bf16" ? at::kBFloat16 : at::kHalf;
    d.reducer.comm_hook = ddp::low_precision_hook(wire);
  }
  if (o.compression == "powersgd") {
    ddp::PowerSgdOptions p;
    p.rank = o.powersgd_rank;
    powersgd = std::make_shared<ddp::PowerSgd>(p);
    d.reducer.comm_hook = powersgd->hook();
  }
  if (o.mode == "nocomm") {
    d.reducer.comm_hook = [](comm::ProcessGroup&, std::size_t, at::Tensor&) -> comm::WorkHandle {
      return std::make_shared<DoneWork>();
    };
  }
  return d;
}

// The GPT the GPT issue names ("a 4-layer d=256 GPT"), as
// configs/gpt_fortunes.toml but without dropout: bench/ddp_pytorch.py builds
// the same one.
models::GptOptions bench_gpt() {
  models::GptOptions g;
  g.vocab = 256;
  g.seq_len = 128;
  g.layers = 4;
  g.d_model = 256;
  g.heads = 4;
  g.dropout = 0;
  return g;
}

// The model (same initial weights on every rank; DDP broadcasts rank 0's
// anyway) and a pool of 8 batches per rank, sliced once so a step pays for
// no data handling: the benchmark measures training, not loading.
Workload make_workload(const DdpBenchOptions& o, int rank) {
  constexpr int64_t kPoolBatches = 8;
  torch::manual_seed(o.seed);
  Workload w;
  data::SyntheticOptions s;
  s.num_samples = kPoolBatches * o.batch;
  s.num_classes = 10;
  s.seed = o.seed + 1000 + static_cast<uint64_t>(rank);
  if (o.model == "gpt") {
    // Random byte windows of seq_len + 1: inputs are the first seq_len
    // tokens, targets the next token at each position.
    const auto g = bench_gpt();
    w.model = models::make_gpt(g);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(s.seed);
    for (int64_t b = 0; b < kPoolBatches; ++b) {
      const at::Tensor window = at::randint(g.vocab, {o.batch, g.seq_len + 1}, gen, at::kLong);
      w.inputs.push_back(window.narrow(1, 0, g.seq_len).contiguous());
      w.targets.push_back(window.narrow(1, 1, g.seq_len).contiguous());
    }
    return w;
  }
  if (o.model == "mlp") {
    w.model = models::make_mlp({784, {1024, 1024}, 10});
    s.input_shape = {784};
  } else {
    w.model = models::make_cnn({});
    s.input_shape = {1, 28, 28};
  }
  const data::TensorDataset d = data::make_synthetic(s);
  for (int64_t b = 0; b < kPoolBatches; ++b) {
    w.inputs.push_back(d.inputs.narrow(0, b * o.batch, o.batch).contiguous());
    w.targets.push_back(d.targets.narrow(0, b * o.batch, o.batch).contiguous());
  }
  return w;
}

// The training loop both sides run: forward, cross-entropy, zero_grad,
// backward (DDP reduces inside it), [naive: sync], SGD step.
Totals run_steps(Workload& w, torch::optim::SGD& opt, ddp::DistributedDataParallel* bucketed,
                 ddp::NaiveDataParallel* naive, int steps, float* last_loss) {
  Totals t;
  at::Tensor loss;
  for (int i = 0; i < steps; ++i) {
    const size_t b = static_cast<size_t>(i) % w.inputs.size();
    const auto t0 = Clock::now();
    if (bucketed) bucketed->prepare_forward();
    if (naive) naive->prepare_forward();
    const at::Tensor logits = w.model->forward(w.inputs[b]);
    // The GPT predicts every position: [B, S, V] against [B, S].
    loss = torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), w.targets[b].reshape({-1}));
    const auto t1 = Clock::now();
    opt.zero_grad();
    loss.backward();
    const auto t2 = Clock::now();
    if (naive) naive->sync_gradients();
    const auto t3 = Clock::now();
    opt.step();
    const auto t4 = Clock::now();
    t.forward_ms += ms_between(t0, t1);
    t.backward_ms += ms_between(t1, t2);
    t.sync_ms += ms_between(t2, t3);
    t.optimizer_ms += ms_between(t3, t4);
    if (bucketed) {
      const ddp::StepStats s = bucketed->last_step_stats();
      t.hook_backward_ms += s.backward_ms;
      t.wait_ms += s.wait_ms;
      t.finalize_ms += s.finalize_ms;
      t.comm_ms += s.comm_ms();
      t.hidden_ms += s.hidden_ms();
      t.buckets = s.buckets.size();
    }
  }
  if (loss.defined()) *last_loss = loss.item<float>();
  return t;
}

nlohmann::json result_json(const DdpBenchOptions& o, comm::ProcessGroup& group, const Workload& w, const Totals& t,
                           double elapsed_s, float loss) {
  int64_t params = 0;
  for (const auto& p : w.model->parameters()) params += p.numel();
  const double n = o.steps;
  const int world = group.size();
  nlohmann::json j = {
      {"impl", "paratrain"},
      {"model", o.model},
      {"mode", o.mode},
      {"comm_backend", o.mode == "bucketed" || o.mode == "naive" ? group.backend() : "none"},
      {"compression", o.compression == "powersgd" ? fmt::format("powersgd r{}", o.powersgd_rank) : o.compression},
      {"world", world},
      {"batch", o.batch},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"bucket_cap_mb", o.bucket_cap_mb},
      {"first_bucket_cap_mb", o.first_bucket_cap_mb},
      {"gradient_as_bucket_view", o.gradient_as_bucket_view},
      {"symmetric_buffers", o.symmetric_buffers && group.backend() == "shm"},
      {"threads", at::get_num_threads()},
      {"params", params},
      {"grad_bytes", params * 4},
      {"elapsed_s", elapsed_s},
      {"samples_per_s", world * o.batch * n / elapsed_s},
      {"step_ms", elapsed_s * 1000.0 / n},
      {"final_loss", loss},
      // Rank 0's mean per step; "backward" is the whole loss.backward() call,
      // which for DDP includes waiting for the last buckets.
      {"phase_ms",
       {{"forward", t.forward_ms / n},
        {"backward", t.backward_ms / n},
        {"sync", t.sync_ms / n},
        {"optimizer", t.optimizer_ms / n}}},
  };
  if (o.mode == "bucketed" || o.mode == "nocomm") {
    j["comm"] = {
        {"source", "paratrain StepStats (rank 0, mean per timed step)"},
        {"buckets", t.buckets},
        {"backward_ms", t.hook_backward_ms / n},  // first gradient hook -> end of backward
        {"comm_ms", t.comm_ms / n},               // some bucket in flight
        {"hidden_ms", t.hidden_ms / n},           // ... before backward ended
        {"exposed_wait_ms", t.wait_ms / n},       // blocked on buckets after backward
        {"finalize_ms", t.finalize_ms / n},       // wait + write-back + bookkeeping
        {"hidden_share", t.comm_ms > 0 ? t.hidden_ms / t.comm_ms : 0.0},
    };
  }
  return j;
}

}  // namespace

void validate(const DdpBenchOptions& o) {
  if (o.model != "mlp" && o.model != "cnn" && o.model != "gpt")
    throw ConfigError(fmt::format("--model must be mlp, cnn or gpt, got '{}'", o.model));
  if (o.mode != "bucketed" && o.mode != "naive" && o.mode != "local" && o.mode != "nocomm")
    throw ConfigError(fmt::format("--mode must be bucketed, naive, local or nocomm, got '{}'", o.mode));
  if (o.compression != "none" && o.compression != "fp16" && o.compression != "bf16" && o.compression != "powersgd")
    throw ConfigError(fmt::format("--compression must be none, fp16, bf16 or powersgd, got '{}'", o.compression));
  if (o.compression != "none" && o.mode != "bucketed")
    throw ConfigError("--compression is a DDP comm hook: it needs --mode bucketed");
  if (o.steps < 1 || o.warmup < 0 || o.batch < 1)
    throw ConfigError(fmt::format("need --steps >= 1, --warmup >= 0, --batch >= 1; got {}, {}, {}", o.steps,
                                  o.warmup, o.batch));
  if (!(o.bucket_cap_mb > 0) || !(o.first_bucket_cap_mb > 0))
    throw ConfigError(fmt::format("bucket caps must be > 0 MiB; got --bucket-cap-mb {} and --first-bucket-cap-mb {}",
                                  o.bucket_cap_mb, o.first_bucket_cap_mb));
}

nlohmann::json run_ddp_bench(comm::ProcessGroup& group, const DdpBenchOptions& o) {
  validate(o);
  if (o.mode == "local" && group.size() != 1)
    throw ConfigError(fmt::format("--mode local trains without data parallelism and needs one rank, got {}; use "
                                  "--mode bucketed or naive",
                                  group.size()));
  Workload w = make_workload(o, group.rank());
  std::unique_ptr<ddp::DistributedDataParallel> bucketed;
  std::unique_ptr<ddp::NaiveDataParallel> naive;
  std::shared_ptr<ddp::PowerSgd> powersgd;
  if (o.mode == "bucketed" || o.mode == "nocomm") {
    bucketed = std::make_unique<ddp::DistributedDataParallel>(w.model, group, ddp_options(o, powersgd));
    if (powersgd) powersgd->attach(bucketed->reducer());
  } else if (o.mode == "naive") {
    naive = std::make_unique<ddp::NaiveDataParallel>(w.model, group);
  }
  torch::optim::SGD opt(w.model->parameters(), torch::optim::SGDOptions(o.lr));

  float loss = 0;
  run_steps(w, opt, bucketed.get(), naive.get(), o.warmup, &loss);
  group.barrier()->wait();
  const auto start = Clock::now();
  const Totals t = run_steps(w, opt, bucketed.get(), naive.get(), o.steps, &loss);
  // The slowest rank's time is the job's time.
  at::Tensor elapsed = torch::tensor({ms_between(start, Clock::now())}, torch::kDouble);
  group.all_reduce(elapsed, comm::ReduceOp::kMax)->wait();
  return result_json(o, group, w, t, elapsed.item<double>() / 1000.0, loss);
}

}  // namespace paratrain::bench
