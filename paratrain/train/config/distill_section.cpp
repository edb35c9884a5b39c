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
  // The megatron strategy distills at tp (the student's logits gathered
  // whole), not with the sequence split over cp or with its stages.
  if (c.parallel.cp > 1 || (c.parallel.tp > 1 && c.parallel.pp > 1) ||
      (builds_gpt(c) && c.parallel.pp > 1 && c.zero.stage > 0))
    return fmt::format("distill.teacher with parallel.cp = {}, or tp = {} with pp = {} (or a GPT in pipeline stages "
                       "under ZeRO): the megatron strategy distills under tensor parallelism alone; distill at "
                       "parallel.tp with cp = pp = 1, under data parallelism, ZeRO/FSDP, parameter servers or "
                       "pipelines with zero.stage = 0 for a GPT, or set distill.teacher = \"\"",
                       c.parallel.cp, c.parallel.tp, c.parallel.pp);
  if (c.zero.stage == 3 && c.elastic.in_job)
    return "distill.teacher with zero.stage = 3 and elastic.in_job = true: the teacher is sharded over the "
           "data-parallel group, which an in-job recovery replaces; use restarts (elastic.in_job = false) or "
           "zero.stage <= 2";
  return "";
}

}  // namespace paratrain::train::detail
