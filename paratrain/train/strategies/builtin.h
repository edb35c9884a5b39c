// Factories of the built-in strategies, one file each in this folder. Only
// strategy_registry.cpp includes this; everything else goes by name.
#pragma once

#include <memory>

#include "paratrain/train/strategies/strategy_registry.h"

namespace paratrain::train::strategies {

// zero.stage 0: DDP (ddp.mode "bucketed" | "naive" | "none").
std::unique_ptr<Strategy> make_ddp_strategy(const StrategyContext& context);
// zero.stage 1 or 2: ZeRO over the dp group.
std::unique_ptr<Strategy> make_zero_strategy(const StrategyContext& context);
// zero.stage 3: fully sharded units.
std::unique_ptr<Strategy> make_fsdp_strategy(const StrategyContext& context);
// parallel.pp > 1 (with tp = cp = 1): pipeline stages (DDP across pipeline
// replicas); a GPT's tied embedding is summed over the first and last stage.
std::unique_ptr<Strategy> make_pipeline_strategy(const StrategyContext& context);
// model.kind = "gpt" with parallel.tp > 1 or parallel.cp > 1: tensor, context
// and Megatron sequence parallelism, DDP over the replicas, and with
// parallel.pp > 1 pipeline stages of the tensor-parallel GPT.
std::unique_ptr<Strategy> make_megatron_strategy(const StrategyContext& context);
// ps.servers > 0: parameter servers and workers (param_server/).
std::unique_ptr<Strategy> make_ps_strategy(const StrategyContext& context);

}  // namespace paratrain::train::strategies
