// The mixture-of-experts layer of moe.h: routing as one process would
// (Note [Routing as one process would]), experts over the ep group by
// all-to-all (Note [Expert parallelism by all-to-all]).
#include "paratrain/moe/moe.h"

#include <torch/autograd.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "paratrain/core/error.h"
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
  if (o.experts % ep != 0) {
    throw Error(fmt::format("Moe: {} experts do not split over an expert-parallel group of {} ranks; pick ep "
                            "dividing the experts",
                            o.experts, ep));
  }
  if (ep > 1 && o.tokens == nullptr) throw Error("Moe: an ep group needs the token group (MoeOptions.tokens)");
  if (ep > 1) {
    // ep inside the token group: every ep peer's tokens are counted there.
    const auto& members = o.tokens->global_ranks();
    for (int g : o.ep->global_ranks()) {
      if (std::find(members.begin(), members.end(), g) == members.end()) {
        throw Error(fmt::format("Moe: world rank {} of the ep group is not in the token group", g));
      }
    }
  }
  const int64_t hidden = o.hidden > 0 ? o.hidden : 4 * o.d_model;
  router = register_module("router", torch::nn::Linear(torch::nn::LinearOptions(o.d_model, o.experts).bias(false)));
  local_experts_ = o.experts / ep;
  first_expert_ = rank_of(o.ep) * local_experts_;
  auto container = register_module("experts", std::make_shared<torch::nn::Module>());
  // Every expert drawn in index order, as one process draws them; the other
  // ranks' are dropped.
  for (int64_t e = 0; e < o.experts; ++e) {
    auto expert = std::make_shared<ExpertImpl>(o.d_model, hidden);
    if (e < first_expert_ || e >= first_expert_ + local_experts_) continue;
    container->register_module(std::to_string(e), expert);
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

std::vector<at::Tensor> Moe::expert_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& e : experts_) {
    for (const auto& p : e->parameters()) out.push_back(p);
  }
  return out;
}

