// A parameter-server worker's side of the protocol: push this step's
// gradients to every server (one message per bucket of key ranges,
// bucket_plan.h, sent as soon as all of its gradients are in), pull the
// parameters they answer with (one message per bucket too, usable as each
// arrives) into the local model, and keep the staleness of every pushed
// gradient. The worker holds no optimizer state. The servers' side is
// server.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/param_server/bucket_plan.h"
#include "paratrain/param_server/key_ranges.h"
#include "paratrain/param_server/protocol.h"

namespace paratrain::param_server {

struct WorkerOptions {
  // Bounds every wait on a server.
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
  // Wire dtype of the pushes; the servers must be built with the same.
  PushDtype push_dtype = PushDtype::kFp32;
};

class Worker {
 public:
  // `params`: the local model's parameters in plan order (updated in place).
  // `world` must outlive this object. `buckets` (built from `plan`, the same
  // on every rank) says which ranges share a message.
  Worker(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, const BucketPlan& buckets,
         std::vector<at::Tensor> params, WorkerOptions options);

  // Hands tensor `tensor`'s ranges of `grad` (its full gradient for this
  // step) to their buckets and sends each bucket this completes now: called
  // from the tensor's backward hook, so the transfer overlaps the rest of
  // backward. At most once per tensor and step; push_pull() adds the
  // tensors this missed and sends the buckets still open.
  void push_tensor(int tensor, const at::Tensor& grad);

  // Sends every range push_tensor did not send this step, from the params'
  // .grad (zeros where undefined), then waits for every server's answer and
  // copies the parameters in. Throws CommError / TimeoutError naming the
  // server (role and rank) that did not answer. Returns the gradient's
  // staleness: optimizer steps applied between the parameters it was
  // computed on and its own application (the most over servers; 0 in sync
  // mode).
  int64_t push_pull();
  // push_pull() in two halves, so a worker can do other work (load the
  // next batch, run its first layers) while the servers step: push() sends
  // what push_pull would, pull() waits for the sends and the answers and
  // copies the parameters in (returns the staleness). Until pull() the
  // local parameters are the old ones; pull_pending() says whether one is
  // due.
  void push();
  int64_t pull();
  bool pull_pending() const { return pulling_; }
  // Part of pull(): waits only for the answers holding tensor `tensor`'s
  // ranges (one bucket message per server) and copies them in; nothing
  // when no pull is due. Called just before the first layer that reads the
  // tensor, so the later buckets travel while the earlier layers compute.
  // The pull is complete, as after pull(), once every bucket has arrived.
  void pull_tensor(int tensor);
  // Ranges, and bucket messages, of the due pull not yet received (0 when
  // none is due).
  int64_t ranges_due() const { return pulling_ ? due_ : 0; }
  int64_t messages_due() const { return pulling_ ? messages_due_ : 0; }

  // Dynamic batches (Note [Dynamic batches] in server.h): marks the pushes
  // of the next step as this worker's last of the window, so the servers
  // post no receive for it beyond them. Set before the step's first push.
  void set_last_push(bool last) { last_ = last; }
  // The item server 0 handed this worker in its answer to the last push
  // (-1: none, or not a dynamic-batch run). Waits for that answer's first
  // bucket if a pull is due, not for the rest.
  int64_t assigned_item();

  // Pushes done so far (this worker's clock).
  int64_t clock() const { return clock_; }
  // How many pushed gradients had each staleness.
  const std::map<int64_t, int64_t>& staleness_histogram() const { return histogram_; }
  // Ranges and bucket messages sent from push_tensor (during backward) and
  // by push_pull (after it), reply messages received, and the bytes of all
  // push messages: what overlap, buckets and compression did, for tests
  // and benchmarks.
  int64_t ranges_pushed_early() const { return early_; }
  int64_t ranges_pushed_late() const { return late_; }
  int64_t messages_pushed_early() const { return messages_early_; }
  int64_t messages_pushed_late() const { return messages_late_; }
  int64_t messages_pulled() const { return messages_pulled_; }
  int64_t bytes_pushed() const { return bytes_; }

 private:
  struct Slot {  // one range: its bucket and where it lies in its messages
    int server = 0;
    int bucket = 0;      // in the server's buckets (its tag)
    int64_t offset = 0;  // elements before it in the bucket's payload
    KeyRange range;
  };
  void open_step();
  // Copies the slot's part of `grad_of_tensor` into its bucket; sends the
  // bucket when that was its last range (`early`: from a hook).
  void stage(const Slot& slot, const at::Tensor& grad_of_tensor, bool early);
  void send(int server, int bucket, bool early);
  // Waits for the answer of bucket `bucket` of `server`, once, and copies
  // its ranges in; the last bucket of the pull completes it.
  void receive(int server, int bucket);
  // Rethrows the CommError in flight naming this worker and `server`.
  [[noreturn]] void fail(int server) const;

  comm::ProcessGroup& world_;
  Roles roles_;
  WorkerOptions options_;
  std::vector<std::vector<KeyRange>> ranges_;  // per server
  std::vector<std::vector<Bucket>> buckets_;   // per server
  std::vector<std::vector<Slot>> slots_;       // per tensor
  std::vector<at::Tensor> params_;
  std::vector<int64_t> versions_;  // per server: version of the parameters last pulled
  int64_t clock_ = 0;
  bool last_ = false;              // this step's pushes are marked last
  int64_t assigned_ = -1;          // from server 0's last answer
  bool open_ = false;              // this step's replies are posted, pushes may leave
  bool pulling_ = false;           // pushed, answers not yet all waited for
  std::vector<bool> pushed_;       // per tensor, this step
  struct Staged { at::Tensor payload; int missing = 0; };  // a push bucket being filled
  std::vector<std::vector<Staged>> staged_;     // per server, per bucket, this step
  struct Incoming { at::Tensor message; comm::WorkHandle work; bool arrived = false; };
  std::vector<std::vector<Incoming>> replies_;  // per server, per bucket
  int64_t due_ = 0;                // ranges of this step's answers not yet received
  int64_t messages_due_ = 0;       // and their bucket messages
  int64_t staleness_ = 0;          // the most any received answer of this step says
  struct Outgoing { at::Tensor message; comm::WorkHandle work; int server; };
  std::vector<Outgoing> sends_;
  std::map<int64_t, int64_t> histogram_;
  int64_t early_ = 0, late_ = 0, bytes_ = 0;
  int64_t messages_early_ = 0, messages_late_ = 0, messages_pulled_ = 0;
};

// Every rank ends with every server's current ranges in `params` (servers
// send theirs to all other ranks; a server's own ranges are `own_pieces`,
// empty on workers). Collective over `world`: before evaluation and
// checkpoints of stale replicas (async, ssp), and for full_parameters().
void refresh_parameters(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan,
                        const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& own_pieces,
                        std::chrono::milliseconds timeout);

}  // namespace paratrain::param_server
