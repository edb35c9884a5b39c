// The schema rows and cross-key rules of [world] and [elastic] (world_section.h).
#include "paratrain/train/config/world_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {
namespace {

// elastic.in_job: DDP redoes the failed step from what each survivor holds in
// memory; ZeRO/FSDP roll back to the latest checkpoint, resharded to the
// survivors (train/recovery/in_job_rollback.h). Pipeline stages, tensor/context
// parallel pieces and parameter-server shards would need their groups and
// stage assignment rebuilt at a world size the config's parallel.* may not
// divide: restart-based recovery (`paratrain launch --max-restarts`) does
// that. State that is not replicated (PowerSGD's error feedback) or a save
// in flight would not survive either.
std::string in_job_problem(const TrainConfig& c) {
  if (!c.elastic.in_job) return "";
  std::string strategy;
  if (c.ps.servers > 0) strategy = fmt::format("parameter servers (ps.servers = {})", c.ps.servers);
  else if (c.parallel.tp > 1 || c.parallel.pp > 1 || c.parallel.cp > 1)
    strategy = fmt::format("parallel.tp = {}, parallel.pp = {}, parallel.cp = {}", c.parallel.tp, c.parallel.pp,
                           c.parallel.cp);
  if (!strategy.empty())
    return fmt::format("elastic.in_job = true recovers data-parallel runs only (DDP from memory; zero.stage 1-3 "
                       "by rolling back to the latest checkpoint), but this run uses {}: its stages, pieces or "
                       "server shards would need a new layout over the survivors. Use restart-based recovery "
                       "(`paratrain launch --max-restarts N` with train.checkpoint_every_steps) or set "
                       "elastic.in_job = false",
                       strategy);
  if (c.ddp.compression == "powersgd" || c.ddp.compression == "int8")
    return fmt::format("elastic.in_job = true with ddp.compression = \"{}\": its per-rank error feedback does "
                       "not survive re-forming the group; use another ddp.compression or elastic.in_job = false",
                       c.ddp.compression);
  if (c.model.sync_batchnorm)
    return "elastic.in_job = true with model.sync_batchnorm = true: the SyncBatchNorm layers keep the group they "
           "were built on, which a dead rank ends; set model.sync_batchnorm = false or elastic.in_job = false";
  if (c.train.async_checkpoint)
    return "elastic.in_job = true with train.async_checkpoint = true: a background save in flight when a rank "
           "dies cannot be completed by the survivors; set train.async_checkpoint = false";
  return "";
}

}  // namespace

std::vector<FieldSpec> world_fields() {
  using TC = TrainConfig;
  return {
      field("world.backend", &TC::world, &WorldConfig::backend, "collective backend: \"gloo\" (TCP), \"mpi\" (under mpirun; needs the MPI build), \"shm\" (shared memory, every rank on one host, CPU tensors) \"hierarchical\" (several hosts: shared memory inside each, gloo among one leader per host), \"nccl\" (GPU tensors between GPUs, one GPU per rank; needs the CUDA build: scripts/cuda-build.sh) or \"auto\" (the default, logged by rank 0: mpi when started by mpirun, else nccl when world.device is cuda, the build has NCCL and every rank of a host has its own GPU, else shm when all ranks share one host with CPU tensors, else hierarchical when several hosts have several ranks each, else gloo; elastic.in_job always uses gloo)", one_of({"gloo", "mpi", "shm", "hierarchical", "nccl", "auto"})),
      field("world.device", &TC::world, &WorldConfig::device, "where each rank's model, batches and gradients live: \"cpu\", \"cuda\" (GPU number LOCAL_RANK modulo the GPUs seen; needs a CUDA build of LibTorch, scripts/cuda-build.sh; every strategy, parameter servers with their shards and step in host memory; collectives over NCCL with one GPU per rank, else staged through host memory) or \"auto\" (cuda when this build has CUDA and sees a GPU, else cpu)", one_of({"cpu", "cuda", "auto"})),
      field("world.timeout_s", &TC::world, &WorldConfig::timeout_s, "seconds before a stalled collective fails", in_range<int64_t>(1, kMaxTimeoutS)),
      field("world.doctor_records", &TC::world, &WorldConfig::doctor_records, "hang doctor: the last N collectives each rank records (op, group, sequence number, sizes, start/end) and dumps to <run_dir>/doctor/ on a timeout, SIGUSR1 or `paratrain doctor` (0 = off)", in_range<int64_t>(0, 1 << 20)),
      field("world.heartbeat_s", &TC::world, &WorldConfig::heartbeat_s, "seconds between heartbeats from each rank to `paratrain launch`, or to the other ranks where no launcher sees them all (torchrun, mpirun, srun, by hand, several nodes; 0 = none); a thread sends them, so a long collective keeps beating", in_range_finite(0.0, 3600.0, "seconds: 0 (off) to 3600")),
      field("world.heartbeat_timeout_s", &TC::world, &WorldConfig::heartbeat_timeout_s, "`paratrain launch` fails the job (or restarts it under --max-restarts), or the other ranks abort their collectives, when a rank's heartbeat is older than this: a stopped (SIGSTOP), frozen or cut-off process, named with its last collective", in_range_finite(0.1, 86400.0, "seconds: 0.1 to 86400")),
  };
}

std::vector<FieldSpec> elastic_fields() {
  using TC = TrainConfig;
  return {
      field("elastic.keep_global_batch", &TC::elastic, &ElasticConfig::keep_global_batch, "when a restarted generation (`paratrain launch --nnodes MIN:MAX`) or the survivors of an in-job recovery (elastic.in_job) run at another world size than the run started with, keep the starting global batch by changing the per-rank batch (train.accumulate when it does not divide), so steps per epoch and the LR schedule stay; a ConfigError when neither divides"),
      field("elastic.in_job", &TC::elastic, &ElasticConfig::in_job, "in-job recovery: when a rank dies mid-step (or inside an evaluation or a checkpoint save), the survivors abort the world group, agree on the new membership through the store, rebuild the group and redo the failed step from memory (DDP) or roll back to the run's latest complete checkpoint, resharded to the survivors (zero.stage 1-3), without restarting processes; the remaining samples of the epoch are split among them (not with parallel.tp/pp/cp > 1 or parameter servers)"),
  };
}

std::string world_problem(const TrainConfig& c) {
  // A timeout within two beats would fail healthy ranks whose beat is merely late.
  if (c.world.heartbeat_s > 0 && c.world.heartbeat_timeout_s < 2 * c.world.heartbeat_s)
    return fmt::format(
        "world.heartbeat_timeout_s = {} must be at least twice world.heartbeat_s = {}, or a rank whose beat is "
        "only late would be taken for a stopped one: raise the timeout or beat more often",
        c.world.heartbeat_timeout_s, c.world.heartbeat_s);
  return in_job_problem(c);
}

}  // namespace paratrain::train::detail
