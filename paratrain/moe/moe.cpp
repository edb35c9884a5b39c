// The mixture-of-experts layer of moe.h: routing as one process would
// (Note [Routing as one process would]), experts over the ep group by
// all-to-all (Note [Expert parallelism by all-to-all]).
#include "paratrain/moe/moe.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/loss_weight.h"
#include "paratrain/quant/activations.h"

namespace paratrain::moe {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int size_of(const comm::ProcessGroup* g) { return g != nullptr ? g->size() : 1; }
int rank_of(const comm::ProcessGroup* g) { return g != nullptr ? g->rank() : 0; }

comm::ProcessGroup* group_at(AutogradContext* ctx) {
  return reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
}
std::chrono::milliseconds timeout_at(AutogradContext* ctx) {
  return std::chrono::milliseconds(ctx->saved_data["timeout_ms"].toInt());
}

// all_to_all of rows with split sizes; backward sends the gradients back
// with the splits swapped (an all-to-all is its own adjoint).
at::Tensor exchange(comm::ProcessGroup& g, const at::Tensor& rows, const std::vector<int64_t>& out_splits,
                    const std::vector<int64_t>& in_splits, std::chrono::milliseconds timeout) {
  int64_t received = 0;
  for (int64_t n : out_splits) received += n;
  std::vector<int64_t> shape = rows.sizes().vec();
  shape[0] = received;
  at::Tensor out = at::empty(shape, rows.options());
  g.all_to_all(out, rows.contiguous(), out_splits, in_splits)->wait(timeout);
  return out;
}

struct AllToAll : torch::autograd::Function<AllToAll> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rows, int64_t group, int64_t timeout_ms,
                            std::vector<int64_t> out_splits, std::vector<int64_t> in_splits) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["timeout_ms"] = timeout_ms;
    ctx->saved_data["out"] = out_splits;
    ctx->saved_data["in"] = in_splits;
    return exchange(*reinterpret_cast<comm::ProcessGroup*>(group), rows, out_splits, in_splits,
                    std::chrono::milliseconds(timeout_ms));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto out_splits = ctx->saved_data["out"].toIntVector();
    const auto in_splits = ctx->saved_data["in"].toIntVector();
    return {exchange(*group_at(ctx), grads[0], in_splits, out_splits, timeout_at(ctx)), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

// Sum over the token group; backward scales the gradient by the group's
// size: each rank's loss holds the group's sum, and the data-parallel mean
// of the ranks' gradients must give the one-process gradient.
struct SumOverTokens : torch::autograd::Function<SumOverTokens> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, int64_t group, int64_t timeout_ms) {
    ctx->saved_data["group"] = group;
    ctx->saved_data["timeout_ms"] = timeout_ms;
    at::Tensor out = x.contiguous().clone();
    reinterpret_cast<comm::ProcessGroup*>(group)->all_reduce(out, comm::ReduceOp::kSum)->wait(
        std::chrono::milliseconds(timeout_ms));
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0] * static_cast<double>(group_at(ctx)->size()), at::Tensor(), at::Tensor()};
  }
};

// Returns the layer's output unchanged; its backward passes the output's
// gradient through and gives the aux loss the gradient `scale` (Note [Aux
// losses in backward]).
struct InjectAuxGradient : torch::autograd::Function<InjectAuxGradient> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& output, const at::Tensor& aux, double scale) {
    ctx->saved_data["scale"] = scale;
    ctx->save_for_backward({aux});
    return output.clone();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor aux = ctx->get_saved_variables()[0];
    return {grads[0], at::full_like(aux, ctx->saved_data["scale"].toDouble()), at::Tensor()};
  }
};

int64_t as_int(const void* p) { return reinterpret_cast<int64_t>(p); }

}  // namespace

ExpertImpl::ExpertImpl(int64_t d, int64_t hidden) {
  fc = register_module("fc", torch::nn::Linear(d, hidden));
  proj = register_module("proj", torch::nn::Linear(hidden, d));
}

// Through quantization's activation sites (quant/activations.h), as the
// dense MLP's Linears are: QAT and `paratrain quantize` see the experts.
at::Tensor ExpertImpl::forward(const at::Tensor& x) {
  return quant::linear(*proj, torch::gelu(quant::linear(*fc, x)));
}

