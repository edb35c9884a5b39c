// The cross-key rules of TrainConfig (cross_key_problem): combinations of
// keys that each pass their own range check but not together, each rule
// saying which keys clash and what to set. The keys themselves, their types
// and single-key checks are the schema table (config_schema.cpp).
#include "paratrain/train/config_schema.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config_ranges.h"
#include "paratrain/train/registry.h"

namespace paratrain::train::detail {
namespace {

// The GPT and the text data go together: a GPT reads token windows, the
// image models read pixels.
std::string gpt_problem(const TrainConfig& c) {
  const bool gpt = builds_gpt(c), text = c.data.dataset == "text";
  if (gpt && !text)
    return fmt::format("model.kind = \"gpt\" reads token windows: set data.dataset = \"text\" (got \"{}\")",
                       c.data.dataset);
  if (text && !gpt)
    return fmt::format("data.dataset = \"text\" gives token windows, which only model.kind = \"gpt\" reads (got \"{}\")",
                       c.model.kind);
  if (!gpt) return "";
  if (c.model.d_model % c.model.heads != 0)
    return fmt::format("model.d_model ({}) must be a multiple of model.heads ({}): each head gets d_model / heads "
                       "dimensions",
                       c.model.d_model, c.model.heads);
  if (c.data.path.empty()) return "data.path must name a text file or folder (e.g. /usr/share/games/fortunes)";
  // A pipeline cuts the GPT into embed, blocks.<i>, head (models/gpt.h):
  // every chunk needs one of them.
  const int64_t chunks = c.parallel.pp * c.pipeline.virtual_stages;
  if (c.parallel.pp > 1 && c.model.layers + 2 < chunks)
    return fmt::format("model.layers ({}) + 2 (the embedding and the head) = {} pipeline layers cannot fill "
                       "parallel.pp ({}) x pipeline.virtual_stages ({}) = {} chunks of at least one layer each: "
                       "raise model.layers or lower parallel.pp",
                       c.model.layers, c.model.layers + 2, c.parallel.pp, c.pipeline.virtual_stages, chunks);
  return "";
}

// Tensor and context parallelism (the "megatron" strategy) split the GPT's
// heads and vocabulary over tp and its sequence over cp; every split must be
// even. The product of the axes with the world size is checked where the
// world is known (topology::ParallelDims::resolve).
std::string megatron_problem(const TrainConfig& c) {
  const auto& p = c.parallel;
  if (p.megatron_sp && p.tp < 2)
    return fmt::format("parallel.megatron_sp = true shards the sequence inside the tensor-parallel group, but "
                       "parallel.tp = {}: set parallel.tp >= 2 or parallel.megatron_sp = false",
                       p.tp);
  // A GPT with stages and ZeRO runs on the megatron strategy at tp = cp = 1
  // too (train::strategy_name), under the same rules.
  const bool gpt_stages_zero = builds_gpt(c) && p.pp > 1 && c.zero.stage > 0;
  if (p.tp == 1 && p.cp == 1 && !gpt_stages_zero) return "";
  if (!builds_gpt(c))
    return fmt::format("parallel.tp = {} and parallel.cp = {} split a transformer's heads and sequence; only "
                       "model.kind = \"gpt\" supports them (got \"{}\"): set parallel.tp = 1 and parallel.cp = 1",
                       p.tp, p.cp, c.model.kind);
  constexpr int64_t kVocab = 256;  // byte tokens (train/config_model.cpp)
  if (c.model.heads % p.tp != 0)
    return fmt::format("model.heads ({}) is not divisible by parallel.tp ({}): each tensor-parallel rank computes "
                       "heads / tp whole heads; pick a tp that divides {}",
                       c.model.heads, p.tp, c.model.heads);
  if (kVocab % p.tp != 0)
    return fmt::format("the vocabulary ({} byte tokens) is not divisible by parallel.tp ({}): each rank holds "
                       "vocab / tp embedding rows; use a power of two for tp",
                       kVocab, p.tp);
  if (c.model.seq_len % p.cp != 0)
    return fmt::format("model.seq_len ({}) is not divisible by parallel.cp ({}): ring attention gives each cp rank "
                       "an equal chunk of the sequence; pick a cp that divides {}",
                       c.model.seq_len, p.cp, c.model.seq_len);
  if (p.megatron_sp && (c.model.seq_len / p.cp) % p.tp != 0)
    return fmt::format("model.seq_len ({}) / parallel.cp ({}) = {} is not divisible by parallel.tp ({}): "
                       "parallel.megatron_sp gives each tp rank an equal part of its sequence chunk; pick seq_len a "
                       "multiple of cp * tp = {}",
                       c.model.seq_len, p.cp, c.model.seq_len / p.cp, p.tp, p.cp * p.tp);
  if (p.cp > 1 && c.model.dropout > 0)
    return fmt::format("model.dropout = {} with parallel.cp = {}: ring attention has no attention dropout (its "
                       "backward rebuilds the probabilities block by block); set model.dropout = 0",
                       c.model.dropout, p.cp);
  if (c.precision.compute != "fp32")
    return fmt::format("precision.compute = \"{}\" with parallel.tp = {} / parallel.cp = {}: the tensor- and "
                       "context-parallel collectives run in fp32 only (Gloo has no bf16 kernels); set "
                       "precision.compute = \"fp32\"",
                       c.precision.compute, p.tp, p.cp);
  if (c.zero.stage == 3)
    return fmt::format("zero.stage = 3 with parallel.tp = {} / parallel.cp = {}: the megatron strategy shards "
                       "optimizer state (1) and gradients (2) over its replicas, not parameters (FSDP); set "
                       "zero.stage = 0, 1 or 2",
                       p.tp, p.cp);
  // ZeRO-2 keeps only this rank's piece of each reduced gradient, but the
  // tied embedding's copies (pp) and Megatron-SP's LayerNorm gradients are
  // summed over whole tensors after the reduction; ZeRO-1 keeps them whole.
  if (c.zero.stage == 2 && (p.pp > 1 || p.megatron_sp))
    return fmt::format("zero.stage = 2 with parallel.pp = {} / parallel.megatron_sp = {} (parallel.tp = {}, "
                       "parallel.cp = {}): the tied embedding's stage copies and Megatron-SP's sequence-parallel "
                       "gradients are summed as whole tensors after the data-parallel reduction, which ZeRO-2 "
                       "frees; set zero.stage = 1 (or parallel.pp = 1 and parallel.megatron_sp = false)",
                       p.pp, p.megatron_sp, p.tp, p.cp);
  if (c.optimizer.kind == "lars" || c.optimizer.kind == "lamb")
    return fmt::format("optimizer.kind = \"{}\" with parallel.tp = {} / parallel.cp = {}: its per-tensor norms "
                       "across tensor-parallel shards are not computed yet; use sgd, adam or adamw",
                       c.optimizer.kind, p.tp, p.cp);
  if (c.ddp.mode != "bucketed")
    return fmt::format("ddp.mode = \"{}\" with parallel.tp = {} / parallel.cp = {}: the megatron strategy "
                       "reduces gradients with the bucketed reducer; set ddp.mode = \"bucketed\"",
                       c.ddp.mode, p.tp, p.cp);
  return "";
}


// The [lr] rules that involve several keys; the ones that need the global
// batch and step counts (lr.min_lr <= peak, cosine longer than warmup) are
// checked where the Trainer builds the schedule.
std::string layerwise_problem(const TrainConfig& c) {
  if (c.optimizer.kind == "lars" && c.optimizer.momentum >= 1)
    return fmt::format("optimizer.kind = \"lars\" needs optimizer.momentum < 1 (got {})", c.optimizer.momentum);
  return "";
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

// Federated keys that this build does not implement yet, and the rules that
// tie them together; checked always, so a config never silently ignores one.
std::string federated_problem(const TrainConfig& c) {
  const FederatedConfig& f = c.federated;
  if (f.dp_noise_multiplier > 0 && f.dp_clip <= 0)
    return fmt::format("federated.dp.noise_multiplier = {} needs federated.dp.clip > 0 (the noise is scaled by "
                       "the clip norm)",
                       f.dp_noise_multiplier);
  if (f.min_clients > f.clients)
    return fmt::format("federated.min_clients = {} > federated.clients = {}: a round could never close; lower "
                       "min_clients",
                       f.min_clients, f.clients);
  if (f.algorithm == "fedavg" && f.mu != FederatedConfig{}.mu && f.mu != 0)
    return fmt::format("federated.mu = {} only applies to federated.algorithm = \"fedprox\" (got \"fedavg\")", f.mu);
  return "";
}

std::string lr_problem(const TrainConfig& c) {
  const LrConfig& l = c.lr;
  if (l.scaling != "none" && l.base_batch == 0)
    return fmt::format("lr.scaling = \"{}\" needs lr.base_batch > 0 (the global batch optimizer.lr was tuned "
                       "for); set it, or lr.scaling = \"none\"",
                       l.scaling);
  if (l.warmup_steps > 0 && l.warmup_epochs > 0)
    return fmt::format("lr.warmup_steps = {} and lr.warmup_epochs = {} are both set; set one of them to 0",
                       l.warmup_steps, l.warmup_epochs);
  if (l.decay == "step") {
    if ((l.step_size > 0) == (l.step_epochs > 0))
      return fmt::format("lr.decay = \"step\" needs exactly one of lr.step_size (steps) and lr.step_epochs "
                         "(epochs) > 0 (got {} and {})",
                         l.step_size, l.step_epochs);
  } else if (l.step_size > 0 || l.step_epochs > 0) {
    return fmt::format("lr.step_size / lr.step_epochs only apply to lr.decay = \"step\" (got \"{}\"): set "
                       "lr.decay = \"step\" or both to 0",
                       l.decay);
  }
  if (l.decay != "cosine" && l.min_lr > 0)
    return fmt::format("lr.min_lr = {} only applies to lr.decay = \"cosine\" (got \"{}\"): set lr.decay = "
                       "\"cosine\" or lr.min_lr = 0",
                       l.min_lr, l.decay);
  return "";
}

// elastic.in_job: DDP redoes the failed step from what each survivor holds in
// memory; ZeRO/FSDP roll back to the latest checkpoint, resharded to the
// survivors (train/in_job_rollback.h). Pipeline stages, tensor/context
// parallel pieces and parameter-server shards would need their groups and
// stage assignment rebuilt at a world size the config's parallel.* may not
// divide: restart-based recovery (`paratrain launch --max-restarts`) does
// that. State that is not replicated (PowerSGD's error feedback) or a save
// in flight would not survive either.
std::string in_job_problem(const TrainConfig& c) {
  if (!c.elastic.in_job) return "";
  std::string strategy;
  if (c.ps.servers > 0) strategy = fmt::format("parameter servers (ps.servers = {})", c.ps.servers);
  else if (c.parallel.tp > 1 || c.parallel.pp > 1 || c.parallel.cp > 1)
    strategy = fmt::format("parallel.tp = {}, parallel.pp = {}, parallel.cp = {}", c.parallel.tp, c.parallel.pp,
                           c.parallel.cp);
  if (!strategy.empty())
    return fmt::format("elastic.in_job = true recovers data-parallel runs only (DDP from memory; zero.stage 1-3 "
                       "by rolling back to the latest checkpoint), but this run uses {}: its stages, pieces or "
                       "server shards would need a new layout over the survivors. Use restart-based recovery "
                       "(`paratrain launch --max-restarts N` with train.checkpoint_every_steps) or set "
                       "elastic.in_job = false",
                       strategy);
  if (c.ddp.compression == "powersgd")
    return "elastic.in_job = true with ddp.compression = \"powersgd\": PowerSGD's per-rank error feedback "
           "does not survive re-forming the group; use another ddp.compression or elastic.in_job = false";
  if (c.model.sync_batchnorm)
    return "elastic.in_job = true with model.sync_batchnorm = true: the SyncBatchNorm layers keep the group they "
           "were built on, which a dead rank ends; set model.sync_batchnorm = false or elastic.in_job = false";
  if (c.train.async_checkpoint)
    return "elastic.in_job = true with train.async_checkpoint = true: a background save in flight when a rank "
           "dies cannot be completed by the survivors; set train.async_checkpoint = false";
  return "";
}

}  // namespace

std::string cross_key_problem(const TrainConfig& c) {
  if (std::string problem = lr_problem(c); !problem.empty()) return problem;
  if (std::string problem = layerwise_problem(c); !problem.empty()) return problem;
  if (std::string problem = federated_problem(c); !problem.empty()) return problem;
  // A timeout within two beats would fail healthy ranks whose beat is merely late.
  if (c.world.heartbeat_s > 0 && c.world.heartbeat_timeout_s < 2 * c.world.heartbeat_s)
    return fmt::format(
        "world.heartbeat_timeout_s = {} must be at least twice world.heartbeat_s = {}, or a rank whose beat is "
        "only late would be taken for a stopped one: raise the timeout or beat more often",
        c.world.heartbeat_timeout_s, c.world.heartbeat_s);
  if (std::string problem = in_job_problem(c); !problem.empty()) return problem;
  if (c.optimizer.nesterov && (c.optimizer.kind != "sgd" || c.optimizer.momentum <= 0))
    return fmt::format(
        "optimizer.nesterov = true needs optimizer.kind = \"sgd\" and optimizer.momentum > 0 "
        "(got kind \"{}\", momentum {}): set nesterov = false or use SGD with momentum",
        c.optimizer.kind, c.optimizer.momentum);
  if (c.zero.stage > 0 && c.ddp.mode != "bucketed")
    return fmt::format(
        "zero.stage = {} reduce-scatters gradients through the bucketed reducer, but ddp.mode = \"{}\": "
        "set ddp.mode = \"bucketed\" (the default), or zero.stage = 0 to keep the {} mode",
        c.zero.stage, c.ddp.mode, c.ddp.mode);
  if (c.pipeline.schedule == "interleaved_1f1b" && c.pipeline.virtual_stages < 2)
    return fmt::format("pipeline.schedule = \"interleaved_1f1b\" needs pipeline.virtual_stages >= 2 (got {}); "
                       "set it to 2 or more, or use pipeline.schedule = \"1f1b\"",
                       c.pipeline.virtual_stages);
  if (c.pipeline.schedule != "interleaved_1f1b" && c.pipeline.virtual_stages != 1)
    return fmt::format("pipeline.virtual_stages = {} only applies to pipeline.schedule = \"interleaved_1f1b\" "
                       "(got \"{}\"): set virtual_stages = 1 or schedule = \"interleaved_1f1b\"",
                       c.pipeline.virtual_stages, c.pipeline.schedule);
  if (c.ddp.first_bucket_cap_mb > c.ddp.bucket_cap_mb)
    return fmt::format("ddp.first_bucket_cap_mb ({}) must be <= ddp.bucket_cap_mb ({})",
                       c.ddp.first_bucket_cap_mb, c.ddp.bucket_cap_mb);
  if (c.model.kind == "cnn" && c.data.dataset == "synthetic" &&
      c.data.synthetic_image_size < (int64_t{1} << c.model.channels.size()))
    return fmt::format(
        "model.kind = \"cnn\" with {} conv blocks needs data.synthetic_image_size >= {} (got {})",
        c.model.channels.size(), int64_t{1} << c.model.channels.size(), c.data.synthetic_image_size);
  if (c.parallel.pp > 1 && find_model(c.model.kind))
    return fmt::format("model.kind = \"{}\" is a registered model, which cannot be cut into pipeline stages yet "
                       "(parallel.pp = {}): stage boundary shapes come from the built-in datasets; set "
                       "parallel.pp = 1 (DDP and zero.stage = 1, 2, 3 do apply)",
                       c.model.kind, c.parallel.pp);
  if (auto problem = gpt_problem(c); !problem.empty()) return problem;
  if (auto problem = megatron_problem(c); !problem.empty()) return problem;
  if (c.train.patience > 0 && c.train.monitor.empty())
    return fmt::format("train.patience = {} stops on a monitored metric, but train.monitor is empty: set "
                       "train.monitor (e.g. \"test_loss\"), or train.patience = 0",
                       c.train.patience);
  if (!c.train.monitor.empty() && c.train.eval_every_epochs == 0)
    return fmt::format("train.monitor = \"{}\" is read at evaluations, but train.eval_every_epochs = 0 never "
                       "evaluates: set train.eval_every_epochs >= 1, or train.monitor = \"\"",
                       c.train.monitor);
  if (c.train.monitor == "perplexity" && !builds_gpt(c))
    return fmt::format("train.monitor = \"perplexity\" is logged for language models only (model.kind = \"{}\"): "
                       "monitor \"test_loss\" or \"test_accuracy\"",
                       c.model.kind);
  if (c.model.batchnorm && c.model.kind != "cnn")
    return fmt::format("model.batchnorm = true applies to model.kind = \"cnn\" (got \"{}\"); set "
                       "model.batchnorm = false or use the CNN",
                       c.model.kind);
  if (c.model.sync_batchnorm && !c.model.batchnorm)
    return "model.sync_batchnorm = true converts the model's BatchNorm layers, but model.batchnorm = false: "
           "set model.batchnorm = true (or sync_batchnorm = false)";
  if (c.precision.compute == "fp16" && !at::hasCUDA())
    return "precision.compute = \"fp16\" needs a CUDA build (LibTorch autocasts CPU ops to bf16 only); this "
           "build is CPU-only: use precision.compute = \"bf16\" (no loss scaling needed) or \"fp32\"";
  // fp16/bf16 also compress ZeRO-1/2's all-reduce or reduce-scatter;
  // PowerSGD's factors only fit DDP's all-reduce.
  const bool zero_wire = c.zero.stage == 1 || c.zero.stage == 2;
  if (c.ddp.compression != "none" &&
      ((c.zero.stage != 0 && !(zero_wire && c.ddp.compression != "powersgd")) || c.ddp.mode != "bucketed" || c.parallel.pp != 1 || c.parallel.tp != 1 || c.parallel.cp != 1 ||
       c.ps.servers != 0))
    return fmt::format("ddp.compression = \"{}\" is a comm hook of the bucketed DDP all-reduce (zero.stage = 0, "
                       "or 1-2 for fp16/bf16; ddp.mode = \"bucketed\", parallel.pp = tp = cp = 1, ps.servers = 0); got zero.stage = {}, "
                       "ddp.mode = \"{}\", pp = {}, tp = {}, cp = {}, ps.servers = {}: set ddp.compression = \"none\" "
                       "or change those keys",
                       c.ddp.compression, c.zero.stage, c.ddp.mode, c.parallel.pp, c.parallel.tp, c.parallel.cp,
                       c.ps.servers);
  if (c.ddp.compression != "none" && c.precision.comm_dtype != "fp32" && c.ddp.compression != c.precision.comm_dtype)
    return fmt::format("ddp.compression = \"{}\" and precision.comm_dtype = \"{}\" both choose the gradient wire "
                       "format: keep one (precision.comm_dtype = \"fp32\", or ddp.compression = \"none\")",
                       c.ddp.compression, c.precision.comm_dtype);
  if (c.precision.comm_dtype != "fp32" &&
      ((c.zero.stage != 0 && !zero_wire) || c.ddp.mode != "bucketed" || c.parallel.pp != 1 || c.parallel.tp != 1 || c.parallel.cp != 1))
    return fmt::format("precision.comm_dtype = \"{}\" compresses the bucketed DDP and ZeRO-1/2 gradient collectives "
                       "only (zero.stage = 0, 1 or 2, ddp.mode = \"bucketed\", parallel.pp = tp = cp = 1); got zero.stage = {}, ddp.mode = \"{}\", "
                       "pp = {}, tp = {}, cp = {}: set precision.comm_dtype = \"fp32\" or change those keys",
                       c.precision.comm_dtype, c.zero.stage, c.ddp.mode, c.parallel.pp, c.parallel.tp, c.parallel.cp);
  if (auto problem = ps_problem(c); !problem.empty()) return problem;
  if (c.data.dataset == "fashion_mnist" && c.data.dir.empty())
    return "data.dir must name the folder with Fashion-MNIST's *-ubyte.gz files";
  return "";
}

}  // namespace paratrain::train::detail
