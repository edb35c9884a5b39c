// The schema rows and cross-key rules of [ddp], [parallel], [zero] and [pipeline] (parallel_section.h).
#include "paratrain/train/config/parallel_section.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"

namespace paratrain::train::detail {
namespace {

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
  if (builds_gpt(c) && !p.tp_plan.empty())
    return "parallel.tp_plan is for models other than the GPT, whose plan is built in (models/parallel_gpt.h, "
           "gpt_tp_plan): leave parallel.tp_plan empty for model.kind = \"gpt\"";
  // A GPT with stages and ZeRO runs on the megatron strategy at tp = cp = 1
  // too (train::strategy_name), under the same rules.
  const bool gpt_stages_zero = builds_gpt(c) && p.pp > 1 && c.zero.stage > 0;
  if (p.tp == 1 && p.cp == 1 && !gpt_stages_zero) return "";
  if (p.pp > 1 && c.pipeline.balance == "rank_speed")
    return fmt::format("pipeline.balance = \"rank_speed\" with parallel.tp = {}, parallel.cp = {}, zero.stage = {}: "
                       "the GPT's megatron strategy cuts its stages by parameters (or pipeline.split); rank_speed "
                       "applies to the pipeline strategy (parallel.tp = parallel.cp = 1, zero.stage = 0)",
                       p.tp, p.cp, c.zero.stage);
  if (!builds_gpt(c)) {
    if (p.cp > 1)
      return fmt::format("parallel.cp = {} splits the sequence over a ring of ranks, which needs ring attention "
                         "inside the model: only model.kind = \"gpt\" has it (got \"{}\"); set parallel.cp = 1",
                         p.cp, c.model.kind);
    if (p.tp_plan.empty())
      return fmt::format("parallel.tp = {} splits the layers of model.kind = \"{}\" by a plan: set "
                         "parallel.tp_plan, e.g. [\"fc0=colwise\", \"fc1=rowwise\"] (docs/tensor-parallel-plans.md)",
                         p.tp, c.model.kind);
    if (p.pp > 1)
      return fmt::format("parallel.tp = {} with parallel.pp = {} for model.kind = \"{}\": tensor times pipeline "
                         "parallelism runs the GPT only; use one of them for a planned model",
                         p.tp, p.pp, c.model.kind);
  }
  constexpr int64_t kVocab = 256;  // byte tokens (train/config/config_model.cpp)
  if (builds_gpt(c) && c.model.heads % p.tp != 0)
    return fmt::format("model.heads ({}) is not divisible by parallel.tp ({}): each tensor-parallel rank computes "
                       "heads / tp whole heads; pick a tp that divides {}",
                       c.model.heads, p.tp, c.model.heads);
  if (builds_gpt(c) && kVocab % p.tp != 0)
    return fmt::format("the vocabulary ({} byte tokens) is not divisible by parallel.tp ({}): each rank holds "
                       "vocab / tp embedding rows; use a power of two for tp",
                       kVocab, p.tp);
  if (builds_gpt(c) && c.model.seq_len % p.cp != 0)
    return fmt::format("model.seq_len ({}) is not divisible by parallel.cp ({}): ring attention gives each cp rank "
                       "an equal chunk of the sequence; pick a cp that divides {}",
                       c.model.seq_len, p.cp, c.model.seq_len);
  if (builds_gpt(c) && p.megatron_sp && (c.model.seq_len / p.cp) % p.tp != 0)
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
  // FSDP shards each tp rank's module over its replicas (Note [FSDP over
  // tensor-parallel shards] in strategies/replica_sync.cpp), not a stage's
  // chunks (parallel.ep with ZeRO-3 is refused for every strategy).
  if (c.zero.stage == 3 && p.pp > 1)
    return fmt::format("zero.stage = 3 with parallel.pp = {} (parallel.tp = {}, parallel.cp = {}): FSDP would "
                       "gather a stage's units again for every micro-batch, and the tied embedding's stage copies "
                       "are summed as whole gradients; set zero.stage = 1 (the optimizer state sharded inside the "
                       "stages), or parallel.pp = 1",
                       p.pp, p.tp, p.cp);
  // ZeRO-2 keeps only this rank's piece of each reduced gradient, but the
  // tied embedding's copies (pp) are summed as whole tensors after the
  // reduction, and their stages cut different pieces; ZeRO-1 keeps them
  // whole. (Megatron-SP's gradients are summed over tp piece by piece: every
  // tp rank cuts the same pieces.)
  if (c.zero.stage == 2 && p.pp > 1)
    return fmt::format("zero.stage = 2 with parallel.pp = {} (parallel.megatron_sp = {}, parallel.tp = {}, "
                       "parallel.cp = {}): the tied embedding's stage copies are summed as whole tensors after the "
                       "data-parallel reduction, which ZeRO-2 frees; set zero.stage = 1, or parallel.pp = 1",
                       p.pp, p.megatron_sp, p.tp, p.cp);
  if (c.ddp.mode != "bucketed")
    return fmt::format("ddp.mode = \"{}\" with parallel.tp = {} / parallel.cp = {}: the megatron strategy "
                       "reduces gradients with the bucketed reducer; set ddp.mode = \"bucketed\"",
                       c.ddp.mode, p.tp, p.cp);
  return "";
}

// zero.offload = "cpu": the zero strategy's optimizer moves to host memory,
// which only means something when training runs on a GPU.
std::string offload_problem(const TrainConfig& c) {
  if (c.zero.offload == "none") return "";
  if (c.zero.stage == 0)
    return fmt::format("zero.offload = \"{}\" moves ZeRO's sharded optimizer state to host memory, but zero.stage = 0 "
                       "(DDP) shards nothing: set zero.stage = 1, 2 or 3, or zero.offload = \"none\"",
                       c.zero.offload);
  if (c.parallel.pp > 1 || c.parallel.tp > 1 || c.parallel.cp > 1 || c.ps.servers > 0)
    return fmt::format("zero.offload = \"{}\" applies to data parallelism with ZeRO-1/2/3 (parallel.pp = tp = cp = 1, "
                       "ps.servers = 0); got pp = {}, tp = {}, cp = {}, ps.servers = {}: set zero.offload = \"none\"",
                       c.zero.offload, c.parallel.pp, c.parallel.tp, c.parallel.cp, c.ps.servers);
  if (!at::hasCUDA())
    return fmt::format("zero.offload = \"{}\" moves optimizer state from a GPU to host memory, and this paratrain is "
                       "built against a CPU-only LibTorch (Debian's libtorch-dev), where it already lives in host "
                       "memory: set zero.offload = \"none\", or build with scripts/cuda-build.sh on a GPU machine",
                       c.zero.offload);
  if (c.world.device == "cpu")
    return fmt::format("zero.offload = \"{}\" moves optimizer state from the GPU to host memory, but world.device = "
                       "\"cpu\" trains in host memory already: set world.device = \"cuda\", or zero.offload = \"none\"",
                       c.zero.offload);
  return "";
}

// parallel.ep > 1: the data-parallel strategies split the experts
// (moe/expert_parallel.h); what they do not combine with yet is refused.
// ep dividing dp is checked where the world is known.
std::string expert_parallel_problem(const TrainConfig& c) {
  const auto& p = c.parallel;
  if (p.ep == 1) return "";
  if (builds_gpt(c) && c.model.moe_experts == 0)
    return fmt::format("parallel.ep = {} splits the experts of mixture-of-experts layers, but model.moe_experts = 0 "
                       "(a dense GPT): set model.moe_experts (e.g. 8), or parallel.ep = 1",
                       p.ep);
  if (builds_gpt(c) && c.model.moe_experts % p.ep != 0)
    return fmt::format("parallel.ep = {} does not divide model.moe_experts = {}: each ep rank holds experts / ep "
                       "experts; pick ep dividing the experts",
                       p.ep, c.model.moe_experts);
  if (p.dp > 0 && p.dp % p.ep != 0)
    return fmt::format("parallel.ep = {} does not divide parallel.dp = {}: ep groups sit inside the data-parallel "
                       "group; pick ep dividing dp",
                       p.ep, p.dp);
  if (c.model.kind == "mlp" || c.model.kind == "cnn")
    return fmt::format("parallel.ep = {} splits the experts of mixture-of-experts layers, and model.kind = \"{}\" has "
                       "none: set parallel.ep = 1 (or train the GPT with model.moe_experts)",
                       p.ep, c.model.kind);
  if (c.elastic.in_job)
    return fmt::format("parallel.ep = {} with elastic.in_job = true: in-job recovery replaces the data-parallel group "
                       "the experts were split over; set elastic.in_job = false (restarts resume from checkpoints "
                       "at any ep)",
                       p.ep);
  if (p.cp > 1 || c.ps.servers > 0)
    return fmt::format("parallel.ep = {} with parallel.cp = {} or ps.servers = {}: expert parallelism runs inside "
                       "data parallelism (DDP, ZeRO-1/2), in pipeline stages and beside tensor parallelism for now; "
                       "set parallel.cp = 1 (and ps.servers = 0)",
                       p.ep, p.cp, c.ps.servers);
  // The GPT's stages with ZeRO are the megatron strategy's, which keeps the
  // experts beside ZeRO's pieces; a program's model in stages is the
  // pipeline strategy's, whose ZeRO would shard them as dense tensors.
  if (p.pp > 1 && c.zero.stage > 0 && !builds_gpt(c))
    return fmt::format("parallel.ep = {} with parallel.pp = {} and zero.stage = {} for model.kind = \"{}\": in "
                       "pipeline stages the experts sit beside ZeRO's shards for the GPT only; set zero.stage = 0 "
                       "(DDP over each stage's replicas)",
                       p.ep, p.pp, c.zero.stage, c.model.kind);
  if (p.tp > 1 && !builds_gpt(c))
    return fmt::format("parallel.ep = {} with parallel.tp = {} for model.kind = \"{}\": beside tensor parallelism "
                       "experts are split for the GPT's MoE layers only; set parallel.ep = 1 (or parallel.tp = 1)",
                       p.ep, p.tp, c.model.kind);
  if (c.zero.stage == 3 || c.zero.offload != "none")
    return fmt::format("parallel.ep = {} with zero.stage = {}, zero.offload = \"{}\": experts are whole tensors each "
                       "ep rank steps itself, beside ZeRO-1/2's shards of the rest; use zero.stage 0, 1 or 2 without "
                       "offload",
                       p.ep, c.zero.stage, c.zero.offload);
  if (c.zero.stage > 0 && (c.optimizer.kind == "lars" || c.optimizer.kind == "lamb"))
    return fmt::format("parallel.ep = {} with optimizer.kind = \"{}\" and zero.stage = {}: the per-tensor norms of "
                       "ZeRO's shards do not cover the whole experts beside them yet; use zero.stage = 0 or another "
                       "optimizer",
                       p.ep, c.optimizer.kind, c.zero.stage);
  if (c.ddp.mode != "bucketed")
    return fmt::format("parallel.ep = {} with ddp.mode = \"{}\": the dense part's gradients go through the bucketed "
                       "reducer beside the experts'; set ddp.mode = \"bucketed\"",
                       p.ep, c.ddp.mode);
  return "";
}

}  // namespace

