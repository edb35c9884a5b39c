// Named ranges around the phases of a training step ("data", "forward",
// "backward", "optimizer", "eval") for the operator profiler (profile.*,
// paratrain/profile/): LibTorch user-scope RecordFunctions, so a profiler's
// operators nest inside them and paratrain/profile/summary.h can tell what
// each millisecond of a step was. With no profiler running a scope costs
// one check of LibTorch's callback registry.
#pragma once

#include <ATen/record_function.h>

namespace paratrain {

/// The phase names the profile summary reads (profile/summary.h).
inline constexpr const char* kPhaseData = "data";
inline constexpr const char* kPhaseForward = "forward";            ///< see kPhaseData
inline constexpr const char* kPhaseBackward = "backward";          ///< see kPhaseData
inline constexpr const char* kPhaseOptimizer = "optimizer";        ///< see kPhaseData
inline constexpr const char* kPhaseEval = "eval";                  ///< see kPhaseData

/// A phase from construction to destruction on this thread. `name` must
/// outlive the scope (a string literal).
class PhaseScope {
 public:
  /// Opens the range `name` when a profiler listens.
  explicit PhaseScope(const char* name) : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) guard_.before(name);
  }
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

 private:
  at::RecordFunction guard_;
};

}  // namespace paratrain
