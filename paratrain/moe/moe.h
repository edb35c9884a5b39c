// A mixture-of-experts layer (GShard, arXiv 2006.16668; Switch Transformer,
// arXiv 2101.03961): a router sends each token to its top-k of E expert
// MLPs, each expert takes at most `capacity` tokens of a step's batch, and
// the token's output is the gate-weighted sum of its experts' outputs. With
// expert parallelism the experts are split over the ranks of an `ep` group
// and the tokens travel to their experts and back by all-to-all.
//
//   MoeOptions o{.d_model = 256, .experts = 8, .top_k = 2};
//   o.tokens = &dp_group;  // the ranks whose tokens make up the step's batch
//   o.ep = &ep_group;      // the ranks the experts are split over (inside dp)
//   auto moe = std::make_shared<Moe>(o);
//   at::Tensor y = moe->forward(x);              // x, y: [..., d_model]
//   at::Tensor loss = task_loss + moe->aux_loss(); // Switch's load balancing
//
// Note [Routing as one process would]
// Which tokens an expert drops when it is full must not depend on how the
// batch is split over ranks. Slots are given as one process would give
// them over the whole batch (the token group's ranks' tokens in rank order):
// every first choice before any second choice, and within a choice in token
// order. Each rank counts its tokens per (choice, expert); one all-gather of
// those counts over the token group gives every rank the number of slots
// the earlier ranks and choices took, so each token's slot, and whether it
// is kept (slot < capacity), is the one-process answer. Ties between router
// probabilities go to the lower expert index. A token none of whose choices
// is kept gets a zero output: in a residual block it passes through
// unchanged (GShard, Switch).
//
// Note [Aux losses in backward]
// The load-balancing loss is a term of the training loss computed inside the
// model. Added to the loss function's value, it only works where that value
// is computed: not on a pipeline's earlier stages. With an aux loss weight
// set (set_aux_loss_weight; the Trainer sets model.moe_aux_loss), the
// forward instead returns its output through a node whose backward passes
// the output's gradient on and gives the aux loss the gradient it would get
// as a term of the loss: weight x the micro-batch's loss weight, read on
// this thread while the forward runs (Note [The weight of a micro-batch's
// loss] in core/loss_weight.h). The same gradient reaches the router as if
// the term had been added, in the same backward (Megatron-Core's aux-loss
// auto-scaler does this too). A forward run again in backward (activation
// checkpointing) gets the weight its first pass saw back from the segment
// (models/recompute.cpp), and only forwards with gradients count in the
// routing totals, so a recomputed layer counts once.
//
// Note [Expert parallelism by all-to-all]
// Rank r of the ep group holds experts [r E/ep, (r+1) E/ep), registered
// under their global index ("experts.5.fc.weight"), so a checkpoint names
// each expert the same at any ep. Dispatch sends each kept (token, choice)
// row to its expert's owner, ordered by expert and slot; the split sizes
// come from the same all-gathered counts, so no sizes are exchanged. The
// owner runs each expert on the rows it received and a second all-to-all
// returns them; the token's output is the gate-weighted sum. Backward runs
// the two all-to-alls in reverse. The layer's gradients, under the
// data-parallel mean of the ranks' losses:
//   - router and other non-expert parameters: averaged over the token group
//     as usual (DDP);
//   - an expert's gradient on its owner is the sum over every token group
//     rank's loss (each rank's tokens reached it): divide by the token
//     group's size, after summing over the ranks that hold the same expert
//     in other ep groups (the caller's to do: moe/expert_parallel.h does it
//     for the Trainer's parallel.ep);
//   - the aux loss's probability means are all-reduced over the token
//     group with a backward scaled by its size, so the data-parallel mean
//     gives the one-process gradient.
// The router's matmul runs in fp32 under autocast (Switch's selective
// precision); the experts' Linears run at quantization's activation sites.
// Not here: the GPT's MoE blocks (models/gpt.h), the replicas of an expert
// and its gradients, slots and norms under the Trainer's parallel.ep
// (moe/expert_parallel.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::moe {

/// The layer's sizes, routing and groups.
struct MoeOptions {
  int64_t d_model = 0;  ///< the token width
  /// Each expert's hidden width (d -> hidden -> d, GELU); 0: 4 d_model.
  int64_t hidden = 0;
  int64_t experts = 8;  ///< E
  int64_t top_k = 1;    ///< 1 (Switch) or 2 (GShard)
  /// Each expert takes at most ceil(capacity_factor * top_k * T / E) of the
  /// step's T tokens (over the token group).
  double capacity_factor = 1.25;
  /// The ranks whose tokens form one batch (the data-parallel group);
  /// nullptr: this rank's tokens alone. Not owned.
  comm::ProcessGroup* tokens = nullptr;
  /// The ranks the experts are split over, a subset of `tokens` (ep inside
  /// dp); nullptr or size 1: every expert on this rank. Not owned.
  comm::ProcessGroup* ep = nullptr;
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;  ///< bound on each collective's wait
};

/// One expert: d -> hidden -> d with GELU.
class ExpertImpl : public torch::nn::Module {
 public:
  /// fc: d -> hidden, proj: hidden -> d (LibTorch's Linear initialization).
  ExpertImpl(int64_t d, int64_t hidden);
  /// x: [rows, d] -> [rows, d].
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear fc{nullptr};    ///< d -> hidden
  torch::nn::Linear proj{nullptr};  ///< hidden -> d
};

