// The loop's distillation part (distillation.h).
#include "paratrain/train/loop/distillation.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/phase.h"
#include "paratrain/pipeline/executor.h"
#include "paratrain/train/distill/distill_loss.h"
#include "paratrain/train/distill/sequence_window.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

Distillation::Distillation(Trainer::State& s) : s_(s) {}

void Distillation::evaluate_teacher() {
  if (!s_.teacher) return;
  const EvalResult r =
      evaluate_forward(s_, [&](const at::Tensor& inputs) { return s_.teacher->logits_everywhere(inputs); });
  // How the teacher is laid out: "stages", "tp" (ranks its layers are split
  // over) and "sharded" (FSDP over dp).
  nlohmann::json record = {{"kind", "teacher"},
                           {"step", s_.step},
                           {"stages", s_.teacher->stages()},
                           {"tp", s_.teacher->tp_split()},
                           {"sharded", s_.teacher->sharded()}};
  for (const auto& [name, value] : r.metrics) record[name] = value;
  if (s_.is_main()) {
    spdlog::info("distill: teacher {} ({}, {} parameters{}) on the test set: loss {:.4f}{}",
                 s_.teacher->source().checkpoint.string(), s_.teacher->source().config.model.kind,
                 s_.teacher->parameter_count(),
                 s_.teacher->sharded()
                     ? std::string(", sharded over dp")
                     : (s_.teacher->stages() > 1 ? fmt::format(", in {} stages", s_.teacher->stages()) : "") +
                           (s_.teacher->tp_split() > 1 ? fmt::format(", split over tp = {}", s_.teacher->tp_split())
                                                       : ""),
                 r.loss,
                 r.perplexity > 0 ? fmt::format(", perplexity {:.3f}", r.perplexity)
                                  : fmt::format(", accuracy {:.2f}%", 100.0 * r.accuracy));
  }
  s_.log_record(std::move(record));
}

void Distillation::before_micro_batch(const at::Tensor& inputs) {
  // A rank that trains no data (a parameter server) runs no student loss:
  // its batches are empty (async) or never trained on (sync).
  if (!s_.teacher || !s_.strategy->data_shard().computes || inputs.numel() == 0) return;
  // Timed with the forward it serves (profile's "forward" phase). In stages
  // every stage takes part and the last, where the loss runs, gets the logits.
  PhaseScope phase(kPhaseForward);
  teacher_logits_ = s_.teacher->logits(inputs);
}

LossFn Distillation::wrap(LossFn task) {
  if (!s_.teacher) return task;
  const double temperature = s_.config.distill.temperature;
  const double alpha = s_.config.distill.alpha;
  return [this, task = std::move(task), temperature, alpha](const at::Tensor& output, const at::Tensor& targets) {
    // A pipeline computes the loss per micro-batch of the step's batch: the
    // teacher's logits of those rows (Note [The rows of a micro-batch's loss]).
    const pipeline::LossRows rows = pipeline::current_loss_rows();
    at::Tensor teacher = rows.count < 0 ? teacher_logits_ : teacher_logits_.narrow(0, rows.begin, rows.count);
    // Under context parallelism, this rank's positions of the sequences
    // (Note [A loss over a sequence chunk]).
    const SequenceWindow window = current_sequence_window();
    if (window.count >= 0) teacher = teacher.narrow(1, window.begin, window.count);
    DistillLoss parts = distillation_loss(output, teacher, task(output, targets), temperature, alpha);
    soft_sum_ += parts.soft.item<double>();
    hard_sum_ += parts.hard.item<double>();
    ++micro_batches_;
    return parts.total;
  };
}

void Distillation::log(int64_t step) {
  if (!s_.teacher) return;
  // Over the world: a rank that computes no loss (a parameter server, a
  // pipeline stage before the last) adds zeros.
  auto sums = torch::tensor({soft_sum_, hard_sum_, static_cast<double>(micro_batches_)}, torch::kDouble);
  s_.world->all_reduce(sums, comm::ReduceOp::kSum)->wait(s_.timeout());
  soft_sum_ = hard_sum_ = 0;
  micro_batches_ = 0;
  const double n = sums[2].item<double>();
  if (n <= 0) return;
  s_.log_record({{"kind", "distill"}, {"step", step}, {"soft_loss", sums[0].item<double>() / n},
                 {"hard_loss", sums[1].item<double>() / n}});
}

}  // namespace paratrain::train
