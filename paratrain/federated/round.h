// The federated round over the comm layer: rank 0 is the server, clients are
// spread over the other ranks (all on rank 0 when it is alone), each rank
// hosting many simulated clients with their own rows. Not the run around it
// (run.h: data, evaluation, metrics, checkpoints) nor the local training
// (client.h).
//
// Note [Federated round]
// 1. Every rank draws the same sample of clients (sampling.h: seeded by run
//    seed and round, so the selection travels without a message) and the
//    same simulated dropouts.
// 2. The server broadcasts the global model x_t (the "download").
// 3. Each rank trains its sampled clients one after another on one model
//    object, each from x_t with a fresh optimizer, and adds n_k (x_k - x_t)
//    to a running sum (n_k = the client's rows: FedAvg's weight). A client
//    whose training throws is dropped from the round and logged.
// 4. One reduce to the server carries [sum, sum n_k, clients, loss]: the
//    "upload". Summing on the client ranks first is exact for FedAvg (the
//    server only ever needs the weighted sum) and sends one vector per rank.
// 5. With at least federated.min_clients updates, the server applies the
//    mean delta with its optimizer (server_optimizer.h); with fewer the
//    round is skipped, logged, and x_t kept.
// The bytes reported are what a real deployment would move per client:
// the model down to each sampled client, an update (+ its count) up from
// each that reported.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data/dataset.h"
#include "paratrain/federated/partition.h"
#include "paratrain/federated/server_optimizer.h"
#include "paratrain/train/config.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::federated {

struct RoundReport {
  int64_t round = 0;
  std::vector<int64_t> sampled;   // client ids
  std::vector<int64_t> dropped;   // sampled clients that did not report (simulated or failed on this rank)
  int64_t reported = 0;           // updates the server aggregated (server only: the others count their own)
  bool applied = false;           // false: fewer than min_clients reported, global model unchanged
  double train_loss = 0.0;        // sample-weighted mean local loss of the reporting clients
  int64_t bytes_down = 0;
  int64_t bytes_up = 0;
};

class FederatedRun {
 public:
  // Collective over `world`. `model` is this rank's copy (built by the
  // caller, e.g. from the same seed); rank 0's weights are the initial
  // global model. `train` is the whole training set (every rank computes
  // the same partition and keeps the rows of its own clients).
  FederatedRun(const train::TrainConfig& config, comm::ProcessGroup& world, std::shared_ptr<models::Model> model,
               const data::TensorDataset& train);

  // Note [Federated round]; collective. Throws CommError / TimeoutError.
  RoundReport run_round(int64_t round);

  // Collective: every rank's model holds the global weights (checkpoints,
  // and tests that compare all ranks).
  void sync_model();

  // The global model as a flat float32 vector: current on the server (rank
  // 0); on the other ranks as of the last broadcast.
  const at::Tensor& global() const { return global_; }
  const Partition& partition() const { return partition_; }
  const ServerOptimizer& server_optimizer() const { return server_optimizer_; }
  // The rank hosting `client`.
  int host_of(int64_t client) const;
  models::Model& model() { return *model_; }

 private:
  const train::TrainConfig& config_;
  comm::ProcessGroup& world_;
  std::shared_ptr<models::Model> model_;
  Partition partition_;
  std::vector<data::TensorDataset> client_data_;  // indexed by client id; empty for clients hosted elsewhere
  at::Tensor global_;
  ServerOptimizer server_optimizer_;
};

// The partition options of a config (federated.partition, alpha,
// shards_per_client, clients; seeded by run.seed).
PartitionOptions partition_options(const train::TrainConfig& config);
// The class label of every row of `train` (targets as int64 class ids).
std::vector<int64_t> labels_of(const data::TensorDataset& train);

}  // namespace paratrain::federated
