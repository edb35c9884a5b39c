// One rank of the pipeline benchmark: a deep MLP cut into pp * v chunks runs
// training steps under one schedule (gpipe, 1f1b, interleaved_1f1b) on
// synthetic batches; every rank records its timeline in memory, rank 0
// gathers them and prints one JSON line: the measured bubble per step (idle
// share of the step from the timelines, pipeline::measure_bubble) next to
// (p-1)/(m+p-1) (or /v interleaved), peak in-flight micro-batches and
// activation bytes per stage, samples/s. The layers are cut by measured time
// (--balance, as pipeline.balance) or by hand (--split, --even-split);
// --events dumps the timelines for bench/pipeline_events.py. Not a driver:
// bench/run_pipeline.sh launches it over schedules and micro-batch counts.
//
//   paratrain launch --nproc-per-node 2 -- pipeline_bubble --schedule 1f1b --microbatches 8
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/core/allocator.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/models/mlp.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/pipeline/partition.h"
#include "paratrain/pipeline/schedule.h"
#include "paratrain/pipeline/stage.h"
#include "paratrain/pipeline/timeline.h"

namespace {

namespace comm = paratrain::comm;
namespace pl = paratrain::pipeline;
using Clock = std::chrono::steady_clock;

struct BenchOptions {
  std::string schedule = "1f1b";
  int microbatches = 4;
  int virtual_stages = 1;
  int layers = 8;       // hidden layers of the MLP (layers + 1 Linear in all)
  int width = 1024;     // wide enough that compute, not messages, fills a step
  int in_features = 0;  // the model's input width (0: = width)
  std::string balance = "time";  // "time" (measured, loss included) or "parameters"
  std::vector<int64_t> split;    // layers per chunk, as pipeline.split (overrides balance)
  bool even_split = false;       // hidden layers evenly over the chunks, the output layer on the last
  int rows = 64;        // per micro-batch
  int steps = 10;       // measured steps
  int warmup = 3;       // unmeasured steps first (allocator, sockets)
  bool recompute = false;
  std::string out;      // also append the JSON line here (rank 0)
  std::string events;   // write every measured event here (rank 0), one JSON line each
};

// Every rank's events, gathered on every rank (8 int64 fields per event).
std::vector<std::vector<pl::TimelineEvent>> gather_events(comm::ProcessGroup& group,
                                                          const std::vector<pl::TimelineEvent>& mine) {
  auto n = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong);
  auto counts_t = torch::zeros({group.size()}, torch::kLong);
  group.all_gather(counts_t, n)->wait();
  std::vector<int64_t> counts;
  for (int r = 0; r < group.size(); ++r) counts.push_back(counts_t[r].item<int64_t>() * 8);
  auto flat = torch::empty({static_cast<int64_t>(mine.size()) * 8}, torch::kLong);
  auto* p = flat.data_ptr<int64_t>();
  for (const auto& e : mine) {
    *p++ = static_cast<int64_t>(e.kind);
    *p++ = e.step;
    *p++ = e.microbatch;
    *p++ = e.chunk;
    *p++ = e.peer;
    *p++ = e.bytes;
    *p++ = e.start_us;
    *p++ = e.end_us;
  }
  int64_t total = 0;
  for (auto c : counts) total += c;
  auto all = torch::empty({total}, torch::kLong);
  group.all_gather_uneven(all, flat, counts)->wait();
  std::vector<std::vector<pl::TimelineEvent>> out(group.size());
  const auto* q = all.data_ptr<int64_t>();
  for (int r = 0; r < group.size(); ++r) {
    for (int64_t i = 0; i < counts[r] / 8; ++i, q += 8) {
      out[r].push_back({static_cast<pl::EventKind>(q[0]), q[1], static_cast<int>(q[2]), static_cast<int>(q[3]),
                        static_cast<int>(q[4]), q[5], q[6], q[7]});
    }
  }
  return out;
}

