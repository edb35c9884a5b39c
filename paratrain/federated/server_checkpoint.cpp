// The federated server's checkpoint: see Note [Federated checkpoint] in
// server_checkpoint.h.
#include "paratrain/federated/server_checkpoint.h"

#include <torch/torch.h>

#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/federated/client.h"
#include "paratrain/federated/round.h"
#include "paratrain/models/model.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain::federated {
namespace {

constexpr const char* kSlot = "server";

// One flat scratch parameter and an Adam over it (lr 0): the Adam state of
// that parameter is how m and v travel through the sharded format.
struct AdamCarrier {
  at::Tensor param;
  std::unique_ptr<torch::optim::Adam> adam;

  explicit AdamCarrier(int64_t numel)
      : param(torch::zeros({numel}, torch::TensorOptions().dtype(torch::kFloat).requires_grad(true))),
        adam(std::make_unique<torch::optim::Adam>(std::vector<at::Tensor>{param},
                                                  torch::optim::AdamOptions(0.0))) {}

  torch::optim::AdamParamState* state() {
    auto& states = adam->state();
    return states.empty() ? nullptr : static_cast<torch::optim::AdamParamState*>(states.begin()->second.get());
  }
  // A step with a zero gradient creates the state (lr 0 leaves the param).
  torch::optim::AdamParamState& make_state() {
    param.mutable_grad() = torch::zeros_like(param);
    adam->step();
    return *state();
  }
  std::vector<checkpoint::OptimizerSlot> slots() {
    return {checkpoint::OptimizerSlot{param, TensorSlot{kSlot, {param.numel()}, 0, param.detach(), true}}};
  }
};

std::string extra_at(const checkpoint::TrainingState& st, const std::string& key, const std::filesystem::path& where) {
  auto it = st.extra.find(key);
  if (it == st.extra.end())
    throw CheckpointError(fmt::format("{} is not a federated checkpoint: its metadata lacks extra.{}; resume a "
                                      "checkpoint written by `paratrain federated`",
                                      where.string(), key));
  return it->second;
}

}  // namespace

void save_server_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& self, FederatedRun& run,
                            const ServerProgress& progress, const train::TrainConfig& config) {
  load_flat_parameters(run.model(), run.global());
  const ServerOptimizer& so = run.server_optimizer();
  AdamCarrier carrier(run.global().numel());
  auto& st = carrier.make_state();
  const at::Tensor& m = so.first_moment();
  const at::Tensor& v = so.second_moment();
  if (m.defined()) st.exp_avg().copy_(m);
  if (v.defined()) st.exp_avg_sq().copy_(v);

  checkpoint::CheckpointContents contents;
  contents.model = train::strategies::replicated_slots(run.model(), true);
  contents.optimizer = carrier.adam.get();
  contents.optimizer_slots = carrier.slots();
  contents.save_rng = false;  // nothing the run draws comes from torch's global generator
  contents.state.step = progress.round;
  contents.state.config = train::to_json(config);
  auto& extra = contents.state.extra;
  extra["federated.server_optimizer"] = config.federated.server_optimizer;
  extra["federated.server_moments"] = std::string(m.defined() ? "m" : "") + (v.defined() ? "v" : "");
  extra["federated.rounds_applied"] = std::to_string(progress.rounds_applied);
  extra["federated.bytes_up"] = std::to_string(progress.bytes_up);
  extra["federated.bytes_down"] = std::to_string(progress.bytes_down);
  extra["federated.rdp"] =
      nlohmann::json{{"rounds", progress.accountant.rounds()}, {"rdp", progress.accountant.rdp()}}.dump();
  checkpoint::save_sharded_checkpoint(dir, self, contents);
}

ServerProgress load_server_checkpoint(const std::filesystem::path& checkpoint, FederatedRun& run,
                                      const train::TrainConfig& config, const ServerResumeOptions& options) {
  AdamCarrier carrier(run.global().numel());
  checkpoint::CheckpointContents contents;
  contents.model = train::strategies::replicated_slots(run.model(), true);
  if (options.server_optimizer) {
    contents.optimizer = carrier.adam.get();
    contents.optimizer_slots = carrier.slots();
  }
  contents.save_rng = false;
  checkpoint::LoadCheckpointOptions load;
  load.restore_rng = false;
  const checkpoint::TrainingState st = checkpoint::load_sharded_checkpoint(checkpoint, contents, load);

  const std::string kind = extra_at(st, "federated.server_optimizer", checkpoint);
  if (options.server_optimizer && kind != config.federated.server_optimizer)
    throw CheckpointError(fmt::format("{} holds the state of federated.server_optimizer = \"{}\", this run uses "
                                      "\"{}\"; resume with the same server optimizer or start a new run",
                                      checkpoint.string(), kind, config.federated.server_optimizer));
  run.mutable_global().copy_(flatten_parameters(run.model()));
  if (options.server_optimizer) {
    const std::string moments = extra_at(st, "federated.server_moments", checkpoint);
    auto* state = carrier.state();
    if (!moments.empty() && state == nullptr)
      throw CheckpointError(fmt::format("{}: the server optimizer's state is missing", checkpoint.string()));
    at::Tensor m, v;
    if (moments.find('m') != std::string::npos) m = state->exp_avg().detach().clone();
    if (moments.find('v') != std::string::npos) v = state->exp_avg_sq().detach().clone();
    run.server_optimizer().restore(m, v);
  }
  ServerProgress p;
  p.round = st.step;
  try {
    p.rounds_applied = std::stoll(extra_at(st, "federated.rounds_applied", checkpoint));
    p.bytes_up = std::stoll(extra_at(st, "federated.bytes_up", checkpoint));
    p.bytes_down = std::stoll(extra_at(st, "federated.bytes_down", checkpoint));
    const auto rdp = nlohmann::json::parse(extra_at(st, "federated.rdp", checkpoint));
    p.accountant.restore(rdp.at("rdp").get<std::vector<double>>(), rdp.at("rounds").get<int64_t>());
  } catch (const CheckpointError&) {
    throw;
  } catch (const std::exception& e) {
    throw CheckpointError(fmt::format("{}: unreadable federated metadata: {}", checkpoint.string(), e.what()));
  }
  return p;
}

}  // namespace paratrain::federated