Moe::Moe(MoeOptions o) : torch::nn::Module("Moe"), options_(o) {
  const int ep = size_of(o.ep);
  if (o.d_model <= 0) throw Error(fmt::format("Moe: d_model must be > 0, got {}", o.d_model));
  if (o.experts < 1) throw Error(fmt::format("Moe: experts must be >= 1, got {}", o.experts));
  if (o.top_k != 1 && o.top_k != 2) throw Error(fmt::format("Moe: top_k must be 1 or 2, got {}", o.top_k));
  if (o.top_k > o.experts) throw Error(fmt::format("Moe: top_k ({}) exceeds experts ({})", o.top_k, o.experts));
  if (!(o.capacity_factor > 0)) throw Error(fmt::format("Moe: capacity_factor must be > 0, got {}", o.capacity_factor));
  if (ep > 1 && o.tokens == nullptr) throw Error("Moe: an ep group needs the token group (MoeOptions.tokens)");
  if (ep > 1) check_ep(*o.tokens, *o.ep);
  const int64_t hidden = o.hidden > 0 ? o.hidden : 4 * o.d_model;
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.experts).bias(false)));
  local_experts_ = o.experts / ep;
  first_expert_ = rank_of(o.ep) * local_experts_;
  container_ = register_module("experts", std::make_shared<torch::nn::Module>());
  // Every expert drawn in index order, as one process draws them; the other
  // ranks' are dropped.
  for (int64_t e = 0; e < o.experts; ++e) {
    auto expert = std::make_shared<ExpertImpl>(o.d_model, hidden);
    if (e < first_expert_ || e >= first_expert_ + local_experts_) continue;
    container_->register_module(std::to_string(e), expert);
    experts_.push_back(expert);
  }
}

void Moe::set_token_group(comm::ProcessGroup* tokens, std::chrono::milliseconds timeout) {
  if (size_of(options_.ep) > 1) {
    throw Error("Moe::set_token_group: the layer splits its experts over an ep group; its token group is fixed "
                "with it at construction");
  }
  options_.tokens = tokens;
  options_.timeout = timeout;
}

void Moe::check_ep(const comm::ProcessGroup& tokens, const comm::ProcessGroup& ep) const {
  if (options_.experts % ep.size() != 0) {
    throw Error(fmt::format("Moe: {} experts do not split over an expert-parallel group of {} ranks; pick ep "
                            "dividing the experts",
                            options_.experts, ep.size()));
  }
  // ep inside the token group: every ep peer's tokens are counted there.
  const auto& members = tokens.global_ranks();
  for (int g : ep.global_ranks()) {
    if (std::find(members.begin(), members.end(), g) == members.end()) {
      throw Error(fmt::format("Moe: world rank {} of the ep group is not in the token group", g));
    }
  }
}

void Moe::split_experts(comm::ProcessGroup& tokens, comm::ProcessGroup& ep, std::chrono::milliseconds timeout) {
  if (local_experts_ != options_.experts) {
    throw Error(fmt::format("Moe::split_experts: the layer holds {} of its {} experts, split already",
                            local_experts_, options_.experts));
  }
  check_ep(tokens, ep);
  options_.tokens = &tokens;
  options_.timeout = timeout;
  if (ep.size() == 1) return;
  options_.ep = &ep;
  local_experts_ = options_.experts / ep.size();
  first_expert_ = ep.rank() * local_experts_;
  std::vector<std::shared_ptr<ExpertImpl>> kept;
  for (int64_t e = 0; e < options_.experts; ++e) {
    if (e >= first_expert_ && e < first_expert_ + local_experts_) {
      kept.push_back(experts_[static_cast<size_t>(e)]);
    } else {
      container_->unregister_module(std::to_string(e));
    }
  }
  experts_ = std::move(kept);
}

std::vector<at::Tensor> Moe::expert_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& e : experts_) {
    for (const auto& p : e->parameters()) out.push_back(p);
  }
  return out;
}

