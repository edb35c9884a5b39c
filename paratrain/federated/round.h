// The federated round over the comm layer: rank 0 is the server, clients are
// spread over the other ranks (all on rank 0 when it is alone), each rank
// hosting many simulated clients with their own rows. Not the run around it
// (run.h: data, evaluation, metrics, checkpoints) nor the local training
// (client.h).
//
// Note [Federated round]
// 1. The server samples the round's clients among those still alive
//    (sampling.h: seeded by run seed and round; while no process died this
//    is the sample of all clients) and draws the simulated dropouts.
// 2. Download: it sends each live client host (mailbox.h) the list of its
//    participating clients and the global model x_t.
// 3. Each host trains its participants one after another on one model
//    object, each from x_t with its optimizer (fresh, or its own kept one:
//    federated.client_optimizer_state), and sends each client's
//    [n_k (x_k - x_t), n_k, 1, n_k loss_k] as soon as it is done (n_k = the
//    client's rows: FedAvg's weight), then "round done" with the clients
//    whose training threw.
// 4. The round closes when every participant on a live host reported or
//    failed, or once the deadline (federated.round_timeout_s) passed with at
//    least federated.min_clients updates. Participants still training then
//    are late, those of a process that died (its connection closed) are
//    lost and the process is never sent a round again; all are dropped from
//    the round and logged. Late updates of closed rounds are discarded.
// 5. With at least min_clients updates the server sums them in client
//    order (so the result does not depend on arrival order) and applies the
//    mean delta with its optimizer (server_optimizer.h); with fewer the
//    round is skipped, logged, and x_t kept.
// Secure aggregation adds, between 2 and 3, the key exchange (hosts send
// their participants' public keys, the server relays the list; the keys
// that arrived by the deadline define the participants), masks each update
// before it leaves the host, and after 4 the recovery: the server names
// the dropped participants and each host with survivors answers with their
// seeds (Note [Pairwise masks]). Recovery waits for those hosts without a
// deadline, and a host that dies during it fails (skips) the round.
// Alone (one process) the server hosts every client and nothing is sent.
// The bytes reported are what a real deployment would move per client:
// the model down to each sampled client, an update (+ its count) up from
// each that reported.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data/dataset.h"
#include "paratrain/federated/mailbox.h"
#include "paratrain/federated/partition.h"
#include "paratrain/federated/server_optimizer.h"
#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}
namespace torch::optim {
class Optimizer;
}

namespace paratrain::federated {

struct RoundReport {
  int64_t round = 0;
  std::vector<int64_t> sampled;   // client ids
  std::vector<int64_t> dropped;   // sampled clients whose update is not in the aggregate, for any reason below
  std::vector<int64_t> failed;    // ... whose training threw
  std::vector<int64_t> late;      // ... still training when the deadline closed the round (server only)
  std::vector<int64_t> lost;      // ... hosted by a process that died (server only)
  std::vector<int> lost_ranks;    // client processes found dead during this round (server only)
  int64_t pool = 0;               // clients alive when the round sampled (the accountant's N)
  int64_t reported = 0;           // updates the server aggregated (server only: the others count their own)
  bool applied = false;           // false: fewer than min_clients reported, global model unchanged
  int64_t secure_bytes_up = 0;    // secure aggregation: extra bytes per reporting client (keys, 8-byte lanes, seeds)
  int64_t secure_bytes_down = 0;  // ... per sampled client (every participant's key)
  double train_loss = 0.0;        // sample-weighted mean local loss of the reporting clients
  int64_t bytes_down = 0;
  int64_t bytes_up = 0;
};

class FederatedRun {
 public:
  // Collective over `world` (the last collective of the run). `model` is this rank's copy (built by the
  // caller, e.g. from the same seed); rank 0's weights are the initial
  // global model. `train` is the whole training set (every rank computes
  // the same partition and keeps the rows of its own clients).
  FederatedRun(const train::TrainConfig& config, comm::ProcessGroup& world, std::shared_ptr<models::Model> model,
               const data::TensorDataset& train);

  ~FederatedRun();  // finish(), errors logged; while unwinding from an error it waits on no peer
  FederatedRun(const FederatedRun&) = delete;
  FederatedRun& operator=(const FederatedRun&) = delete;

  // Note [Federated round]: every rank calls it once per round. The server
  // drives round `round`; a client host serves the server's next round
  // (whatever its number: a resumed run starts past 1) and returns at once
  // once the server stopped the run (stopped()). Throws CommError on a host
  // whose server is gone; the server survives any client process.
  RoundReport run_round(int64_t round);

  // Every rank, after its last round: the server stops the hosts and waits
  // for their goodbye; a host waits for the stop. Idempotent.
  void finish();

  // The global model as a flat float32 vector: current on the server (rank
  // 0); on the other ranks as of the last round they trained in.
  const at::Tensor& global() const { return global_; }
  // The server's, for checkpoints and resume (the model after the last round).
  at::Tensor& mutable_global() { return global_; }
  const Partition& partition() const { return partition_; }
  ServerOptimizer& server_optimizer() { return server_optimizer_; }
  // The rank hosting `client`.
  int host_of(int64_t client) const;
  // Client processes the server lost so far (server only), ascending.
  const std::vector<int>& lost_ranks() const { return lost_ranks_; }
  // Whether this host was told the run is over (client hosts only).
  bool stopped() const { return stopped_; }
  models::Model& model() { return *model_; }

 private:
  RoundReport local_round(int64_t round);
  RoundReport server_round(int64_t round);
  RoundReport host_round(int64_t round);
  // Trains client c for `round` from global_: its upload vector
  // [n delta, n, 1, n loss] (float32); throws when its training fails.
  at::Tensor train_for_upload(int64_t client, int64_t round);
  // The server step on the aggregate (float64 [sum, weight, clients, loss]);
  // fills reported, bytes, train_loss and applied.
  void apply_aggregate(RoundReport& report, const at::Tensor& aggregate);
  Message receive_from_server();
  std::vector<int64_t> live_pool() const;

  const train::TrainConfig& config_;
  comm::ProcessGroup& world_;
  std::shared_ptr<models::Model> model_;
  Partition partition_;
  std::vector<data::TensorDataset> client_data_;  // indexed by client id; empty for clients hosted elsewhere
  at::Tensor global_;
  ServerOptimizer server_optimizer_;
  // federated.client_optimizer_state = "keep": each client's own optimizer,
  // bound to model_'s parameters (one model object serves every client, and
  // each optimizer's state is its own).
  std::map<int64_t, std::unique_ptr<torch::optim::Optimizer>> client_optimizers_;
  std::unique_ptr<ServerLinks> links_;  // the server's, with more than one rank
  std::vector<int> lost_ranks_;
  bool stopped_ = false;
  bool finished_ = false;
};

// Note [Federated round] step 4: whether the server may close the round
// with `outstanding` participants on live processes still to report,
// `reported` updates in hand, and the deadline passed or not.
bool round_can_close(int64_t outstanding, int64_t reported, int64_t min_clients, bool deadline_passed);

// The partition options of a config (federated.partition, alpha,
// shards_per_client, clients; seeded by run.seed).
PartitionOptions partition_options(const train::TrainConfig& config);
// The class label of every row of `train` (targets as int64 class ids).
std::vector<int64_t> labels_of(const data::TensorDataset& train);

}  // namespace paratrain::federated
