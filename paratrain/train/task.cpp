// The built-in tasks: classification and language modelling.
#include "paratrain/train/task.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include <torch/torch.h>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

void EvalSums::add(const std::string& name, double value) {
  for (auto& [k, v] : sums) {
    if (k == name) {
      v += value;
      return;
    }
  }
  sums.emplace_back(name, value);
}

double EvalSums::get(const std::string& name) const {
  for (const auto& [k, v] : sums)
    if (k == name) return v;
  return 0;
}

namespace {

namespace F = torch::nn::functional;

EvalSums cross_entropy_sums(const at::Tensor& logits, const at::Tensor& targets) {
  EvalSums s;
  s.count = static_cast<double>(targets.size(0));
  s.add("loss", F::cross_entropy(logits, targets, F::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>());
  s.add("accuracy", logits.argmax(1).eq(targets).sum().item<double>());
  return s;
}

class Classification final : public Task {
 public:
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    return F::cross_entropy(logits, targets);
  }
  EvalSums eval_sums(const at::Tensor& logits, const at::Tensor& targets) const override {
    return cross_entropy_sums(logits, targets);
  }
  std::string name() const override { return "classification"; }
};

class LanguageModel final : public Task {
 public:
  explicit LanguageModel(int64_t seq_len) : seq_len_(std::max<int64_t>(seq_len, 1)) {}
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    auto [l, t] = flatten_tokens(logits, targets);
    return F::cross_entropy(l, t);
  }
  EvalSums eval_sums(const at::Tensor& logits, const at::Tensor& targets) const override {
    auto [l, t] = flatten_tokens(logits, targets);
    return cross_entropy_sums(l, t);
  }
  std::vector<std::pair<std::string, double>> derived(
      const std::vector<std::pair<std::string, double>>& means) const override {
    for (const auto& [k, v] : means)
      if (k == "test_loss") return {{"perplexity", std::exp(v)}};
    return {};
  }
  // 8192 tokens per forward: a d=256, 4-head GPT at seq 128 holds ~16 MB of
  // attention weights per layer and 8 MB of logits.
  int64_t eval_rows_per_chunk() const override { return std::max<int64_t>(1, 8192 / seq_len_); }
  std::string name() const override { return "language model"; }

 private:
  // [B, S, V] logits and [B, S] targets as [B*S, V] and [B*S] int64.
  static std::pair<at::Tensor, at::Tensor> flatten_tokens(const at::Tensor& logits, const at::Tensor& targets) {
    TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                    logits.size(1) == targets.size(1),
                "language-model loss expects logits [B, S, vocab] and targets [B, S], got ", logits.sizes(), " and ",
                targets.sizes());
    return {logits.reshape({-1, logits.size(2)}), targets.reshape({-1}).to(torch::kLong)};
  }
  int64_t seq_len_;
};

}  // namespace

std::shared_ptr<Task> classification_task() { return std::make_shared<Classification>(); }

std::shared_ptr<Task> language_model_task(int64_t seq_len) { return std::make_shared<LanguageModel>(seq_len); }

std::shared_ptr<Task> task_for_config(const TrainConfig& config) {
  if (builds_gpt(config)) return language_model_task(config.model.seq_len);
  return classification_task();
}

}  // namespace paratrain::train
