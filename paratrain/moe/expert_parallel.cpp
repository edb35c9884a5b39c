// Experts split over ep groups of the data-parallel group (Note [Experts in
// the data-parallel mesh], expert_parallel.h).
#include "paratrain/moe/expert_parallel.h"

#include <torch/torch.h>

#include <map>

#include <fmt/format.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"

namespace paratrain::moe {
namespace {

// "blocks.1.mlp.experts.5.fc.weight" -> the layer's expert index, or -1.
int64_t expert_index(const std::string& layer, const std::string& name) {
  const std::string prefix = layer + ".experts.";
  if (name.rfind(prefix, 0) != 0) return -1;
  return std::stoll(name.substr(prefix.size(), name.find('.', prefix.size()) - prefix.size()));
}

// Gradients of `params`, undefined ones as zeros (an expert that no token
// reached still takes part in the collective).
at::Tensor flat_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const auto& p : params) {
    flat.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}, p.options()));
  }
  return at::cat(flat);
}

}  // namespace

ExpertGroups make_expert_groups(comm::ProcessGroup& dp, int ep) {
  if (ep < 1 || dp.size() % ep != 0) {
    throw ConfigError(fmt::format("parallel.ep = {} does not divide the data-parallel group's {} ranks; pick ep "
                                  "dividing dp (ep groups sit inside dp)",
                                  ep, dp.size()));
  }
  ExpertGroups out;
  // new_subgroup is collective over dp: every rank creates every group, in
  // the same order, and keeps its own.
  for (int g = 0; g < dp.size() / ep; ++g) {
    std::vector<int> members;
    for (int j = 0; j < ep; ++j) members.push_back(g * ep + j);
    if (auto group = dp.new_subgroup(members)) out.ep = std::move(group);
  }
  for (int j = 0; j < ep; ++j) {
    std::vector<int> members;
    for (int g = 0; g < dp.size() / ep; ++g) members.push_back(g * ep + j);
    if (auto group = dp.new_subgroup(members)) out.replicas = std::move(group);
  }
  if (!out.ep || !out.replicas) {
    throw Error(fmt::format("rank {}: no ep group or expert replica group contains this rank; this is a bug",
                            dp.rank()));
  }
  comm::name_group(*out.ep, "ep");
  comm::name_group(*out.replicas, "ep-replicas");
  return out;
}

std::vector<std::pair<std::string, std::shared_ptr<Moe>>> find_moe_layers(torch::nn::Module& model) {
  std::vector<std::pair<std::string, std::shared_ptr<Moe>>> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    if (auto layer = std::dynamic_pointer_cast<Moe>(item.value())) out.emplace_back(item.key(), layer);
  }
  return out;
}

void check_expert_parallel(torch::nn::Module& model, int dp_size, int ep) {
  const auto layers = find_moe_layers(model);
  if (layers.empty()) {
    throw ConfigError(fmt::format("parallel.ep = {} splits the experts of mixture-of-experts layers, but the model "
                                  "has none: set model.moe_experts (the GPT), build the model with moe::Moe layers, "
                                  "or set parallel.ep = 1",
                                  ep));
  }
  for (const auto& [name, layer] : layers) {
    if (layer->options().experts % ep != 0) {
      throw ConfigError(fmt::format("parallel.ep = {} does not divide the {} experts of MoE layer '{}'; pick ep "
                                    "dividing model.moe_experts",
                                    ep, layer->options().experts, name));
    }
  }
  if (ep < 1 || dp_size % ep != 0) {
    throw ConfigError(fmt::format("parallel.ep = {} does not divide the data-parallel group's {} ranks; pick ep "
                                  "dividing dp (ep groups sit inside dp)",
                                  ep, dp_size));
  }
}

