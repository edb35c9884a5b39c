// GradScaler: dynamic loss scaling for mixed-precision training, with the
// semantics of torch.cuda.amp.GradScaler, plus agreement across ranks: the
// found-inf flag is MAX-reduced over the given process groups, so every rank
// (and every shard holder under ZeRO-2/FSDP) skips the same step.
// Not here: autocast (LibTorch 1.13 has no C++ autocast API on CPU) or
// gradient clipping (unscale_ first, then clip as usual).
//
//   GradScaler scaler(parse_loss_scale(config_value));
//   for (...) {
//     scaler.scale(loss).backward();
//     scaler.unscale_(grads, {&dp, &tp}, timeout);  // optional: before clipping
//     torch::nn::utils::clip_grad_norm_(params, 1.0);
//     scaler.step(optimizer, {&dp, &tp}, timeout);  // skipped if any rank saw inf/nan
//     scaler.update();                              // back off or grow the scale
//   }
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace torch::optim {
class Optimizer;
}

namespace paratrain::optim {

/// How a GradScaler chooses its scale.
struct GradScalerOptions {
  /// How the scale evolves.
  enum class Mode {
    /// Scale starts at init_scale, halves (backoff) on every step with inf/nan
    /// gradients and doubles (growth) after growth_interval good steps in a
    /// row: the mixed-precision default, costs one 4-byte all-reduce per step.
    kDynamic,
    /// Scale stays init_scale forever; inf/nan steps are still detected (one
    /// all-reduce) and skipped. For models whose loss range is known.
    kStatic,
    /// Pass-through, as PyTorch's GradScaler(enabled=False): scale 1, unscale_
    /// touches nothing and reports no inf, step() always steps, no
    /// communication. A non-finite gradient reaches the optimizer exactly as it
    /// would without a scaler (use this for fp32 training).
    kNone,
  };
  Mode mode = Mode::kDynamic;  ///< see Mode
  /// First scale. Large (2^16) so fp16 gradients use their range; a too-large
  /// start only costs a few skipped steps while it backs off.
  double init_scale = 65536.0;
  /// Factor on growth. Powers of two keep scaling and unscaling exact.
  double growth_factor = 2.0;
  /// Factor on an inf/nan step, in (0, 1).
  double backoff_factor = 0.5;
  /// Good steps in a row before growing. Shorter chases the largest usable
  /// scale faster but skips more steps from overshooting.
  int64_t growth_interval = 2000;

  bool operator==(const GradScalerOptions&) const = default;
};

/// Parses the config value precision.loss_scale: "dynamic", "none", or a
/// positive finite number (a static scale, e.g. "1024"). Other fields of
/// `base` (growth factor, interval, ...) are kept. Throws ConfigError naming
/// the key and the allowed forms.
GradScalerOptions parse_loss_scale(std::string_view value, GradScalerOptions base = {});

/// One scaler serves one optimizer per step: scale -> backward ->
/// [unscale_] -> step -> update, in that order (TORCH_CHECK on misuse).
///
/// Agreement: unscale_ and step take a list of groups; the found-inf flag is
/// MAX-reduced over each in turn. Over the axes of a device mesh (say dp then
/// tp) that yields the maximum over every rank of the mesh, since after the dp
/// reduction each rank holds its dp group's maximum and the tp reduction then
/// combines one value from every dp group. Pass every axis whose ranks hold
/// different gradients (dp when gradients are sharded or not yet reduced, tp,
/// pp). An empty list (or nullptr) means this process decides alone. All
/// members of a group must call unscale_/step the same number of times.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});  ///< starts at options.init_scale (1 in kNone)

  const GradScalerOptions& options() const { return options_; }  ///< as constructed

  /// loss * scale (the loss unchanged in kNone mode).
  at::Tensor scale(const at::Tensor& loss) const;

  /// Multiplies every defined gradient by 1/scale in place (math in fp32;
  /// grads may be fp32, fp16 or bf16, dense), looks for inf/nan in them (the
  /// tensors this rank holds: whole gradients or shards), and MAX-reduces the
  /// flag over `groups`. Returns found_inf, the same on every rank. A second
  /// call in the same step is a no-op returning the same flag (it must pass
  /// the same gradients or a subset; other gradients are a caller mistake). A
  /// rank with no gradients (an empty shard) must still call it.
  bool unscale_(const std::vector<at::Tensor>& grads, const std::vector<comm::ProcessGroup*>& groups,
                std::chrono::milliseconds timeout = comm::kDefaultTimeout);
  /// unscale_ over one group (nullptr: this process alone).
  bool unscale_(const std::vector<at::Tensor>& grads, comm::ProcessGroup* group,
                std::chrono::milliseconds timeout = comm::kDefaultTimeout) {
    return unscale_(grads, group ? std::vector<comm::ProcessGroup*>{group} : std::vector<comm::ProcessGroup*>{},
                    timeout);
  }

  /// Steps `optimizer` unless inf/nan was found; unscales its parameters'
  /// gradients first (over `groups`) if unscale_ was not called this step.
  /// Returns whether the optimizer stepped.
  bool step(torch::optim::Optimizer& optimizer, const std::vector<comm::ProcessGroup*>& groups,
            std::chrono::milliseconds timeout = comm::kDefaultTimeout);
  /// step over one group (nullptr: this process alone).
  bool step(torch::optim::Optimizer& optimizer, comm::ProcessGroup* group = nullptr,
            std::chrono::milliseconds timeout = comm::kDefaultTimeout) {
    return step(optimizer, group ? std::vector<comm::ProcessGroup*>{group} : std::vector<comm::ProcessGroup*>{},
                timeout);
  }

  /// Ends the step: kDynamic backs off on inf (and restarts the count of good
  /// steps) or grows after growth_interval good steps; kStatic and kNone keep
  /// the scale. Needs unscale_ or step earlier in this step.
  void update();

  double get_scale() const { return scale_; }  ///< the current scale
  /// Good steps in a row since the last growth or backoff.
  int64_t growth_tracker() const { return growth_tracker_; }
  /// The flag of the current step (false before unscale_).
  bool found_inf() const { return found_inf_; }

  /// For checkpoints: {"scale": float64 [1], "growth_tracker": int64 [1]}.
  /// The options are configuration and are not saved. Same on every rank, so
  /// any one rank's copy restores all.
  std::vector<std::pair<std::string, at::Tensor>> state() const;
  /// Throws CheckpointError if an entry is missing or malformed. Only between
  /// steps (after update()).
  void load_state(const std::vector<std::pair<std::string, at::Tensor>>& state);

 private:
  enum class Phase { kReady, kUnscaled, kStepped };

  GradScalerOptions options_;
  double scale_;
  int64_t growth_tracker_ = 0;
  Phase phase_ = Phase::kReady;
  bool found_inf_ = false;
  /// The gradients unscaled this step (their storage), to reject a second
  /// unscale_ with other gradients, which would silently stay scaled.
  std::vector<const void*> unscaled_;
};

}  // namespace paratrain::optim
