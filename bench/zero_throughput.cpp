// One rank of the ZeRO/FSDP benchmark: trains the MLP (784-1024-1024-10) on
// synthetic in-memory batches with Adam under paratrain's DDP (stage 0),
// ZeroDataParallel (stages 1, 2) or FullyShardedDataParallel (stage 3); rank 0
// prints one JSON line with samples/s, every rank's model-state bytes counted
// from live tensors after a step, and the peak RSS of every rank.
// Not a driver: bench/run_zero.sh launches it (and bench/zero_pytorch.py, the
// same work under PyTorch's DDP / ZeroRedundancyOptimizer) and compares; the
// formula the bytes are held against lives in bench/zero_report.py.
//
//   paratrain launch --nproc-per-node 2 -- zero_throughput --stage 2 --steps 40
#include <sys/resource.h>

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

#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"
#include "paratrain/data/synthetic.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/core/model_state.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/models/mlp.h"

namespace {

using Clock = std::chrono::steady_clock;
using paratrain::ConfigError;
namespace comm = paratrain::comm;

struct BenchOptions {
  int stage = 0;        // 0: DistributedDataParallel, 1/2: ZeroDataParallel, 3: FSDP
  int steps = 40;       // timed steps (short: the machine is shared and 4 ranks oversubscribe it)
  int warmup = 5;       // untimed steps first (Adam state, allocator, sockets)
  int batch = 64;       // per rank
  double lr = 1e-3;     // Adam
  uint64_t seed = 0;
  std::string out;      // also append the JSON line to this file (rank 0)
};

// What a rank measured; all-gathered so rank 0 can report every rank.
struct RankBytes {
  // comm_buffers: the reducer's bucket buffers as the engine reports them
  // (sized from its bucket plans); -1 where the engine reports none.
  int64_t params = 0, grads = 0, optimizer_state = 0, comm_buffers = 0, peak_rss = 0;
};

// The engine under test behind one interface: the loop below is the same
// for every stage apart from these four calls.
class Engine {
 public:
  virtual ~Engine() = default;
  virtual void prepare_forward() = 0;
  virtual void step(torch::optim::Optimizer& opt) = 0;
  virtual std::vector<at::Tensor> optimizer_params() = 0;
  virtual RankBytes bytes(const torch::optim::Optimizer& opt) = 0;
  // Elements the formula should use after padding (sum over buckets/units of
  // the padded size); equals the parameter count when nothing is padded.
  virtual int64_t padded_numel() = 0;
  virtual std::string padding() = 0;  // what padded_numel() accounts for, in words
};

std::unique_ptr<Engine> make_engine(int stage, std::shared_ptr<torch::nn::Module> model,
                                    comm::ProcessGroup& group);
struct Workload {
  std::shared_ptr<paratrain::models::Model> model;
  std::vector<at::Tensor> inputs, targets;
};
Workload make_workload(const BenchOptions& o, int rank);
// Rank 0's time per phase, summed over steps: forward (with prepare_forward),
// backward (reduction overlapped or waited for inside it), step (the engine's
// step: optimizer plus ZeRO's parameter all-gather).
struct Phases {
  double forward_ms = 0, backward_ms = 0, step_ms = 0;
};
float run_steps(Workload& w, Engine& engine, torch::optim::Optimizer& opt, int steps, Phases* phases);
int64_t peak_rss_bytes();

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int run(const BenchOptions& o) {
  if (o.stage < 0 || o.stage > 3) {
    throw ConfigError(fmt::format("--stage must be 0 (DDP), 1, 2 (ZeRO) or 3 (FSDP), got {}", o.stage));
  }
  if (o.steps < 1 || o.warmup < 1 || o.batch < 1) {
    throw ConfigError(fmt::format("need --steps >= 1, --warmup >= 1 (Adam state exists only after a "
                                  "step), --batch >= 1; got {}, {}, {}", o.steps, o.warmup, o.batch));
  }
  at::set_num_threads(1);  // one compute thread per rank, 1 rank included
  const comm::WorldInfo world = comm::world_from_env();
  std::shared_ptr<comm::ProcessGroup> group = comm::init_process_group(world);

  Workload w = make_workload(o, world.rank);
  int64_t psi = 0;
  for (const auto& p : w.model->parameters()) psi += p.numel();
  std::unique_ptr<Engine> engine = make_engine(o.stage, w.model, *group);
  torch::optim::Adam opt(engine->optimizer_params(), torch::optim::AdamOptions(o.lr));

  Phases phases;
  float loss = run_steps(w, *engine, opt, o.warmup, &phases);
  phases = {};
  group->barrier()->wait();
  const auto start = Clock::now();
  loss = run_steps(w, *engine, opt, o.steps, &phases);
  at::Tensor elapsed = torch::tensor({ms_between(start, Clock::now())}, torch::kDouble);
  group->all_reduce(elapsed, comm::ReduceOp::kMax)->wait();  // the slowest rank's time
  const double elapsed_s = elapsed.item<double>() / 1000.0;

  // After the last step: what each rank holds between steps.
  RankBytes mine = engine->bytes(opt);
  mine.peak_rss = peak_rss_bytes();
  at::Tensor local = torch::tensor({mine.params, mine.grads, mine.optimizer_state, mine.comm_buffers,
                                    mine.peak_rss}, torch::kLong);
  at::Tensor all = torch::zeros({world.world_size * 5}, torch::kLong);
  group->all_gather(all, local)->wait();

  if (world.rank != 0) return 0;
  nlohmann::json ranks = nlohmann::json::array();
  for (int r = 0; r < world.world_size; ++r) {
    const int64_t* v = all.data_ptr<int64_t>() + r * 5;
    ranks.push_back({{"params", v[0]}, {"grads", v[1]}, {"optimizer_state", v[2]},
                     {"model_state", v[0] + v[1] + v[2]},
                     {"comm_buffers", v[3] < 0 ? nlohmann::json() : nlohmann::json(v[3])},
                     {"peak_rss", v[4]}});
  }
  const nlohmann::json j = {
      {"impl", "paratrain"},
      {"mode", o.stage == 0 ? "ddp" : o.stage == 3 ? "fsdp" : fmt::format("zero{}", o.stage)},
      {"stage", o.stage},
      {"world", world.world_size},
      {"batch", o.batch},
      {"steps", o.steps},
      {"warmup", o.warmup},
      {"optimizer", "adam"},
      {"threads", at::get_num_threads()},
      {"params", psi},
      {"padded_numel", engine->padded_numel()},
      {"padding", engine->padding()},
      {"elapsed_s", elapsed_s},
      {"samples_per_s", world.world_size * o.batch * o.steps / elapsed_s},
      {"step_ms", elapsed_s * 1000.0 / o.steps},
      {"final_loss", loss},
      {"phase_ms",
       {{"forward", phases.forward_ms / o.steps},
        {"backward", phases.backward_ms / o.steps},
        {"step", phases.step_ms / o.steps}}},
      {"bytes_source", "paratrain model_state_bytes (live tensors, after the last step)"},
      {"ranks", ranks},
  };
  const std::string line = j.dump();
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
  CLI::App app{"One rank of the ZeRO/FSDP benchmark; rank 0 prints one JSON line. "
               "Run under `paratrain launch --nproc-per-node N --`."};
  app.add_option("--stage", o.stage, "0 (DDP), 1, 2 (ZeroDataParallel) or 3 (FSDP)")->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps before")->capture_default_str();
  app.add_option("--batch", o.batch, "examples per rank and step")->capture_default_str();
  app.add_option("--lr", o.lr, "Adam learning rate")->capture_default_str();
  app.add_option("--seed", o.seed, "seeds the model and this rank's data (+rank)")->capture_default_str();
  app.add_option("--out", o.out, "also append the JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zero_throughput: error: %s\n", e.what());
    return 1;
  }
}

