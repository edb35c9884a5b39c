// What the model is trained to predict, as the Trainer sees it: the loss of
// a batch and the evaluation sums. Classification: logits [N, classes] and
// labels [N] (Fashion-MNIST, synthetic). Language modelling: logits
// [B, S, vocab] and next tokens [B, S] (the GPT on text), where every token
// position is one prediction. Not the model or the data: only how their
// outputs are scored.
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

#include "paratrain/train/config.h"
#include "paratrain/train/strategy.h"

namespace paratrain::train {

// Sums over one evaluation chunk; the Trainer all-reduces them over ranks.
struct EvalSums {
  double loss = 0;     // cross-entropy summed over predictions
  double correct = 0;  // predictions whose argmax is the target
  double count = 0;    // predictions: examples, or tokens for a language model
};

class Objective {
 public:
  enum class Kind { kClassification, kLanguageModel };

  explicit Objective(Kind kind, int64_t seq_len = 1) : kind_(kind), seq_len_(seq_len) {}
  // Language modelling for model.kind = "gpt", else classification.
  static Objective for_config(const TrainConfig& config);

  Kind kind() const { return kind_; }
  bool language_model() const { return kind_ == Kind::kLanguageModel; }

  // Mean cross-entropy of a micro-batch: over examples (classification) or
  // over every token of every sequence (language modelling; targets of any
  // integer dtype, the text dataset's are bytes).
  LossFn loss() const;
  // Summed loss, correct argmax predictions and prediction count of a chunk.
  EvalSums eval_sums(const at::Tensor& logits, const at::Tensor& targets) const;
  // Rows per evaluation forward: bounded by activation memory, which for a
  // sequence model grows with the tokens (and attention with seq_len^2).
  int64_t eval_rows_per_chunk() const;

 private:
  Kind kind_;
  int64_t seq_len_;
};

}  // namespace paratrain::train