/// What the last forward routed (this rank's tokens; the counts over the
/// token group).
struct RoutingStats {
  int64_t tokens = 0;                ///< the token group's tokens
  int64_t capacity = 0;              ///< slots per expert
  std::vector<int64_t> load;         ///< kept (token, choice) pairs per expert, over the token group
  int64_t dropped = 0;               ///< (token, choice) pairs dropped at capacity, over the token group
  int64_t tokens_without_expert = 0; ///< this rank's tokens none of whose choices was kept
};

/// What the forwards since the last take_totals() routed, summed (the
/// counts over the token group; the capacity of the last forward).
struct RoutingTotals {
  int64_t forwards = 0;       ///< training forwards summed
  int64_t tokens = 0;         ///< the token group's tokens they routed
  int64_t capacity = 0;       ///< slots per expert in the last forward
  std::vector<int64_t> load;  ///< kept (token, choice) pairs per expert
  int64_t dropped = 0;        ///< (token, choice) pairs dropped at capacity
  /// The aux losses' sum (0-dim double, on the layer's device; undefined
  /// before a forward): read it when logging, not every step.
  at::Tensor aux_loss_sum;
};

/// The layer (see the notes above).
class Moe : public torch::nn::Module {
 public:
  /// Draws the router and this rank's experts as one process would draw all
  /// of them (the experts in index order), keeping only this rank's: every
  /// rank at the same generator state builds the one-process layer's part.
  explicit Moe(MoeOptions options);

  /// x: [..., d_model] -> [..., d_model]. Collective over `tokens` (one
  /// all-gather of counts, one all-reduce for the aux loss) and `ep` (two
  /// all-to-alls); every rank of them must call it together.
  at::Tensor forward(const at::Tensor& x);

  /// The token group (and timeout) of a layer built without one, e.g. a
  /// model built before the Trainer's groups existed; its experts stay all
  /// local (ep is fixed at construction).
  void set_token_group(comm::ProcessGroup* tokens, std::chrono::milliseconds timeout);

  /// Splits a layer built with every expert local over `ep`, a subgroup of
  /// `tokens` (the Trainer's parallel.ep, which builds the model as one
  /// process would first): this rank keeps experts [r E/ep, (r+1) E/ep) and
  /// drops the others. Not collective; every ep rank calls it with the same
  /// groups, before any forward. Throws Error when the layer is split
  /// already or ep does not divide the experts. Not owned; both groups must
  /// outlive the layer's forwards.
  void split_experts(comm::ProcessGroup& tokens, comm::ProcessGroup& ep, std::chrono::milliseconds timeout);

  /// Switch's load-balancing loss of the last forward, E * sum_e f_e * P_e
  /// (f_e: the share of tokens whose first choice is e, P_e: the mean router
  /// probability of e, both over the token group); differentiable in P.
  /// Scale it by the config's weight and add it to the loss.
  at::Tensor aux_loss() const { return aux_loss_; }
  /// Makes the forward give the aux loss its gradient itself, `weight` times
  /// the thread's micro-batch loss weight (core/loss_weight.h), whenever one
  /// is set: the Trainer's way (model.moe_aux_loss), which a pipeline stage
  /// without the loss function needs (Note [Aux losses in backward]). The
  /// caller then must not add aux_loss() to its loss. 0 (the default): the
  /// caller adds it.
  void set_aux_loss_weight(double weight) { aux_loss_weight_ = weight; }
  double aux_loss_weight() const { return aux_loss_weight_; }  ///< see set_aux_loss_weight()
  /// What the last forward routed.
  const RoutingStats& stats() const { return stats_; }
  /// What the forwards since the last call routed, and their aux losses;
  /// starts the next sums.
  RoutingTotals take_totals();
  /// The options it was built with (the token group as last set).
  const MoeOptions& options() const { return options_; }

  /// The first expert this rank holds: it holds [first, first + count).
  int64_t first_expert() const { return first_expert_; }
  /// How many experts this rank holds (E / ep).
  int64_t local_experts() const { return local_experts_; }

  /// Expert parameters (to reduce over the ranks holding the same experts,
  /// divided by the token group's size; Note [Expert parallelism by
  /// all-to-all]).
  std::vector<at::Tensor> expert_parameters() const;

  torch::nn::Linear router{nullptr};  ///< d -> E, no bias

 private:
  // The kept pairs of ep peer s (its token group rank) on expert e.
  using SlotCounts = std::function<int64_t(int s, int64_t e)>;
  at::Tensor run_experts(const at::Tensor& rows, const std::vector<int64_t>& send, const SlotCounts& kept);
  // Each ep peer's rank in the token group.
  std::vector<int> ep_peers_in_tokens() const;

  // Checks ep against the token group and the expert count.
  void check_ep(const comm::ProcessGroup& tokens, const comm::ProcessGroup& ep) const;
  // Adds the last forward's routing and aux loss to totals_.
  void add_to_totals();

  MoeOptions options_;
  std::shared_ptr<torch::nn::Module> container_;  // "experts": this rank's, named by global index
  int64_t first_expert_ = 0, local_experts_ = 0;
  std::vector<std::shared_ptr<ExpertImpl>> experts_;  // this rank's, in index order
  at::Tensor aux_loss_;
  double aux_loss_weight_ = 0;
  RoutingStats stats_;
  RoutingTotals totals_;
};

}  // namespace paratrain::moe
