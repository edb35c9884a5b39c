// bf16 autocast vs fp32 training throughput on this machine, one process:
// the MLP (784-1024-1024-10) and the CNN (32-64 channels, Fashion-MNIST
// shape) on synthetic in-memory batches with SGD, fp32 master weights as the
// Trainer does (autocast around forward and loss only). Prints one JSON line
// per model with samples/s of each and the ratio bf16 / fp32 measured in the
// same run, rounds interleaved so machine noise hits both alike.
// Not a driver and not a test: results go to bench/results/ by hand.
//
//   build/bench/precision_throughput --steps 30 --rounds 3
#include <chrono>
#include <cstdio>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/core/allocator.h"
#include "paratrain/core/autocast.h"
#include "paratrain/models/cnn.h"
#include "paratrain/models/mlp.h"

namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  int steps = 30;   // timed steps per round and dtype
  int warmup = 3;   // untimed steps first (allocator, bf16 weight casts)
  int rounds = 3;   // fp32 and bf16 alternate this many times; best round counts
  int batch = 64;
};

// Seconds for `steps` SGD steps of `model` at `dtype` (kFloat = plain fp32).
double time_steps(paratrain::models::Model& model, torch::optim::SGD& opt, at::ScalarType dtype, int steps,
                  const at::Tensor& x, const at::Tensor& y) {
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) {
    at::Tensor loss;
    {
      paratrain::core::AutocastGuard autocast(dtype);
      loss = torch::nn::functional::cross_entropy(model.forward(x).to(at::kFloat), y);
    }
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  return std::chrono::duration<double>(Clock::now() - start).count();
}

nlohmann::json bench_model(const std::string& name, std::shared_ptr<paratrain::models::Model> model,
                           const BenchOptions& o) {
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
  const at::Tensor x = torch::randn({o.batch, 1, 28, 28});
  const at::Tensor y = torch::randint(0, 10, {o.batch}, torch::kLong);
  for (auto dtype : {at::kFloat, at::kBFloat16}) time_steps(*model, opt, dtype, o.warmup, x, y);
  double best_fp32 = 1e30, best_bf16 = 1e30;
  for (int r = 0; r < o.rounds; ++r) {
    best_fp32 = std::min(best_fp32, time_steps(*model, opt, at::kFloat, o.steps, x, y));
    best_bf16 = std::min(best_bf16, time_steps(*model, opt, at::kBFloat16, o.steps, x, y));
  }
  const double fp32 = o.steps * o.batch / best_fp32;
  const double bf16 = o.steps * o.batch / best_bf16;
  return {{"bench", "precision_throughput"}, {"model", name},           {"batch", o.batch},
          {"steps", o.steps},                {"rounds", o.rounds},        {"threads", at::get_num_threads()},
          {"fp32_samples_per_s", fp32},      {"bf16_samples_per_s", bf16}, {"bf16_over_fp32", bf16 / fp32}};
}

}  // namespace

int main(int argc, char** argv) {
  paratrain::core::retain_freed_memory();
  BenchOptions o;
  CLI::App app{"bf16 autocast vs fp32 training throughput (one process)"};
  app.add_option("--steps", o.steps, "timed steps per round and dtype")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps per dtype first")->check(CLI::NonNegativeNumber);
  app.add_option("--rounds", o.rounds, "alternating rounds; the best counts")->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "examples per step")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  torch::manual_seed(0);
  auto mlp = paratrain::models::make_mlp({.in_features = 784, .hidden = {1024, 1024}, .out_features = 10});
  auto cnn = paratrain::models::make_cnn({.channels = {32, 64}, .hidden = 128});
  for (auto& [name, model] : {std::pair{std::string("mlp"), mlp}, std::pair{std::string("cnn"), cnn}}) {
    std::printf("%s\n", bench_model(name, model, o).dump().c_str());
    std::fflush(stdout);
  }
  return 0;
}