std::vector<FieldSpec> ddp_fields() {
  using TC = TrainConfig;
  return {
      field("ddp.mode", &TC::ddp, &DdpConfig::mode, "\"bucketed\", \"naive\" or \"none\"", one_of({"bucketed", "naive", "none"})),
      field("ddp.bucket_cap_mb", &TC::ddp, &DdpConfig::bucket_cap_mb, "gradient bucket size (MiB)", in_range_finite(kMinBucketMiB, kMaxBucketMiB, "MiB: 1 byte to 1 TiB")),
      field("ddp.first_bucket_cap_mb", &TC::ddp, &DdpConfig::first_bucket_cap_mb, "first bucket size (MiB): small so its all-reduce starts early", in_range_finite(kMinBucketMiB, kMaxBucketMiB, "MiB: 1 byte to 1 TiB")),
      field("ddp.find_unused_parameters", &TC::ddp, &DdpConfig::find_unused_parameters, "tolerate parameters without gradients"),
      field("ddp.broadcast_buffers", &TC::ddp, &DdpConfig::broadcast_buffers, "copy rank 0's buffers before each forward"),
      field("ddp.compression", &TC::ddp, &DdpConfig::compression, "gradient compression of the bucketed all-reduce: \"none\", \"fp16\" / \"bf16\" (16-bit wire, fp32 sums; also ZeRO-1/2's all-reduce / reduce-scatter), \"int8\" (int8 blocks with fp32 scales, fp32 sums, error feedback saved in checkpoints; also ZeRO-1/2) or \"powersgd\" (rank-r factors, error feedback; DDP only)", one_of({"none", "fp16", "bf16", "int8", "powersgd"})),
      field("ddp.powersgd_rank", &TC::ddp, &DdpConfig::powersgd_rank, "PowerSGD: columns of the factors each gradient matrix is sent as (higher: closer to exact, more bytes)", at_least<int64_t>(1)),
      field("ddp.powersgd_start_step", &TC::ddp, &DdpConfig::powersgd_start_step, "PowerSGD: synchronized steps sent uncompressed before compression starts (PyTorch suggests ~10% of training)", at_least<int64_t>(0)),
  };
}

