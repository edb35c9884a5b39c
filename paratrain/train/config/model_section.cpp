// The schema rows and cross-key rules of [model] and [data] (model_section.h).
#include "paratrain/train/config/model_section.h"

#include <cmath>

#include <fmt/format.h>

#include "paratrain/train/config/config_ranges.h"
#include "paratrain/train/config/config_schema.h"
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
  // A registered model (a program's) may read token windows too.
  if (text && (c.model.kind == "mlp" || c.model.kind == "cnn"))
    return fmt::format("data.dataset = \"text\" gives token windows, which model.kind = \"gpt\" or a program's "
                       "registered model reads, not \"{}\"",
                       c.model.kind);
  if (!gpt) {
    if (c.model.moe_experts > 0)
      return fmt::format("model.moe_experts = {} makes the GPT's MLPs mixtures of experts; model.kind = \"{}\" has "
                         "none: set model.moe_experts = 0",
                         c.model.moe_experts, c.model.kind);
    return "";
  }
  if (c.model.moe_experts > 0) {
    if (c.model.moe_top_k > c.model.moe_experts)
      return fmt::format("model.moe_top_k = {} exceeds model.moe_experts = {}", c.model.moe_top_k,
                         c.model.moe_experts);
    if (c.model.moe_every > c.model.layers)
      return fmt::format("model.moe_every = {} with model.layers = {}: no block would be a MoE layer; set "
                         "model.moe_every <= model.layers",
                         c.model.moe_every, c.model.layers);
    // What the MoE blocks' routing over the dp group and their aux loss do
    // not survive yet: a model rebuilt mid-run (adaptive freezing) or a
    // replaced dp group (in-job recovery), weighted shares and a reduction
    // that does not average (the aux gradient assumes the dp mean), fake
    // quantization. (Activation checkpointing works: the recompute sees the
    // micro-batch's loss weight again and counts its routing once.)
    if (c.freeze.adaptive || c.elastic.in_job || !c.data.batch_shares.empty() || c.ddp.mode == "none" ||
        c.quant.qat)
      return fmt::format("model.moe_experts = {} with freeze.adaptive = {}, elastic.in_job = {}, data.batch_shares "
                         "set = {}, ddp.mode = \"{}\" or quant.qat = {}: the mixture-of-experts GPT does not train "
                         "under these yet (docs/moe.md, Limits); turn them off",
                         c.model.moe_experts, c.freeze.adaptive, c.elastic.in_job, !c.data.batch_shares.empty(),
                         c.ddp.mode, c.quant.qat);
    // Under tensor parallelism the MoE layers are replicated over tp (the
    // plan splits the rest, models/parallel_gpt.h); Megatron-SP and cp
    // would hand them a sequence chunk, whose routing is not the whole
    // batch's. In pipeline stages (the pipeline strategy, or the megatron
    // strategy's stages with ZeRO or tp) each MoE layer gives its aux loss
    // its gradient itself (Note [Aux losses in backward]).
    if (c.parallel.cp > 1 || c.ps.servers > 0 || c.parallel.megatron_sp)
      return fmt::format("model.moe_experts with parallel.cp = {}, megatron_sp = {} or ps.servers = {}: "
                         "mixture-of-experts GPTs train under data parallelism (DDP, ZeRO-1/2/3; experts split over "
                         "parallel.ep), tensor parallelism (parallel.tp, MoE layers replicated over tp) and "
                         "pipeline stages (parallel.pp) for now; set those to 1 (megatron_sp = false, "
                         "ps.servers = 0)",
                         c.parallel.cp, c.parallel.megatron_sp, c.ps.servers);
  }
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

