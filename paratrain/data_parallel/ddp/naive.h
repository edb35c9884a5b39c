// NaiveDataParallel: the reference twin of DistributedDataParallel. After
// backward, the caller calls sync_gradients(), which all-reduces every
// gradient one by one, blocking, and averages it. No buckets, no hooks, no
// overlap: slow on purpose, and simple enough to trust as the tests' yardstick.
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/data_parallel/ddp/module_sync.h"
#include "paratrain/data_parallel/ddp/reducer.h"

namespace torch::nn {
class Module;
}

namespace paratrain::ddp {

struct NaiveOptions {
  // As DdpOptions::broadcast_buffers.
  bool broadcast_buffers = true;
  std::chrono::milliseconds timeout = comm::kDefaultTimeout;
};

class NaiveDataParallel {
 public:
  // Collective, as DistributedDataParallel's constructor: checks the ranks
  // hold the same model and broadcasts parameters and buffers from rank 0.
  NaiveDataParallel(std::shared_ptr<torch::nn::Module> module, comm::ProcessGroup& group,
                    NaiveOptions options = {});

  torch::nn::Module& module() { return *module_; }

  // Call before each forward: broadcasts buffers (when enabled).
  void prepare_forward();
  // Call after backward: every trainable parameter's .grad becomes the mean
  // over ranks. Throws Error naming the first parameter without a gradient.
  void sync_gradients();

 private:
  std::shared_ptr<torch::nn::Module> module_;
  comm::ProcessGroup& group_;
  NaiveOptions options_;
  std::vector<NamedParameter> params_;
  std::vector<NamedTensor> buffers_;
};

}  // namespace paratrain::ddp