ExpertParallel::ExpertParallel(torch::nn::Module& model, comm::ProcessGroup& dp, int ep,
                               std::chrono::milliseconds timeout)
    : ep_(ep), dp_size_(dp.size()), timeout_(timeout), layers_(find_moe_layers(model)) {
  check_expert_parallel(model, dp.size(), ep);
  groups_ = make_expert_groups(dp, ep);
  for (const auto& [name, layer] : layers_) {
    layer->split_experts(dp, *groups_.ep, timeout);
    for (const auto& p : layer->expert_parameters()) {
      all_.push_back(p);
      held_.insert(p.unsafeGetTensorImpl());
      if (p.requires_grad()) params_.push_back(p);
    }
  }
  // The replicas hold the same experts: one start, whatever each built.
  if (groups_.replicas->size() > 1 && !all_.empty()) {
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> flat;
    for (const auto& p : all_) flat.push_back(p.detach().reshape({-1}));
    at::Tensor values = at::cat(flat);
    groups_.replicas->broadcast(values, 0)->wait(timeout_);
    int64_t offset = 0;
    for (auto& p : all_) {
      p.detach().copy_(values.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
  }
}

bool ExpertParallel::holds(const at::Tensor& t) const { return held_.count(t.unsafeGetTensorImpl()) > 0; }

void ExpertParallel::reduce_gradients() {
  if (params_.empty()) return;
  at::Tensor flat = flat_grads(params_);
  if (groups_.replicas->size() > 1) groups_.replicas->all_reduce(flat, comm::ReduceOp::kSum)->wait(timeout_);
  flat.div_(static_cast<double>(dp_size_));
  int64_t offset = 0;
  for (auto& p : params_) {
    const at::Tensor piece = flat.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    if (p.grad().defined()) {
      p.mutable_grad().copy_(piece);
    } else {
      p.mutable_grad() = piece.clone();
    }
  }
}

double ExpertParallel::grad_square_sum() {
  at::Tensor sum = at::zeros({1}, at::kDouble);
  for (const auto& p : params_) {
    if (p.grad().defined()) sum += p.grad().to(at::kDouble).pow(2).sum().to(at::kCPU);
  }
  if (groups_.ep->size() > 1) groups_.ep->all_reduce(sum, comm::ReduceOp::kSum)->wait(timeout_);
  return sum.item<double>();
}

void ExpertParallel::scale_gradients(double coef) {
  for (auto& p : params_) {
    if (p.grad().defined()) p.mutable_grad().mul_(coef);
  }
}

std::vector<TensorSlot> ExpertParallel::checkpoint_slots(std::vector<TensorSlot> slots) const {
  for (auto& slot : slots) {
    for (const auto& [name, layer] : layers_) {
      if (expert_index(name, slot.name) >= 0) slot.write = writes();
    }
  }
  return slots;
}

std::vector<std::pair<std::string, at::Tensor>> ExpertParallel::gather(
    const std::vector<std::pair<std::string, at::Tensor>>& local) {
  // Every layer's experts, gathered in one all-gather per layer: rank s of
  // the ep group sends its experts' parameters flattened in model order.
  std::map<std::string, std::vector<std::pair<std::string, at::Tensor>>> whole;
  for (const auto& [layer_name, layer] : layers_) {
    std::vector<std::pair<std::string, at::Tensor>> mine;
    for (const auto& item : layer->named_parameters()) {
      if (expert_index("", "." + item.key()) >= 0) mine.emplace_back(item.key(), item.value().detach());
    }
    std::vector<at::Tensor> flat;
    for (const auto& [n, t] : mine) flat.push_back(t.reshape({-1}));
    const at::Tensor sent = at::cat(flat);
    at::Tensor received = at::empty({ep_ * sent.numel()}, sent.options());
    groups_.ep->all_gather(received, sent)->wait(timeout_);
    const int64_t per_rank = static_cast<int64_t>(mine.size()) / layer->local_experts();
    auto& out = whole[layer_name];
    for (int s = 0; s < ep_; ++s) {
      int64_t offset = s * sent.numel();
      for (size_t i = 0; i < mine.size(); ++i) {
        const auto& [n, t] = mine[i];
        // experts.<first + le>.<rest> -> experts.<s * local + le>.<rest>
        const int64_t le = static_cast<int64_t>(i) / per_rank;
        const std::string rest = n.substr(n.find('.', std::string("experts.").size()));
        const std::string global = fmt::format("{}.experts.{}{}", layer_name, s * layer->local_experts() + le, rest);
        out.emplace_back(global, received.narrow(0, offset, t.numel()).view(t.sizes()).clone());
        offset += t.numel();
      }
    }
  }
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& [name, t] : local) {
    bool expert = false;
    for (const auto& [layer_name, layer] : layers_) {
      const int64_t e = expert_index(layer_name, name);
      if (e < 0) continue;
      expert = true;
      // The layer's whole set goes where its first expert parameter was.
      auto it = whole.find(layer_name);
      if (it != whole.end()) {
        for (auto& item : it->second) out.push_back(std::move(item));
        whole.erase(it);
      }
    }
    if (!expert) out.emplace_back(name, t);
  }
  return out;
}

}  // namespace paratrain::moe
