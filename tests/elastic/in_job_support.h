// What the in-job recovery tests share (tests/elastic/): a job whose ranks
// are threads with their own Gloo groups over one test-held store, one of
// which "dies" after a given step by aborting its group and leaving (as a
// killed process's sockets close, it never joins a membership round), and
// the recovery records of a run's metrics.jsonl.
#pragma once

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/rejoin.h"
#include "paratrain/train/callbacks.h"
#include "paratrain/train/trainer.h"
#include "tests/support/trainer_oracle.h"

namespace paratrain::testing {

struct Died : std::runtime_error {
  Died() : std::runtime_error("this rank was made to die") {}
};

// Aborts this rank's group after step `at` and leaves.
class DieAfter : public train::Callback {
 public:
  DieAfter(comm::ProcessGroup& group, int64_t at) : group_(group), at_(at) {}
  void on_train_batch_end(const train::StepInfo& info) override {
    if (info.step == at_) {
      group_.abort();
      throw Died();
    }
  }

 private:
  comm::ProcessGroup& group_;
  int64_t at_;
};

struct RankOutcome {
  std::optional<Params> params;
  std::exception_ptr error;
  train::TrainResult result;
};

// Trains `c` on `world` threads; rank `dying` (-1: none) dies after step
// `death`. With `with_rejoiner` every rank can recover in the job. `setup`
// (if any) sees each rank's group and Trainer before fit(), to add
// callbacks (another way to die, for instance).
inline std::vector<RankOutcome> run_job_with_death(const train::TrainConfig& c, int world, int dying,
                                                   int64_t death, bool with_rejoiner,
                                                   const std::function<void(int, comm::ProcessGroup&, train::Trainer&)>& setup = {}) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<RankOutcome> out(world);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        comm::GlooOptions gloo;
        gloo.timeout = std::chrono::seconds(c.world.timeout_s);
        auto group = comm::make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("gen0", store), rank, world, gloo);
        train::Trainer trainer(c, *group);
        if (with_rejoiner) {
          comm::RejoinOptions options;
          options.gloo = gloo;
          trainer.enable_in_job_recovery(std::make_shared<comm::Rejoiner>(store, "elastic", options));
        }
        if (rank == dying) trainer.add_callback(std::make_shared<DieAfter>(*group, death));
        if (setup) setup(rank, *group, trainer);
        out[rank].result = trainer.fit();
        out[rank].params = trainer.full_parameters();
      } catch (...) {
        out[rank].error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

inline std::vector<nlohmann::json> recovery_records(const std::filesystem::path& metrics) {
  std::vector<nlohmann::json> out;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.value("kind", "") == "recovery") out.push_back(j);
  }
  return out;
}

}  // namespace paratrain::testing