namespace {

using paratrain::optimizer_state_tensors;
using paratrain::tensor_bytes;

// Stage 0: DDP over the full model, Adam over every parameter. Counted the
// way ZeRO counts: parameters, .grad, Adam state, the reducer's buckets.
class DdpEngine final : public Engine {
 public:
  DdpEngine(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group)
      : model_(model), ddp_(model, group) {}
  void prepare_forward() override { ddp_.prepare_forward(); }
  void step(torch::optim::Optimizer& opt) override {
    ddp_.finish_backward();
    opt.step();
  }
  std::vector<at::Tensor> optimizer_params() override { return model_->parameters(); }
  RankBytes bytes(const torch::optim::Optimizer& opt) override {
    std::vector<at::Tensor> params = model_->parameters(), grads;
    for (const auto& p : params) grads.push_back(p.grad());
    RankBytes b;
    b.params = tensor_bytes(params);
    b.grads = tensor_bytes(grads);
    b.optimizer_state = tensor_bytes(optimizer_state_tensors(opt));
    for (const auto& plan : ddp_.reducer().plans()) {
      b.comm_buffers += plan.padded_numel * static_cast<int64_t>(c10::elementSize(plan.dtype));
    }
    return b;
  }
  int64_t padded_numel() override {
    int64_t n = 0;
    for (const auto& p : model_->parameters()) n += p.numel();
    return n;
  }
  std::string padding() override { return "none (nothing sharded)"; }

