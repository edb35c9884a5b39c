// The schema rows and cross-key rules of [ps] (ps_section.h).
#include "paratrain/train/config/ps_section.h"

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {

std::vector<FieldSpec> ps_fields() {
  using TC = TrainConfig;
  return {
      field("ps.servers", &TC::ps, &PsConfig::servers, "parameter servers: the last N ranks (0 = off; the rest are workers)", in_range<int64_t>(0, kMaxRanks)),
      field("ps.mode", &TC::ps, &PsConfig::mode, "\"sync\" (= one process on the global batch), \"async\" (each push applied as it arrives) or \"ssp\" (bounded staleness)", one_of({"sync", "async", "ssp"})),
      field("ps.staleness", &TC::ps, &PsConfig::staleness, "ssp: clocks a worker may run ahead of the slowest (0 = sync)", in_range<int64_t>(0, kMaxCount)),
      field("ps.slow_worker", &TC::ps, &PsConfig::slow_worker, "experiments: this worker sleeps ps.slow_ms before each forward (-1 = none)", in_range<int64_t>(-1, kMaxRanks)),
      field("ps.slow_ms", &TC::ps, &PsConfig::slow_ms, "experiments: the slowed worker's delay per forward (ms)", in_range_finite(0.0, 3600e3)),
      field("ps.slow_pattern", &TC::ps, &PsConfig::slow_pattern, "experiments: \"always\" (worker ps.slow_worker before every forward) or \"random\" (every worker before each forward with probability 1 / workers, seeded by run.seed: a straggler that comes and goes)", one_of({"always", "random"})),
      field("ps.push_dtype", &TC::ps, &PsConfig::push_dtype, "gradient pushes on the wire: \"fp32\" or \"fp16\" (half the bytes; rounded per worker, summed in fp32 on the server)", one_of({"fp32", "fp16"})),
      field("ps.overlap", &TC::ps, &PsConfig::overlap, "push each tensor's gradient from its backward hook as soon as it is ready, and wait for each layer's pulled parameters just before it runs in the next forward (false: push all after backward, pull at once)"),
      field("ps.dynamic_batches", &TC::ps, &PsConfig::dynamic_batches, "async: workers take the epoch's batches from a queue on server 0, so fast workers train more of them (false: a fixed share per worker, as sync and ssp)"),
      field("ps.staleness_aware_lr", &TC::ps, &PsConfig::staleness_aware_lr, "async and ssp: divide each update's learning rate by its staleness, lr / max(tau, 1) (Zhang et al., arXiv 1511.05950); false applies stale updates at the full rate"),
      field("ps.bucket_kb", &TC::ps, &PsConfig::bucket_kb, "KiB: one push and one reply message per bucket of a server's neighbouring key ranges, each layer's ranges merged with neighbouring layers up to this size (a larger layer travels alone; 0 = one message per key range)", in_range<int64_t>(0, 1 << 22)),
  };
}

// Parameter servers replace the gradient exchange of the SPMD strategies:
// the keys that configure another exchange must be at their defaults.
std::string ps_problem(const TrainConfig& c) {
  if (c.ps.servers == 0) {
    if (c.ps.slow_worker >= 0 || c.ps.slow_ms > 0 || c.ps.mode != "sync" || c.ps.push_dtype != "fp32" ||
        c.ps.slow_pattern != "always")
      return "ps.mode, ps.slow_worker, ps.slow_ms, ps.slow_pattern and ps.push_dtype apply to parameter servers: set "
             "ps.servers >= 1 (or leave them at their defaults)";
    return "";
  }
  const auto& p = c.parallel;
  if (c.zero.stage != 0 || p.tp != 1 || p.pp != 1 || p.cp != 1 || (p.dp != 0))
    return fmt::format("ps.servers = {} replaces data parallelism, but zero.stage = {}, parallel.dp = {}, tp = {}, "
                       "pp = {}, cp = {}: set zero.stage = 0, parallel.dp = 0 and tp = pp = cp = 1",
                       c.ps.servers, c.zero.stage, p.dp, p.tp, p.pp, p.cp);
  if (c.precision.compute != "fp32" || c.precision.loss_scale != "none" || c.precision.comm_dtype != "fp32")
    return fmt::format("ps.servers = {}: parameter servers compute in fp32 without loss scaling; set "
                       "precision.compute = \"fp32\", precision.loss_scale = \"none\", precision.comm_dtype = "
                       "\"fp32\" (ps.push_dtype = \"fp16\" halves the bytes of gradient pushes instead)",
                       c.ps.servers);
  if (c.optimizer.clip_grad_norm > 0)
    return fmt::format("optimizer.clip_grad_norm = {} with ps.servers = {}: gradient clipping across server "
                       "shards is not implemented; set optimizer.clip_grad_norm = 0",
                       c.optimizer.clip_grad_norm, c.ps.servers);
  if (c.model.batchnorm)
    return fmt::format("model.batchnorm = true with ps.servers = {}: servers hold parameters only, not running "
                       "statistics; set model.batchnorm = false",
                       c.ps.servers);
  if ((c.optimizer.kind == "lars" || c.optimizer.kind == "lamb") && c.ps.mode == "async" && c.ps.servers > 1)
    return fmt::format("optimizer.kind = \"{}\" with ps.mode = \"async\" and ps.servers = {}: its per-tensor "
                       "norms need the servers to step together; use ps.servers = 1, or ps.mode = \"sync\" or "
                       "\"ssp\"",
                       c.optimizer.kind, c.ps.servers);
  return "";
}

}  // namespace paratrain::train::detail
