#include "paratrain/param_server/straggler.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::param_server {
namespace {

// SplitMix64's finalizer: consecutive inputs give independent-looking outputs.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

SlowPattern parse_slow_pattern(const std::string& name) {
  if (name == "always") return SlowPattern::kAlways;
  if (name == "random") return SlowPattern::kRandom;
  throw ConfigError(fmt::format("ps.slow_pattern = \"{}\": use \"always\" (worker ps.slow_worker before every "
                                "forward) or \"random\" (every worker, each forward with probability 1 / workers)",
                                name));
}

bool is_slowed(const StragglerOptions& o, int worker, int64_t forward) {
  if (o.slow_ms <= 0) return false;
  if (o.pattern == SlowPattern::kAlways) return worker == o.slow_worker;
  const uint64_t draw = mix(mix(mix(o.seed) ^ static_cast<uint64_t>(worker)) ^ static_cast<uint64_t>(forward));
  return o.workers > 0 && draw % static_cast<uint64_t>(o.workers) == 0;
}

}  // namespace paratrain::param_server
