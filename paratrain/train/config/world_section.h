// [world] and [elastic]: how the processes talk and survive losing some.
// The sections of TrainConfig (config.h) that configure comm/ (backends, hang doctor), launch/ (heartbeats) and train/recovery/.
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in world_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// `[world]`: how the processes talk.
struct WorldConfig {
  /// "auto" (the default: mpi under mpirun, shm on one host, hierarchical
  /// over several hosts with several ranks each, else gloo; rank 0 logs the
  /// choice, comm/rendezvous.cpp) | "gloo" | "mpi" | "shm" | "hierarchical"
  std::string backend = "auto";
  /// "cpu" | "cuda" (GPU LOCAL_RANK % GPUs; needs a CUDA build) | "auto" (core/device.h)
  std::string device = "cpu";
  int64_t timeout_s = 300;  ///< collectives and rendezvous give up after this
  /// Hang doctor: collectives each rank keeps in its ring buffer (comm/doctor/flight_recorder.h); 0 = off.
  int64_t doctor_records = 256;
  /// Seconds between a rank's heartbeats to `paratrain launch` (launch/heartbeat_monitor.h); 0 = none.
  double heartbeat_s = 1.0;
  /// The launcher fails the job when a rank's heartbeat is this many seconds old (stopped or hung process).
  double heartbeat_timeout_s = 15.0;

  bool operator==(const WorldConfig&) const = default;
};

/// `[elastic]`: keeping a job going when ranks or nodes come and go (docs/elastic.md).
struct ElasticConfig {
  /// When a restarted generation runs at another world size than the run
  /// started with (`paratrain launch --nnodes MIN:MAX`), keep the global batch
  /// (and so the steps per epoch and the LR schedule) of the run's start by
  /// changing the per-rank batch, or train.accumulate when that does not
  /// divide; false lets the global batch follow the world size.
  bool keep_global_batch = false;
  /// In-job recovery: survivors of a dead rank re-form the world through the
  /// store and redo the failed step from memory, without restarting (DDP only).
  bool in_job = false;

  bool operator==(const ElasticConfig&) const = default;
};

}  // namespace paratrain::train