namespace {

// Each entry of parallel.tp_plan: "PATTERN=STYLE" with a style the plan parses.
Check<std::vector<std::string>> tp_plan_entries() {
  return [](const std::vector<std::string>& entries) -> std::string {
    for (const auto& entry : entries) {
      const size_t eq = entry.find('=');  // a style's own '=' (parts=3) comes after
      if (eq == std::string::npos || eq == 0 || eq + 1 == entry.size())
        return fmt::format("entry \"{}\" must be PATTERN=STYLE, e.g. \"blocks.*.mlp.fc=colwise\"", entry);
      try {
        parallelize::StyleSpec::parse(std::string_view(entry).substr(eq + 1));
      } catch (const ConfigError& e) {
        return e.what();
      }
    }
    return "";
  };
}

}  // namespace

std::vector<FieldSpec> parallel_fields() {
  using TC = TrainConfig;
  return {
      field("parallel.dp", &TC::parallel, &ParallelConfig::dp, "data-parallel size (0 = world / (tp * pp * cp))", in_range<int64_t>(0, kMaxRanks)),
      field("parallel.tp", &TC::parallel, &ParallelConfig::tp, "tensor-parallel size", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.pp", &TC::parallel, &ParallelConfig::pp, "pipeline-parallel stages", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.cp", &TC::parallel, &ParallelConfig::cp, "context (sequence) parallel size: ring self-attention over cp ranks (GPT)", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.ep", &TC::parallel, &ParallelConfig::ep, "expert-parallel size: the MoE layers' experts split over groups of ep data-parallel ranks (of each pipeline stage's replicas with parallel.pp), tokens routed by all-to-all (divides dp and model.moe_experts)", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.megatron_sp", &TC::parallel, &ParallelConfig::megatron_sp, "Megatron sequence parallelism inside the tp group (needs parallel.tp > 1; the GPT, or a plan naming its norms sequence_parallel)"),
      table_of_strings(field("parallel.tp_plan", &TC::parallel, &ParallelConfig::tp_plan, "tensor-parallel plan of a model other than the GPT: \"PATTERN=STYLE\" entries or a [parallel.tp_plan] table; styles colwise, colwise[parts=N], colwise[gather], rowwise, vocab_embedding, sequence_parallel, replicate", tp_plan_entries())),
  };
}

