// A parameter server: owns its key ranges of every parameter (key_ranges.h)
// and the optimizer state for them, receives workers' gradient pushes and
// answers each with its ranges of the current parameters, one message per
// bucket of ranges each way (bucket_plan.h). Driven one round
// per training step by the "ps" strategy (train/strategies/ps_strategy.cpp);
// the workers' side is worker.h.
//
// Note [Parameter-server modes]
// sync:  a round takes one push from every worker (received in worker order),
//        averages them, steps the optimizer once and replies to all: the
//        same update as DDP or one process on the global batch.
// async: a round takes the next `workers` pushes from whichever workers send
//        them; each push is one optimizer step with that worker's gradient
//        (a batch of global / workers examples) and is answered at once with
//        the latest parameters. Gradients may be computed on parameters that
//        other pushes have since changed: their staleness.
// ssp:   stale-synchronous parallel (Ho et al., NIPS'13) with bound s =
//        ps.staleness. Pushes are aggregated per clock (a worker's c-th push
//        is clock c) and clock c is applied, as one averaged step, once every
//        worker pushed it. The answer to a worker's push of clock c is held
//        back until every worker reached clock c - s: no worker runs more
//        than s clocks ahead of the slowest, and a gradient is computed on
//        parameters at most s clocks old. s = 0 is sync, update for update.
//
// Note [Dynamic batches]
// Under async, workers do not read fixed shares of the epoch: they take its
// batches from a queue, so a fast worker trains more of them than a slowed
// one and the epoch ends when its batches are done, not when the slowest
// worker has done a third of them. The epoch's "items" are the batches of
// the fixed shares (item x = worker x % W's step x / W of its sampler
// share), so the examples of an epoch are the same and each is trained
// exactly once; only who trains which item changes. The queue lives on
// server 0, in the protocol: its answer to each push names the next item
// of that worker (reply header slot 2), handed out in the order the pushes
// are handled. A window is the steps between two points where all ranks
// meet (an epoch's end, a checkpoint, train.max_steps): R rounds, W * R
// items. Worker w starts a window holding items first + w and first + W + w
// (one item of look-ahead), server 0 hands out first + 2W onwards, and
// every answer adds one item or -1. With that look-ahead a worker knows
// when it pushes its last item of the window and marks the push (push
// header slot 2), so every server stops posting receives for it without
// knowing the assignment: no receive is left posted at a window's end, and
// the R rounds of each server handle exactly the W * R pushes. sync must
// equal one process and ssp ties each worker to within s clocks of the
// slowest, where fixed shares lose at most s batches' time: both keep
// fixed shares, as async does with ps.dynamic_batches = false.
//
// Note [Parameter servers on the GPU]
// With world.device = "cuda" the workers' models, forward and backward are
// on their GPUs and everything of the protocol stays in host memory: a
// server's pieces and its optimizer state (its step runs on the host, like
// ZeRO-Offload's), and every message. A worker copies each gradient range
// into its host push bucket (a device-to-host copy ordered after the
// backward that computed it) and copies pulled ranges into its parameters
// (host-to-device, before the layer that reads them runs). The messages then
// travel over the host group as on CPU runs; NCCL would carry nothing here.
// A server's model replica is on its GPU too (the Trainer moves every rank's
// model; refresh_parameters fills it for evaluation and full parameters), but
// no computation runs on it.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/param_server/bucket_plan.h"
#include "paratrain/param_server/key_ranges.h"
#include "paratrain/param_server/protocol.h"

namespace torch::optim {
class Optimizer;
}

namespace paratrain::param_server {

struct ServerOptions {
  Mode mode = Mode::kSync;
  // ssp: how many clocks a worker may run ahead of the slowest one.
  int64_t staleness = 0;
  // Bounds every wait; a silent worker fails the round with TimeoutError.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  // Wire dtype of the workers' pushes (WorkerOptions::push_dtype).
  PushDtype push_dtype = PushDtype::kFp32;
  // async and ssp: an update computed on parameters tau versions old is
  // applied at the rate divided by max(tau, 1) (Note [Staleness-aware
  // learning rate] in server.cpp). No effect in sync mode (tau = 0).
  bool staleness_aware_lr = false;
};

class Server {
 public:
  // `world` holds workers and servers (Roles) and must outlive this object.
  // `params` are the model's parameters in plan order (the plan was built
  // from their sizes); this server copies its ranges of them. `buckets`
  // (built from `plan`) says which ranges share a message.
  Server(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, const BucketPlan& buckets,
         const std::vector<at::Tensor>& params, ServerOptions options);
  // Aborts `world` if a receive is still posted (only after a failed
  // round): its waiter must not hold the process until the timeout.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // This server's pieces, one 1-D tensor per owned range (ranges() order):
  // the tensors its optimizer steps and its checkpoint slots hold.
  const std::vector<at::Tensor>& pieces() const { return pieces_; }
  const std::vector<KeyRange>& ranges() const { return ranges_; }
  int index() const { return index_; }