at::Tensor Moe::forward(const at::Tensor& input) {
  const MoeOptions& o = options_;
  TORCH_CHECK(input.dim() >= 1 && input.size(-1) == o.d_model, "Moe expects [..., ", o.d_model, "], got ",
              input.sizes());
  const at::Tensor x = input.reshape({-1, o.d_model});
  const int64_t n = x.size(0), e_count = o.experts, k = o.top_k;
  const int r_count = size_of(o.tokens), me = rank_of(o.tokens);

  // Routing: probabilities in fp32, the top-k by repeated argmax (ties to
  // the lower index), GShard's renormalized gates for k = 2.
  // Switch's selective precision: the router's matmul in fp32 whatever
  // autocast would choose, so 16-bit rounding does not flip choices.
  at::Tensor logits;
  {
    c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
    logits = at::linear(x.to(at::kFloat), router->weight.to(at::kFloat));
  }
  const at::Tensor probs = torch::softmax(logits, -1);  // [n, E]
  std::vector<at::Tensor> choice(static_cast<size_t>(k)), gate(static_cast<size_t>(k));
  {
    at::Tensor masked = probs.detach().clone();
    for (int64_t j = 0; j < k; ++j) {
      choice[j] = masked.argmax(-1);  // [n]
      masked.scatter_(1, choice[j].unsqueeze(1), -1.0);
    }
  }
  for (int64_t j = 0; j < k; ++j) gate[j] = probs.gather(1, choice[j].unsqueeze(1)).squeeze(1);
  if (k == 2) {
    const at::Tensor total = gate[0] + gate[1];
    gate[0] = gate[0] / total;
    gate[1] = gate[1] / total;
  }

  // Counts per (choice, expert), gathered over the token group.
  at::Tensor counts = at::zeros({k, e_count}, at::kLong);
  for (int64_t j = 0; j < k; ++j) counts[j] = at::bincount(choice[j].to(at::kCPU), {}, e_count);
  at::Tensor all_counts = counts.unsqueeze(0).repeat({r_count, 1, 1});  // [R, k, E]
  if (r_count > 1) o.tokens->all_gather(all_counts, counts.contiguous())->wait(o.timeout);
  // Each token has exactly one first choice: the token group's tokens.
  const int64_t t_total = all_counts.select(1, 0).sum().item<int64_t>();
  const int64_t capacity = static_cast<int64_t>(
      std::ceil(o.capacity_factor * static_cast<double>(k * t_total) / static_cast<double>(e_count)));

  // base[r][j][e]: the slots taken before rank r's choice-j tokens of e.
  const auto acc = all_counts.accessor<int64_t, 3>();
  std::vector<int64_t> base(static_cast<size_t>(r_count * k * e_count));
  auto at_base = [&](int r, int64_t j, int64_t e) -> int64_t& {
    return base[static_cast<size_t>((r * k + j) * e_count + e)];
  };
  for (int64_t e = 0; e < e_count; ++e) {
    int64_t taken = 0;
    for (int64_t j = 0; j < k; ++j) {
      for (int r = 0; r < r_count; ++r) {
        at_base(r, j, e) = taken;
        taken += acc[r][j][e];
      }
    }
  }
  auto kept_of = [&](int r, int64_t j, int64_t e) {
    return std::clamp<int64_t>(capacity - at_base(r, j, e), 0, acc[r][j][e]);
  };

  // This rank's kept (token, choice) pairs, ordered by expert, then slot.
  struct Pair {
    int64_t expert, slot, token, choice;
  };
  std::vector<Pair> pairs;
  std::vector<int64_t> next(static_cast<size_t>(k * e_count), 0);
  for (int64_t j = 0; j < k; ++j) {
    const at::Tensor cj = choice[j].to(at::kCPU).contiguous();
    const int64_t* c = cj.data_ptr<int64_t>();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t e = c[t];
      const int64_t slot = at_base(me, j, e) + next[static_cast<size_t>(j * e_count + e)]++;
      if (slot < capacity) pairs.push_back({e, slot, t, j});
    }
  }
  std::sort(pairs.begin(), pairs.end(),
            [](const Pair& a, const Pair& b) { return a.expert != b.expert ? a.expert < b.expert : a.slot < b.slot; });

  // Routing stats over the token group.
  stats_ = RoutingStats{};
  stats_.tokens = t_total;
  stats_.capacity = capacity;
  stats_.load.assign(static_cast<size_t>(e_count), 0);
  for (int r = 0; r < r_count; ++r) {
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t e = 0; e < e_count; ++e) {
        stats_.load[static_cast<size_t>(e)] += kept_of(r, j, e);
        stats_.dropped += acc[r][j][e] - kept_of(r, j, e);
      }
    }
  }
  {
    std::vector<char> has(static_cast<size_t>(n), 0);
    for (const Pair& p : pairs) has[static_cast<size_t>(p.token)] = 1;
    stats_.tokens_without_expert = std::count(has.begin(), has.end(), 0);
  }

  // Dispatch: the rows of the kept pairs to their experts' owners.
  const int ep = size_of(o.ep);
  std::vector<int64_t> token_index;
  token_index.reserve(pairs.size());
  for (const Pair& p : pairs) token_index.push_back(p.token);
  const at::Tensor rows_index = torch::tensor(token_index, at::kLong).to(x.device());
  const at::Tensor rows = x.index_select(0, rows_index);  // [pairs, d], by expert then slot
  std::vector<int64_t> send(static_cast<size_t>(ep), 0), recv(static_cast<size_t>(ep), 0);
  for (const Pair& p : pairs) send[static_cast<size_t>(p.expert / local_experts_)]++;
  // From each ep peer: the kept pairs of its tokens on this rank's experts,
  // known from the gathered counts (the peer's rank in the token group).
  std::vector<int> peer_in_tokens(static_cast<size_t>(ep), me);
  if (ep > 1) {
    const auto& members = o.tokens->global_ranks();
    for (int s = 0; s < ep; ++s) {
      peer_in_tokens[static_cast<size_t>(s)] = static_cast<int>(
          std::find(members.begin(), members.end(), o.ep->global_ranks()[static_cast<size_t>(s)]) - members.begin());
    }
  }
  // Received rows, source by source, each ordered by expert then slot.
  std::vector<int64_t> rows_per_expert(static_cast<size_t>(ep * local_experts_), 0);
  for (int s = 0; s < ep; ++s) {
    for (int64_t le = 0; le < local_experts_; ++le) {
      int64_t m = 0;
      for (int64_t j = 0; j < k; ++j) m += kept_of(peer_in_tokens[static_cast<size_t>(s)], j, first_expert_ + le);
      rows_per_expert[static_cast<size_t>(s * local_experts_ + le)] = m;
      recv[static_cast<size_t>(s)] += m;
    }
  }
  at::Tensor arrived = ep > 1 ? AllToAll::apply(rows, as_int(o.ep), o.timeout.count(), recv, send) : rows;

  // Each local expert on its rows (from every source), then back in the
  // order they arrived.
  std::vector<at::Tensor> pieces;
  {
    std::vector<at::Tensor> by_source = arrived.split_with_sizes(recv, 0);
    std::vector<std::vector<at::Tensor>> parts(static_cast<size_t>(ep));
    std::vector<at::Tensor> outputs_per_expert(static_cast<size_t>(local_experts_));
    for (int64_t le = 0; le < local_experts_; ++le) {
      std::vector<at::Tensor> inputs;
      std::vector<int64_t> sizes;
      for (int s = 0; s < ep; ++s) {
        std::vector<int64_t> split(rows_per_expert.begin() + s * local_experts_,
                                   rows_per_expert.begin() + (s + 1) * local_experts_);
        const at::Tensor piece = by_source[static_cast<size_t>(s)].split_with_sizes(split, 0)[static_cast<size_t>(le)];
        inputs.push_back(piece);
        sizes.push_back(piece.size(0));
      }
      const at::Tensor out = experts_[static_cast<size_t>(le)]->forward(at::cat(inputs, 0));
      const auto outs = out.split_with_sizes(sizes, 0);
      for (int s = 0; s < ep; ++s) parts[static_cast<size_t>(s)].push_back(outs[static_cast<size_t>(s)]);
    }
    for (int s = 0; s < ep; ++s) pieces.push_back(at::cat(parts[static_cast<size_t>(s)], 0));
  }
  const at::Tensor processed = at::cat(pieces, 0);
  const at::Tensor returned = ep > 1 ? AllToAll::apply(processed, as_int(o.ep), o.timeout.count(), send, recv)
                                     : processed;

  // Combine: each pair's output times its gate, summed per token.
  std::vector<int64_t> choice_of;
  choice_of.reserve(pairs.size());
  for (const Pair& p : pairs) choice_of.push_back(p.choice * n + p.token);
  const at::Tensor gates = at::stack(gate, 0).reshape({-1});  // [k * n], choice-major
  const at::Tensor pair_gate = gates.index_select(0, torch::tensor(choice_of, at::kLong).to(x.device()));
  at::Tensor y = at::zeros({n, o.d_model}, returned.options());
  y = y.index_add(0, rows_index, returned * pair_gate.unsqueeze(1).to(returned.scalar_type()));

  // Switch's load-balancing loss over the token group.
  at::Tensor prob_sums = probs.sum(0);  // [E]
  if (r_count > 1) prob_sums = SumOverTokens::apply(prob_sums, as_int(o.tokens), o.timeout.count());
  const double denominator = static_cast<double>(std::max<int64_t>(t_total, 1));  // an empty round: zero
  const at::Tensor first_share = all_counts.select(1, 0).sum(0).to(at::kFloat).to(x.device()) / denominator;
  aux_loss_ = static_cast<double>(e_count) * (first_share * (prob_sums / denominator)).sum();
  return y.to(input.scalar_type()).reshape(input.sizes());
}

}  // namespace paratrain::moe
