// The thread's micro-batch loss weight: see loss_weight.h.
#include "paratrain/core/loss_weight.h"

namespace paratrain::core {
namespace {

thread_local std::optional<double> current;

}  // namespace

std::optional<double> loss_weight() { return current; }

LossWeightScope::LossWeightScope(double weight) : previous_(current) { current = weight; }

LossWeightScope::~LossWeightScope() { current = previous_; }

}  // namespace paratrain::core
