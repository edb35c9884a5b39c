// soft_target_kl and distillation_loss (distill_loss.h).
#include "paratrain/train/distill/distill_loss.h"

#include <ATen/ATen.h>

#include <c10/util/Exception.h>

namespace paratrain::train {

at::Tensor soft_target_kl(const at::Tensor& student_logits, const at::Tensor& teacher_logits, double temperature) {
  TORCH_CHECK(student_logits.sizes() == teacher_logits.sizes(), "distillation: the student's logits are ",
              student_logits.sizes(), " but the teacher's are ", teacher_logits.sizes(),
              ": the two models must predict the same classes (or vocabulary) for the same inputs");
  const int64_t classes = student_logits.size(-1);
  const at::Tensor s = student_logits.to(at::kFloat).reshape({-1, classes}) / temperature;
  const at::Tensor t = teacher_logits.detach().to(at::kFloat).reshape({-1, classes}) / temperature;
  const at::Tensor log_p_teacher = at::log_softmax(t, -1);
  const at::Tensor log_p_student = at::log_softmax(s, -1);
  // sum_c p_t (log p_t - log p_s) per row, then the mean over rows.
  return (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(-1).mean();
}

DistillLoss distillation_loss(const at::Tensor& student_logits, const at::Tensor& teacher_logits,
                              const at::Tensor& task_loss, double temperature, double alpha) {
  const at::Tensor soft = soft_target_kl(student_logits, teacher_logits, temperature);
  const at::Tensor total = soft * (alpha * temperature * temperature) + task_loss * (1.0 - alpha);
  return {total, soft.detach(), task_loss.detach()};
}

}  // namespace paratrain::train
