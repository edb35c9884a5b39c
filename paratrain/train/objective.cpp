// Classification and language-modelling losses and evaluation sums.
#include "paratrain/train/objective.h"

#include <algorithm>
#include <tuple>
#include <utility>

#include <torch/torch.h>

namespace paratrain::train {
namespace {

namespace F = torch::nn::functional;

// [B, S, V] logits and [B, S] targets as [B*S, V] and [B*S] int64.
std::pair<at::Tensor, at::Tensor> flatten_tokens(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "language-model loss expects logits [B, S, vocab] and targets [B, S], got ", logits.sizes(), " and ",
              targets.sizes());
  return {logits.reshape({-1, logits.size(2)}), targets.reshape({-1}).to(torch::kLong)};
}

}  // namespace

Objective Objective::for_config(const TrainConfig& config) {
  if (config.model.kind == "gpt") return Objective(Kind::kLanguageModel, config.model.seq_len);
  return Objective(Kind::kClassification);
}

LossFn Objective::loss() const {
  if (language_model()) {
    return [](const at::Tensor& logits, const at::Tensor& targets) {
      auto [flat_logits, flat_targets] = flatten_tokens(logits, targets);
      return F::cross_entropy(flat_logits, flat_targets);
    };
  }
  return [](const at::Tensor& logits, const at::Tensor& targets) { return F::cross_entropy(logits, targets); };
}

EvalSums Objective::eval_sums(const at::Tensor& logits, const at::Tensor& targets) const {
  at::Tensor l = logits, t = targets;
  if (language_model()) std::tie(l, t) = flatten_tokens(logits, targets);
  EvalSums s;
  s.loss = F::cross_entropy(l, t, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
  s.correct = l.argmax(1).eq(t).sum().item<double>();
  s.count = static_cast<double>(t.size(0));
  return s;
}

int64_t Objective::eval_rows_per_chunk() const {
  // 8192 tokens per forward: a d=256, 4-head GPT at seq 128 holds ~16 MB of
  // attention weights per layer and 8 MB of logits.
  return language_model() ? std::max<int64_t>(1, 8192 / seq_len_) : 1000;
}

}  // namespace paratrain::train
