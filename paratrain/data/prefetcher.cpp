// Background batch preparation: a bounded single-producer single-consumer
// queue. The bound keeps memory at `depth` batches however slow training is.
#include "paratrain/data/prefetcher.h"

#include <torch/torch.h>

namespace paratrain::data {

Prefetcher::Prefetcher(int64_t begin, int64_t end, int depth, Produce produce)
    : begin_(begin), end_(end), depth_(static_cast<size_t>(depth)), produce_(std::move(produce)) {
  TORCH_CHECK(depth >= 1, "Prefetcher: depth must be >= 1, got ", depth);
  TORCH_CHECK(begin <= end, "Prefetcher: begin ", begin, " > end ", end);
  thread_ = std::thread([this] { run(); });
}

Prefetcher::~Prefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_.notify_all();
  thread_.join();
}

std::optional<Batch> Prefetcher::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  ready_.wait(lock, [this] { return !queue_.empty() || finished_ || error_; });
  if (!queue_.empty()) {
    Batch batch = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    space_.notify_one();
    return batch;
  }
  if (error_) std::rethrow_exception(error_);
  return std::nullopt;
}

void Prefetcher::run() {
  // A fresh thread starts with OpenMP's default thread count, not the one
  // the process chose with at::set_num_threads; adopt the latter, as
  // autograd's worker threads do, so ranks keep to their one core.
  at::init_num_threads();
  // Batches are data, not part of any graph.
  at::NoGradGuard no_grad;
  for (int64_t i = begin_; i < end_; ++i) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_.wait(lock, [this] { return stop_ || queue_.size() < depth_; });
      if (stop_) return;
    }
    std::optional<Batch> batch;
    try {
      batch = produce_(i);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
      ready_.notify_one();
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
      queue_.push_back(std::move(*batch));
    }
    ready_.notify_one();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  finished_ = true;
  ready_.notify_one();
}

}  // namespace paratrain::data
