// A worker's items under dynamic batches: see item_queue.h.
#include "paratrain/param_server/item_queue.h"

#include <c10/util/Exception.h>

namespace paratrain::param_server {

void ItemQueue::begin_window(int worker, int workers, int64_t first_step, int64_t steps) {
  TORCH_CHECK(worker >= 0 && worker < workers && steps >= 1, "ItemQueue::begin_window: worker ", worker, " of ",
              workers, ", ", steps, " steps");
  const int64_t first = workers * first_step + worker;
  held_.assign({first});  // always inside: steps >= 1
  if (first + workers < workers * (first_step + steps)) held_.push_back(first + workers);
  pushed_ = false;
}

int64_t ItemQueue::next(int64_t answered, bool& last) {
  if (pushed_ && answered >= 0) held_.push_back(answered);
  last = false;
  if (held_.empty()) return -1;
  const int64_t item = held_.front();
  held_.pop_front();
  // Every answer adds one item while server 0 has any: holding none now
  // means one answer was empty, and so will every later one be.
  last = held_.empty();
  pushed_ = true;
  ++taken_;
  return item;
}

}  // namespace paratrain::param_server
