// Quantization-aware training (quant.qat; docs/quantization.md): the model
// the strategies train, wrapped so that its forward sees every Linear and
// Conv2d weight fake-quantized per output channel. Internal to
// paratrain/train: the model builder wraps (builders.cpp), the loop switches
// it on at quant.start_step (FitLoop::take_step).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"
#include "paratrain/models/model.h"
#include "paratrain/quant/activations.h"

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
/// Note [Learned activation ranges]
/// With activation bits (quant.activation_bits), every Linear's and Conv2d's
/// input is fake-quantized too (per tensor, quant/activations.h: Note
/// [Activation sites]) on the grid of a range learned as a running average
/// (Jacob et al., arXiv 1712.05877, Section 3): during a step each rank
/// records the min and max of every layer's inputs over its micro-batches;
/// after the step update_activation_ranges() takes the min and max over
/// the ranks (one all-reduce for all layers) and moves each range towards
/// them, range = 0.99 range + 0.01 observed (the first observation taken as
/// it is). So the range a forward uses depends on the global batches before
/// it, not on how they were split: 2 ranks equal one process. Until its
/// first update a layer's input stays float. The ranges are the buffers
/// "act_range.<layer>" ([min, max, observed], the layer's name with '_' for
/// '.'), saved and resumed with the model; `paratrain quantize` of the run
/// writes them as its static activation ranges.
class FakeQuantModel final : public models::Model {
 public:
  /// `weight_bits`: 2 to 8; `activation_bits`: 0 (float activations) or 2 to 8.
  FakeQuantModel(std::shared_ptr<models::Model> inner, int weight_bits, int activation_bits = 0);
  ~FakeQuantModel() override;

  at::Tensor forward(const at::Tensor& x) override;
  void train(bool on = true) override;
  /// Off: the plain model's forward (before quant.start_step).
  void set_active(bool active) { active_ = active; }
  bool active() const { return active_; }

  int activation_bits() const { return activation_bits_; }
  /// Collective over `group` (every rank that trains a replica, each after
  /// the same step): the step's observed ranges reduced and folded into the
  /// learned ones (Note [Learned activation ranges]); a range that is not
  /// finite is left out. Nothing without activation bits, or when inactive;
  /// with `stepped` false (the step was skipped on every rank) the step's
  /// observations are dropped, without a collective.
  void update_activation_ranges(comm::ProcessGroup& group, std::chrono::milliseconds timeout, bool stepped = true);
  /// The learned ranges by layer name (layers observed at least once).
  std::map<std::string, quant::ActivationRange> activation_ranges() const;

 private:
  class Activations;  // the observer installed during forward

  std::shared_ptr<models::Model> inner_;
  std::vector<at::Tensor*> weights_;  // the `weight` members of every Linear and Conv2d
  int bits_;
  int activation_bits_;
  std::unique_ptr<Activations> activations_;
  bool is_training_cache_ = false;  // is_training() of the forward in progress, for the observer
  bool active_ = true;
};

}  // namespace paratrain::train
