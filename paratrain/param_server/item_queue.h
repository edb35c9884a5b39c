// A worker's side of the dynamic-batch queue (Note [Dynamic batches] in
// server.h): the items it holds in a window, one of them ahead, so it knows
// which of its pushes is its last. Server 0 is the queue itself (it hands
// out the items in its answers); this only keeps a worker's bookkeeping.
#pragma once

#include <cstdint>
#include <deque>

namespace paratrain::param_server {

class ItemQueue {
 public:
  // A window of `steps` steps from step `first_step` of the epoch: items
  // workers * first_step .. workers * (first_step + steps) - 1. The worker
  // holds items first + worker and first + workers + worker (when inside).
  void begin_window(int worker, int workers, int64_t first_step, int64_t steps);
  // The next item to train, or -1 when this worker's part of the window is
  // done. `answered`: the item server 0 named in its answer to this
  // worker's previous push (-1: none; ignored before the window's first
  // push). Sets `last` when the item's push will be the worker's last of
  // the window: nothing is held back, so server 0 has nothing left.
  int64_t next(int64_t answered, bool& last);
  int64_t taken() const { return taken_; }  ///< items returned so far (all windows)

 private:
  std::deque<int64_t> held_;
  bool pushed_ = false;  // an item of this window was returned (and will be pushed)
  int64_t taken_ = 0;
};

}  // namespace paratrain::param_server
