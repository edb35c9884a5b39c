// One rank of the DDP throughput benchmark: trains the MLP or the CNN on
// synthetic in-memory batches with SGD under paratrain's bucketed DDP, its
// naive twin, or no data parallelism at all, and rank 0 prints one JSON line.
// --mode nocomm is for analysis only: DDP whose buckets skip the all-reduce
// (gradients are not averaged), i.e. the ceiling if communication were free.
// --comm picks the process group's backend: gloo (TCP), shm (shared memory,
// paratrain/comm/shm) or mpi (under mpirun).
// Not a driver: bench/run_ddp.sh launches it (and bench/ddp_pytorch.py, the
// same work under PyTorch's DDP) at 1 and 2 ranks, repeats and compares.
//
//   paratrain launch --nproc-per-node 2 -- ddp_throughput --model mlp --steps 200
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/data_parallel/ddp/powersgd.h"
#include "paratrain/core/error.h"
#include "paratrain/data/synthetic.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/naive.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/gpt.h"
#include "paratrain/models/mlp.h"

namespace {

using Clock = std::chrono::steady_clock;
using paratrain::ConfigError;
namespace comm = paratrain::comm;
namespace ddp = paratrain::ddp;

struct BenchOptions {
  // mlp: 784-1024-1024-10; cnn: models::CnnOptions{} (28x28x1); gpt: kBenchGpt
  // (4 layers, d 256, 4 heads, 128 byte tokens, dropout 0) on random tokens.
  std::string model = "mlp";
  // bucketed (DDP), naive (NaiveDataParallel), local (no DDP, 1 rank), nocomm
  // (DDP skipping the all-reduce: analysis only, trains replicas apart).
  std::string mode = "bucketed";
  int steps = 200;               // timed steps
  int warmup = 20;               // untimed steps first (allocator, BLAS buffers, sockets)
  int batch = 64;                // per rank
  double lr = 0.01;              // plain SGD, no momentum
  double bucket_cap_mb = 25;     // MiB, as PyTorch's bucket_cap_mb
  double first_bucket_cap_mb = 1;  // MiB, PyTorch's fixed first bucket
  bool gradient_as_bucket_view = false;
  uint64_t seed = 0;
  // The process group's backend: gloo, shm (one machine) or mpi (run under
  // mpirun instead of paratrain launch).
  std::string comm = "gloo";
  // none, fp16/bf16 (16-bit wire, fp32 sums) or powersgd (rank-r factors).
  std::string compression = "none";
  int64_t powersgd_rank = 1;
  std::string out;  // also append the JSON line to this file (rank 0)
};

// The GPT the issue names ("a 4-layer d=256 GPT"), as configs/gpt_fortunes.toml
// but without dropout: bench/ddp_pytorch.py builds the same one.
paratrain::models::GptOptions bench_gpt() {
  paratrain::models::GptOptions g;
  g.vocab = 256;
  g.seq_len = 128;
  g.layers = 4;
  g.d_model = 256;
  g.heads = 4;
  g.dropout = 0;
  return g;
}

struct Workload {
  std::shared_ptr<paratrain::models::Model> model;
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

void validate(const BenchOptions& o);
ddp::DdpOptions ddp_options(const BenchOptions& o, comm::ProcessGroup& group, const Workload& w,
                            std::shared_ptr<ddp::PowerSgd>& powersgd);
nlohmann::json result_json(const BenchOptions& o, const comm::WorldInfo& world, const Workload& w,
                           const Totals& t, double elapsed_s, float loss);
Workload make_workload(const BenchOptions& o, int rank);
Totals run_steps(Workload& w, torch::optim::SGD& opt,
                 ddp::DistributedDataParallel* bucketed, ddp::NaiveDataParallel* naive, int steps,
                 float* last_loss);
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int run(const BenchOptions& o) {
  validate(o);
  // One compute thread per rank, as torchrun / `paratrain launch` do for
  // several ranks; set here too so a 1-rank run does the same work per core.
  at::set_num_threads(1);

  const comm::WorldInfo world = comm::world_from_env();
  if (o.mode == "local" && world.world_size != 1) {
    throw ConfigError(fmt::format("--mode local trains without data parallelism and needs one "
                                  "rank, got WORLD_SIZE={}; use --mode bucketed or naive",
                                  world.world_size));
  }
  comm::InitOptions init;
  init.backend = o.comm;
  std::shared_ptr<comm::ProcessGroup> group = comm::init_process_group(world, init);

  Workload w = make_workload(o, world.rank);
  std::unique_ptr<ddp::DistributedDataParallel> bucketed;
  std::unique_ptr<ddp::NaiveDataParallel> naive;
  std::shared_ptr<ddp::PowerSgd> powersgd;
  if (o.mode == "bucketed" || o.mode == "nocomm") {
    bucketed = std::make_unique<ddp::DistributedDataParallel>(w.model, *group,
                                                              ddp_options(o, *group, w, powersgd));
    if (powersgd) powersgd->attach(bucketed->reducer());
  } else if (o.mode == "naive") {
    naive = std::make_unique<ddp::NaiveDataParallel>(w.model, *group);
  }
  torch::optim::SGD opt(w.model->parameters(), torch::optim::SGDOptions(o.lr));

  float loss = 0;
  run_steps(w, opt, bucketed.get(), naive.get(), o.warmup, &loss);
  group->barrier()->wait();
  const auto start = Clock::now();
  const Totals t = run_steps(w, opt, bucketed.get(), naive.get(), o.steps, &loss);
  // The slowest rank's time is the job's time.
  at::Tensor elapsed = torch::tensor({ms_between(start, Clock::now())}, torch::kDouble);
  group->all_reduce(elapsed, comm::ReduceOp::kMax)->wait();
  const double elapsed_s = elapsed.item<double>() / 1000.0;

  if (world.rank != 0) return 0;
  const std::string line = result_json(o, world, w, t, elapsed_s, loss).dump();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (!o.out.empty()) {
    std::ofstream f(o.out, std::ios::app);
    if (!f) throw paratrain::Error(fmt::format("cannot open --out file '{}' for appending", o.out));
    f << line << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BenchOptions o;
  CLI::App app{"One rank of the DDP throughput benchmark; rank 0 prints one JSON line. "
               "Run under `paratrain launch --nproc-per-node N --`."};
  app.add_option("--model", o.model, "mlp (784-1024-1024-10), cnn or gpt (4 layers, d 256, seq 128)")->capture_default_str();
  app.add_option("--mode", o.mode,
                 "bucketed (DDP), naive (NaiveDataParallel), local (no DDP) or nocomm (DDP "
                 "without all-reduce: analysis only)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps before")->capture_default_str();
  app.add_option("--batch", o.batch, "examples per rank and step")->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "bucket cap, MiB")->capture_default_str();
  app.add_option("--first-bucket-cap-mb", o.first_bucket_cap_mb, "first bucket's cap, MiB")
      ->capture_default_str();
  app.add_flag("--gradient-as-bucket-view", o.gradient_as_bucket_view,
               "let .grad alias the bucket buffers");
  app.add_option("--seed", o.seed, "seeds the model and this rank's data (+rank)")->capture_default_str();
  app.add_option("--comm", o.comm, "process group backend: gloo, shm (shared memory, one host) or mpi (under mpirun)")
      ->capture_default_str();
  app.add_option("--compression", o.compression, "none, fp16, bf16 or powersgd (DDP comm hook)")
      ->capture_default_str();
  app.add_option("--powersgd-rank", o.powersgd_rank, "PowerSGD's r")->capture_default_str();
  app.add_option("--out", o.out, "also append the JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_throughput: error: %s\n", e.what());
    return 1;
  }
}

namespace {

void validate(const BenchOptions& o) {
  if (o.model != "mlp" && o.model != "cnn" && o.model != "gpt") {
    throw ConfigError(fmt::format("--model must be mlp, cnn or gpt, got '{}'", o.model));
  }
  if (o.mode != "bucketed" && o.mode != "naive" && o.mode != "local" && o.mode != "nocomm") {
    throw ConfigError(
        fmt::format("--mode must be bucketed, naive, local or nocomm, got '{}'", o.mode));
  }
  if (o.comm != "gloo" && o.comm != "shm" && o.comm != "mpi") {
    throw ConfigError(fmt::format("--comm must be gloo, mpi or shm, got '{}'", o.comm));
  }
  if (o.compression != "none" && o.compression != "fp16" && o.compression != "bf16" && o.compression != "powersgd") {
    throw ConfigError(fmt::format("--compression must be none, fp16, bf16 or powersgd, got '{}'", o.compression));
  }
  if (o.compression != "none" && o.mode != "bucketed") {
    throw ConfigError("--compression is a DDP comm hook: it needs --mode bucketed");
  }
  if (o.steps < 1 || o.warmup < 0 || o.batch < 1) {
    throw ConfigError(fmt::format("need --steps >= 1, --warmup >= 0, --batch >= 1; got {}, {}, {}",
                                  o.steps, o.warmup, o.batch));
  }
}

// The bench's flags as DdpOptions; --mode nocomm replaces the all-reduce
// through the comm hook (the reducer still buckets, copies and pre-divides
// as usual).
ddp::DdpOptions ddp_options(const BenchOptions& o, comm::ProcessGroup& group, const Workload& w,
                            std::shared_ptr<ddp::PowerSgd>& powersgd) {
  ddp::DdpOptions d;
  d.reducer.buckets.bucket_cap_bytes = static_cast<int64_t>(o.bucket_cap_mb * 1024 * 1024);
  d.reducer.buckets.first_bucket_cap_bytes = static_cast<int64_t>(o.first_bucket_cap_mb * 1024 * 1024);
  d.reducer.gradient_as_bucket_view = o.gradient_as_bucket_view;
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

nlohmann::json result_json(const BenchOptions& o, const comm::WorldInfo& world, const Workload& w,
                           const Totals& t, double elapsed_s, float loss) {
  int64_t params = 0;
  for (const auto& p : w.model->parameters()) params += p.numel();
  const double n = o.steps;
  nlohmann::json j = {
      {"impl", "paratrain"},
      {"model", o.model},
      {"mode", o.mode},
      {"comm_backend", o.mode == "bucketed" ? o.comm : o.mode == "naive" ? (o.comm == "mpi" ? "mpi" : "gloo") : "none"},
      {"compression", o.compression == "powersgd" ? fmt::format("powersgd r{}", o.powersgd_rank) : o.compression},
      {"world", world.world_size},
      {"batch", o.batch},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"bucket_cap_mb", o.bucket_cap_mb},
      {"first_bucket_cap_mb", o.first_bucket_cap_mb},
      {"gradient_as_bucket_view", o.gradient_as_bucket_view},
      {"threads", at::get_num_threads()},
      {"params", params},
      {"grad_bytes", params * 4},
      {"elapsed_s", elapsed_s},
      {"samples_per_s", world.world_size * o.batch * n / elapsed_s},
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

// The model (same initial weights on every rank; DDP broadcasts rank 0's
// anyway) and a pool of 8 batches per rank, sliced once so a step pays for
// no data handling: the benchmark measures training, not loading.
Workload make_workload(const BenchOptions& o, int rank) {
  constexpr int64_t kPoolBatches = 8;
  torch::manual_seed(o.seed);
  Workload w;
  paratrain::data::SyntheticOptions s;
  s.num_samples = kPoolBatches * o.batch;
  s.num_classes = 10;
  s.seed = o.seed + 1000 + static_cast<uint64_t>(rank);
  if (o.model == "gpt") {
    // Random byte windows of seq_len + 1: inputs are the first seq_len tokens,
    // targets the next token at each position.
    const auto g = bench_gpt();
    w.model = paratrain::models::make_gpt(g);
    auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed + 1000 + static_cast<uint64_t>(rank));
    for (int64_t b = 0; b < kPoolBatches; ++b) {
      const at::Tensor window = at::randint(g.vocab, {o.batch, g.seq_len + 1}, gen, at::kLong);
      w.inputs.push_back(window.narrow(1, 0, g.seq_len).contiguous());
      w.targets.push_back(window.narrow(1, 1, g.seq_len).contiguous());
    }
    return w;
  }
  if (o.model == "mlp") {
    w.model = paratrain::models::make_mlp({784, {1024, 1024}, 10});
    s.input_shape = {784};
  } else {
    w.model = paratrain::models::make_cnn({});
    s.input_shape = {1, 28, 28};
  }
  const paratrain::data::TensorDataset data = paratrain::data::make_synthetic(s);
  for (int64_t b = 0; b < kPoolBatches; ++b) {
    w.inputs.push_back(data.inputs.narrow(0, b * o.batch, o.batch).contiguous());
    w.targets.push_back(data.targets.narrow(0, b * o.batch, o.batch).contiguous());
  }
  return w;
}

// The training loop both sides run: forward, cross-entropy, zero_grad,
// backward (DDP reduces inside it), [naive: sync], SGD step.
Totals run_steps(Workload& w, torch::optim::SGD& opt,
                 ddp::DistributedDataParallel* bucketed, ddp::NaiveDataParallel* naive, int steps,
                 float* last_loss) {
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

}  // namespace
