// Activation checkpointing (train.activation_checkpointing): runs chosen
// runs of a model's layers (model.h) so that backward recomputes their
// forward instead of keeping what it saved. Not here: which strategies use
// it (the Trainer wraps the model, pipelines run their chunks through
// run_layers, the megatron strategy sets ParallelGptOptions::recompute).
//
//   RecomputePolicy policy{.mode = RecomputeMode::kBlocks};
//   auto model = std::make_shared<RecomputedModel>(make_gpt(o), policy);
//   loss_fn(model->forward(x), y).backward();   // each block recomputed once in backward
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "paratrain/models/model.h"

namespace paratrain::models {

/// Note [Recompute in backward]
/// A recomputed segment (one or more consecutive layers) runs its forward
/// without autograd history and keeps only its input. It is one autograd
/// node whose inputs are the segment's input and the parameters it reads
/// (every parameter of its layers' modules and reads that requires a
/// gradient); in backward it runs the forward again with history, takes the
/// gradients of its input and parameters with torch::autograd::grad and
/// returns them to the engine. So each parameter's gradient is accumulated
/// by the engine exactly once, through the parameter's own AccumulateGrad:
/// DDP's and ZeRO's hooks fire once per parameter per backward, as without
/// recomputation (the re-entrant form, a backward() inside backward, fires
/// them inside the recompute and is PyTorch's documented hazard with DDP).
/// The recompute sees the same random numbers: the state of the default CPU
/// generator (the default CUDA generator for CUDA inputs, and the
/// policy's extra generators) is taken before the forward, put back for the
/// recompute and the state backward found is restored after, so dropout
/// replays exactly and the run's random stream goes on as without
/// recomputation: gradients are bitwise those of the plain forward. The
/// forward's autocast state is replayed too. ZeRO-3/FSDP see the recompute's
/// operations touch a unit and gather it again, as for its backward.

enum class RecomputeMode {
  kNone,    ///< keep every activation (no recomputation)
  kBlocks,  ///< each chosen layer is its own segment
  kEveryK,  ///< consecutive chosen layers in segments of `every_k`
};

/// Which layers are recomputed.
struct RecomputePolicy {
  RecomputeMode mode = RecomputeMode::kNone;  ///< which layers form segments
  /// kEveryK: layers per segment (a segment keeps one input for k layers;
  /// more layers, less memory, the same one extra forward).
  int64_t every_k = 2;
  /// Glob patterns (fnmatch: `*`, `?`, `[...]`) over layer names
  /// ("blocks.*", "fc1", "3"): the layers that may be recomputed. Empty:
  /// every layer but the model's last (the last layer's output is the
  /// loss's input: recomputing it saves nothing the loss does not keep).
  std::vector<std::string> layers = {};
  /// Random streams besides the default generators that the layers draw from
  /// (ParallelGpt's tensor-parallel attention dropout): replayed too.
  std::vector<at::Generator> generators = {};

  /// Whether anything is recomputed.
  bool enabled() const { return mode != RecomputeMode::kNone; }
};

/// The states of the random streams a forward draws from, taken before it,
/// so that a recompute draws the same numbers (Note [Recompute in backward]).
class RandomStates {
 public:
  RandomStates() = default;
  /// The default generator of `device` (CPU, or the CUDA device) and `extra`.
  static RandomStates capture(c10::Device device, const std::vector<at::Generator>& extra = {});
  /// Runs `fn` from the captured states, then puts back the states found
  /// (also when fn throws): the streams go on as if fn had not run.
  void replay(const std::function<void()>& fn) const;

 private:
  std::vector<at::Generator> generators_;
  std::vector<at::Tensor> states_;
};

/// Puts `buffers` back as they were when it was made, when it goes: a
/// recompute runs a layer's forward a second time, and BatchNorm's running
/// statistics (and its batch counter) must move once per step, as without
/// recomputation.
class KeepBuffers {
 public:
  /// Copies `buffers` (a segment's modules' buffers).
  explicit KeepBuffers(std::vector<at::Tensor> buffers);
  /// Writes the copies back in place.
  ~KeepBuffers();
  KeepBuffers(const KeepBuffers&) = delete;
  KeepBuffers& operator=(const KeepBuffers&) = delete;

 private:
  std::vector<at::Tensor> buffers_, saved_;
};

/// "none" | "blocks" | "every_k" (config values); Error otherwise.
RecomputeMode parse_recompute_mode(const std::string& name);

/// For each layer of a model named `names` (in forward order): the index of
/// the recomputed segment it belongs to, or -1 (not recomputed). Segments
/// are consecutive runs; a segment never includes a layer the policy leaves
/// out. Throws Error naming the model's layers when a pattern matches none.
std::vector<int> recompute_segments(const std::vector<std::string>& names, const RecomputePolicy& policy);

/// What a segment reads besides its input.
struct SegmentState {
  std::vector<at::Tensor> params;   ///< that may need gradients
  std::vector<at::Tensor> buffers = {};  ///< kept as the forward left them (KeepBuffers)
  std::vector<at::Generator> generators = {};  ///< random streams besides the default one
  std::string name = {};            ///< "blocks.3", "blocks.0..blocks.1": for errors
};

/// Runs `fn(x)` as one recomputed segment (Note [Recompute in backward]).
/// Without grad mode, or when neither x nor any parameter requires a
/// gradient, simply fn(x). Throws Error when fn modifies x in place (the
/// recompute would start from the modified input).
at::Tensor recompute_in_backward(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& x,
                                 SegmentState state);

/// Counts a recomputation done outside recompute_in_backward (a pipeline
/// chunk's, pipeline.checkpoint_activations) in recomputed_segments().
void count_recompute();

/// Runs `layers` in order on x, each run of equal non-negative `segment_of`
/// ids as one recomputed segment (recompute_segments' output, or a slice
/// of it for a pipeline chunk; empty: no recomputation); layers with -1 run
/// plainly. `kept_bytes`, when given, grows by the bytes of every plain
/// layer's output and every segment's input: roughly what autograd keeps
/// alive for backward (a pipeline's accounting).
at::Tensor run_layers(const std::vector<Layer>& layers, const at::Tensor& x, const std::vector<int>& segment_of,
                      const std::vector<at::Generator>& generators = {}, int64_t* kept_bytes = nullptr);

/// Segments recomputed so far in this process (all threads): tests and logs.
int64_t recomputed_segments();

/// A model whose forward is its layers with the policy's segments
/// recomputed. It adopts the inner model's parameters, buffers and children
/// under their own names (as any_module does), so checkpoints and every
/// strategy see the inner model's names. Throws Error when the inner model
/// lists no layers (its forward cannot be cut) or a pattern matches none.
class RecomputedModel final : public Model {
 public:
  /// Adopts `inner` and computes its segments under `policy`.
  RecomputedModel(std::shared_ptr<Model> inner, RecomputePolicy policy);

  /// The inner model's layers in order, the segments recomputed in backward.
  at::Tensor forward(const at::Tensor& x) override;
  /// The inner model's layers (a pipeline cuts them as the inner model's).
  std::vector<Layer> layers() override { return inner_->layers(); }
  /// Training or evaluation mode, on the adopted children and the inner model.
  void train(bool on = true) override;

  /// The model as built.
  const std::shared_ptr<Model>& inner() const { return inner_; }
  /// recompute_segments() of the inner model's layers.
  const std::vector<int>& segments() const { return segment_of_; }

 private:
  std::shared_ptr<Model> inner_;
  RecomputePolicy policy_;
  std::vector<int> segment_of_;
};

}  // namespace paratrain::models
