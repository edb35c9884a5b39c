// `paratrain federated`: a whole federated training run on one or more
// processes: data, partition, the global model, rounds (round.h), the
// server's evaluation of the global model, metrics.jsonl, progress lines and
// global-model checkpoints in the run directory. A driver beside the SPMD
// Trainer sharing its config, data, models and checkpoint format.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>

#include "paratrain/comm/process_group.h"
#include "paratrain/data/dataset.h"
#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::federated {

struct Evaluation {
  double loss = 0.0;
  double accuracy = 0.0;
  int64_t count = 0;
};

// Cross-entropy and accuracy of `model` on `data` (no gradients), in chunks.
Evaluation evaluate(models::Model& model, const data::TensorDataset& data, int64_t chunk = 1000);

struct FederatedResult {
  int64_t rounds = 0;
  int64_t rounds_applied = 0;  // rounds whose update reached the global model
  Evaluation test;             // of the final global model (server only)
  std::filesystem::path run_dir;
};

// Every rank of `world` calls it: rank 0 serves, the others host clients
// (see round.h); after the start the ranks talk point to point, and a client
// process that dies costs the run only its clients. The server writes
// <run_dir>/metrics.jsonl (one record per round), config.toml and
// checkpoints/step_<round>/ (the global model and the server optimizer's
// state in the sharded format, Note [Federated checkpoint]) every
// federated.checkpoint_every rounds and at the end; train.resume ("auto" or
// a path) continues from one. On client hosts the result holds only
// run_dir and rounds. The server keeps <run_dir>/run.json as `paratrain
// train` does ("running", then "finished" or "failed"); `on_run_dir`, when
// given, is called on every rank with the run's folder once it exists (the
// CLI records a signal's "stopped" there).
FederatedResult run_federated(const train::TrainConfig& config, comm::ProcessGroup& world,
                              const std::function<void(const std::filesystem::path&)>& on_run_dir = {});

}  // namespace paratrain::federated
