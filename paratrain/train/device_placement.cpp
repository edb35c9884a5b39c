// training_device() and to_device(): see device_placement.h.
#include "paratrain/train/device_placement.h"

#include <fmt/format.h>

#include "paratrain/core/device.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::train {

c10::Device training_device(const TrainConfig& c, const std::string& strategy) {
  const c10::Device device = core::resolve_device(c.world.device, env::get_int_in_or("LOCAL_RANK", 0, (1L << 20) - 1, "this process's rank on its host", 0));
  if (device.is_cpu()) return device;
  // Wired for GPUs: DDP, ZeRO-1/2 and tensor/context parallelism (their
  // buffers follow the parameters' device; collectives on host-memory
  // backends go through comm/host_staging_group.h). Measured on an H200
  // (bench/results/2026-11-26-cuda-h200.md). Not yet: FSDP (its units swap
  // storage under the parameters, which LibTorch 2.11 refused on the GPU),
  // pipeline stages (receive buffers and shape probes made on the CPU), and
  // parameter servers (shards in host memory).
  const bool wired = strategy == "ddp" || strategy == "zero" || (strategy == "megatron" && c.parallel.pp <= 1);
  if (!wired)
    throw ConfigError(fmt::format("world.device = \"{}\" runs the ddp, zero (stage 1-2) and megatron (tp/cp without pp) "
                                  "strategies for now; this config selects \"{}\"{}: set world.device = \"cpu\" "
                                  "or change those keys",
                                  c.world.device, strategy,
                                  strategy == "megatron" ? fmt::format(" with parallel.pp = {}", c.parallel.pp) : ""));
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
