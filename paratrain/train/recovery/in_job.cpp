// In-job recovery of the Trainer's state (in_job.h).
#include "paratrain/train/recovery/in_job.h"

#include <chrono>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/recovery/in_job_batch.h"
#include "paratrain/train/recovery/in_job_rollback.h"
#include "paratrain/train/strategies/strategy_registry.h"

namespace paratrain::train {
namespace {

using Clock = std::chrono::steady_clock;

// The survivors must stand at the same step and epoch position, or they
// would apply different updates. Ring all-reduce can finish on one rank and
// fail on another when the dead rank dies after sending its last chunk: then
// one survivor took the failed step and the other did not. The lagging one
// lacks the dead rank's gradient, so nothing in memory can bring them
// together: that case fails here, by name, for restart-based recovery. So
// does a failure that caught ranks in different phases (one in a step,
// another in the checkpoint save before it, which the first had finished):
// they would redo different collectives.
void check_survivors_agree(comm::ProcessGroup& world, int64_t step, int64_t position, RecoveryPhase phase,
                           std::chrono::milliseconds timeout) {
  if (world.size() == 1) return;
  auto lo = torch::tensor({static_cast<double>(step), static_cast<double>(position), static_cast<double>(phase)},
                          torch::kDouble);
  auto hi = lo.clone();
  world.all_reduce(lo, comm::ReduceOp::kMin)->wait(timeout);
  world.all_reduce(hi, comm::ReduceOp::kMax)->wait(timeout);
  if (lo[2].item<double>() != hi[2].item<double>()) {
    throw CommError(fmt::format(
        "rank {}: in-job recovery: the failure caught the survivors in different phases (step {}: some in the "
        "training step, some in its evaluation or checkpoint save), so they cannot redo the same work. Restart "
        "from a checkpoint instead (`paratrain launch --max-restarts N` with train.checkpoint_every_steps)",
        world.rank(), lo[0].item<int64_t>()));
  }
  if (!torch::equal(lo, hi)) {
    throw CommError(fmt::format(
        "rank {}: in-job recovery: the survivors stand at different steps ({} to {}; epoch positions {} to {}): "
        "the failure hit the end of a gradient all-reduce, which completed on some ranks only, and the others "
        "lack the dead rank's gradient. Restart from a checkpoint instead (`paratrain launch --max-restarts N` "
        "with train.checkpoint_every_steps)",
        world.rank(), lo[0].item<int64_t>(), hi[0].item<int64_t>(), lo[1].item<int64_t>(), hi[1].item<int64_t>()));
  }
}

}  // namespace

int64_t consumed_positions(const data::LoaderState& at, int64_t per_rank_batch, int64_t replicas) {
  return at.first_position + at.next_batch * per_rank_batch * replicas;
}

Recovery recover_in_job(Trainer::State& s, const data::LoaderState& resume_at, const std::exception& failure,
                        RecoveryPhase phase) {
  const auto t0 = Clock::now();
  const auto& c = s.config;
  Recovery r;
  r.old_world_size = s.world->size();
  const int old_rank = s.world->rank();
  const int64_t failed_after = s.step;  // optimizer steps this rank completed
  const bool roll_back = rolls_back_in_job(c);
  const char* phase_name = phase == RecoveryPhase::kStep         ? "step"
                           : phase == RecoveryPhase::kEvaluation ? "evaluation"
                                                                 : "checkpoint save";
  const std::string failed = phase == RecoveryPhase::kStep ? fmt::format("step {}", s.step + 1)
                                                           : fmt::format("the {} after step {}", phase_name, s.step);
  spdlog::warn("rank {}: {} failed: {}. elastic.in_job: aborting the world group of {} ranks and re-forming it "
               "with the survivors",
               old_rank, failed, failure.what(), r.old_world_size);
  s.world->abort();
  const comm::Membership m = s.rejoiner->rejoin(old_rank, r.old_world_size);
  r.world_size = static_cast<int>(m.survivors.size());
  r.dead_ranks = m.dead();

  // Note [Consumed samples]
  // `resume_at` is the loader at the start of the step every survivor stands
  // at: the steps before it trained positions [0, c) of the epoch's
  // permutation on every rank (strided split, Note [Strided split] in
  // data/sampler.cpp), c = first_position + next_batch * per-rank batch *
  // old dp size. The failed step consumed nothing: its gradients are
  // dropped and it is redone by the survivors on P[c, ...).
  const auto& old_sampler = s.loader->sampler().options();
  const int64_t per_rank = s.loader->options().batch_size;
  const int64_t n = s.datasets.train.size();
  int64_t consumed = consumed_positions(resume_at, per_rank, old_sampler.num_replicas);
  int64_t epoch = resume_at.epoch;

  // The old strategy's reducer hooks the model's parameters and holds the
  // aborted group: it goes first (its destructor removes the hooks). DDP:
  // the model, and with it the optimizer's tensors, stays. A rollback
  // replaces both (in_job_rollback.h).
  std::shared_ptr<models::Model> model;
  if (!roll_back) {
    model = std::dynamic_pointer_cast<models::Model>(s.strategy->module());
    TORCH_CHECK(model, "in-job recovery: the strategy's module is not a paratrain model");
  } else {
    s.optimizer.reset();  // its tensors are the old strategy's shards
  }
  s.strategy.reset();
  s.checkpointer.reset();
  s.mesh.reset();
  // The failed step's partial gradients (this rank's own, maybe half
  // reduced) must not leak into the redone step.
  if (model)
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();

  std::shared_ptr<comm::ProcessGroup> group = m.group;
  if (auto recorder = comm::recorder_of(*s.world)) {
    comm::RecordingOptions recording;
    recording.name = "world";
    recording.timeout = s.timeout();
    group = comm::record_collectives(std::move(group), std::move(recorder), recording);
  }
  s.owned_world = std::move(group);  // the previous owned world (if any) goes here
  s.world = s.owned_world.get();
  // A rollback needs no agreement on the step or phase: every survivor
  // leaves where it stood.
  if (!roll_back) check_survivors_agree(*s.world, s.step, consumed, phase, s.timeout());

  const auto dims = topology::ParallelDims::resolve(0, 1, 1, 1, s.world->size());
  s.mesh = std::make_unique<topology::DeviceMesh>(*s.world, dims);
  if (roll_back) {
    const RolledBack back = roll_back_in_job(s);
    r.rolled_back = true;
    epoch = back.epoch;
    consumed = back.consumed_positions;
    r.restored_step = back.step;
    r.restored = back.what;
  } else {
    s.strategy = make_strategy(strategy_name(c), StrategyContext{s.config, *s.mesh, s.timeout(), s.run_dir});
    // Replicas are identical (they took the same steps), so the wrapper's
    // broadcast from the new rank 0 changes nothing.
    s.strategy->build_model([model] { return model; });
    r.restored_step = s.step;
    r.restored = "kept the model and optimizer in memory";
  }
  s.checkpointer = std::make_unique<TrainingCheckpointer>(c, *s.world);
  if (s.is_main() && old_rank != 0) s.metrics = MetricsLog(s.run_dir / "metrics.jsonl");  // rank 0 died: re-elected

  // The per-rank batch stays, so the global batch shrinks with the world;
  // with elastic.keep_global_batch the per-rank batch (or train.accumulate)
  // changes instead (Note [Keeping the global batch in the job] in
  // in_job_batch.cpp). Either way the survivors start at `consumed`.
  r.old_batch = s.batch;
  const RecoveredBatch batch = batch_after_recovery(c, s.batch, r.old_world_size, s.world->size());
  s.batch = batch.sizes;
  r.batch = s.batch;
  if (s.is_main() && !batch.message.empty()) spdlog::warn("in-job recovery {}: {}", m.epoch, batch.message);
  data::SamplerOptions sampler = old_sampler;
  sampler.num_replicas = s.world->size();
  sampler.rank = s.world->rank();
  data::LoaderOptions loader = s.loader->options();
  loader.batch_size = s.batch.per_rank;
  s.loader = std::make_unique<data::Loader>(s.datasets.train, data::DistributedSampler(n, sampler), loader);
  if (consumed < n) {
    r.first_position = consumed;
    s.loader->load_state({epoch, 0, consumed});
  } else {  // the failed step was in the padded tail (or the checkpoint at its end): the epoch is over
    r.first_position = n;
    s.loader->load_state({epoch, s.loader->num_batches(), 0});
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (s.is_main()) {
    spdlog::warn("in-job recovery {}: rank(s) {} of {} died in {}; {} survivors (old ranks {}) go on as ranks 0-{}, "
                 "{}: redoing {} from epoch {} position {} of {} (global batch now {}), after {:.2f} s",
                 m.epoch, fmt::join(r.dead_ranks, ","), r.old_world_size, failed, r.world_size,
                 fmt::join(m.survivors, ","), r.world_size - 1, r.restored,
                 roll_back ? fmt::format("step {}", s.step + 1) : failed, epoch + 1, r.first_position, n,
                 s.batch.global, r.seconds);
    s.log_record({{"kind", "recovery"}, {"recovery", m.epoch}, {"step", failed_after}, {"redo_step", s.step + 1},
                  {"epoch", epoch}, {"dead_ranks", r.dead_ranks}, {"survivors", m.survivors},
                  {"old_world_size", r.old_world_size}, {"world_size", r.world_size},
                  {"first_position", r.first_position}, {"global_batch", s.batch.global},
                  {"old_global_batch", r.old_batch.global}, {"per_rank_batch", s.batch.per_rank},
                  {"old_per_rank_batch", r.old_batch.per_rank}, {"accumulate", s.batch.accumulate},
                  {"old_accumulate", r.old_batch.accumulate}, {"keep_global_batch", c.elastic.keep_global_batch},
                  {"phase", phase == RecoveryPhase::kCheckpoint ? "checkpoint" : phase_name},
                  {"restored", r.restored}, {"restored_step", r.restored_step}, {"seconds", r.seconds},
                  {"error", failure.what()}});
  }
  return r;
}

}  // namespace paratrain::train
