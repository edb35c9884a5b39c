// How the Trainer keeps replicas in step: the small interface every
// data-parallel strategy offers the training loop (DDP today; ZeRO and FSDP
// plug in behind the same calls). The Trainer never names a strategy type.
#pragma once

#include <memory>
#include <string>

#include "paratrain/comm/process_group.h"
#include "paratrain/train/config.h"

namespace torch::nn {
class Module;
}

namespace paratrain::train {

// Per-step communication timings, for progress lines and benchmarks.
struct SyncStats {
  double backward_ms = 0;     // first gradient ready -> end of backward
  double comm_ms = 0;         // wall time with a collective in flight
  double hidden_share = 0;    // part of comm_ms overlapped with backward
  double exposed_ms = 0;      // waited on communication after backward
};

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual std::string name() const = 0;
  // Before every forward (buffer broadcast).
  virtual void before_forward() = 0;
  // After loss.backward() returned, before optimizer.step().
  virtual void after_backward() = 0;
  virtual SyncStats last_stats() const { return {}; }
};

// Builds what config.ddp.mode asks for over `group`: "bucketed" (DDP with
// overlapped bucketed all-reduce), "naive" (all-reduce every gradient after
// backward) or "none" (local training; only valid on one rank). Collective:
// broadcasts rank 0's parameters and buffers to every rank.
std::unique_ptr<GradientSync> make_gradient_sync(const TrainConfig& config,
                                                 std::shared_ptr<torch::nn::Module> model,
                                                 comm::ProcessGroup& group);

}  // namespace paratrain::train
