// The federated server's checkpoint: the global model, the server
// optimizer's moments and the run's position, in the sharded checkpoint
// format the Trainer writes (checkpoint/sharded.h: rank_0.safetensors
// + index.json, written atomically, index last), so `paratrain checkpoint
// inspect|consolidate` read it and `paratrain federated` resumes from it
// (train.resume). Only the server writes and reads it: client hosts get the
// model every round. Not the round (round.h).
//
// Note [Federated checkpoint]
// - model/<param>: the global model x_t after `round` rounds.
// - optimizer/server/{exp_avg, exp_avg_sq, step}: the server optimizer's m
//   and v (Note [Server update]) stored as a torch Adam state of one flat
//   parameter named "server", so the format and its tools need nothing new;
//   extra.federated.server_moments says which of m, v exist ("", "m",
//   "mv"; sgd without momentum has none).
// - step = round; extra.federated.*: rounds applied, bytes so far, the
//   privacy accountant's RDP per order (JSON). Client sampling, dropouts,
//   client shuffles and DP noise are pure functions of (run.seed, round),
//   so the round number is their whole position.
// - Not saved: clients' own optimizers (federated.client_optimizer_state =
//   "keep"): a resumed run starts them afresh (logged), and processes that
//   died are alive again in the new launch.
#pragma once

#include <cstdint>
#include <filesystem>

#include "paratrain/comm/process_group.h"
#include "paratrain/federated/rdp_accountant.h"
#include "paratrain/train/config/config.h"

namespace paratrain::federated {

class FederatedRun;

// What the run loop carries from round to round besides the model.
struct ServerProgress {
  int64_t round = 0;           // rounds completed
  int64_t rounds_applied = 0;  // of which changed the global model
  int64_t bytes_up = 0;        // totals so far, for the progress line
  int64_t bytes_down = 0;
  RdpAccountant accountant;
};

// Server only; `self` is a one-rank group holding the server (the sharded
// writer is collective over the group it is given). Replaces `dir`.
void save_server_checkpoint(const std::filesystem::path& dir, comm::ProcessGroup& self, FederatedRun& run,
                            const ServerProgress& progress, const train::TrainConfig& config);

struct ServerResumeOptions {
  // false: the server optimizer starts afresh (its moments are not loaded):
  // the tests' control showing that the moments matter.
  bool server_optimizer = true;
};

// Server only: loads the global model (into run's model and its global
// vector) and the server optimizer state; returns the progress. Throws
// CheckpointError naming the file, or when the checkpoint's server optimizer
// differs from the config's.
ServerProgress load_server_checkpoint(const std::filesystem::path& checkpoint, FederatedRun& run,
                                      const train::TrainConfig& config, const ServerResumeOptions& options = {});

}  // namespace paratrain::federated
