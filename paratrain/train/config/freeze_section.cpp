// The schema rows and cross-key rules of [freeze] (freeze_section.h).
#include "paratrain/train/config/freeze_section.h"

#include <set>

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {

std::vector<FieldSpec> freeze_fields() {
  using TC = TrainConfig;
  const Check<std::vector<std::string>> names = [](const std::vector<std::string>& v) -> std::string {
    std::set<std::string> seen;
    for (const std::string& name : v) {
      if (name.empty() || name.front() == '.' || name.back() == '.' || name.find("..") != std::string::npos)
        return fmt::format("\"{}\" is not a module name: use names as named_parameters() gives them, e.g. \"fc0\" "
                           "or \"blocks.0\"",
                           name);
      if (!seen.insert(name).second) return fmt::format("\"{}\" is listed twice", name);
    }
    return "";
  };
  return {
      field("freeze.modules", &TC::freeze, &FreezeConfig::modules, "modules frozen from the first step (prefixes of parameter names, e.g. [\"fc0\", \"blocks.0\"]): no gradient, no gradient traffic, no optimizer step", names),
      field("freeze.adaptive", &TC::freeze, &FreezeConfig::adaptive, "AutoFreeze: every freeze.check_every_steps, freeze the longest prefix of layers (forward order) whose gradient norm changed by less than freeze.threshold since the last check"),
      field("freeze.check_every_steps", &TC::freeze, &FreezeConfig::check_every_steps, "optimizer steps between two checks of freeze.adaptive (each check reduces one number per layer over the world)", in_range<int64_t>(1, int64_t{1} << 40)),
      field("freeze.threshold", &TC::freeze, &FreezeConfig::threshold, "a layer has converged when |G - G_prev| / G_prev < this, G its gradient norm over a check interval", in_range_finite(1e-9, 10.0)),
      field("freeze.max_fraction", &TC::freeze, &FreezeConfig::max_fraction, "adaptive freezing never freezes more than this share of the parameters", in_range_finite(0.0, 1.0)),
  };
}

std::string freeze_problem(const TrainConfig& c) {
  const FreezeConfig& f = c.freeze;
  if (f.modules.empty() && !f.adaptive) return "";
  if (!f.adaptive) return "";
  if (c.ps.servers > 0)
    return fmt::format("freeze.adaptive with ps.servers = {}: parameter servers step gradients the workers "
                       "pushed, which adaptive freezing does not measure yet; freeze statically there "
                       "(freeze.modules), or set freeze.adaptive = false",
                       c.ps.servers);
  if (c.elastic.in_job)
    return "freeze.adaptive with elastic.in_job = true: a rollback to a checkpoint saved before a freezing decision "
           "would train a different frozen set than the run did; use restarts (elastic.in_job = false), or set "
           "freeze.adaptive = false";
  if (f.max_fraction <= 0.0)
    return "freeze.adaptive = true with freeze.max_fraction = 0 can never freeze anything: raise "
           "freeze.max_fraction (e.g. 0.5), or set freeze.adaptive = false";
  return "";
}

}  // namespace paratrain::train::detail
