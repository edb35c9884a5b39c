// The federated round: see Note [Federated round] in round.h. Here: what
// every rank shares (construction, local training of one client, the server
// step) and the one-process round; the server's side of a multi-process
// round is in round_server.cpp, a client host's in round_host.cpp.
#include "paratrain/federated/round.h"

#include <ATen/CPUGeneratorImpl.h>
#include <algorithm>
#include <exception>
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
  if (builds_gpt(c) || c.data.dataset == "text")
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
  // The run's only collective: from here on the server and the hosts talk
  // point to point, so that no client process is needed by all the others.
  if (world_.size() > 1) world_.broadcast(global_, 0)->wait();
  load_flat_parameters(*model_, global_);
  if (world_.size() > 1 && world_.rank() == 0) {
    std::vector<int> hosts;
    for (int r = 1; r < world_.size(); ++r) hosts.push_back(r);
    links_ = std::make_unique<ServerLinks>(world_, hosts);
  }
}

FederatedRun::~FederatedRun() {
  if (std::uncaught_exceptions() > 0) {
    // Unwinding from an error: wait on no peer. The server cuts its links
    // (aborting the group wakes its threads); a host just goes, and the
    // server sees its connection close.
    if (links_) {
      try {
        links_->shutdown(std::chrono::milliseconds(0));
      } catch (...) {
      }
    }
    return;
  }
  try {
    finish();
  } catch (const std::exception& e) {
    spdlog::warn("rank {}: federated run ended uncleanly: {}", world_.rank(), e.what());
  }
}

int FederatedRun::host_of(int64_t client) const {
  if (world_.size() == 1) return 0;
  return 1 + static_cast<int>(client % (world_.size() - 1));
}

std::vector<int64_t> FederatedRun::live_pool() const {
  std::vector<int64_t> pool;
  for (int64_t c = 0; c < config_.federated.clients; ++c) {
    const int host = host_of(c);
    if (!std::binary_search(lost_ranks_.begin(), lost_ranks_.end(), host)) pool.push_back(c);
  }
  return pool;
}

void FederatedRun::finish() {
  if (finished_) return;
  finished_ = true;
  if (world_.size() == 1) return;
  if (links_) {
    links_->shutdown(std::chrono::milliseconds(config_.world.timeout_s * 1000));
    return;
  }
  while (!stopped_) {
    Message m = receive_from_server();
    if (m.kind == MessageKind::kStop) stopped_ = true;
  }
  send_message(world_, 0, Message{MessageKind::kBye, 0, -1, at::Tensor()});
}

RoundReport FederatedRun::run_round(int64_t round) {
  if (world_.size() == 1) return local_round(round);
  return world_.rank() == 0 ? server_round(round) : host_round(round);
}

at::Tensor FederatedRun::train_for_upload(int64_t c, int64_t round) {
  const auto& f = config_.federated;
  LocalTrainingOptions local;
  local.epochs = f.local_epochs;
  local.steps = f.local_steps;
  local.batch_size = config_.data.batch_size;
  local.prox_mu = f.algorithm == "fedprox" ? f.mu : 0.0;
  local.clip_grad_norm = config_.optimizer.clip_grad_norm;
  local.seed = mix_seed(static_cast<uint64_t>(config_.run.seed), static_cast<uint64_t>(round), static_cast<uint64_t>(c));
  // "keep": the client's own optimizer from its earlier rounds (its state is
  // keyed by the shared model's parameters, which every client reuses).
  std::unique_ptr<torch::optim::Optimizer> fresh;
  torch::optim::Optimizer* optimizer = nullptr;
  if (f.client_optimizer_state == "keep") {
    auto& kept = client_optimizers_[c];
    if (!kept) kept = train::make_optimizer(config_.optimizer, model_->parameters());
    optimizer = kept.get();
  } else {
    fresh = train::make_optimizer(config_.optimizer, model_->parameters());
    optimizer = fresh.get();
  }
  ClientUpdate u = train_client(*model_, global_, client_data_[c], *optimizer, local);
  if (!u.delta.isfinite().all().item<bool>()) throw Error("its update is not finite");
  // DP-FedAvg: a bounded contribution per client (norm <= clip, weight 1),
  // which is what the noise on the sum is calibrated to hide.
  const bool dp = f.dp_clip > 0;
  if (dp) clip_to_norm(u.delta, f.dp_clip);
  const double n = dp ? 1.0 : static_cast<double>(u.samples);
  return torch::cat({u.delta.mul(n), torch::tensor({n, 1.0, u.loss * n}, torch::kFloat)});
}

