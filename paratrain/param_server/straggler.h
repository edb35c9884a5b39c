// The parameter-server straggler knob for experiments (ps.slow_worker,
// ps.slow_ms, ps.slow_pattern): which forward passes of which worker sleep.
// "always": worker ps.slow_worker before every forward, a machine that is
// slower for good; every mode is then tied to it except async with dynamic
// batches. "random": every worker, before each of its forwards, with
// probability 1 / workers: a straggler that comes and goes, the case
// stale-synchronous parallel absorbs (a worker slowed now catches up while
// another is slowed) and sync pays for at almost every step. The draws are a
// hash of (seed, worker, forward count): reproducible, no shared RNG.
#pragma once

#include <cstdint>
#include <string>

namespace paratrain::param_server {

enum class SlowPattern { kAlways, kRandom };

// "always" | "random"; anything else is a ConfigError naming ps.slow_pattern.
SlowPattern parse_slow_pattern(const std::string& name);

struct StragglerOptions {
  SlowPattern pattern = SlowPattern::kAlways;
  int64_t slow_worker = -1;  // kAlways: the slowed worker (-1 = none)
  double slow_ms = 0.0;
  uint64_t seed = 0;
  int workers = 1;
};

// Whether worker `worker` sleeps slow_ms before its `forward`-th forward pass
// (0-based, counted per worker).
bool is_slowed(const StragglerOptions& options, int worker, int64_t forward);

}  // namespace paratrain::param_server
