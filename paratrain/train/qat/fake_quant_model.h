// Quantization-aware training (quant.qat; docs/quantization.md): the model
// the strategies train, wrapped so that its forward sees every Linear and
// Conv2d weight fake-quantized per output channel. Internal to
// paratrain/train: the model builder wraps (builders.cpp), the loop switches
// it on at quant.start_step (FitLoop::take_step).
#pragma once

#include <memory>
#include <vector>

#include "paratrain/models/model.h"

namespace paratrain::train {

/// Note [Fake quantization by swapping weights]
/// LibTorch's C++ modules have no forward pre-hooks, but a Linear's or a
/// Conv's forward reads its public `weight` member, a handle of the
/// registered parameter. During the wrapped forward each member is swapped
/// for fake_quantize(weight) (quant/quantize.h: the forward of a
/// quantize-dequantize, the backward straight through) and put back after,
/// so autograd records fake_quantize between the parameter and its use: the
/// gradient reaches the registered leaf, which is what the optimizer, DDP's
/// hooks and ZeRO/FSDP's shards know. The wrapper adopts the model's
/// children under their own names (as any_module does): checkpoints read as
/// the model's. Its scales are each channel's max |w| / (2^(b-1) - 1), as
/// `paratrain quantize` computes them: the int8 file of a QAT run holds the
/// weights its forward used.
class FakeQuantModel final : public models::Model {
 public:
  FakeQuantModel(std::shared_ptr<models::Model> inner, int bits);

  at::Tensor forward(const at::Tensor& x) override;
  void train(bool on = true) override;
  /// Off: the plain model's forward (before quant.start_step).
  void set_active(bool active) { active_ = active; }
  bool active() const { return active_; }

 private:
  std::shared_ptr<models::Model> inner_;
  std::vector<at::Tensor*> weights_;  // the `weight` members of every Linear and Conv2d
  int bits_;
  bool active_ = true;
};

}  // namespace paratrain::train
