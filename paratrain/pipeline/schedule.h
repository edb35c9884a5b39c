// Pipeline schedules: which forward and backward passes one pipeline stage
// runs, in which order (GPipe, 1F1B, interleaved 1F1B). Pure arithmetic: no
// tensors, no communication; the executor (pipeline/ stage code) runs these
// lists across ranks, and simulate.h checks them against the data dependencies.
#pragma once

#include <string>
#include <vector>

namespace paratrain::pipeline {

enum class ScheduleKind { kGpipe, kOneFOneB, kInterleaved1F1B };

// "gpipe" | "1f1b" | "interleaved_1f1b" (the config key pipeline.schedule).
// Throws ConfigError naming the key, the value and the allowed values.
ScheduleKind parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind kind);

enum class ActionKind { kForward, kBackward };

// One pass of one micro-batch through one of this stage's model chunks.
// `chunk` is the LOCAL chunk index 0..v-1; the model chunk (virtual stage) it
// runs is chunk * stages + stage (model_chunk() below), as in Megatron-LM.
struct Action {
  ActionKind kind = ActionKind::kForward;
  int microbatch = 0;
  int chunk = 0;
  bool operator==(const Action&) const = default;
};
// "F(mb 3, chunk 1)" / "B(mb 0, chunk 0)": for logs and error messages.
std::string to_string(const Action& action);

struct ScheduleOptions {
  // Pipeline stages p (= parallel.pp). More stages split memory further but
  // add (p - 1) fill/drain slots to every step (the bubble).
  int stages = 1;
  // Micro-batches m per step (pipeline.microbatches). More shrink the bubble
  // ((p-1)/(m+p-1)) but each is smaller (less efficient kernels) and GPipe
  // keeps all m alive.
  int microbatches = 1;
  // Model chunks v per stage (pipeline.virtual_stages), interleaved only.
  // v chunks cut the bubble by v but send v times as many activations.
  int virtual_stages = 1;
};

// Throws ConfigError naming keys and values: stages < 1 (parallel.pp),
// microbatches < 1 (pipeline.microbatches), virtual_stages != 1 for gpipe and
// 1f1b, virtual_stages < 2 or microbatches % stages != 0 for interleaved
// (Megatron-LM's requirement: micro-batches go through the chunks in groups of p).
void validate_schedule(ScheduleKind kind, const ScheduleOptions& options);
// TORCH_CHECK (a caller's mistake, not the user's config): 0 <= stage < stages.
void validate_stage(const ScheduleOptions& options, int stage);

// The one dispatcher: this stage's actions in execution order. Every
// (microbatch, chunk) is run forward once and backward once, each backward
// after its forward. Validates options and stage first.
std::vector<Action> make_schedule(ScheduleKind kind, const ScheduleOptions& options, int stage);

// One function per schedule (schedules/*.cpp), sections as in the papers.
// GPipe (Huang et al., arXiv 1811.06965): all forwards, then all backwards.
std::vector<Action> gpipe_schedule(const ScheduleOptions& options, int stage);
// 1F1B / PipeDream-Flush (Narayanan et al., arXiv 2104.04473, section 2.2):
// warm-up forwards, steady one-forward-one-backward, cool-down backwards.
std::vector<Action> one_f_one_b_schedule(const ScheduleOptions& options, int stage);
// Interleaved 1F1B (same paper, section 2.2): v chunks per stage, micro-batches
// through them in groups of p.
std::vector<Action> interleaved_1f1b_schedule(const ScheduleOptions& options, int stage);

// Model chunk (virtual stage, 0..stages*v-1) that local `chunk` of `stage` runs.
inline int model_chunk(const ScheduleOptions& options, int stage, int chunk) {
  return chunk * options.stages + stage;
}

// Throws paratrain::Error naming the stage and the offending action unless
// `actions` has every (microbatch, chunk) of `options` forward exactly once
// and backward exactly once, each backward after its forward. The executor
// can run it on a schedule before trusting it.
void verify_schedule(const std::vector<Action>& actions, const ScheduleOptions& options, int stage);

// The schedule's own accounting of activation memory: the most (microbatch,
// chunk) forwards whose backward has not run yet, at any point of `actions`
// (counted after each forward, before the backward that frees it). Units are
// chunks: an interleaved chunk holds 1/v of a stage's layers.
int peak_in_flight(const std::vector<Action>& actions);

// Idle share of a step when every pass costs the same and communication is
// free: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) for interleaved.
double theoretical_bubble(ScheduleKind kind, const ScheduleOptions& options);

}  // namespace paratrain::pipeline