RoundReport FederatedRun::local_round(int64_t round) {
  const auto& f = config_.federated;
  const uint64_t seed = static_cast<uint64_t>(config_.run.seed);
  RoundReport report;
  report.round = round;
  report.pool = f.clients;
  report.sampled = sample_clients(f.clients, f.fraction, seed, round);
  const int64_t numel = global_.numel();
  auto aggregate = torch::zeros({numel + 3}, torch::kDouble);
  // Secure aggregation alone: the same masks, over a one-rank "collective".
  std::unique_ptr<SecureAggregationRound> secure;
  if (f.secure_aggregation) {
    std::vector<int64_t> participants;
    for (int64_t c : report.sampled) {
      if (!client_drops(f.dropout, seed, round, c)) participants.push_back(c);
    }
    secure = std::make_unique<SecureAggregationRound>(world_, round, participants, [](int64_t) { return true; },
                                                      numel + 3);
  }
  // Summed in client order, in float32 as the multi-process server does.
  auto sum = torch::zeros({numel + 3}, torch::kFloat);
  for (int64_t c : report.sampled) {
    if (client_drops(f.dropout, seed, round, c)) {
      report.dropped.push_back(c);
      continue;
    }
    try {
      at::Tensor upload = train_for_upload(c, round);
      if (secure) {
        secure->add(c, upload.to(torch::kDouble));
      } else {
        sum.add_(upload);
      }
    } catch (const std::exception& e) {
      spdlog::warn("round {}: client {} failed and is dropped from the round: {}", round, c, e.what());
      report.failed.push_back(c);
      report.dropped.push_back(c);
    }
  }
  load_flat_parameters(*model_, global_);  // the model object leaves the round holding x_t again
  if (secure) {
    aggregate = secure->aggregate();
    report.secure_bytes_up = secure->extra_bytes_up_per_client();
    report.secure_bytes_down = secure->extra_bytes_down_per_client();
  } else {
    aggregate = sum.to(torch::kDouble);
  }
  apply_aggregate(report, aggregate);
  return report;
}

void FederatedRun::apply_aggregate(RoundReport& report, const at::Tensor& aggregate) {
  const auto& f = config_.federated;
  const uint64_t seed = static_cast<uint64_t>(config_.run.seed);
  const int64_t numel = global_.numel();
  const int64_t model_bytes = numel * static_cast<int64_t>(sizeof(float));
  at::Tensor sum = aggregate.slice(0, 0, numel).to(torch::kFloat);
  const double weight = aggregate[numel].item<double>();
  report.reported = static_cast<int64_t>(aggregate[numel + 1].item<double>() + 0.5);
  report.bytes_down = static_cast<int64_t>(report.sampled.size()) * (model_bytes + report.secure_bytes_down);
  report.bytes_up = report.reported * (model_bytes + static_cast<int64_t>(sizeof(int64_t)) + report.secure_bytes_up);
  report.train_loss = weight > 0 ? aggregate[numel + 2].item<double>() / weight : 0.0;
  if (report.reported < f.min_clients || weight <= 0) {
    spdlog::warn("round {}: {} of {} sampled clients reported, fewer than federated.min_clients = {}; the round "
                 "is skipped and the global model kept",
                 report.round, report.reported, report.sampled.size(), f.min_clients);
    return;
  }
  at::Tensor delta;
  if (f.dp_clip > 0) {
    // Noise on the sum, then a fixed denominator (the sampled count, not
    // the reported one): one client changes the mean by at most clip / m.
    if (f.dp_noise_multiplier > 0) {
      auto gen = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed ^ 0x4e4f495345ULL, report.round));
      sum.add_(at::normal(0.0, f.dp_noise_multiplier * f.dp_clip, {numel}, gen));
    }
    delta = sum / static_cast<double>(report.sampled.size());
  } else {
    delta = sum / weight;
  }
  server_optimizer_.step(global_, delta);
  load_flat_parameters(*model_, global_);
  report.applied = true;
}

}  // namespace paratrain::federated
