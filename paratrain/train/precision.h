// The [precision] section turned into the objects the Trainer holds: the
// loss scaler (none when precision.loss_scale = "none") and the loss
// function that scales. Autocast itself is the strategies' (they know where
// forward ends); see core/autocast.h and docs/notes/precision.md.
#pragma once

#include <memory>

#include "paratrain/optim/grad_scaler.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/strategies/strategy.h"

namespace paratrain::train {

// nullptr for loss_scale = "none"; else a GradScaler with the section's
// dynamic/static options.
std::unique_ptr<optim::GradScaler> make_grad_scaler(const PrecisionConfig& precision);

// `loss` (computed in fp32 even when the model's output is bf16), times the
// scaler's current scale when there is one. The strategies return what the
// LossFn returned; divide it by the scale of that step for logging.
LossFn scaled_loss(LossFn loss, const optim::GradScaler* scaler);

}  // namespace paratrain::train