std::vector<FieldSpec> zero_fields() {
  using TC = TrainConfig;
  return {
      field("zero.stage", &TC::zero, &ZeroConfig::stage, "0 = DDP, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters (FSDP)", in_range<int64_t>(0, 3)),
      field("zero.unit_min_params", &TC::zero, &ZeroConfig::unit_min_params, "stage 3: parameter elements per wrapping unit", in_range<int64_t>(1, kMaxCount)),
      field("zero.unit_modules", &TC::zero, &ZeroConfig::unit_modules, "stage 3: comma-separated child modules, one unit each (overrides unit_min_params)", module_list()),
      field("zero.reshard_after_forward", &TC::zero, &ZeroConfig::reshard_after_forward, "stage 3: free gathered parameters between forward and backward"),
      field("zero.prefetch", &TC::zero, &ZeroConfig::prefetch, "stage 3: gather the next unit while this one computes"),
      field("zero.offload", &TC::zero, &ZeroConfig::offload, "\"none\" or \"cpu\": stages 1-3 keep the optimizer state and run its step in host memory, for GPU training (ZeRO-Offload: shard gradients copied down, stepped pieces sent back up; needs a CUDA build and world.device = \"cuda\")", one_of({"none", "cpu"})),
  };
}

std::vector<FieldSpec> pipeline_fields() {
  using TC = TrainConfig;
  return {
      field("pipeline.schedule", &TC::pipeline, &PipelineConfig::schedule, "\"gpipe\", \"1f1b\" or \"interleaved_1f1b\"", one_of({"gpipe", "1f1b", "interleaved_1f1b"})),
      field("pipeline.microbatches", &TC::pipeline, &PipelineConfig::microbatches, "micro-batches per step (divides the per-replica batch)", in_range<int64_t>(1, kMaxCount)),
      field("pipeline.virtual_stages", &TC::pipeline, &PipelineConfig::virtual_stages, "model chunks per rank (interleaved_1f1b: >= 2)", in_range<int64_t>(1, 1024)),
      field("pipeline.split", &TC::pipeline, &PipelineConfig::split, "layers per chunk, e.g. [5, 3] (empty = balanced)", widths(0)),
      field("pipeline.balance", &TC::pipeline, &PipelineConfig::balance, "\"parameters\", \"time\" (measured layer times) or \"rank_speed\" (layer times, each stage weighted by its ranks' measured speed): how an empty split balances chunks", one_of({"parameters", "time", "rank_speed"})),
      field("pipeline.checkpoint_activations", &TC::pipeline, &PipelineConfig::checkpoint_activations, "recompute each chunk's forward during backward"),
      field("pipeline.trace_steps", &TC::pipeline, &PipelineConfig::trace_steps, "steps recorded for `paratrain trace` (0 = none)", in_range<int64_t>(0, kMaxCount)),
  };
}