  // async / ssp: each worker will push `pushes` more times in this run; no
  // receive is posted beyond that (none may be left pending at the end).
  void expect_pushes(int64_t pushes);
  // async, dynamic batches (Note [Dynamic batches]): the next `rounds`
  // rounds handle the pushes of items first_item .. first_item + W*rounds - 1,
  // each worker's until its push marked last; server 0 hands out the items
  // from first_item + 2W on.
  void begin_window(int64_t first_item, int64_t rounds);

  // One training step: see Note [Parameter-server modes]. `optimizer` steps
  // pieces() with the learning rate already set. Throws CommError or
  // TimeoutError naming the worker that failed to send or receive.
  void serve_round(torch::optim::Optimizer& optimizer);

  // Optimizer steps applied (sync / ssp: clocks; async: pushes).
  int64_t version() const { return version_; }

 private:
  struct Inbox;  // a posted receive of one worker's next push, and its waiter
  struct ClockSum { at::Tensor sum; int count = 0; int64_t staleness_sum = 0; };
  struct HeldReply { int worker = 0; int64_t clock = 0; int64_t staleness = 0; };

  void serve_sync(torch::optim::Optimizer& optimizer);
  void serve_unordered(torch::optim::Optimizer& optimizer);
  // Applies `flat_grad` (this server's ranges back to back) as one step,
  // computed on parameters `staleness` versions old (a mean under ssp).
  void apply(const at::Tensor& flat_grad, torch::optim::Optimizer& optimizer, double staleness = 0);
  // One push: a message per bucket (push_tag), and their receives.
  struct Push {
    std::vector<at::Tensor> messages;
    std::vector<comm::WorkHandle> works;
  };
  Push post_push(int worker);
  // The push's gradient, this server's ranges back to back, in fp32.
  at::Tensor gradient_of(const Push& push) const;
  void handle_push(int worker, const Push& push, torch::optim::Optimizer& optimizer);
  void reply(int worker, int64_t staleness, int64_t item = -1);
  void post(int worker);
  void drain_replies();
  int64_t slowest_clock() const;

  comm::ProcessGroup& world_;
  Roles roles_;
  int index_;
  ServerOptions options_;
  std::vector<KeyRange> ranges_;
  std::vector<Bucket> buckets_;  // of ranges_, in order
  std::vector<at::Tensor> pieces_;
  int64_t numel_ = 0;
  int64_t version_ = 0;
  std::vector<int64_t> clocks_;       // pushes received per worker
  std::vector<int64_t> remaining_;    // pushes each worker will still send
  int64_t next_item_ = -1;            // server 0, dynamic batches: the next item to hand out
  int64_t end_item_ = -1;             // one past the window's last item
  std::vector<std::unique_ptr<Inbox>> inbox_;
  std::mutex mu_;                    // guards Inbox::done / error
  std::condition_variable arrived_;  // a waiter finished
  std::map<int64_t, ClockSum> pending_;  // ssp: clocks not yet complete
  std::vector<HeldReply> held_;       // ssp: answers waiting for the slowest worker
  struct Outgoing { at::Tensor tensor; comm::WorkHandle work; int worker; };
  std::vector<Outgoing> sends_;
};

// What every rank needs to address the servers: flat messages of a server's
// ranges. Both sides use these, so the layout lives in one place.
// Concatenates tensors[r.tensor].flatten()[r.begin:r.end] over `ranges`.
at::Tensor pack_ranges(const std::vector<at::Tensor>& tensors, const std::vector<KeyRange>& ranges);
// The inverse: copies consecutive slices of `flat` into those ranges.
void unpack_ranges(const at::Tensor& flat, const std::vector<at::Tensor>& tensors,
                   const std::vector<KeyRange>& ranges);

}  // namespace paratrain::param_server
