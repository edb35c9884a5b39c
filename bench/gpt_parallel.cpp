// One rank of the GPT parallelism benchmark: trains the GPT of a config
// (configs/gpt_fortunes.toml) through the Trainer under whatever layout the
// --set options give (parallel.tp, parallel.cp, parallel.megatron_sp, dp),
// and prints, on rank 0, one JSON line: parameters per rank, tokens/s, and the
// bytes each collective moved per step on each group, read from the hang
// doctor's flight recorder, next to the analytic Megatron count for TP.
// Not a driver: bench/run_gpt_parallel.sh launches it at each layout.
//
//   paratrain launch --nproc-per-node 2 -- gpt_parallel -c configs/gpt_fortunes.toml --set parallel.tp=2
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"
#include "paratrain/core/logging.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = paratrain::comm;
namespace train = paratrain::train;

struct Options {
  std::string config = "configs/gpt_fortunes.toml";
  std::vector<std::string> overrides;
  int warmup = 2;  // untimed steps first (allocator, sockets, first-touch)
  int steps = 6;   // timed and counted steps
  std::string out;  // also append the JSON line here (rank 0)
};

// Marks where the counted window starts and ends: the recorder's history
// index and the clock at the end of step `warmup` and of the last step.
class Window final : public train::Callback {
 public:
  Window(std::shared_ptr<comm::FlightRecorder> recorder, int64_t first, int64_t last)
      : recorder_(std::move(recorder)), first_(first), last_(last) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (info.step == first_) mark(begin_index, begin);
    if (info.step == last_) mark(end_index, end);
  }
  uint64_t begin_index = 0, end_index = 0;
  Clock::time_point begin, end;

 private:
  void mark(uint64_t& index, Clock::time_point& at) {
    const auto records = recorder_->records();
    index = records.empty() ? 0 : records.back().index + 1;
    at = Clock::now();
  }
  std::shared_ptr<comm::FlightRecorder> recorder_;
  int64_t first_, last_;
};

int64_t element_bytes(const std::string& dtype) {
  if (dtype == "Double" || dtype == "Long") return 8;
  if (dtype == "BFloat16" || dtype == "Half") return 2;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool") return 1;
  return 4;
}

// Megatron's count for tensor parallelism without sequence parallelism, per
// rank and step: in each layer the attention output and the MLP output are
// all-reduced in forward (2 x b*s*h) and the inputs of qkv and fc in backward
// (2 x b*s*h); the vocab-parallel embedding adds one forward all-reduce and
// the LM head's input one backward all-reduce (2 x b*s*h); the vocab-parallel
// cross-entropy all-reduces the max, the sum of exponentials and the target
// logit per token (3 x b*s). In elements of fp32, per micro-batch of b
// sequences of s tokens; h = d_model.
int64_t megatron_tp_elements(const train::TrainConfig& c, int64_t b) {
  const int64_t s = c.model.seq_len / c.parallel.cp, h = c.model.d_model;
  return (4 * c.model.layers + 2) * b * s * h + 3 * b * s;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"GPT parallelism benchmark (one rank; run under paratrain launch)"};
  app.add_option("-c,--config", o.config, "config file")->capture_default_str();
  app.add_option("--set", o.overrides, "KEY=VALUE overrides, as paratrain train --set");
  app.add_option("--warmup", o.warmup, "untimed steps before the counted ones")->capture_default_str();
  app.add_option("--steps", o.steps, "timed and counted steps")->capture_default_str();
  app.add_option("--out", o.out, "also append the JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  try {
    train::TrainConfig c = train::load_config(o.config, o.overrides);
    if (o.warmup < 1 || o.steps < 1) throw paratrain::ConfigError("--warmup and --steps must be >= 1");
    c.train.max_steps = o.warmup + o.steps;
    c.train.eval_every_epochs = 0;  // no evaluation inside the window
    c.run.log_every = 0;            // no loss all-reduce per step either
    c.run.name = fmt::format("{}_bench", c.run.name);
    c.run.version = -1;
    if (c.run.output_dir == "runs") c.run.output_dir = "/tmp/paratrain-gpt-bench";

    const auto world = comm::world_from_env();
    paratrain::init_logging(world.rank, "warn");
    comm::InitOptions init;
    init.timeout = std::chrono::seconds(c.world.timeout_s);
    init.backend = c.world.backend;
    init.doctor_records = 1 << 20;  // every collective of the run stays in the ring
    auto group = comm::init_process_group(world, init);
    auto recorder = comm::recorder_of(*group);
    if (!recorder) throw paratrain::Error("the world group records no collectives");

    train::Trainer trainer(c, *group);
    auto window = std::make_shared<Window>(recorder, o.warmup, o.warmup + o.steps);
    trainer.add_callback(window);
    trainer.fit();

    // Bytes per step of each (group, op) in the window, as this rank saw them.
    const auto groups = recorder->groups();
    std::map<std::string, nlohmann::json> per;
    for (const auto& r : recorder->records()) {
      if (r.index < window->begin_index || r.index >= window->end_index) continue;
      const std::string key = fmt::format("{}/{}", groups.at(r.group).name, r.op);
      auto& e = per[key];
      if (e.is_null()) e = {{"count", 0}, {"elements", 0}, {"bytes", 0}};
      e["count"] = e["count"].get<int64_t>() + 1;
      e["elements"] = e["elements"].get<int64_t>() + r.numel;
      e["bytes"] = e["bytes"].get<int64_t>() + r.numel * element_bytes(r.dtype);
    }
    nlohmann::json collectives = nlohmann::json::object();
    for (auto& [key, e] : per) {
      for (const char* f : {"count", "elements", "bytes"}) e[f] = e[f].get<double>() / o.steps;
      collectives[key] = e;
    }
    int64_t params = 0;
    for (const auto& p : trainer.model()->parameters()) params += p.numel();
    const double seconds = std::chrono::duration<double>(window->end - window->begin).count();
    const int64_t dp = group->size() / (c.parallel.tp * c.parallel.cp * c.parallel.pp);
    const int64_t per_rank_batch =
        c.data.global_batch_size > 0 ? c.data.global_batch_size / dp : c.data.batch_size;
    const int64_t tokens_per_step = per_rank_batch * dp * c.train.accumulate * c.model.seq_len;
    nlohmann::json j = {
        {"world", group->size()}, {"tp", c.parallel.tp}, {"cp", c.parallel.cp}, {"dp", dp},
        {"megatron_sp", c.parallel.megatron_sp}, {"layers", c.model.layers}, {"d_model", c.model.d_model},
        {"heads", c.model.heads}, {"seq_len", c.model.seq_len}, {"batch_per_dp_rank", per_rank_batch},
        {"steps", o.steps}, {"warmup", o.warmup}, {"seconds", seconds},
        {"tokens_per_s", tokens_per_step * o.steps / seconds}, {"params_rank0", params},
        {"param_bytes_rank0", params * 4}, {"collectives_per_step_rank0", collectives},
    };
    if (c.parallel.tp > 1 && !c.parallel.megatron_sp) {
      const int64_t elements = megatron_tp_elements(c, per_rank_batch) * c.train.accumulate;
      j["analytic_tp_all_reduce_elements_per_step"] = elements;
      j["analytic_tp_all_reduce_bytes_per_step"] = elements * 4;
    }
    if (group->rank() == 0) {
      const std::string line = j.dump();
      std::printf("%s\n", line.c_str());
      if (!o.out.empty()) std::ofstream(o.out, std::ios::app) << line << "\n";
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpt_parallel: %s\n", e.what());
    return 1;
  }
}
