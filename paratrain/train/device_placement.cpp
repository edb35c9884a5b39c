// training_device() and to_device(): see device_placement.h.
#include "paratrain/train/device_placement.h"

#include "paratrain/core/device.h"
#include "paratrain/core/env.h"

namespace paratrain::train {

c10::Device training_device(const TrainConfig& c) {
  const c10::Device device = core::resolve_device(c.world.device, env::get_int_in_or("LOCAL_RANK", 0, (1L << 20) - 1, "this process's rank on its host", 0));
  if (device.is_cpu()) return device;
  // Every strategy runs on GPUs: DDP, ZeRO-1/2, FSDP (ZeRO-3), pipelines,
  // megatron (tp/cp/pp) and parameter servers (Note [Parameter servers on
  // the GPU]). Collectives go over NCCL (world.backend = "nccl": one GPU per
  // rank) or through host memory (comm/host_staging_group.h, any backend;
  // several ranks may share a GPU).
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
