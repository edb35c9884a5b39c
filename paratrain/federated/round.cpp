// The federated round: see Note [Federated round] in round.h.
#include "paratrain/federated/round.h"

#include <ATen/CPUGeneratorImpl.h>
#include <algorithm>
#include <torch/torch.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"
#include "paratrain/federated/client.h"
#include "paratrain/federated/secure_aggregation.h"
#include "paratrain/federated/sampling.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"

namespace paratrain::federated {
namespace {

ServerOptimizerOptions server_options(const train::FederatedConfig& f) {
  ServerOptimizerOptions o;
  o.kind = parse_server_optimizer(f.server_optimizer);
  o.lr = f.server_lr;
  o.momentum = f.server_momentum;
  o.beta1 = f.server_betas.at(0);
  o.beta2 = f.server_betas.at(1);
  o.tau = f.server_tau;
  return o;
}

// Keys the federated driver cannot honour, refused instead of ignored.
void check_supported(const train::TrainConfig& c) {
  if (c.federated.secure_aggregation && !secure_aggregation_available())
    throw ConfigError("federated.secure_aggregation = true, but paratrain was built without libsodium; install it "
                      "(scripts/install-deps.sh installs libsodium-dev) and rebuild, or set "
                      "federated.secure_aggregation = false");
  if (c.model.batchnorm)
    throw ConfigError("model.batchnorm = true with federated training: clients exchange parameters only, not "
                      "running statistics; set model.batchnorm = false");
  if (c.model.kind == "gpt" || c.data.dataset == "text")
    throw ConfigError(fmt::format("federated training needs a classification dataset; got model.kind = \"{}\", "
                                  "data.dataset = \"{}\"",
                                  c.model.kind, c.data.dataset));
}

void clip_to_norm(at::Tensor& delta, double max_norm) {
  const double norm = delta.norm().item<double>();
  if (norm > max_norm) delta.mul_(max_norm / norm);
}

}  // namespace

PartitionOptions partition_options(const train::TrainConfig& config) {
  PartitionOptions o;
  o.kind = parse_partition_kind(config.federated.partition);
  o.clients = config.federated.clients;
  o.alpha = config.federated.alpha;
  o.shards_per_client = config.federated.shards_per_client;
  o.seed = static_cast<uint64_t>(config.run.seed);
  return o;
}

std::vector<int64_t> labels_of(const data::TensorDataset& train) {
  if (train.targets.dim() != 1)
    throw DataError("federated partitions need class labels: targets of shape [N] (got a [N, K] target)");
  auto t = train.targets.to(at::kLong).contiguous();
  return std::vector<int64_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + t.numel());
}

FederatedRun::FederatedRun(const train::TrainConfig& config, comm::ProcessGroup& world,
                           std::shared_ptr<models::Model> model, const data::TensorDataset& train)
    : config_(config), world_(world), model_(std::move(model)),
      server_optimizer_(server_options(config.federated)) {
  check_supported(config);
  partition_ = make_partition(labels_of(train), partition_options(config));
  client_data_.resize(partition_.size());
  for (int64_t c = 0; c < static_cast<int64_t>(partition_.size()); ++c) {
    if (host_of(c) != world_.rank()) continue;
    auto rows = torch::tensor(partition_[c], torch::kLong);
    client_data_[c] = data::TensorDataset(train.inputs.index_select(0, rows), train.targets.index_select(0, rows));
  }
  global_ = flatten_parameters(*model_);
  if (world_.size() > 1) world_.broadcast(global_, 0)->wait();
  load_flat_parameters(*model_, global_);
}

int FederatedRun::host_of(int64_t client) const {
  if (world_.size() == 1) return 0;
  return 1 + static_cast<int>(client % (world_.size() - 1));
}

void FederatedRun::sync_model() {
  if (world_.size() > 1) world_.broadcast(global_, 0)->wait();
  load_flat_parameters(*model_, global_);
}

