// [ps]: parameter servers.
// The sections of TrainConfig (config.h) that configure param_server/ through train/strategies/ps_strategy.cpp.
// Each key's type, doc line and range check, and the rules between keys, are
// beside them in ps_section.cpp: adding a key is a field here and one line
// there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace paratrain::train {

/// Parameter servers (param_server/): the last `servers` ranks hold the
/// parameters and the optimizer state, the others are workers that push
/// gradients and pull parameters. See Note [Parameter-server modes] in
/// param_server/server.h.
struct PsConfig {
  int64_t servers = 0;         ///< 0 = off (the SPMD strategies); else 1 .. world - 1
  std::string mode = "sync";   ///< "sync" | "async" | "ssp"
  int64_t staleness = 2;       ///< ssp: clocks a worker may run ahead of the slowest
  /// Straggler knob for experiments: worker `slow_worker` (-1 = none) sleeps
  /// slow_ms before each of its forward passes.
  int64_t slow_worker = -1;
  double slow_ms = 0.0;  ///< the straggler's sleep before each forward, in ms
  /// "always": worker slow_worker sleeps before every forward (a slower
  /// machine); "random": every worker sleeps before each of its forwards with
  /// probability 1 / workers, seeded by run.seed (a straggler that comes and
  /// goes; slow_worker stays -1). See param_server/straggler.h.
  std::string slow_pattern = "always";
  /// Gradient pushes on the wire: "fp32", or "fp16" (half the bytes; the
  /// server widens each push to fp32 before adding, so only the rounding of
  /// each worker's gradient to fp16 is lost). Parameters come back in fp32.
  std::string push_dtype = "fp32";
  /// Push each tensor's gradient from its backward hook (overlapping backward)
  /// and wait for each layer's pulled parameters just before it runs in the
  /// next forward; false pushes after backward and pulls at once (naive twin).
  bool overlap = true;
  /// async: workers take the epoch's batches from a queue on server 0, so a
  /// fast worker trains more of them (Note [Dynamic batches] in
  /// param_server/server.h); false keeps each worker's fixed share, as sync
  /// and ssp always do.
  bool dynamic_batches = true;
  /// async and ssp: each update's rate divided by its staleness, lr /
  /// max(tau, 1) (Note [Staleness-aware learning rate] in
  /// param_server/server.cpp); false applies every update at the full rate.
  bool staleness_aware_lr = true;
  /// Messages between a worker and a server carry buckets of that server's
  /// neighbouring key ranges: each layer's ranges (what the forward's
  /// layer-wise pull waits for; each tensor's without Model::layers()),
  /// merged with neighbouring layers while the bucket stays within
  /// bucket_kb KiB (a layer larger than that travels alone). One push and one
  /// reply message per bucket and step, so small tensors (biases) do not
  /// travel alone. 0 = one message per key range. See
  /// param_server/bucket_plan.h.
  int64_t bucket_kb = 256;

  bool operator==(const PsConfig&) const = default;
};

}  // namespace paratrain::train
