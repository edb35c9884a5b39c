// make_grad_scaler and scaled_loss: see precision.h.
#include "paratrain/train/precision.h"

#include <ATen/ATen.h>

namespace paratrain::train {

std::unique_ptr<optim::GradScaler> make_grad_scaler(const PrecisionConfig& p) {
  if (p.loss_scale == "none") return nullptr;
  return std::make_unique<optim::GradScaler>(optim::parse_loss_scale(p.loss_scale, p.scaler));
}

LossFn scaled_loss(LossFn loss, const optim::GradScaler* scaler) {
  return [loss = std::move(loss), scaler](const at::Tensor& output, const at::Tensor& targets) {
    // Under autocast the logits are bf16; the softmax and the mean over the
    // batch are kept in fp32 (a no-op cast for fp32 logits).
    at::Tensor l = loss(output.scalar_type() == at::kFloat ? output : output.to(at::kFloat), targets);
    return scaler ? scaler->scale(l) : l;
  };
}

}  // namespace paratrain::train
