// Shared by the parameter-server tests: a tiny Trainer config, training it
// on thread-ranks, the relative difference of two parameter lists, and the
// workers' metrics records of a run.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/train/config/config.h"

namespace paratrain::train {
class Trainer;
}

namespace paratrain::param_server::testing {

using Params = std::vector<std::pair<std::string, at::Tensor>>;

// A 2-layer MLP on synthetic 6x6 images, global batch 24 (divides over 1, 2
// and 3 workers), 20 steps, no evaluation. ps.servers stays 0 (the oracle).
train::TrainConfig small_config(const std::string& dir, const std::string& optimizer);

// Trains `cfg` on `world` thread-ranks; returns rank 0's full parameters and
// checks that every rank holds the same ones. `tweak` runs on every rank
// after the Trainer is built (a resume has loaded) and before fit().
Params train(const train::TrainConfig& cfg, int world, const std::function<void(train::Trainer&)>& tweak = {});

// max over tensors of max|a - b| / max|b|.
double relative_diff(const Params& a, const Params& b);

// The workers' ps_staleness records (one per worker, in worker order) in
// `run_dir`/metrics.jsonl: staleness, pushes, what the transport did.
std::vector<nlohmann::json> worker_records(const std::string& run_dir);

}  // namespace paratrain::param_server::testing
