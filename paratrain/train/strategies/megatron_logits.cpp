// The GPT's logits and loss in the megatron strategy: see megatron_logits.h.
#include "paratrain/train/strategies/megatron_logits.h"

#include <torch/torch.h>

#include "paratrain/tensor_parallel/mappings.h"
#include "paratrain/train/task.h"

namespace paratrain::train::strategies {

// Note [The Trainer's loss under tensor parallelism]
// The Trainer hands every strategy a LossFn of (full logits, targets): the
// objective's mean cross-entropy times what the Trainer wraps around it (the
// loss scaler's scale, 1/k for accumulation). Here no rank holds full logits,
// so the strategy computes the mean cross-entropy itself
// (vocab_parallel_cross_entropy) and asks the LossFn for its factor by
// evaluating it on a probe whose plain cross-entropy is known (uniform logits
// of one token: log(vocab)). Every wrapper the Trainer applies is a
// multiplication, so factor = LossFn(probe) / CE(probe); with no scaler and
// k = 1 it is exactly 1.
double loss_factor(const LossFn& loss_fn) {
  at::NoGradGuard no_grad;
  const at::Tensor logits = at::zeros({1, 1, kGptVocab});
  const at::Tensor targets = at::zeros({1, 1}, at::kLong);
  const double plain = language_model_task(1)->loss(logits, targets).item<double>();
  return loss_fn(logits, targets).item<double>() / plain;
}

at::Tensor gather_logits(const at::Tensor& part, const tensor_parallel::TpContext& tp, comm::ProcessGroup& cp,
                         std::chrono::milliseconds timeout) {
  at::Tensor logits = tensor_parallel::all_gather_last_dim(part.contiguous(), tp);
  if (cp.size() == 1) return logits;
  at::Tensor stacked = at::empty({cp.size(), logits.size(0), logits.size(1), logits.size(2)}, logits.options());
  cp.all_gather(stacked, logits.contiguous())->wait(timeout);
  // [cp, B, S/cp, V] -> [B, S, V]. No -1: an empty share has no elements to
  // infer it from.
  return stacked.permute({1, 0, 2, 3}).reshape({logits.size(0), cp.size() * logits.size(1), logits.size(2)});
}

at::Tensor mean_over_cp(const at::Tensor& loss, comm::ProcessGroup& cp, std::chrono::milliseconds timeout) {
  at::Tensor reported = loss.detach().to(at::kFloat).clone().reshape({1});
  if (cp.size() > 1) {
    cp.all_reduce(reported, comm::ReduceOp::kSum)->wait(timeout);
    reported.div_(cp.size());
  }
  return reported.reshape({});
}

}  // namespace paratrain::train::strategies
