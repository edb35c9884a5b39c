// The schema rows and cross-key rules of [federated] (federated_section.h).
#include "paratrain/train/config/federated_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {

std::vector<FieldSpec> federated_fields() {
  using TC = TrainConfig;
  return {
      field("federated.clients", &TC::federated, &FederatedConfig::clients, "simulated clients, spread over the ranks", in_range<int64_t>(1, kMaxRanks)),
      field("federated.rounds", &TC::federated, &FederatedConfig::rounds, "communication rounds", in_range<int64_t>(1, kMaxCount)),
      field("federated.partition", &TC::federated, &FederatedConfig::partition, "\"iid\", \"dirichlet\" (label skew by federated.alpha) or \"shards\" (McMahan's label-sorted shards)", one_of({"iid", "dirichlet", "shards"})),
      field("federated.alpha", &TC::federated, &FederatedConfig::alpha, "dirichlet: concentration (small = each client sees few labels, large = IID)", in_range_finite(1e-6, 1e9, "> 0")),
      field("federated.shards_per_client", &TC::federated, &FederatedConfig::shards_per_client, "shards: label-sorted shards per client", in_range<int64_t>(1, kMaxCount)),
      field("federated.fraction", &TC::federated, &FederatedConfig::fraction, "clients sampled per round (at least one), seeded by run.seed", in_range_finite(1e-9, 1.0, "in (0, 1]")),
      field("federated.min_clients", &TC::federated, &FederatedConfig::min_clients, "updates a round needs; with fewer (dropouts) the round is skipped and logged", in_range<int64_t>(1, kMaxRanks)),
      field("federated.dropout", &TC::federated, &FederatedConfig::dropout, "experiments: probability that a sampled client fails to report", in_range_finite(0.0, 1.0)),
      field("federated.local_epochs", &TC::federated, &FederatedConfig::local_epochs, "passes over the client's data per round", in_range<int64_t>(1, kMaxCount)),
      field("federated.local_steps", &TC::federated, &FederatedConfig::local_steps, "> 0: exactly this many client mini-batches per round instead of local_epochs", in_range<int64_t>(0, kMaxCount)),
      field("federated.algorithm", &TC::federated, &FederatedConfig::algorithm, "\"fedavg\" or \"fedprox\" (proximal term federated.mu)", one_of({"fedavg", "fedprox"})),
      field("federated.mu", &TC::federated, &FederatedConfig::mu, "fedprox: weight of mu/2 ||w - w_global||^2 in the client loss", in_range_finite(0.0, 1e6)),
      field("federated.server_optimizer", &TC::federated, &FederatedConfig::server_optimizer, "\"sgd\" (lr 1 = plain FedAvg), or \"adam\", \"yogi\", \"adagrad\" (Reddi et al., arXiv 2003.00295)", one_of({"sgd", "adam", "yogi", "adagrad"})),
      field("federated.server_lr", &TC::federated, &FederatedConfig::server_lr, "server learning rate applied to the mean client update", in_range_finite(1e-12, 1e6)),
      field("federated.server_momentum", &TC::federated, &FederatedConfig::server_momentum, "sgd: server momentum (FedAvgM; 0 = none)", in_range_finite(0.0, 1.0 - 1e-9, "in [0, 1)")),
      field("federated.server_betas", &TC::federated, &FederatedConfig::server_betas, "adam/yogi: [beta1, beta2]; adagrad uses beta1", adam_betas()),
      field("federated.server_tau", &TC::federated, &FederatedConfig::server_tau, "adaptive server optimizers: added to sqrt(v) (Reddi et al.'s tau)", in_range_finite(1e-12, 1e6)),
      field("federated.secure_aggregation", &TC::federated, &FederatedConfig::secure_aggregation, "the server learns only the sum of the updates: pairwise X25519 masks that cancel in the sum (Bonawitz et al. 2017), dropped clients' masks recovered from the survivors; needs libsodium"),
      field("federated.dp.clip", &TC::federated, &FederatedConfig::dp_clip, "DP-FedAvg: clip each client update to this L2 norm; clients then weigh 1 each (0 = off)", in_range_finite(0.0, 1e9)),
      field("federated.dp.noise_multiplier", &TC::federated, &FederatedConfig::dp_noise_multiplier, "DP-FedAvg: Gaussian noise std = this x dp.clip on the sum (0 = none)", in_range_finite(0.0, 1e6)),
      field("federated.dp.delta", &TC::federated, &FederatedConfig::dp_delta, "DP-FedAvg: the delta at which epsilon is reported", in_range_finite(1e-30, 0.5, "in (0, 0.5]")),
      field("federated.eval_every", &TC::federated, &FederatedConfig::eval_every, "rounds between test evaluations of the global model (0 = only the last)", in_range<int64_t>(0, kMaxCount)),
      field("federated.checkpoint_every", &TC::federated, &FederatedConfig::checkpoint_every, "rounds between global-model checkpoints (0 = only the last)", in_range<int64_t>(0, kMaxCount)),
      field("federated.round_timeout_s", &TC::federated, &FederatedConfig::round_timeout_s, "round deadline (multi-process): after it, with at least min_clients updates, the round closes and late clients are dropped from it (0 = wait for every client on a live process)", in_range_finite(0.0, 1e9)),
      field("federated.client_optimizer_state", &TC::federated, &FederatedConfig::client_optimizer_state, "\"reset\": a fresh client optimizer each round (FedAvg); \"keep\": a client selected again continues its own optimizer state", one_of({"reset", "keep"})),
      field("federated.test_kill_process_at_round", &TC::federated, &FederatedConfig::test_kill_process_at_round, "fault injection for tests: > 0 makes the last rank SIGKILL itself in this round (0 = off)", in_range<int64_t>(0, kMaxCount)),
  };
}

// Federated keys that this build does not implement yet, and the rules that
// tie them together; checked always, so a config never silently ignores one.
std::string federated_problem(const TrainConfig& c) {
  const FederatedConfig& f = c.federated;
  if (f.dp_noise_multiplier > 0 && f.dp_clip <= 0)
    return fmt::format("federated.dp.noise_multiplier = {} needs federated.dp.clip > 0 (the noise is scaled by "
                       "the clip norm)",
                       f.dp_noise_multiplier);
  if (f.min_clients > f.clients)
    return fmt::format("federated.min_clients = {} > federated.clients = {}: a round could never close; lower "
                       "min_clients",
                       f.min_clients, f.clients);
  if (f.algorithm == "fedavg" && f.mu != FederatedConfig{}.mu && f.mu != 0)
    return fmt::format("federated.mu = {} only applies to federated.algorithm = \"fedprox\" (got \"fedavg\")", f.mu);
  return "";
}

}  // namespace paratrain::train::detail