RoundReport FederatedRun::run_round(int64_t round) {
  const auto& f = config_.federated;
  const uint64_t seed = static_cast<uint64_t>(config_.run.seed);
  RoundReport report;
  report.round = round;
  report.sampled = sample_clients(f.clients, f.fraction, seed, round);

  // 2. download
  if (world_.size() > 1) world_.broadcast(global_, 0)->wait();

  // 3. local training of this rank's sampled clients
  const int64_t numel = global_.numel();
  auto upload = torch::zeros({numel + 3}, torch::kFloat);
  auto sum = upload.slice(0, 0, numel);
  double weight = 0, clients = 0, loss = 0;
  const bool prox = f.algorithm == "fedprox";
  const bool dp = f.dp_clip > 0;
  auto make_optimizer = [&](const std::vector<at::Tensor>& params) {
    return train::make_optimizer(config_.optimizer, params);
  };
  // Secure aggregation: the clients not dropped at the round's start
  // advertise keys now, and each update leaves its client masked.
  std::unique_ptr<SecureAggregationRound> secure;
  if (f.secure_aggregation) {
    std::vector<int64_t> participants;
    for (int64_t c : report.sampled) {
      if (!client_drops(f.dropout, seed, round, c)) participants.push_back(c);
    }
    std::sort(participants.begin(), participants.end());
    secure = std::make_unique<SecureAggregationRound>(
        world_, round, participants, [&](int64_t c) { return host_of(c) == world_.rank(); }, numel + 3);
  }
  for (int64_t c : report.sampled) {
    if (client_drops(f.dropout, seed, round, c)) {
      report.dropped.push_back(c);
      continue;
    }
    if (host_of(c) != world_.rank()) continue;
    LocalTrainingOptions local;
    local.epochs = f.local_epochs;
    local.steps = f.local_steps;
    local.batch_size = config_.data.batch_size;
    local.prox_mu = prox ? f.mu : 0.0;
    local.clip_grad_norm = config_.optimizer.clip_grad_norm;
    local.seed = mix_seed(seed, static_cast<uint64_t>(round), static_cast<uint64_t>(c));
    try {
      ClientUpdate u = train_client(*model_, global_, client_data_[c], make_optimizer, local);
      if (!u.delta.isfinite().all().item<bool>()) throw Error("its update is not finite");
      // DP-FedAvg: a bounded contribution per client (norm <= clip, weight
      // 1), which is what the noise on the sum is calibrated to hide.
      if (dp) clip_to_norm(u.delta, f.dp_clip);
      const double n = dp ? 1.0 : static_cast<double>(u.samples);
      if (secure) {
        // The same [n delta, n, 1, n loss] the plain upload sums, one per client.
        auto mine = torch::cat({u.delta.to(torch::kDouble).mul(n), torch::tensor({n, 1.0, u.loss * n}, torch::kDouble)});
        secure->add(c, mine);
      } else {
        sum.add_(u.delta, n);
        weight += n;
        clients += 1;
        loss += u.loss * n;
      }
    } catch (const std::exception& e) {
      spdlog::warn("round {}: client {} (rank {}) failed and is dropped from the round: {}", round, c,
                   world_.rank(), e.what());
      report.dropped.push_back(c);
    }
  }
  load_flat_parameters(*model_, global_);  // the model object leaves the round holding x_t again
  upload[numel] = weight;
  upload[numel + 1] = clients;
  upload[numel + 2] = loss;

  // 4. upload: one sum over ranks lands on the server (masked: only the sum
  // can be read, after the dropped clients' masks are removed)
  if (secure) {
    at::Tensor total = secure->aggregate();
    if (world_.rank() == 0) upload.copy_(total);
    for (int64_t c : secure->dropped()) {
      if (std::find(report.dropped.begin(), report.dropped.end(), c) == report.dropped.end())
        report.dropped.push_back(c);
    }
  } else if (world_.size() > 1) {
    world_.reduce(upload, 0, comm::ReduceOp::kSum)->wait();
  }

  const int64_t model_bytes = numel * static_cast<int64_t>(sizeof(float));
  report.bytes_down = static_cast<int64_t>(report.sampled.size()) * model_bytes;
  if (world_.rank() != 0) return report;

  // 5. server update
  weight = upload[numel].item<double>();
  report.reported = static_cast<int64_t>(upload[numel + 1].item<double>() + 0.5);
  report.bytes_up = report.reported * (model_bytes + static_cast<int64_t>(sizeof(int64_t)));
  if (secure) {
    report.bytes_up += report.reported * secure->extra_bytes_up_per_client();
    report.bytes_down += static_cast<int64_t>(report.sampled.size()) * secure->extra_bytes_down_per_client();
  }
  report.train_loss = weight > 0 ? upload[numel + 2].item<double>() / weight : 0.0;
  if (report.reported < f.min_clients || weight <= 0) {
    spdlog::warn("round {}: {} of {} sampled clients reported, fewer than federated.min_clients = {}; the round "
                 "is skipped and the global model kept",
                 round, report.reported, report.sampled.size(), f.min_clients);
    return report;
  }
  at::Tensor delta;
  if (dp) {
    // Noise on the sum, then a fixed denominator (the sampled count, not
    // the reported one): one client changes the mean by at most clip / m.
    if (f.dp_noise_multiplier > 0) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed ^ 0x4e4f495345ULL, round));
      sum.add_(at::normal(0.0, f.dp_noise_multiplier * f.dp_clip, {numel}, gen));
    }
    delta = sum / static_cast<double>(report.sampled.size());
  } else {
    delta = sum / weight;
  }
  server_optimizer_.step(global_, delta);
  load_flat_parameters(*model_, global_);
  report.applied = true;
  return report;
}

}  // namespace paratrain::federated