 private:
  std::shared_ptr<torch::nn::Module> model_;
  paratrain::ddp::DistributedDataParallel ddp_;
};

class ZeroEngine final : public Engine {
 public:
  ZeroEngine(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group, int stage)
      : zero_(model, group, options(stage)) {}
  void prepare_forward() override { zero_.prepare_forward(); }
  void step(torch::optim::Optimizer& opt) override { zero_.step(opt); }
  std::vector<at::Tensor> optimizer_params() override { return zero_.optimizer_params(); }
  RankBytes bytes(const torch::optim::Optimizer& opt) override {
    const auto s = zero_.model_state_bytes(&opt);
    return {s.params, s.grads, s.optimizer_state, s.comm_buffers, 0};
  }
  int64_t padded_numel() override {
    int64_t n = 0;
    for (const auto& plan : zero_.reducer().plans()) n += plan.padded_numel;
    return n;
  }
  std::string padding() override { return "each gradient bucket padded to a multiple of the world size"; }

 private:
  static paratrain::zero::ZeroOptions options(int stage) {
    paratrain::zero::ZeroOptions o;  // defaults otherwise: buckets as DDP's
    o.stage = stage;
    return o;
  }
  paratrain::zero::ZeroDataParallel zero_;
};

class FsdpEngine final : public Engine {
 public:
  FsdpEngine(std::shared_ptr<torch::nn::Module> model, comm::ProcessGroup& group) : fsdp_(model, group) {}
  void prepare_forward() override { fsdp_.prepare_forward(); }
  void step(torch::optim::Optimizer& opt) override {
    fsdp_.finish_backward();
    fsdp_.step(opt);
  }
  std::vector<at::Tensor> optimizer_params() override { return fsdp_.optimizer_params(); }
  RankBytes bytes(const torch::optim::Optimizer& opt) override {
    const auto s = fsdp_.model_state_bytes(&opt);
    // FSDP's ModelStateBytes has no comm-buffer field (gathered units are in
    // params): -1 prints as null, "not reported", rather than a made-up 0.
    return {s.params, s.grads, s.optimizer_state, -1, 0};
  }
  int64_t padded_numel() override {
    int64_t n = 0;
    for (const auto& u : fsdp_.units()) n += u.padded_numel;
    return n;
  }
  std::string padding() override { return "each FSDP unit padded to a multiple of the world size"; }

 private:
  paratrain::fsdp::FullyShardedDataParallel fsdp_;
};

std::unique_ptr<Engine> make_engine(int stage, std::shared_ptr<torch::nn::Module> model,
                                    comm::ProcessGroup& group) {
  if (stage == 0) return std::make_unique<DdpEngine>(std::move(model), group);
  if (stage == 3) return std::make_unique<FsdpEngine>(std::move(model), group);
  return std::make_unique<ZeroEngine>(std::move(model), group, stage);
}

// Same model and data as bench/ddp_throughput.cpp: 8 ready-made batches per
// rank, cycled, so a step pays for no data handling.
Workload make_workload(const BenchOptions& o, int rank) {
  constexpr int64_t kPoolBatches = 8;
  torch::manual_seed(o.seed);
  Workload w;
  w.model = paratrain::models::make_mlp({784, {1024, 1024}, 10});
  paratrain::data::SyntheticOptions s;
  s.num_samples = kPoolBatches * o.batch;
  s.num_classes = 10;
  s.seed = o.seed + 1000 + static_cast<uint64_t>(rank);
  s.input_shape = {784};
  const paratrain::data::TensorDataset data = paratrain::data::make_synthetic(s);
  for (int64_t b = 0; b < kPoolBatches; ++b) {
    w.inputs.push_back(data.inputs.narrow(0, b * o.batch, o.batch).contiguous());
    w.targets.push_back(data.targets.narrow(0, b * o.batch, o.batch).contiguous());
  }
  return w;
}

// prepare_forward, forward, cross-entropy, zero_grad, backward (reduction
// inside), engine step (optimizer + whatever the stage does after it).
float run_steps(Workload& w, Engine& engine, torch::optim::Optimizer& opt, int steps, Phases* phases) {
  at::Tensor loss;
  for (int i = 0; i < steps; ++i) {
    const size_t b = static_cast<size_t>(i) % w.inputs.size();
    const auto t0 = Clock::now();
    engine.prepare_forward();
    loss = torch::nn::functional::cross_entropy(w.model->forward(w.inputs[b]), w.targets[b]);
    const auto t1 = Clock::now();
    opt.zero_grad();
    loss.backward();
    const auto t2 = Clock::now();
    engine.step(opt);
    const auto t3 = Clock::now();
    phases->forward_ms += ms_between(t0, t1);
    phases->backward_ms += ms_between(t1, t2);
    phases->step_ms += ms_between(t2, t3);
  }
  return loss.defined() ? loss.item<float>() : 0.0f;
}

// getrusage's high-water mark of this process's resident set (Linux: KiB).
int64_t peak_rss_bytes() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

}  // namespace
