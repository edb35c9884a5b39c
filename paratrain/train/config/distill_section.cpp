// The schema rows and cross-key rules of [distill] (distill_section.h).
#include "paratrain/train/config/distill_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {

std::vector<FieldSpec> distill_fields() {
  using TC = TrainConfig;
  return {
      field("distill.teacher", &TC::distill, &DistillConfig::teacher, "knowledge distillation from a teacher: a checkpoint folder (checkpoints/step_N) or a run folder (runs/NAME: its newest checkpoint); its architecture from the config saved with it; \"\" = off"),
      field("distill.temperature", &TC::distill, &DistillConfig::temperature, "T: both distributions are softmax(logits / T); the soft loss is scaled by T^2", in_range_finite(1e-3, 1e3)),
      field("distill.alpha", &TC::distill, &DistillConfig::alpha, "loss = alpha * T^2 * KL(teacher || student) + (1 - alpha) * the task loss", in_range_finite(0.0, 1.0)),
  };
}

std::string distill_problem(const TrainConfig& c) {
  const DistillConfig& d = c.distill;
  if (d.teacher.empty()) return "";
  if (c.zero.stage == 3 && c.elastic.in_job)
    return "distill.teacher with zero.stage = 3 and elastic.in_job = true: the teacher is sharded over the "
           "data-parallel group, which an in-job recovery replaces; use restarts (elastic.in_job = false) or "
           "zero.stage <= 2";
  return "";
}

}  // namespace paratrain::train::detail