int run(BenchOptions o) {
  const comm::WorldInfo world = comm::world_from_env();
  auto group = comm::init_process_group(world);
  at::set_num_threads(1);
  const auto kind = pl::parse_schedule(o.schedule);
  const int p = group->size();
  const pl::ScheduleOptions shape{p, o.microbatches, o.virtual_stages};
  pl::validate_schedule(kind, shape);

  const int in_features = o.in_features > 0 ? o.in_features : o.width;
  torch::manual_seed(0);
  auto model = paratrain::models::make_mlp(
      {.in_features = in_features, .hidden = std::vector<int64_t>(o.layers, o.width), .out_features = 10});
  const auto layers = model->layers();
  const auto shapes = pl::infer_boundary_shapes(layers, {in_features});
  auto loss = [](const at::Tensor& out, const at::Tensor& t) { return torch::nn::functional::cross_entropy(out, t); };
  std::vector<double> costs;
  if (o.balance == "time") {
    // As the pipeline strategy does: every rank times every layer (the loss
    // on the last), all cut by the per-layer minimum.
    const auto mine = pl::measure_layer_times(layers, shapes, o.rows, [&](const at::Tensor& out) {
      return loss(out, torch::zeros({out.size(0)}, torch::kLong));
    });
    auto t = torch::tensor(mine, torch::kDouble);
    group->all_reduce(t, comm::ReduceOp::kMin)->wait();
    costs.assign(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  } else {
    costs = pl::layer_parameter_counts(layers);
  }
  const int chunk_count = p * o.virtual_stages;
  if (o.even_split) {
    // With --in-features = 1.5 x width every hidden layer costs the same
    // (the first computes no input gradient), so this cut gives equal
    // stages up to the output layer and the loss (a few percent of a layer).
    if (o.layers % chunk_count != 0) {
      throw std::runtime_error("--even-split: " + std::to_string(o.layers) + " hidden layers over " +
                               std::to_string(chunk_count) + " chunks");
    }
    o.split.assign(chunk_count, o.layers / chunk_count);
    o.split.back() += 1;
  }
  // A given split still reports the probe's chunk costs: how even it is.
  const auto bounds = o.split.empty() ? pl::balanced_partition(costs, p * o.virtual_stages)
                                      : pl::explicit_partition(o.split, static_cast<int>(layers.size()),
                                                               p * o.virtual_stages);
  std::vector<pl::LocalChunk> chunks;
  for (int i = 0; i < o.virtual_stages; ++i) {
    const int mc = i * p + group->rank();
    pl::LocalChunk c;
    c.module = std::make_shared<pl::StageModule>(
        std::vector<paratrain::models::Layer>(layers.begin() + bounds[mc], layers.begin() + bounds[mc + 1]));
    c.model_chunk = mc;
    c.input_shape = shapes.shapes[bounds[mc]];
    c.output_shape = shapes.shapes[bounds[mc + 1]];
    chunks.push_back(std::move(c));
  }
  model.reset();
  pl::ExecutorOptions options;
  options.schedule = kind;
  options.shape = shape;
  options.checkpoint_activations = o.recompute;
  pl::Executor executor(*group, chunks, options);
  pl::TimelineOptions topts;
  topts.max_steps = o.warmup + o.steps;
  pl::Timeline timeline(group->rank(), topts);

  const int64_t batch = static_cast<int64_t>(o.rows) * o.microbatches;
  auto x = torch::randn({batch, in_features});
  auto y = torch::randint(0, 10, {batch}, torch::kLong);
  pl::StepReport report;
  Clock::time_point start;
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) {
      group->barrier()->wait();
      start = Clock::now();
    }
    report = executor.train_step(x, y, loss, {}, &timeline, s);
    // Keep the gradient buffers: reallocating them every step page-faults
    // in the first backward and shows up as a bubble the schedule did not make.
    for (auto& c : chunks) c.module->zero_grad(/*set_to_none=*/false);
  }
  group->barrier()->wait();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();

  const auto per_rank = gather_events(*group, timeline.events());
  auto stats = torch::tensor({static_cast<int64_t>(report.peak_in_flight), report.peak_activation_bytes});
  auto all_stats = torch::zeros({2 * p}, torch::kLong);
  group->all_gather(all_stats, stats)->wait();
  if (group->rank() != 0) return 0;

  if (!o.events.empty()) {
    // Raw events, so where the idle time goes can be read off one step.
    std::ofstream f(o.events);
    for (int r = 0; r < p; ++r) {
      for (const auto& e : per_rank[r]) {
        if (e.step < o.warmup) continue;
        f << nlohmann::json{{"rank", r}, {"kind", pl::to_string(e.kind)}, {"step", e.step}, {"mb", e.microbatch},
                            {"chunk", e.chunk}, {"peer", e.peer}, {"bytes", e.bytes}, {"start_us", e.start_us},
                            {"end_us", e.end_us}}
                 .dump()
          << "\n";
      }
    }
  }
  std::vector<double> bubbles;
  for (int s = o.warmup; s < o.warmup + o.steps; ++s) bubbles.push_back(pl::measure_bubble(per_rank, s).bubble);
  // The whole loop's view: idle share of the mean step period (elapsed /
  // steps), which also holds what lies between steps (zero_grad, the rank
  // that finishes first waiting for the next step).
  double busy_us = 0;
  for (int r = 0; r < p; ++r) {
    for (const auto& e : per_rank[r]) {
      if (e.step >= o.warmup && (e.kind == pl::EventKind::kForward || e.kind == pl::EventKind::kBackward ||
                                 e.kind == pl::EventKind::kRecompute)) {
        busy_us += static_cast<double>(e.end_us - e.start_us);
      }
    }
  }
  const double bubble_period = 1.0 - busy_us / p / (elapsed * 1e6);  // mean busy share of the elapsed time
  std::vector<double> sorted = bubbles;
  std::sort(sorted.begin(), sorted.end());
  nlohmann::json in_flight = nlohmann::json::array(), act_bytes = nlohmann::json::array();
  for (int r = 0; r < p; ++r) {
    in_flight.push_back(all_stats[2 * r].item<int64_t>());
    act_bytes.push_back(all_stats[2 * r + 1].item<int64_t>());
  }
  nlohmann::json layers_per_chunk = nlohmann::json::array(), chunk_cost = nlohmann::json::array();
  for (size_t c = 0; c + 1 < bounds.size(); ++c) {
    layers_per_chunk.push_back(bounds[c + 1] - bounds[c]);
    double sum = 0;
    for (int i = bounds[c]; i < bounds[c + 1]; ++i) sum += costs[i];
    chunk_cost.push_back(o.balance == "time" ? sum * 1e3 : sum);  // ms, or parameters
  }
  nlohmann::json j = {
      {"bench", "pipeline_bubble"},
      {"schedule", o.schedule},
      {"stages", p},
      {"microbatches", o.microbatches},
      {"virtual_stages", o.virtual_stages},
      {"recompute", o.recompute},
      {"layers", o.layers + 1},
      {"width", o.width},
      {"in_features", in_features},
      {"balance", o.even_split ? "even_split" : o.split.empty() ? o.balance : "split"},
      {"layers_per_chunk", layers_per_chunk},
      {"chunk_cost", chunk_cost},
      {"layer_cost", costs},
      {"rows_per_microbatch", o.rows},
      {"bubble_formula", pl::theoretical_bubble(kind, shape)},
      {"bubble_measured_median", sorted[sorted.size() / 2]},
      {"bubble_measured_min", sorted.front()},
      {"bubble_measured", bubbles},
      {"bubble_period", bubble_period},
      {"peak_in_flight", in_flight},
      {"peak_activation_bytes", act_bytes},
      {"samples_per_s", static_cast<double>(batch) * o.steps / elapsed},
  };
  const std::string line = j.dump();
  std::printf("%s\n", line.c_str());
  if (!o.out.empty()) std::ofstream(o.out, std::ios::app) << line << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  paratrain::core::retain_freed_memory();
  BenchOptions o;
  CLI::App app{"pipeline bubble benchmark (one rank; run under paratrain launch)"};
  app.add_option("--schedule", o.schedule, "gpipe | 1f1b | interleaved_1f1b");
  app.add_option("--microbatches", o.microbatches, "micro-batches per step")->check(CLI::PositiveNumber);
  app.add_option("--virtual-stages", o.virtual_stages, "chunks per rank (interleaved)")->check(CLI::PositiveNumber);
  app.add_option("--layers", o.layers, "hidden layers")->check(CLI::PositiveNumber);
  app.add_option("--width", o.width, "hidden width")->check(CLI::PositiveNumber);
  app.add_option("--in-features", o.in_features, "input width (default: the hidden width)")
      ->check(CLI::PositiveNumber);
  app.add_option("--split", o.split, "layers per chunk, e.g. 16,17 (as pipeline.split; overrides --balance)")
      ->delimiter(',');
  app.add_flag("--even-split", o.even_split, "hidden layers evenly over the chunks, the output layer on the last");
  app.add_option("--balance", o.balance, "cut the layers by measured \"time\" (loss included) or \"parameters\"")
      ->check(CLI::IsMember({"time", "parameters"}));
  app.add_option("--events", o.events, "write the measured steps' events here, one JSON line each");
  app.add_option("--rows", o.rows, "rows per micro-batch")->check(CLI::PositiveNumber);
  app.add_option("--steps", o.steps, "measured steps")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "unmeasured steps first")->check(CLI::NonNegativeNumber);
  app.add_flag("--recompute", o.recompute, "activation checkpointing");
  app.add_option("--out", o.out, "append the JSON line to this file (rank 0)");
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pipeline_bubble: %s\n", e.what());
    return 1;
  }
}
