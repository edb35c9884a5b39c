// In-job recovery time (elastic.in_job, train/recovery/in_job.h): ranks as threads
// of this process, each with its own Gloo group over one in-memory store,
// train the config's model; the last rank aborts its group after step
// --die-at (as a killed process's sockets close) and leaves. Measured on the
// survivors' rank 0: from that abort to the end of the first step after the
// recovery (detection + membership round + new group + rebuilt DDP + the
// redone step), next to the median step time before the failure. Prints one
// JSON object per world size, then a summary line.
//
//   build/bench/in_job_recovery -c configs/fashion_mnist_mlp.toml --worlds 2,4 --trials 3
#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/torch.h>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = paratrain::comm;
namespace train = paratrain::train;

struct Died : std::runtime_error {
  Died() : std::runtime_error("made to die") {}
};

struct Timeline {
  std::mutex mu;
  Clock::time_point died{};
  Clock::time_point first_after{};
  std::vector<double> step_ms;  // survivors' rank 0, before the failure
};

class Probe : public train::Callback {
 public:
  Probe(comm::ProcessGroup& group, bool dies, bool watches, int64_t die_at, Timeline& t)
      : group_(group), dies_(dies), watches_(watches), die_at_(die_at), t_(t) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    const auto now = Clock::now();
    if (dies_ && info.step == die_at_) {
      {
        std::lock_guard<std::mutex> lock(t_.mu);
        t_.died = Clock::now();
      }
      group_.abort();
      throw Died();
    }
    if (watches_) {
      std::lock_guard<std::mutex> lock(t_.mu);
      if (info.step <= die_at_ && last_ != Clock::time_point{}) {
        t_.step_ms.push_back(std::chrono::duration<double, std::milli>(now - last_).count());
      }
      if (info.step == die_at_ + 1) t_.first_after = now;
      last_ = now;
    }
  }

 private:
  comm::ProcessGroup& group_;
  bool dies_, watches_;
  int64_t die_at_;
  Timeline& t_;
  Clock::time_point last_{};
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One job of `world` ranks; returns {recovery ms, median step ms}.
std::pair<double, double> trial(const train::TrainConfig& base, int world, int64_t die_at, int index) {
  auto c = base;
  c.run.name = fmt::format("in_job_bench_w{}_t{}", world, index);
  c.run.version = -1;
  c.elastic.in_job = true;
  c.train.max_steps = die_at + 3;
  c.train.eval_every_epochs = 0;
  c.train.checkpoint_every_steps = 0;
  auto store = c10::make_intrusive<c10d::HashStore>();
  Timeline t;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        comm::GlooOptions gloo;
        gloo.timeout = std::chrono::seconds(c.world.timeout_s);
        auto group = comm::make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("gen0", store), rank, world, gloo);
        train::Trainer trainer(c, *group);
        comm::RejoinOptions options;
        options.gloo = gloo;
        trainer.enable_in_job_recovery(std::make_shared<comm::Rejoiner>(store, "elastic", options));
        trainer.add_callback(std::make_shared<Probe>(*group, rank == world - 1, rank == 0, die_at, t));
        trainer.fit();
      } catch (const Died&) {
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
        ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  if (failures > 0) throw std::runtime_error("a survivor failed; see above");
  return {std::chrono::duration<double, std::milli>(t.first_after - t.died).count(), median(t.step_ms)};
}

}  // namespace

int main(int argc, char** argv) {
  // A survivor's Gloo writev() to the dead rank's closed socket raises
  // SIGPIPE, which would end this process (`paratrain train` ignores it too).
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app("in-job recovery time: failure -> first step after recovery");
  std::string config_path = "configs/fashion_mnist_mlp.toml";
  std::vector<int> worlds{2, 4};
  int trials = 3;
  int64_t die_at = 10;
  std::string output_dir = "/tmp/paratrain_in_job_bench";
  app.add_option("-c,--config", config_path);
  app.add_option("--worlds", worlds)->delimiter(',');
  app.add_option("--trials", trials);
  app.add_option("--die-at", die_at, "the last rank dies after this step");
  app.add_option("--output-dir", output_dir);
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);  // ranks share the cores, one compute thread each (design.md)
  auto base = train::load_config(config_path, {"run.output_dir=" + output_dir, "log.progress=off"});
  std::string summary;
  for (int world : worlds) {
    std::vector<double> rec, step;
    for (int i = 0; i < trials; ++i) {
      auto [r, s] = trial(base, world, die_at, i);
      rec.push_back(r);
      step.push_back(s);
    }
    nlohmann::json out = {{"bench", "in_job_recovery"}, {"config", config_path},
                          {"world_before", world}, {"world_after", world - 1}, {"die_at_step", die_at},
                          {"trials", trials}, {"recovery_ms", rec}, {"recovery_ms_median", median(rec)},
                          {"step_ms_median_before", median(step)},
                          {"recovery_in_steps", median(rec) / std::max(median(step), 1e-9)}};
    std::printf("%s\n", out.dump().c_str());
    summary += fmt::format("{}->{}: {:.0f} ms ({:.1f} steps); ", world, world - 1, median(rec),
                           median(rec) / std::max(median(step), 1e-9));
  }
  std::printf("in_job_recovery: %s\n", summary.c_str());
  return 0;
}