namespace {

// A token's top-k experts by repeated argmax (ties to the lower index) and
// their gates (GShard's renormalized pair for k = 2).
struct Choices {
  std::vector<at::Tensor> expert, gate;  // k of [n]
};
Choices choose(const at::Tensor& probs, int64_t k) {
  Choices c{std::vector<at::Tensor>(static_cast<size_t>(k)), std::vector<at::Tensor>(static_cast<size_t>(k))};
  at::Tensor masked = probs.detach().clone();
  for (int64_t j = 0; j < k; ++j) {
    c.expert[j] = masked.argmax(-1);
    masked.scatter_(1, c.expert[j].unsqueeze(1), -1.0);
    c.gate[j] = probs.gather(1, c.expert[j].unsqueeze(1)).squeeze(1);
  }
  if (k == 2) {
    const at::Tensor total = c.gate[0] + c.gate[1];
    c.gate = {c.gate[0] / total, c.gate[1] / total};
  }
  return c;
}

// The one-process slot arithmetic over the token group's gathered counts
// (Note [Routing as one process would]): base(r, j, e) is the slots taken
// before rank r's choice-j pairs of expert e.
class SlotTable {
 public:
  SlotTable(const at::Tensor& counts, int64_t capacity) : capacity_(capacity) {
    ranks_ = counts.size(0), k_ = counts.size(1), experts_ = counts.size(2);
    const at::Tensor flat = counts.contiguous();
    counts_.assign(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
    base_.resize(counts_.size());
    for (int64_t e = 0; e < experts_; ++e) {
      int64_t taken = 0;
      for (int64_t j = 0; j < k_; ++j) {
        for (int64_t r = 0; r < ranks_; ++r) {
          base_[index(r, j, e)] = taken;
          taken += counts_[index(r, j, e)];
        }
      }
    }
  }
  int64_t base(int64_t r, int64_t j, int64_t e) const { return base_[index(r, j, e)]; }
  int64_t count(int64_t r, int64_t j, int64_t e) const { return counts_[index(r, j, e)]; }
  int64_t kept(int64_t r, int64_t j, int64_t e) const {
    return std::clamp<int64_t>(capacity_ - base(r, j, e), 0, count(r, j, e));
  }
  int64_t capacity() const { return capacity_; }

 private:
  size_t index(int64_t r, int64_t j, int64_t e) const { return static_cast<size_t>((r * k_ + j) * experts_ + e); }
  int64_t capacity_, ranks_ = 0, k_ = 0, experts_ = 0;
  std::vector<int64_t> counts_, base_;  // [R, k, E], row-major
};

// A kept (token, choice) pair of this rank.
struct Pair {
  int64_t expert, slot, token, choice;
};

// This rank's kept pairs, ordered by expert, then slot.
std::vector<Pair> kept_pairs(const Choices& c, const SlotTable& slots, int64_t me, int64_t n, int64_t experts) {
  std::vector<Pair> pairs;
  const int64_t k = static_cast<int64_t>(c.expert.size());
  std::vector<int64_t> next(static_cast<size_t>(k * experts), 0);
  for (int64_t j = 0; j < k; ++j) {
    const at::Tensor cj = c.expert[j].to(at::kCPU).contiguous();
    const int64_t* chosen = cj.data_ptr<int64_t>();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t e = chosen[t];
      const int64_t slot = slots.base(me, j, e) + next[static_cast<size_t>(j * experts + e)]++;
      if (slot < slots.capacity()) pairs.push_back({e, slot, t, j});
    }
  }
  std::sort(pairs.begin(), pairs.end(),
            [](const Pair& a, const Pair& b) { return a.expert != b.expert ? a.expert < b.expert : a.slot < b.slot; });
  return pairs;
}

RoutingStats routing_stats(const SlotTable& slots, const std::vector<Pair>& pairs, int64_t ranks, int64_t k,
                           int64_t experts, int64_t tokens, int64_t n) {
  RoutingStats stats;
  stats.tokens = tokens;
  stats.capacity = slots.capacity();
  stats.load.assign(static_cast<size_t>(experts), 0);
  for (int64_t r = 0; r < ranks; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t e = 0; e < experts; ++e) {
        stats.load[static_cast<size_t>(e)] += slots.kept(r, j, e);
        stats.dropped += slots.count(r, j, e) - slots.kept(r, j, e);
      }
    }
  }
  std::vector<char> has(static_cast<size_t>(n), 0);
  for (const Pair& p : pairs) has[static_cast<size_t>(p.token)] = 1;
  stats.tokens_without_expert = std::count(has.begin(), has.end(), 0);
  return stats;
}

}  // namespace