// data.batch_shares weights each dp rank's gradient by its share of the
// global batch (train/loop, Note [Weighted shares]): DDP, ZeRO and FSDP.
std::string shares_problem(const TrainConfig& c) {
  if (c.data.batch_shares.empty()) return "";
  const std::string shares = c.data.auto_shares() ? "\"auto\"" : fmt::format("[{}]", fmt::join(c.data.batch_shares, ", "));
  if (c.parallel.tp > 1 || c.parallel.cp > 1)
    return fmt::format("data.batch_shares = {} with parallel.tp = {}, parallel.cp = {}: the ranks of a tensor- or "
                       "context-parallel group compute one batch together and need equal shares; weighted shares "
                       "apply to DDP, ZeRO and FSDP (parallel.tp = parallel.cp = parallel.pp = 1)",
                       shares, c.parallel.tp, c.parallel.cp);
  if (c.parallel.pp > 1)
    return fmt::format("data.batch_shares = {} with parallel.pp = {}: pipeline replicas cannot weight their shares "
                       "yet; for stages on ranks of different speeds set pipeline.balance = \"rank_speed\"",
                       shares, c.parallel.pp);
  if (c.ps.servers > 0)
    return fmt::format("data.batch_shares = {} with ps.servers = {}: parameter servers balance by themselves (ps.mode "
                       "= \"async\" gives fast workers more steps); leave data.batch_shares empty",
                       shares, c.ps.servers);
  if (c.data.auto_shares() && c.world.device != "cpu")
    return fmt::format("data.batch_shares = \"auto\" with world.device = \"{}\": the shares are measured from host "
                       "threads' time (on a GPU backward and its collectives run on other threads, and kernels "
                       "asynchronously); give a static list of shares, e.g. [2, 1]",
                       c.world.device);
  if (c.elastic.in_job)
    return fmt::format("data.batch_shares = {} with elastic.in_job = true: in-job recovery re-cuts the batch over the "
                       "survivors with equal shares; restart-based elastic training (elastic.in_job = false) works: "
                       "\"auto\" re-measures, a list that does not fit the new size falls back to equal shares",
                       shares);
  return "";
}

}  // namespace

std::vector<FieldSpec> model_fields() {
  using TC = TrainConfig;
  return {
      field("model.kind", &TC::model, &ModelConfig::kind, "\"mlp\", \"cnn\" or \"gpt\" (gpt needs data.dataset = \"text\"), or a name the program registered (register_model)", one_of_now(&model_kinds)),
      field("model.hidden", &TC::model, &ModelConfig::hidden, "MLP hidden layer widths", widths(0)),
      field("model.channels", &TC::model, &ModelConfig::channels, "CNN channels per conv block", widths(1)),
      field("model.cnn_hidden", &TC::model, &ModelConfig::cnn_hidden, "CNN fully connected width", in_range<int64_t>(1, kMaxWidth)),
      field("model.layers", &TC::model, &ModelConfig::layers, "GPT decoder blocks", in_range<int64_t>(1, 1024)),
      field("model.d_model", &TC::model, &ModelConfig::d_model, "GPT width (a multiple of model.heads)", in_range<int64_t>(1, kMaxWidth)),
      field("model.heads", &TC::model, &ModelConfig::heads, "GPT attention heads", in_range<int64_t>(1, kMaxWidth)),
      field("model.seq_len", &TC::model, &ModelConfig::seq_len, "GPT context length in tokens", in_range<int64_t>(1, kMaxWidth)),
      field("model.dropout", &TC::model, &ModelConfig::dropout, "GPT dropout on embeddings, attention and residuals", in_range_finite(0.0, 0.999)),
      field("model.moe_experts", &TC::model, &ModelConfig::moe_experts, "GPT: experts per mixture-of-experts MLP (0 = dense)", in_range<int64_t>(0, 4096)),
      field("model.moe_top_k", &TC::model, &ModelConfig::moe_top_k, "GPT: experts per token, 1 (Switch) or 2 (GShard)", in_range<int64_t>(1, 2)),
      field("model.moe_capacity_factor", &TC::model, &ModelConfig::moe_capacity_factor, "GPT: each expert takes at most ceil(factor * top_k * tokens / experts) of a micro-batch's tokens (over the dp group); the rest are dropped (the residual carries them)", in_range_finite(1e-3, 1e3)),
      field("model.moe_every", &TC::model, &ModelConfig::moe_every, "GPT: every n-th block's MLP is a MoE layer", in_range<int64_t>(1, 1024)),
      field("model.moe_aux_loss", &TC::model, &ModelConfig::moe_aux_loss, "GPT: weight of the load-balancing loss (Switch, GShard) in the training loss, its gradient given inside each MoE layer (the logged loss is the task's; the aux losses are in the moe records)", in_range_finite(0.0, 1e3)),
      field("model.batchnorm", &TC::model, &ModelConfig::batchnorm, "CNN: BatchNorm2d after each conv"),
      field("model.sync_batchnorm", &TC::model, &ModelConfig::sync_batchnorm, "BatchNorm statistics over the whole dp batch (needs batchnorm = true)"),
  };
}

