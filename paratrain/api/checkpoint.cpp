// save_checkpoint / load_checkpoint for user models (checkpoint.h): each
// wrapper says which slots this rank holds, as the Trainer's strategies do,
// and the sharded writer/reader does the rest.
#include "paratrain/api/checkpoint.h"

#include <torch/torch.h>

#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/train/strategies/common.h"

namespace paratrain {
namespace {

namespace strategies = train::strategies;
using checkpoint::CheckpointContents;
using checkpoint::OptimizerSlot;

// Parameter slots of a sharding wrapper plus the buffers every rank holds.
std::vector<TensorSlot> with_buffers(std::vector<TensorSlot> params, torch::nn::Module& model, bool write) {
  auto buffers = strategies::buffer_slots(model, write);
  params.insert(params.end(), buffers.begin(), buffers.end());
  return params;
}

CheckpointContents replicated(torch::nn::Module& model, torch::optim::Optimizer* optimizer, bool write) {
  CheckpointContents c;
  c.model = strategies::replicated_slots(model, write);
  c.optimizer = optimizer;
  if (optimizer) c.optimizer_slots = strategies::replicated_optimizer_slots(model, write);
  return c;
}

CheckpointContents of(zero::ZeroDataParallel& zero, torch::optim::Optimizer* optimizer) {
  CheckpointContents c;
  c.model = with_buffers(zero.parameter_slots(), zero.module(), zero.group().rank() == 0);
  c.optimizer = optimizer;
  if (optimizer)
    for (auto& [param, slot] : zero.optimizer_param_slots()) c.optimizer_slots.push_back(checkpoint::OptimizerSlot{param, slot});
  return c;
}

CheckpointContents of(fsdp::FullyShardedDataParallel& fsdp, torch::optim::Optimizer* optimizer) {
  CheckpointContents c;
  c.model = with_buffers(fsdp.parameter_slots(), *fsdp.module(), fsdp.group().rank() == 0);
  c.optimizer = optimizer;
  if (optimizer) {
    auto params = fsdp.optimizer_params();
    auto slots = fsdp.parameter_slots();
    for (size_t i = 0; i < params.size(); ++i) c.optimizer_slots.push_back(checkpoint::OptimizerSlot{params[i], slots.at(i)});
  }
  return c;
}

void save(const std::filesystem::path& dir, comm::ProcessGroup& group, CheckpointContents c, int64_t step) {
  c.state.step = step;
  checkpoint::save_sharded_checkpoint(dir, group, c);
}

int64_t load(const std::filesystem::path& dir, const CheckpointContents& c) {
  return checkpoint::load_sharded_checkpoint(dir, c).step;
}

}  // namespace

void save_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, int64_t step) {
  save(dir, group, replicated(model, optimizer, group.rank() == 0), step);
}
void save_checkpoint(const std::filesystem::path& dir, ddp::DistributedDataParallel& ddp,
                     torch::optim::Optimizer* optimizer, int64_t step) {
  save_checkpoint(dir, ddp.group(), ddp.module(), optimizer, step);
}
void save_checkpoint(const std::filesystem::path& dir, zero::ZeroDataParallel& zero,
                     torch::optim::Optimizer* optimizer, int64_t step) {
  save(dir, zero.group(), of(zero, optimizer), step);
}
void save_checkpoint(const std::filesystem::path& dir, fsdp::FullyShardedDataParallel& fsdp,
                     torch::optim::Optimizer* optimizer, int64_t step) {
  save(dir, fsdp.group(), of(fsdp, optimizer), step);
}

int64_t load_checkpoint(const std::filesystem::path& dir, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer) {
  return load(dir, replicated(model, optimizer, true));
}
int64_t load_checkpoint(const std::filesystem::path& dir, ddp::DistributedDataParallel& ddp,
                        torch::optim::Optimizer* optimizer) {
  return load_checkpoint(dir, ddp.module(), optimizer);
}
int64_t load_checkpoint(const std::filesystem::path& dir, zero::ZeroDataParallel& zero,
                        torch::optim::Optimizer* optimizer) {
  const int64_t step = load(dir, of(zero, optimizer));
  zero.after_load();  // every rank's full parameters from the loaded shards (and offloaded copies)
  return step;
}
int64_t load_checkpoint(const std::filesystem::path& dir, fsdp::FullyShardedDataParallel& fsdp,
                        torch::optim::Optimizer* optimizer) {
  const int64_t step = load(dir, of(fsdp, optimizer));
  fsdp.after_load();  // gathered units would hold the values from before loading
  return step;
}

}  // namespace paratrain