// Note [Expert parallelism by all-to-all]: `rows` (this rank's kept pairs,
// by expert then slot) to their experts' owners, each local expert on the
// rows it received from every source, and the outputs back in `rows`'
// order.
at::Tensor Moe::run_experts(const at::Tensor& rows, const std::vector<int64_t>& send, const SlotCounts& kept) {
  const int ep = size_of(options_.ep);
  // What each ep peer sends here: its kept pairs on this rank's experts.
  std::vector<int64_t> recv(static_cast<size_t>(ep), 0), rows_per_expert(static_cast<size_t>(ep * local_experts_), 0);
  for (int s = 0; s < ep; ++s) {
    for (int64_t le = 0; le < local_experts_; ++le) {
      const int64_t m = kept(s, first_expert_ + le);
      rows_per_expert[static_cast<size_t>(s * local_experts_ + le)] = m;
      recv[static_cast<size_t>(s)] += m;
    }
  }
  const int64_t group = as_int(options_.ep), timeout_ms = options_.timeout.count();
  const at::Tensor arrived = ep > 1 ? AllToAll::apply(rows, group, timeout_ms, recv, send) : rows;
  const std::vector<at::Tensor> by_source = arrived.split_with_sizes(recv, 0);
  std::vector<std::vector<at::Tensor>> back(static_cast<size_t>(ep));
  for (int64_t le = 0; le < local_experts_; ++le) {
    std::vector<at::Tensor> inputs;
    std::vector<int64_t> sizes;
    for (int s = 0; s < ep; ++s) {
      const std::vector<int64_t> split(rows_per_expert.begin() + s * local_experts_,
                                       rows_per_expert.begin() + (s + 1) * local_experts_);
      inputs.push_back(by_source[static_cast<size_t>(s)].split_with_sizes(split, 0)[static_cast<size_t>(le)]);
      sizes.push_back(inputs.back().size(0));
    }
    const auto outs = experts_[static_cast<size_t>(le)]->forward(at::cat(inputs, 0)).split_with_sizes(sizes, 0);
    for (int s = 0; s < ep; ++s) back[static_cast<size_t>(s)].push_back(outs[static_cast<size_t>(s)]);
  }
  std::vector<at::Tensor> pieces;
  for (auto& part : back) pieces.push_back(at::cat(part, 0));
  const at::Tensor processed = at::cat(pieces, 0);
  return ep > 1 ? AllToAll::apply(processed, group, timeout_ms, send, recv) : processed;
}

