// The GPT's logits and loss in the megatron strategy: the Trainer's loss
// factor (Note [The Trainer's loss under tensor parallelism]), the full
// logits from a rank's vocabulary columns and sequence chunk, and the loss
// reported over cp. Internal to paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor_parallel/context.h"
#include "paratrain/train/strategies/strategy.h"

namespace paratrain::train::strategies {

constexpr int64_t kGptVocab = 256;  // byte tokens, as make_model builds the GPT

/// What the Trainer's LossFn multiplies the mean cross-entropy by (the
/// loss scaler's scale, 1/k for accumulation): 1 without either.
double loss_factor(const LossFn& loss_fn);

/// [B, S, V] from this rank's [B, S/cp, V/tp]: the vocabulary columns
/// gathered over tp, the sequence chunks over cp (collective over both).
at::Tensor gather_logits(const at::Tensor& part, const tensor_parallel::TpContext& tp, comm::ProcessGroup& cp,
                         std::chrono::milliseconds timeout);

/// The loss as one process reports it: the mean of the cp ranks' losses
/// (each the mean over its chunk of every sequence), a float scalar.
at::Tensor mean_over_cp(const at::Tensor& loss, comm::ProcessGroup& cp, std::chrono::milliseconds timeout);

}  // namespace paratrain::train::strategies