std::string parallel_problem(const TrainConfig& c) {
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
  if (auto problem = expert_parallel_problem(c); !problem.empty()) return problem;
  if (auto problem = megatron_problem(c); !problem.empty()) return problem;
  if (auto problem = offload_problem(c); !problem.empty()) return problem;
  // fp16/bf16 also compress ZeRO-1/2's all-reduce or reduce-scatter;
  // PowerSGD's factors only fit DDP's all-reduce.
  const bool zero_wire = c.zero.stage == 1 || c.zero.stage == 2;
  if (c.ddp.compression != "none" &&
      ((c.zero.stage != 0 && !(zero_wire && c.ddp.compression != "powersgd")) || c.ddp.mode != "bucketed" ||
       c.parallel.pp != 1 || c.parallel.tp != 1 || c.parallel.cp != 1 || c.ps.servers != 0))
    return fmt::format("ddp.compression = \"{}\" is a comm hook of the bucketed DDP all-reduce (zero.stage = 0, "
                       "or 1-2 for fp16/bf16/int8; ddp.mode = \"bucketed\", parallel.pp = tp = cp = 1, ps.servers = 0); "
                       "got zero.stage = {}, ddp.mode = \"{}\", pp = {}, tp = {}, cp = {}, ps.servers = {}: set "
                       "ddp.compression = \"none\" or change those keys",
                       c.ddp.compression, c.zero.stage, c.ddp.mode, c.parallel.pp, c.parallel.tp, c.parallel.cp,
                       c.ps.servers);
  if (c.ddp.compression == "int8" && c.precision.loss_scale == "dynamic")
    return "ddp.compression = \"int8\" with precision.loss_scale = \"dynamic\": the wire's error feedback keeps "
           "residuals in loss-scaled units, which a changing scale would re-inject at the wrong size; use a static "
           "loss scale (a number), bf16 compute without loss scaling, or another ddp.compression";
  if (c.ddp.compression != "none" && c.precision.comm_dtype != "fp32" && c.ddp.compression != c.precision.comm_dtype)
    return fmt::format("ddp.compression = \"{}\" and precision.comm_dtype = \"{}\" both choose the gradient wire "
                       "format: keep one (precision.comm_dtype = \"fp32\", or ddp.compression = \"none\")",
                       c.ddp.compression, c.precision.comm_dtype);
  return "";
}

}  // namespace paratrain::train::detail