at::Tensor Moe::forward(const at::Tensor& input) {
  const MoeOptions& o = options_;
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == o.d_model, "Moe expects [..., ", o.d_model, "], got ",
              input.sizes());
  const at::Tensor x = input.reshape({-1, o.d_model});
  const int64_t n = x.size(0), e_count = o.experts, k = o.top_k;
  const int r_count = size_of(o.tokens), me = rank_of(o.tokens);

  // Switch's selective precision: the router's matmul in fp32 whatever
  // autocast would choose, so 16-bit rounding does not flip choices.
  at::Tensor logits;
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    logits = at::linear(x.to(at::kFloat), router->weight.to(at::kFloat));
  }
  const at::Tensor probs = torch::softmax(logits, -1);  // [n, E]
  const Choices choices = choose(probs, k);

  // Counts per (choice, expert), gathered over the token group.
  at::Tensor counts = at::zeros({k, e_count}, at::kLong);
  for (int64_t j = 0; j < k; ++j) counts[j] = at::bincount(choices.expert[j].to(at::kCPU), {}, e_count);
  at::Tensor all_counts = counts.unsqueeze(0).repeat({r_count, 1, 1});  // [R, k, E]
  if (r_count > 1) o.tokens->all_gather(all_counts, counts.contiguous())->wait(o.timeout);
  // Each token has exactly one first choice: the token group's tokens.
  const int64_t t_total = all_counts.select(1, 0).sum().item<int64_t>();
  const double slots_per_expert = o.capacity_factor * static_cast<double>(k * t_total) / static_cast<double>(e_count);
  const SlotTable slots(all_counts, static_cast<int64_t>(std::ceil(slots_per_expert)));
  const std::vector<Pair> pairs = kept_pairs(choices, slots, me, n, e_count);
  stats_ = routing_stats(slots, pairs, r_count, k, e_count, t_total, n);

  // The kept pairs' rows through their experts (on their owners).
  std::vector<int64_t> token_index, choice_index;
  std::vector<int64_t> send(static_cast<size_t>(size_of(o.ep)), 0);
  for (const Pair& p : pairs) {
    token_index.push_back(p.token);
    choice_index.push_back(p.choice * n + p.token);
    send[static_cast<size_t>(p.expert / local_experts_)]++;
  }
  const at::Tensor rows_index = torch::tensor(token_index, at::kLong).to(x.device());
  const auto& token_ranks = ep_peers_in_tokens();
  const at::Tensor returned = run_experts(x.index_select(0, rows_index), send, [&](int s, int64_t e) {
    int64_t m = 0;
    for (int64_t j = 0; j < k; ++j) m += slots.kept(token_ranks[static_cast<size_t>(s)], j, e);
    return m;
  });

  // Combine: each pair's output times its gate, summed per token.
  const at::Tensor gates = at::stack(choices.gate, 0).reshape({-1});  // [k * n], choice-major
  const at::Tensor pair_gate = gates.index_select(0, torch::tensor(choice_index, at::kLong).to(x.device()));
  at::Tensor y = at::zeros({n, o.d_model}, returned.options());
  y = y.index_add(0, rows_index, returned * pair_gate.unsqueeze(1).to(returned.scalar_type()));

  // Switch's load-balancing loss over the token group.
  at::Tensor prob_sums = probs.sum(0);  // [E]
  if (r_count > 1) prob_sums = SumOverTokens::apply(prob_sums, as_int(o.tokens), o.timeout.count());
  const double denominator = static_cast<double>(std::max<int64_t>(t_total, 1));  // an empty round: zero
  const at::Tensor first_share = all_counts.select(1, 0).sum(0).to(at::kFloat).to(x.device()) / denominator;
  aux_loss_ = static_cast<double>(e_count) * (first_share * (prob_sums / denominator)).sum();
  // The loop logs what training routed: forwards with gradients, so a
  // recomputed layer (activation checkpointing: first without, then again
  // in backward) counts once.
  if (is_training() && at::GradMode::is_enabled()) add_to_totals();
  at::Tensor out = y.to(input.scalar_type()).reshape(input.sizes());
  // Note [Aux losses in backward]: the load-balancing loss's gradient comes
  // with the output's, weighted as the micro-batch's loss is.
  if (aux_loss_weight_ > 0 && is_training() && at::GradMode::is_enabled() && aux_loss_.requires_grad()) {
    if (const std::optional<double> weight = core::loss_weight())
      out = InjectAuxGradient::apply(out, aux_loss_, aux_loss_weight_ * *weight);
  }
  return out;
}

void Moe::add_to_totals() {
  RoutingTotals& t = totals_;
  if (t.load.size() != stats_.load.size()) t.load.assign(stats_.load.size(), 0);
  for (size_t e = 0; e < t.load.size(); ++e) t.load[e] += stats_.load[e];
  t.dropped += stats_.dropped;
  t.tokens += stats_.tokens;
  t.capacity = stats_.capacity;
  ++t.forwards;
  const at::Tensor aux = aux_loss_.detach().to(at::kDouble);
  t.aux_loss_sum = t.aux_loss_sum.defined() ? t.aux_loss_sum + aux : aux;
}

RoutingTotals Moe::take_totals() {
  RoutingTotals out = std::move(totals_);
  totals_ = RoutingTotals{};
  return out;
}

std::vector<int> Moe::ep_peers_in_tokens() const {
  const int ep = size_of(options_.ep);
  std::vector<int> out(static_cast<size_t>(ep), rank_of(options_.tokens));
  if (ep == 1) return out;
  const auto& members = options_.tokens->global_ranks();
  for (int s = 0; s < ep; ++s) {
    out[static_cast<size_t>(s)] = static_cast<int>(
        std::find(members.begin(), members.end(), options_.ep->global_ranks()[static_cast<size_t>(s)]) -
        members.begin());
  }
  return out;
}

}  // namespace paratrain::moe
