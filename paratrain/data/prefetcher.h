// Runs produce(i) for i = begin .. end-1 on one background thread, keeping
// at most `depth` finished batches ahead of the consumer. Internal to the
// Loader (loader.h is the public entry); kept apart because threading is
// its own idea.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "paratrain/data/dataset.h"

namespace paratrain::data {

class Prefetcher {
 public:
  using Produce = std::function<Batch(int64_t index)>;

  // Starts the thread at once: batch `begin` is being prepared on return.
  Prefetcher(int64_t begin, int64_t end, int depth, Produce produce);
  // Stops the thread (it finishes the produce() call in flight, if any) and
  // discards batches nobody took. Safe mid-sequence.
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // The next batch in order; blocks until it is ready. nullopt after the
  // last one. If produce() threw, batches finished before the failure are
  // still returned in order, then every call rethrows that exception.
  std::optional<Batch> next();

 private:
  void run();

  const int64_t begin_;
  const int64_t end_;
  const size_t depth_;
  Produce produce_;

  std::mutex mutex_;
  std::condition_variable ready_;  // a batch, the end or an error is available
  std::condition_variable space_;  // the queue has room, or stop was asked
  std::deque<Batch> queue_;
  bool finished_ = false;  // producer has pushed its last batch
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last member: started after everything it uses exists
};

}  // namespace paratrain::data
