// The strategy registry: see strategy_registry.h.
#include "paratrain/train/strategies/strategy_registry.h"

#include <map>
#include <mutex>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"
#include "paratrain/train/strategies/builtin.h"

namespace paratrain::train {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, StrategyFactory> factories;
};

// Built-ins are added here, explicitly, rather than from static initializers
// in their own files: the linker drops unreferenced objects of a static
// library, and with them such initializers.
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    reg->factories["ddp"] = strategies::make_ddp_strategy;
    reg->factories["zero"] = strategies::make_zero_strategy;
    reg->factories["fsdp"] = strategies::make_fsdp_strategy;
    reg->factories["pipeline"] = strategies::make_pipeline_strategy;
    reg->factories["megatron"] = strategies::make_megatron_strategy;
    reg->factories["ps"] = strategies::make_ps_strategy;
    return reg;
  }();
  return *r;
}

}  // namespace

void register_strategy(const std::string& name, StrategyFactory factory) {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> registered_strategies() {
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

std::unique_ptr<Strategy> make_strategy(const std::string& name, const StrategyContext& context) {
  StrategyFactory factory;
  {
    auto& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    throw ConfigError(fmt::format("no strategy named \"{}\"; registered: {}", name,
                                  fmt::join(registered_strategies(), ", ")));
  }
  return factory(context);
}

std::string strategy_name(const TrainConfig& config) {
  if (config.ps.servers > 0) return "ps";
  // A GPT in pipeline stages with ZeRO goes to the megatron strategy too (at
  // tp = cp = 1): it shards over the replicas around the tied embedding's
  // stage copies, which the pipeline strategy's per-chunk ZeRO cannot.
  const bool gpt_stages_zero = config.parallel.pp > 1 && config.zero.stage > 0;
  if (builds_gpt(config) && (config.parallel.tp > 1 || config.parallel.cp > 1 || gpt_stages_zero))
    return "megatron";
  // Any other model under tensor parallelism: its parallel.tp_plan.
  if (config.parallel.tp > 1) return "megatron";
  if (config.parallel.pp > 1) return "pipeline";
  if (config.zero.stage == 0) return "ddp";
  if (config.zero.stage <= 2) return "zero";
  return "fsdp";
}

}  // namespace paratrain::train
