// The strategy registry: names to factories, so the Trainer builds whatever
// the config asks for without an if-chain over strategy types. Built-in
// strategies (train/strategies/) are registered on first use; a library user
// can register their own under a new name.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <c10/core/ScalarType.h>

#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/strategies/strategy.h"

namespace paratrain::train {

struct StrategyContext {
  const TrainConfig& config;
  topology::DeviceMesh& mesh;
  std::chrono::milliseconds timeout;  // for every collective the strategy issues
  std::filesystem::path run_dir = {};  // the run's version folder (run_dir.h), for files a strategy writes
  // One training example's shape and dtype, where a pipeline cuts (the
  // loaded data's; the GPT's window of token ids; nullopt when unknown:
  // model_input_shape(config) then). A shape may be empty (a scalar example).
  std::optional<std::vector<int64_t>> input_shape = std::nullopt;
  at::ScalarType input_dtype = at::kFloat;
};

using StrategyFactory = std::function<std::unique_ptr<Strategy>(const StrategyContext&)>;

// Adds (or replaces) a factory. Thread-safe.
void register_strategy(const std::string& name, StrategyFactory factory);
// Throws ConfigError listing the registered names when `name` is unknown.
std::unique_ptr<Strategy> make_strategy(const std::string& name, const StrategyContext& context);
std::vector<std::string> registered_strategies();

// The strategy a config asks for: ps.servers > 0 -> "ps"; a GPT with parallel.tp > 1 or parallel.cp >
// 1, or with parallel.pp > 1 and zero.stage > 0 -> "megatron"; parallel.pp > 1 -> "pipeline"; else
// zero.stage 0 -> "ddp", 1-2 -> "zero", 3 -> "fsdp".
std::string strategy_name(const TrainConfig& config);

}  // namespace paratrain::train
