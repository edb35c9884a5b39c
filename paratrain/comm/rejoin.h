// In-job recovery's membership round: after the world group lost a member,
// the survivors meet under a fresh key prefix of the job's store (one per
// recovery: "recovery<e>/"), agree on who is alive, renumber densely in the
// old order (the lowest surviving rank is the new rank 0: rank 0 dying
// re-elects) and build a new Gloo world group among them.
// Not here: what the Trainer rebuilds over the new group (train/recovery/in_job.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/process_group.h"

namespace paratrain::comm {

struct RejoinOptions {
  // How long a survivor waits for the others after it arrived. When all but
  // one of the old ranks are in, the round closes at once (one dead rank,
  // the usual case); otherwise it closes when this window ends and the
  // absent count as dead. Longer survives slow detection of the failure on
  // some survivor; shorter recovers sooner from several deaths at once.
  std::chrono::milliseconds window = std::chrono::seconds(15);
  // The new group's options (its timeout also bounds its connection setup).
  GlooOptions gloo;
};

// The outcome of one round, as every survivor sees it.
struct Membership {
  int epoch = 0;                // recoveries so far, this one included (1 for the first)
  std::vector<int> survivors;   // ranks of the old group that are in, ascending
  int old_rank = 0;             // this process in the old group
  int old_size = 1;
  int rank = 0;                 // this process in the new group: its index in `survivors`
  std::shared_ptr<ProcessGroup> group;  // the new world, size() == survivors.size()

  std::vector<int> dead() const;  // ranks of the old group that did not arrive
};

// Holds the store every recovery of this process meets in. All survivors of
// one job must use the same store and the same `prefix`, and call rejoin()
// once per failure (their epochs advance together).
class Rejoiner {
 public:
  Rejoiner(c10::intrusive_ptr<c10d::Store> store, std::string prefix, RejoinOptions options);

  // Blocks until the round closed and the new group is connected. Throws
  // CommError when this rank arrived after the round closed without it, and
  // TimeoutError (from the store) when no round closes in gloo.timeout.
  Membership rejoin(int old_rank, int old_size);

  int epoch() const { return epoch_; }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  RejoinOptions options_;
  int epoch_ = 0;
};

}  // namespace paratrain::comm
