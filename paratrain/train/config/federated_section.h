// [federated]: federated learning (`paratrain federated`).
// The sections of TrainConfig (config.h) that configure federated/.
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in federated_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// Federated learning (`paratrain federated`, federated/): rank 0 is the
/// server, every rank (rank 0 too when it is alone) hosts simulated clients,
/// each with its own partition of the training set. A round: sample clients,
/// send the global model, train locally, aggregate the updates. The clients'
/// optimizer is [optimizer] (clip_grad_norm clips on the client) with
/// data.batch_size; the server's is server_optimizer. See Note [Federated
/// round] in federated/round.h.
struct FederatedConfig {
  int64_t clients = 100;  ///< simulated clients, spread over the ranks
  int64_t rounds = 20;    ///< aggregation rounds of the run
  /// "iid" (a shuffled equal split), "dirichlet" (per class, client shares
  /// drawn from Dirichlet(alpha): Hsu et al. 2019; small alpha = label skew),
  /// "shards" (sorted by label, cut into clients * shards_per_client shards,
  /// each client takes shards_per_client at random: McMahan et al. 2017).
  std::string partition = "iid";
  double alpha = 0.5;             ///< dirichlet: concentration (small = skewed labels)
  int64_t shards_per_client = 2;  ///< shards: label-sorted shards per client
  double fraction = 0.1;       ///< clients sampled per round (at least 1), seeded by run.seed
  /// A round needs this many client updates; fewer (dropouts) fail the round
  /// (the global model is kept) and it is logged.
  int64_t min_clients = 1;
  /// Experiments: each sampled client fails (sends no update) with this
  /// probability, drawn from the round's seed.
  double dropout = 0.0;
  int64_t local_epochs = 1;  ///< passes over the client's data per round
  int64_t local_steps = 0;   ///< > 0: exactly this many mini-batches instead of local_epochs
  /// "fedavg" or "fedprox" (Li et al. 2020: the client loss gets
  /// mu/2 ||w - w_global||^2, limiting client drift on non-IID data).
  std::string algorithm = "fedavg";
  double mu = 0.01;  ///< fedprox: weight of the proximal term
  /// How the server applies the sample-weighted mean update delta:
  /// "sgd" (w += server_lr * delta; server_lr = 1 is FedAvg), or the adaptive
  /// "adam" | "yogi" | "adagrad" of Reddi et al. (arXiv 2003.00295, Alg. 2).
  std::string server_optimizer = "sgd";
  double server_lr = 1.0;  ///< the server optimizer's learning rate
  double server_momentum = 0.0;               ///< sgd: server momentum (FedAvgM)
  std::vector<double> server_betas{0.9, 0.99};  ///< adam/yogi: beta1, beta2 (adagrad: beta1)
  double server_tau = 1e-3;                   ///< adaptivity: added to sqrt(v)
  /// The server learns only the sum of the updates (federated/
  /// secure_aggregation.h: Note [Pairwise masks]); needs libsodium.
  bool secure_aggregation = false;
  /// DP-FedAvg (central DP, McMahan et al., arXiv 1710.06963): each client's
  /// update is clipped to L2 norm dp.clip and weighs 1 (not its row count);
  /// the server adds N(0, (dp.noise_multiplier * dp.clip)^2) to the sum and
  /// divides by the sampled count. Epsilon at dp.delta is printed per round.
  double dp_clip = 0.0;              ///< federated.dp.clip (0 = off)
  double dp_noise_multiplier = 0.0;  ///< federated.dp.noise_multiplier
  double dp_delta = 1e-5;            ///< federated.dp.delta
  int64_t eval_every = 1;            ///< rounds between evaluations of the global model (0 = only the last)
  int64_t checkpoint_every = 0;      ///< rounds between global-model checkpoints (0 = only the last)
  /// Round deadline in seconds (multi-process runs): once it passed and at
  /// least min_clients updates arrived, the round closes and the clients
  /// still training are dropped from it. 0 = no deadline: a round waits for
  /// every selected client on a live process (a dead process never delays it).
  double round_timeout_s = 0.0;
  /// "reset" (a fresh client optimizer every round, as in FedAvg) or "keep"
  /// (a client selected again continues its own optimizer state).
  std::string client_optimizer_state = "reset";
  /// Fault injection for tests only: > 0 makes the last rank SIGKILL itself
  /// in this round, after its first client's update went out.
  int64_t test_kill_process_at_round = 0;

  bool operator==(const FederatedConfig&) const = default;
};

}  // namespace paratrain::train
