// training_device() and to_device(): see device_placement.h.
#include "paratrain/train/device_placement.h"

#include <fmt/format.h>

#include "paratrain/core/device.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::train {

c10::Device training_device(const TrainConfig& c, const std::string& strategy) {
  const c10::Device device = core::resolve_device(c.world.device, static_cast<int>(env::get_int_or("LOCAL_RANK", 0)));
  if (device.is_cpu()) return device;
  // Only the DDP strategy is wired for GPUs: the others allocate flat shards,
  // pipeline and ring buffers on the CPU.
  if (strategy != "ddp")
    throw ConfigError(fmt::format("world.device = \"{}\" runs the ddp strategy only for now (zero.stage = 0, "
                                  "parallel.pp = tp = cp = 1, ps.servers = 0); this config selects \"{}\": set "
                                  "world.device = \"cpu\" or change those keys",
                                  c.world.device, strategy));
  if (c.world.backend == "shm" || c.world.backend == "mpi" || c.world.backend == "hierarchical")
    throw ConfigError(fmt::format("world.backend = \"{}\" moves CPU tensors only; with world.device = \"{}\" use "
                                  "\"gloo\" (or \"auto\")",
                                  c.world.backend, c.world.device));
  return device;
}

data::Batch to_device(data::Batch batch, const c10::Device& device) {
  if (device.is_cpu()) return batch;
  // The loader's rows are pageable memory: the copy is synchronous anyway.
  batch.inputs = batch.inputs.to(device);
  batch.targets = batch.targets.to(device);
  return batch;
}

}  // namespace paratrain::train
