// Checkpoints of a user's own model and optimizer, in paratrain's sharded
// format (one safetensors file per rank + index.json): whatever wraps the
// model (nothing, DDP, ZeRO-1/2, FSDP), any other layout or world size loads
// it back, and `paratrain checkpoint consolidate|inspect|compare` read it.
// Not here: the format (checkpoint/sharded.h), run folders.
#pragma once

#include <cstdint>
#include <filesystem>

#include "paratrain/comm/process_group.h"

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}
namespace paratrain::ddp {
class DistributedDataParallel;
}
namespace paratrain::zero {
class ZeroDataParallel;
}
namespace paratrain::fsdp {
class FullyShardedDataParallel;
}

namespace paratrain {

/// Collective over `group` (every rank calls it): `dir` is replaced by the
/// checkpoint at `step`. `optimizer` may be nullptr (model only); SGD, Adam
/// and AdamW states are supported. Throws CheckpointError on every rank when
/// any rank fails.
void save_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& group, torch::nn::Module& model,
                     torch::optim::Optimizer* optimizer, int64_t step = 0);  ///< replicated model (or one process)
void save_checkpoint(const std::filesystem::path& dir, ddp::DistributedDataParallel& ddp,
                     torch::optim::Optimizer* optimizer, int64_t step = 0);
void save_checkpoint(const std::filesystem::path& dir, zero::ZeroDataParallel& zero,
                     torch::optim::Optimizer* optimizer, int64_t step = 0);
void save_checkpoint(const std::filesystem::path& dir, fsdp::FullyShardedDataParallel& fsdp,
                     torch::optim::Optimizer* optimizer, int64_t step = 0);

/// Not collective (each rank reads its part), except that ZeRO-1/2 regathers
/// its parameters after loading: every rank of its group must call that one.
/// Restores in place (the optimizer keeps its parameters) and returns the
/// saved step. Throws CheckpointError naming any missing or mis-shaped tensor.
int64_t load_checkpoint(const std::filesystem::path& dir, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer);
int64_t load_checkpoint(const std::filesystem::path& dir, ddp::DistributedDataParallel& ddp,
                        torch::optim::Optimizer* optimizer);
int64_t load_checkpoint(const std::filesystem::path& dir, zero::ZeroDataParallel& zero,
                        torch::optim::Optimizer* optimizer);
int64_t load_checkpoint(const std::filesystem::path& dir, fsdp::FullyShardedDataParallel& fsdp,
                        torch::optim::Optimizer* optimizer);

}  // namespace paratrain
