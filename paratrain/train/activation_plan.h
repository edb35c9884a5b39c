// What `paratrain plan` counts beyond the model state: bytes that a rank
// keeps alive between a micro-batch's forward and its backward, per layer of the
// built-in models (MLP, CNN, GPT) at the config's sizes, under tensor and
// sequence parallelism, pipeline schedules and activation checkpointing;
// the loader's bytes; the data-parallel strategies' communication buffers.
// Pure arithmetic from the config, like memory_plan.h (which adds it to the
// model state); builds no model. Not the measurement (core/memory_meter.h,
// `paratrain plan --measure`).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/train/config/config.h"

namespace paratrain::train {

/// One layer of the model's layers() as the planner sees it, per micro-batch.
struct LayerActivations {
  std::string name;           ///< "fc0", "blocks.3", "head"
  int64_t input_bytes = 0;    ///< the layer's input, which its first operation saves
  int64_t saved_bytes = 0;    ///< everything else its forward saves for backward (the loss's too, on the last layer)
  int64_t parameters = 0;     ///< its parameter count on this rank (a pipeline balances by it)
  int64_t largest_tensor = 0; ///< elements of its largest parameter on this rank
  /// Backward's working set inside it: the gradient of its output and of its
  /// widest activation, alive together while its backward runs (Note
  /// [Backward's working set]).
  int64_t grad_bytes = 0;
};

/// The config's model as layers, for one micro-batch of `rows` examples on
/// one rank (its tp shard, its cp chunk). Empty for a registered or
/// program's own model (no formula).
std::vector<LayerActivations> layer_activations(const TrainConfig& config, int64_t rows);

/// Activations of the fullest rank.
struct ActivationPlan {
  int64_t microbatch_rows = 0;   ///< examples in one micro-batch on a rank
  int stage = 0;                 ///< the pipeline stage of the fullest rank (0 without pp)
  int64_t in_flight = 1;         ///< micro-batches whose activations that rank holds at once
  int64_t kept_bytes = 0;        ///< per micro-batch, after recomputation: what waits for backward
  int64_t recompute_bytes = 0;   ///< the largest recomputed segment's activations, re-made during backward
  /// in_flight * kept_bytes / pipeline.virtual_stages + recompute_bytes (a
  /// micro-batch in flight on an interleaved rank is one of its chunks')
  int64_t total_bytes = 0;
  int64_t unrecomputed_bytes = 0;///< kept_bytes without activation checkpointing (for the saving)
  bool modelled = true;          ///< false: no formula for this model (a registered one)
  /// The loader's side (Note [Loader bytes]): this rank's shard of the
  /// epoch's sample order and the batches prefetched ahead of the one in use.
  int64_t data_bytes = 0;
  /// Backward's largest temporary besides the activations: a parameter's
  /// new gradient before it is added into the .grad it already has (the
  /// largest parameter's, in fp32).
  int64_t transient_bytes = 0;
  std::vector<std::string> notes;
};

/// Bytes of communication buffers per rank at ZeRO stages 0-3 (Note
/// [Communication buffers] in activation_plan.cpp) for a rank holding `psi`
/// parameters in a data-parallel group of `dp` ranks; 0 at stage 3 for a
/// model without a formula or under tp / pp.
std::array<int64_t, 4> communication_buffer_bytes(const TrainConfig& config, int64_t psi, int64_t dp);

/// Note [Activation formulas] in activation_plan.cpp says what is counted
/// and where it comes from. `dp`: the data-parallel ranks (the micro-batch
/// is the per-rank batch / pipeline.microbatches).
ActivationPlan plan_activations(const TrainConfig& config, int64_t dp);

}  // namespace paratrain::train
