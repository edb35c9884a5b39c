// The teacher of knowledge distillation (distill.teacher; docs/distillation.md):
// a trained model rebuilt from the config saved with its checkpoint, its
// weights read from the checkpoint (any layout: the shards are re-cut on
// load), run in eval mode without autograd history on the student's
// micro-batches. Replicated on every rank, or sharded over the data-parallel
// group like the student under ZeRO-3/FSDP. Internal to paratrain/train.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <c10/core/Device.h>

#include "paratrain/comm/process_group.h"
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}
namespace paratrain::checkpoint {
class ShardedReader;
}
namespace paratrain::fsdp {
class FullyShardedDataParallel;
}
namespace paratrain::pipeline {
class Executor;
}

namespace paratrain::train {

/// Where a teacher comes from: the checkpoint and the config saved with it.
struct TeacherSource {
  std::filesystem::path checkpoint;  ///< a committed checkpoint folder
  TrainConfig config;                ///< the teacher run's config (its [model] builds the teacher)
};

/// distill.teacher resolved: a checkpoint folder as it is; a run folder
/// (runs/NAME, or one version of it) -> its newest committed checkpoint.
/// ConfigError when there is none, when the checkpoint holds no config, or
/// when the teacher cannot read the student's data (another dataset, a
/// shorter GPT window).
TeacherSource find_teacher(const std::string& spec, const TrainConfig& student);

/// How the teacher is laid out over the ranks, like the student.
struct TeacherPlacement {
  c10::Device device{c10::kCPU};
  /// Shard it over `dp` (FSDP, the student's zero.stage 3).
  bool shard = false;
  comm::ProcessGroup* dp = nullptr;
  /// Cut it into pp->size() stages when > 1 (the student's parallel.pp): each
  /// rank keeps its stage's layers, and logits() runs the stages in turn.
  comm::ProcessGroup* pp = nullptr;
  /// Split over tp->size() ranks when > 1 (the student's parallel.tp): a GPT
  /// teacher by its own plan (gpt_tp_plan), another by the parallel.tp_plan
  /// saved with it; without one it stays whole on every rank. logits() are
  /// whole on every rank either way.
  comm::ProcessGroup* tp = nullptr;
  /// The student's input shape per example and dtype (token ids for a GPT),
  /// for the stage boundaries.
  std::vector<int64_t> example_shape;
  at::ScalarType input_dtype = at::kFloat;
  std::chrono::milliseconds timeout{0};
};

class Teacher {
 public:
  /// Builds the teacher's model, loads its weights, moves it to the device
  /// and lays it out (`placement`; collective when sharded or staged). Every
  /// rank builds the same teacher.
  Teacher(const TeacherSource& source, const TeacherPlacement& placement);
  ~Teacher();

  /// The teacher's logits for `inputs`: eval mode, no autograd history.
  /// Collective over dp when sharded. In stages: collective over pp, and
  /// defined on the last stage only (where the loss runs).
  at::Tensor logits(const at::Tensor& inputs);
  /// The same, defined on every rank (stages: broadcast from the last).
  at::Tensor logits_everywhere(const at::Tensor& inputs);
  /// Every parameter in full, by name (the same on every rank). Collective
  /// over dp when sharded, over pp when in stages.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();

  const TeacherSource& source() const { return source_; }
  int64_t parameter_count() const { return parameter_count_; }
  bool sharded() const { return fsdp_ != nullptr; }
  /// Stages it is cut into (1: whole).
  int stages() const { return stages_; }
  /// Tensor-parallel ranks its layers are split over (1: whole).
  int tp_split() const { return tp_split_; }

 private:
  void load_sharded(checkpoint::ShardedReader& reader, const TeacherPlacement& placement);
  void cut_into_stages(const TeacherPlacement& placement);
  void split_over_tp(const TeacherPlacement& placement);

  TeacherSource source_;
  TeacherPlacement placement_;
  std::shared_ptr<models::Model> model_;  // null once cut into stages: the executor holds this rank's layers
  std::unique_ptr<fsdp::FullyShardedDataParallel> fsdp_;
  std::unique_ptr<pipeline::Executor> stages_executor_;
  std::vector<int64_t> output_shape_;  // per example, for logits_everywhere
  std::vector<std::pair<std::string, at::Tensor>> stage_parameters_;  // this stage's, by name
  int stages_ = 1;
  int tp_split_ = 1;
  bool gather_vocabulary_ = false;  // a GPT split over tp gives its vocabulary columns
  torch::OrderedDict<std::string, tensor_parallel::ShardSpec> tp_layout_;  // in stages and split over tp
  int64_t parameter_count_ = 0;
};

}  // namespace paratrain::train
