// The distillation loss (Hinton, Vinyals and Dean, arXiv 1503.02531), used by
// distill.* (docs/distillation.md).
#pragma once

#include <ATen/core/Tensor.h>

namespace paratrain::train {

/// KL(softmax(teacher / T) || softmax(student / T)), averaged over
/// predictions: every row of the logits' last dimension is one (a batch of
/// class logits [B, C], or a language model's [B, L, V]: B * L next-token
/// distributions). Computed in float32 whatever the logits' dtype. The
/// teacher's logits carry no gradient.
at::Tensor soft_target_kl(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double temperature);

/// The parts of one micro-batch's distillation loss.
struct DistillLoss {
  at::Tensor total;  ///< alpha * T^2 * soft + (1 - alpha) * hard: what backward runs on
  at::Tensor soft;   ///< soft_target_kl(student, teacher, T), detached
  at::Tensor hard;   ///< the task's loss on the labels, detached
};

/// Note [Distillation loss]
/// loss = alpha * T^2 * KL(p_teacher^T || p_student^T) + (1 - alpha) * task
/// loss, with p^T = softmax(logits / T). The T^2 keeps the soft part's
/// gradients the size they have at T = 1 (d KL / d logits scales as 1 / T^2,
/// Hinton et al. section 2), so alpha weighs the two parts alike at any T.
/// KL instead of the cross-entropy with soft targets: the two differ by the
/// teacher's entropy, a constant for the student, so the gradients are equal
/// and a perfect student's soft loss is 0.
DistillLoss distillation_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                              const at::Tensor& task_loss, double temperature, double alpha);

}  // namespace paratrain::train
