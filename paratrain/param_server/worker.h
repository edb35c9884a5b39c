// A parameter-server worker's side of the protocol: push this step's
// gradients to every server (its key ranges of each, one message per
// server), pull the parameters they answer with into the local model, and
// keep the staleness of every pushed gradient. The worker holds no optimizer
// state. The servers' side is server.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/param_server/key_ranges.h"
#include "paratrain/param_server/protocol.h"

namespace paratrain::param_server {

class Worker {
 public:
  // `params`: the local model's parameters in plan order (updated in place).
  // `world` must outlive this object; `timeout` bounds every wait.
  Worker(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, std::vector<at::Tensor> params,
         std::chrono::milliseconds timeout);

  // Sends each server its ranges of the params' .grad (zeros where a
  // gradient is undefined), then waits for every server's answer and copies
  // the parameters in. Throws CommError / TimeoutError naming the server
  // (role and rank) that did not answer. Returns the gradient's staleness:
  // optimizer steps applied between the parameters it was computed on and
  // its own application (the most over servers; 0 in sync mode).
  int64_t push_pull();

  // Pushes done so far (this worker's clock).
  int64_t clock() const { return clock_; }
  // How many pushed gradients had each staleness.
  const std::map<int64_t, int64_t>& staleness_histogram() const { return histogram_; }

 private:
  comm::ProcessGroup& world_;
  Roles roles_;
  std::vector<std::vector<KeyRange>> ranges_;  // per server
  std::vector<int64_t> numel_;                 // per server
  std::vector<at::Tensor> params_;
  std::chrono::milliseconds timeout_;
  std::vector<int64_t> versions_;  // per server: version of the parameters last pulled
  int64_t clock_ = 0;
  std::map<int64_t, int64_t> histogram_;
};

// Every rank ends with every server's current ranges in `params` (servers
// send theirs to all other ranks; a server's own ranges are `own_pieces`,
// empty on workers). Collective over `world`: before evaluation and
// checkpoints of stale replicas (async, ssp), and for full_parameters().
void refresh_parameters(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan,
                        const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& own_pieces,
                        std::chrono::milliseconds timeout);

}  // namespace paratrain::param_server
