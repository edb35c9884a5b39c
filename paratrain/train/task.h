// Task: what a model is trained to do, as the Trainer sees it — the loss of
// a micro-batch and the metrics of an evaluation. The C++ user's answer to
// Lightning's training_step / validation_step, one level down: a strategy
// runs the forward (DDP wraps it, ZeRO-3 gathers around it, a pipeline cuts
// it), so a Task scores what the forward returned against the batch's
// targets. The built-in objectives are two Tasks (classification, language
// modelling), picked for a config by task_for_config(); a program brings its
// own through TrainerParts (trainer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

namespace paratrain::train {

struct TrainConfig;

/// Sums over one evaluation chunk. The Trainer adds them over chunks and
/// over data-parallel ranks, then reports each sum divided by the total
/// count as "test_<name>" (metrics.jsonl, logs, train.monitor, callbacks).
struct EvalSums {
  double count = 0;  ///< predictions summed over: examples, or tokens
  /// Named sums; "loss" is required (test_loss: checkpoints, early stopping).
  std::vector<std::pair<std::string, double>> sums;

  /// Adds `value` to the sum under `name` (a new name is appended).
  void add(const std::string& name, double value);
  /// The sum under `name`; 0 when absent.
  double get(const std::string& name) const;
};

/// What a model is trained to do: its loss and its evaluation metrics
/// (this header's opening comment). Implement loss() and eval_sums().
class Task {
 public:
  virtual ~Task() = default;
  /// The mean loss of a micro-batch: `output` is what the model's forward
  /// returned for the batch's inputs, `targets` the batch's targets. Must
  /// be a scalar that autograd can differentiate; the Trainer divides it for
  /// accumulation and multiplies it for loss scaling around this call.
  virtual at::Tensor loss(const at::Tensor& output, const at::Tensor& targets) const = 0;
  /// Sums of the evaluation metrics of one chunk (see EvalSums), computed
  /// under NoGradGuard with the model in eval mode.
  virtual EvalSums eval_sums(const at::Tensor& output, const at::Tensor& targets) const = 0;
  /// Figures derived from the reported means (`means`: "test_<name>" and
  /// value, as logged) after the reduction: perplexity from a language
  /// model's test_loss. Appended as named, without a "test_" prefix.
  virtual std::vector<std::pair<std::string, double>> derived(
      const std::vector<std::pair<std::string, double>>& means) const {
    (void)means;
    return {};
  }
  /// Rows per evaluation forward (activation memory bounds it).
  virtual int64_t eval_rows_per_chunk() const { return 1000; }
  /// For logs: "classification", "language model", the user's name.
  virtual std::string name() const { return "user task"; }
};

/// Mean cross-entropy of logits [N, classes] against int64 labels [N];
/// evaluation: "loss" and "accuracy" (argmax == label) per example.
std::shared_ptr<Task> classification_task();
/// Next-token cross-entropy of logits [B, S, vocab] against targets [B, S]
/// (any integer dtype): every token is one prediction; evaluation adds
/// "perplexity" = exp(test loss). `seq_len` bounds evaluation chunks.
std::shared_ptr<Task> language_model_task(int64_t seq_len);
/// The built-in objective of a config's model: language modelling for
/// model.kind = "gpt", classification for every other kind.
std::shared_ptr<Task> task_for_config(const TrainConfig& config);

}  // namespace paratrain::train
