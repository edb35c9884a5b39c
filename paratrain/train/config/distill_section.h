// [distill]: knowledge distillation from a teacher run (docs/distillation.md).
// The section of TrainConfig (config.h); its schema rows and rules are in
// distill_section.cpp.
#pragma once

#include <string>

namespace paratrain::train {

/// `[distill]`: train against a teacher's softened outputs besides the
/// labels (Hinton et al., arXiv 1503.02531): loss = alpha * T^2 *
/// KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * task loss.
struct DistillConfig {
  /// A checkpoint folder or a run folder (its newest checkpoint); "" = off.
  std::string teacher;
  double temperature = 2.0;  ///< T: softens both distributions
  double alpha = 0.5;        ///< weight of the soft (teacher) part of the loss

  bool operator==(const DistillConfig&) const = default;
};

}  // namespace paratrain::train
