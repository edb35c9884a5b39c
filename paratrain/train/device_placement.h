// Where the Trainer puts its model and batches (world.device): resolving the
// device for this rank and moving a batch there. Not here: the device arithmetic itself (core/device.h).
#pragma once

#include <string>

#include <c10/core/Device.h>

#include "paratrain/data/dataset.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {

// world.device resolved for this process (LOCAL_RANK picks the GPU). Throws
// ConfigError when this build or machine has no GPU for "cuda". Every
// strategy runs on either device.
c10::Device training_device(const TrainConfig& config);

// The batch with inputs and targets on `device` (unchanged on the CPU).
data::Batch to_device(data::Batch batch, const c10::Device& device);

}  // namespace paratrain::train