std::vector<FieldSpec> data_fields() {
  using TC = TrainConfig;
  const Check<std::vector<double>> shares = [](const std::vector<double>& v) -> std::string {
    if (v == kAutoShares) return "";
    if (v.size() > static_cast<size_t>(kMaxRanks)) return fmt::format("at most {} entries", kMaxRanks);
    for (double w : v)
      if (!(w > 0) || !std::isfinite(w) || w > 1e9) return "every share must be a positive number (relative: [2, 1, 1]), or \"auto\"";
    return "";
  };
  FieldSpec batch_shares = field("data.batch_shares", &TC::data, &DataConfig::batch_shares, "each dp rank's relative share of every global batch, e.g. [2, 1, 1] (a rank half as fast gets half), \"auto\" (measured and rebalanced), or [] (equal)", shares);
  batch_shares.keyword = "auto";
  batch_shares.keyword_value = kAutoShares;
  return {
      field("data.dataset", &TC::data, &DataConfig::dataset, "\"fashion_mnist\", \"synthetic\" or \"text\", or a name the program registered (register_dataset)", one_of_now(&dataset_names)),
      field("data.dir", &TC::data, &DataConfig::dir, "folder of the *-ubyte.gz files"),
      field("data.path", &TC::data, &DataConfig::path, "text: a file or folder of text files (byte tokens, the last 5% for validation)"),
      field("data.batch_size", &TC::data, &DataConfig::batch_size, "examples per rank per micro-batch (global = batch_size * dp * train.accumulate)", in_range<int64_t>(1, kMaxCount)),
      field("data.global_batch_size", &TC::data, &DataConfig::global_batch_size, "examples per optimizer step over all ranks (0 = batch_size * dp * train.accumulate); overrides batch_size", in_range<int64_t>(0, kMaxCount)),
      field("data.shuffle", &TC::data, &DataConfig::shuffle, "reshuffle the training set every epoch"),
      field("data.drop_last", &TC::data, &DataConfig::drop_last, "drop the last incomplete batch"),
      field("data.prefetch", &TC::data, &DataConfig::prefetch, "batches prepared ahead (0 = none)", in_range<int64_t>(0, 1024)),
      batch_shares,
      field("data.rebalance_every_steps", &TC::data, &DataConfig::rebalance_every_steps, "batch_shares = \"auto\": steps each measurement of the ranks' speeds covers", in_range<int64_t>(1, kMaxCount)),
      field("data.rebalance_max_change", &TC::data, &DataConfig::rebalance_max_change, "batch_shares = \"auto\": the most a rank's share moves per rebalance, as a fraction of it", in_range_finite(0.01, 1.0)),
      field("data.synthetic_train_size", &TC::data, &DataConfig::synthetic_train_size, "synthetic training examples", in_range<int64_t>(1, kMaxCount)),
      field("data.synthetic_test_size", &TC::data, &DataConfig::synthetic_test_size, "synthetic test examples", in_range<int64_t>(0, kMaxCount)),
      field("data.synthetic_channels", &TC::data, &DataConfig::synthetic_channels, "synthetic image channels", in_range<int64_t>(1, kMaxWidth)),
      field("data.synthetic_image_size", &TC::data, &DataConfig::synthetic_image_size, "synthetic image height = width", in_range<int64_t>(1, kMaxWidth)),
      field("data.synthetic_classes", &TC::data, &DataConfig::synthetic_classes, "synthetic label classes", in_range<int64_t>(2, kMaxWidth)),
  };
}

std::string model_problem(const TrainConfig& c) {
  if (c.model.kind == "cnn" && c.data.dataset == "synthetic" &&
      c.data.synthetic_image_size < (int64_t{1} << c.model.channels.size()))
    return fmt::format(
        "model.kind = \"cnn\" with {} conv blocks needs data.synthetic_image_size >= {} (got {})",
        c.model.channels.size(), int64_t{1} << c.model.channels.size(), c.data.synthetic_image_size);
  if (auto problem = gpt_problem(c); !problem.empty()) return problem;
  if (c.model.batchnorm && c.model.kind != "cnn")
    return fmt::format("model.batchnorm = true applies to model.kind = \"cnn\" (got \"{}\"); set "
                       "model.batchnorm = false or use the CNN",
                       c.model.kind);
  if (c.model.sync_batchnorm && !c.model.batchnorm)
    return "model.sync_batchnorm = true converts the model's BatchNorm layers, but model.batchnorm = false: "
           "set model.batchnorm = true (or sync_batchnorm = false)";
  if (c.data.dataset == "fashion_mnist" && c.data.dir.empty())
    return "data.dir must name the folder with Fashion-MNIST's *-ubyte.gz files";
  return shares_problem(c);
}

}  // namespace paratrain::train::detail
