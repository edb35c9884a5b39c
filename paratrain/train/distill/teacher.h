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
#include "paratrain/train/config/config.h"

namespace paratrain::models {
class Model;
}
namespace paratrain::fsdp {
class FullyShardedDataParallel;
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

class Teacher {
 public:
  /// Builds the teacher's model, loads its weights, moves it to `device` and,
  /// with `shard`, shards it over `dp` (FSDP; collective). Every rank builds
  /// the same teacher.
  Teacher(const TeacherSource& source, c10::Device device, comm::ProcessGroup& dp, bool shard,
          std::chrono::milliseconds timeout);
  ~Teacher();

  /// The teacher's logits for `inputs`: eval mode, no autograd history.
  /// Collective over dp when sharded.
  at::Tensor logits(const at::Tensor& inputs);
  /// Every parameter in full, by name (the same on every rank). Collective
  /// over dp when sharded.
  std::vector<std::pair<std::string, at::Tensor>> full_parameters();

  const TeacherSource& source() const { return source_; }
  int64_t parameter_count() const { return parameter_count_; }
  bool sharded() const { return fsdp_ != nullptr; }

 private:
  TeacherSource source_;
  std::shared_ptr<models::Model> model_;
  std::unique_ptr<fsdp::FullyShardedDataParallel> fsdp_;
  int64_t parameter_count_ = 0;
};

}  // namespace paratrain::train
