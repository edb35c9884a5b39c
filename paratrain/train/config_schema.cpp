// The schema table of TrainConfig: every key, its type, its doc line and its
// range check, in one place. Adding a key = a field in config.h + one line in
// schema() below. Parsing and printing (config.cpp) only walk this table.
#include "paratrain/train/config_schema.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <type_traits>

#include <ATen/Context.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config_ranges.h"
#include "paratrain/train/registry.h"

namespace paratrain::train::detail {
namespace {

template <class T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, int64_t>) return ValueType::Int;
  else if constexpr (std::is_same_v<T, double>) return ValueType::Double;
  else if constexpr (std::is_same_v<T, bool>) return ValueType::Bool;
  else if constexpr (std::is_same_v<T, std::string>) return ValueType::String;
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) return ValueType::IntList;
  else {
    static_assert(std::is_same_v<T, std::vector<double>>, "unsupported config field type");
    return ValueType::DoubleList;
  }
}

// One schema row from pointers to the section and to the member in it.
template <class S, class T>
FieldSpec field(std::string key, S TrainConfig::*section, T S::*member, std::string doc,
                Check<T> check = {}) {
  FieldSpec f;
  f.key = std::move(key);
  f.type = value_type_of<T>();
  f.doc = std::move(doc);
  f.get = [section, member](const TrainConfig& c) { return Value((c.*section).*member); };
  f.set = [section, member](TrainConfig& c, const Value& v) { (c.*section).*member = std::get<T>(v); };
  f.check = [check](const Value& v) { return check ? check(std::get<T>(v)) : std::string(); };
  return f;
}

// ---- range checks (the numeric ones are in config_ranges.h): each returns ""
// when fine, else the rule that was broken.

// Note [Numeric bounds]
// Every numeric key has an upper bound, so no value that passes validation
// can overflow where the code converts it: a bucket cap in MiB becomes an
// int64 byte count (<= 1 TiB keeps it far inside), a timeout in seconds
// becomes milliseconds in 32-bit APIs (poll, Gloo; <= 7 days = 6.0e8 ms),
// and counts multiply with each other (batch x dp, width x width). The
// bounds are far above any run this library can do, not tuning advice.
constexpr int64_t kMaxCount = int64_t{1} << 40;       // steps, epochs, examples (a seed is never multiplied)
constexpr int64_t kMaxWidth = int64_t{1} << 24;       // a layer width or channel count
constexpr int64_t kMaxRanks = int64_t{1} << 20;       // one parallel axis
constexpr int64_t kMaxTimeoutS = 7 * 24 * 3600;       // 7 days
constexpr double kMaxBucketMiB = 1024.0 * 1024.0;     // 1 TiB
constexpr double kMinBucketMiB = 1.0 / (1024 * 1024);  // 1 byte

// A child-module name list for zero.unit_modules: "" or comma-separated
// names of letters, digits and '_' (LibTorch's register_module names: "fc0",
// or "0" inside a Sequential), spaces around commas allowed, no repeats.
Check<std::string> module_list() {
  return [](const std::string& v) -> std::string {
    std::vector<std::string> seen;
    size_t begin = 0;
    while (begin <= v.size() && !v.empty()) {
      const size_t end = std::min(v.find(',', begin), v.size());
      std::string name = v.substr(begin, end - begin);
      name.erase(0, name.find_first_not_of(' '));
      name.erase(name.find_last_not_of(' ') + 1);
      const auto bad = std::find_if(name.begin(), name.end(), [](char c) {
        return !(std::isalnum(static_cast<unsigned char>(c)) || c == '_');
      });
      if (name.empty() || bad != name.end())
        return fmt::format(
            "must be comma-separated child module names (letters, digits, '_'), e.g. \"fc0,fc1\"; "
            "'{}' is not one", name);
      if (std::find(seen.begin(), seen.end(), name) != seen.end())
        return fmt::format("names '{}' twice; list each module once", name);
      seen.push_back(name);
      begin = end + 1;
    }
    return "";
  };
}

// run.name is one folder under run.output_dir, never a path out of it.
Check<std::string> path_component() {
  return [](const std::string& v) -> std::string {
    if (v.empty()) return "must not be empty";
    // A newline or another control character in a folder name breaks every
    // line-based tool that lists it (`paratrain runs`, ls, logs).
    if (std::any_of(v.begin(), v.end(), [](char c) { return std::iscntrl(static_cast<unsigned char>(c)); }))
      return "must be one folder name without control characters (a newline, a tab): use letters, digits, "
             "'-', '_', '.' or spaces";
    if (v.find('/') != std::string::npos || v.find('\0') != std::string::npos || v.front() == '.')
      return "must be one folder name inside run.output_dir: no '/', and not starting with '.' "
             "(so not '..' or a hidden folder); put the parent folder in run.output_dir instead";
    return "";
  };
}
Check<std::string> one_of(std::vector<std::string> allowed) {
  return [allowed](const std::string& v) -> std::string {
    if (std::find(allowed.begin(), allowed.end(), v) != allowed.end()) return "";
    return fmt::format("allowed values are \"{}\"", fmt::join(allowed, "\", \""));
  };
}
// Like one_of, but the list is read when the value is checked: model.kind and
// data.dataset also accept names the program registered (registry.h).
Check<std::string> one_of_now(std::vector<std::string> (*allowed)()) {
  return [allowed](const std::string& v) { return one_of(allowed())(v); };
}
Check<std::string> non_empty() {
  return [](const std::string& v) { return v.empty() ? "must not be empty" : ""; };
}
Check<std::vector<int64_t>> widths(size_t min_size) {
  return [min_size](const std::vector<int64_t>& v) -> std::string {
    if (v.size() < min_size) return fmt::format("needs at least {} entries", min_size);
    if (v.size() > 1024) return "needs at most 1024 entries";
    for (int64_t x : v)
      if (x < 1 || x > kMaxWidth) return fmt::format("every entry must be in [1, {}]", kMaxWidth);
    return "";
  };
}

}  // namespace

// Note [Default hyper-parameters]
// The defaults train an MLP 784-256-128-10 on Fashion-MNIST with SGD
// (lr 0.05, momentum 0.9) and 64 examples per rank: a global batch of 128 on
// 2 ranks, 468 steps per epoch. Measured with the same LibTorch (Debian's
// python3-torch, one process at batch 128, which is what 2 DDP ranks at 64
// compute): with inputs standardized as data/fashion_mnist does, 84.8% /
// 86.5% / 86.8% test accuracy after epochs 1 / 2 / 3; with inputs only
// scaled to [0, 1], 85.7-85.8% after epoch 3 over 3 seeds. lr 0.02 and 0.1
// did no better there (85.6%, 85.3%); Adam at 1e-3 reached 86.9%. Why this model:
// 235k parameters (0.9 MB of gradients per step) keep a step a few ms and
// the all-reduce cheap on loopback Gloo, while 1024-1024 (1.86M parameters,
// ~8x the compute and gradient bytes) gained 0.6 points (86.5%, [0, 1] inputs).
const std::vector<FieldSpec>& schema() {
  using TC = TrainConfig;
  static const std::vector<FieldSpec> fields = {
      field("run.name", &TC::run, &RunConfig::name, "outputs go to <output_dir>/<name>/version_<N>/", path_component()),
      field("run.version", &TC::run, &RunConfig::version, "-1 = a new version_N per run (with train.resume = \"auto\": the newest version holding a checkpoint); N = exactly version_N", in_range<int64_t>(-1, 999999999)),
      field("run.output_dir", &TC::run, &RunConfig::output_dir, "parent folder of all runs", non_empty()),
      field("run.seed", &TC::run, &RunConfig::seed, "seeds model init and data shuffling", at_least<int64_t>(0)),
      field("run.log_every", &TC::run, &RunConfig::log_every, "steps between log lines (0 = per epoch only)", in_range<int64_t>(0, kMaxCount)),

      field("model.kind", &TC::model, &ModelConfig::kind, "\"mlp\", \"cnn\" or \"gpt\" (gpt needs data.dataset = \"text\"), or a name the program registered (register_model)", one_of_now(&model_kinds)),
      field("model.hidden", &TC::model, &ModelConfig::hidden, "MLP hidden layer widths", widths(0)),
      field("model.channels", &TC::model, &ModelConfig::channels, "CNN channels per conv block", widths(1)),
      field("model.cnn_hidden", &TC::model, &ModelConfig::cnn_hidden, "CNN fully connected width", in_range<int64_t>(1, kMaxWidth)),
      field("model.layers", &TC::model, &ModelConfig::layers, "GPT decoder blocks", in_range<int64_t>(1, 1024)),
      field("model.d_model", &TC::model, &ModelConfig::d_model, "GPT width (a multiple of model.heads)", in_range<int64_t>(1, kMaxWidth)),
      field("model.heads", &TC::model, &ModelConfig::heads, "GPT attention heads", in_range<int64_t>(1, kMaxWidth)),
      field("model.seq_len", &TC::model, &ModelConfig::seq_len, "GPT context length in tokens", in_range<int64_t>(1, kMaxWidth)),
      field("model.dropout", &TC::model, &ModelConfig::dropout, "GPT dropout on embeddings, attention and residuals", in_range_finite(0.0, 0.999)),
      field("model.batchnorm", &TC::model, &ModelConfig::batchnorm, "CNN: BatchNorm2d after each conv"),
      field("model.sync_batchnorm", &TC::model, &ModelConfig::sync_batchnorm, "BatchNorm statistics over the whole dp batch (needs batchnorm = true)"),

      field("optimizer.kind", &TC::optimizer, &OptimizerConfig::kind, "\"sgd\", \"adam\", \"adamw\", \"lars\" or \"lamb\"", one_of({"sgd", "adam", "adamw", "lars", "lamb"})),
      field("optimizer.lr", &TC::optimizer, &OptimizerConfig::lr, "learning rate; the base rate that the [lr] schedule scales, warms up and decays", positive_float32()),
      field("optimizer.momentum", &TC::optimizer, &OptimizerConfig::momentum, "SGD and LARS momentum (0 = plain SGD; LARS needs < 1)", in_range_finite(0.0, 1.0)),
      field("optimizer.weight_decay", &TC::optimizer, &OptimizerConfig::weight_decay, "L2 penalty (decoupled for adamw)", non_negative_float32()),
      field("optimizer.nesterov", &TC::optimizer, &OptimizerConfig::nesterov, "SGD Nesterov momentum (needs momentum > 0)"),
      field("optimizer.betas", &TC::optimizer, &OptimizerConfig::betas, "Adam, AdamW and LAMB [beta1, beta2]", adam_betas()),
      field("optimizer.eps", &TC::optimizer, &OptimizerConfig::eps, "Adam/AdamW/LAMB denominator epsilon (LAMB paper: 1e-6); LARS: added to the trust ratio's denominator", positive_float32()),
      field("optimizer.trust_coefficient", &TC::optimizer, &OptimizerConfig::trust_coefficient, "LARS trust coefficient eta (paper: 0.001)", in_range_finite(0.0, 1e6)),
      field("optimizer.exclude_from_adaptation", &TC::optimizer, &OptimizerConfig::exclude_from_adaptation, "LARS/LAMB: biases and norm weights (<= 1-D) skip the trust ratio and weight decay"),

      field("optimizer.clip_grad_norm", &TC::optimizer, &OptimizerConfig::clip_grad_norm, "max global gradient L2 norm (0 = no clipping)", non_negative_float32()),

      field("lr.base_batch", &TC::lr, &LrConfig::base_batch, "global batch optimizer.lr was tuned for (0 = none; needs lr.scaling = \"none\")", in_range<int64_t>(0, kMaxCount)),
      field("lr.scaling", &TC::lr, &LrConfig::scaling, "\"none\", \"linear\" or \"sqrt\": peak = optimizer.lr x (global batch / lr.base_batch), or x its square root", one_of({"none", "linear", "sqrt"})),
      field("lr.warmup_steps", &TC::lr, &LrConfig::warmup_steps, "linear warmup to the peak over this many optimizer steps (0 = none)", in_range<int64_t>(0, kMaxCount)),
      field("lr.warmup_epochs", &TC::lr, &LrConfig::warmup_epochs, "warmup in epochs instead (rounded to whole steps; 0 = use warmup_steps)", in_range_finite(0.0, static_cast<double>(kMaxCount))),
      field("lr.warmup_start_factor", &TC::lr, &LrConfig::warmup_start_factor, "warmup starts at peak x this (Goyal et al.: lr.base_batch / global batch)", in_range_finite(0.0, 1.0)),
      field("lr.decay", &TC::lr, &LrConfig::decay, "after warmup: \"constant\", \"cosine\" (to lr.min_lr at the last step) or \"step\"", one_of({"constant", "cosine", "step"})),
      field("lr.min_lr", &TC::lr, &LrConfig::min_lr, "cosine: the rate at the last step", non_negative_float32()),
      field("lr.step_size", &TC::lr, &LrConfig::step_size, "step decay: multiply by lr.gamma every this many steps (or use lr.step_epochs)", in_range<int64_t>(0, kMaxCount)),
      field("lr.step_epochs", &TC::lr, &LrConfig::step_epochs, "step decay: period in epochs instead (rounded to whole steps)", in_range_finite(0.0, static_cast<double>(kMaxCount))),
      field("lr.gamma", &TC::lr, &LrConfig::gamma, "step decay: factor per period, in (0, 1]", Check<double>([](const double& v) { return v > 0 && v <= 1 ? "" : "must be a number in (0, 1]"; })),

      field("data.dataset", &TC::data, &DataConfig::dataset, "\"fashion_mnist\", \"synthetic\" or \"text\", or a name the program registered (register_dataset)", one_of_now(&dataset_names)),
      field("data.dir", &TC::data, &DataConfig::dir, "folder of the *-ubyte.gz files"),
      field("data.path", &TC::data, &DataConfig::path, "text: a file or folder of text files (byte tokens, the last 5% for validation)"),
      field("data.batch_size", &TC::data, &DataConfig::batch_size, "examples per rank per micro-batch (global = batch_size * dp * train.accumulate)", in_range<int64_t>(1, kMaxCount)),
      field("data.global_batch_size", &TC::data, &DataConfig::global_batch_size, "examples per optimizer step over all ranks (0 = batch_size * dp * train.accumulate); overrides batch_size", in_range<int64_t>(0, kMaxCount)),
      field("data.shuffle", &TC::data, &DataConfig::shuffle, "reshuffle the training set every epoch"),
      field("data.drop_last", &TC::data, &DataConfig::drop_last, "drop the last incomplete batch"),
      field("data.prefetch", &TC::data, &DataConfig::prefetch, "batches prepared ahead (0 = none)", in_range<int64_t>(0, 1024)),
      field("data.synthetic_train_size", &TC::data, &DataConfig::synthetic_train_size, "synthetic training examples", in_range<int64_t>(1, kMaxCount)),
      field("data.synthetic_test_size", &TC::data, &DataConfig::synthetic_test_size, "synthetic test examples", in_range<int64_t>(0, kMaxCount)),
      field("data.synthetic_channels", &TC::data, &DataConfig::synthetic_channels, "synthetic image channels", in_range<int64_t>(1, kMaxWidth)),
      field("data.synthetic_image_size", &TC::data, &DataConfig::synthetic_image_size, "synthetic image height = width", in_range<int64_t>(1, kMaxWidth)),
      field("data.synthetic_classes", &TC::data, &DataConfig::synthetic_classes, "synthetic label classes", in_range<int64_t>(2, kMaxWidth)),

      field("train.epochs", &TC::train, &TrainLoopConfig::epochs, "passes over the training set", in_range<int64_t>(1, kMaxCount)),
      field("train.max_steps", &TC::train, &TrainLoopConfig::max_steps, "stop after this many optimizer steps (0 = no limit)", in_range<int64_t>(0, kMaxCount)),
      field("train.eval_every_epochs", &TC::train, &TrainLoopConfig::eval_every_epochs, "test-set evaluation period (0 = never)", in_range<int64_t>(0, kMaxCount)),
      field("train.checkpoint_every_steps", &TC::train, &TrainLoopConfig::checkpoint_every_steps, "0 = checkpoint at epoch ends only", in_range<int64_t>(0, kMaxCount)),
      field("train.resume", &TC::train, &TrainLoopConfig::resume, "\"\" = fresh, \"auto\" = latest in the run dir (damaged ones moved aside as step_N.unreadable), or a checkpoint path"),
      field("train.keep_checkpoints", &TC::train, &TrainLoopConfig::keep_checkpoints, "keep only the newest N checkpoints (0 = all)", in_range<int64_t>(0, kMaxCount)),
      field("train.async_checkpoint", &TC::train, &TrainLoopConfig::async_checkpoint, "write checkpoints in the background: a save copies the state and training goes on; index.json is still written last, and the next save waits for the previous one"),
      field("train.accumulate", &TC::train, &TrainLoopConfig::accumulate, "micro-batches per optimizer step (gradient accumulation; an epoch's incomplete last step is dropped)", in_range<int64_t>(1, kMaxRanks)),

      field("train.monitor", &TC::train, &TrainLoopConfig::monitor, "metric that picks checkpoints/best and drives early stopping: \"test_loss\", \"test_accuracy\", \"perplexity\", \"train_loss\", a program's own \"test_<name>\" (its Task's sums) or \"\" (none)", monitor_name()),
      field("train.mode", &TC::train, &TrainLoopConfig::mode, "\"min\", \"max\" or \"auto\" (max for accuracies): which way train.monitor improves", one_of({"auto", "min", "max"})),
      field("train.patience", &TC::train, &TrainLoopConfig::patience, "early stopping: evaluations without improvement of train.monitor before stopping (0 = never stop early)", in_range<int64_t>(0, kMaxCount)),
      field("train.min_delta", &TC::train, &TrainLoopConfig::min_delta, "smallest change of train.monitor that counts as an improvement", in_range_finite(0.0, 1e30, "a non-negative number")),

      field("log.tensorboard", &TC::log, &LogConfig::tensorboard, "also write TensorBoard scalar event files to <run_dir>/tensorboard/"),
      field("log.progress", &TC::log, &LogConfig::progress, "\"auto\" (a progress bar on a terminal, log lines otherwise), \"on\" or \"off\"", one_of({"auto", "on", "off"})),

      field("world.backend", &TC::world, &WorldConfig::backend, "collective backend: \"gloo\" (TCP), \"mpi\" (under mpirun; needs the MPI build), \"shm\" (shared memory, every rank on one host, CPU tensors) \"hierarchical\" (several hosts: shared memory inside each, gloo among one leader per host) or \"auto\" (the default, logged by rank 0: mpi when started by mpirun, else shm when all ranks share one host with CPU tensors, else hierarchical when several hosts have several ranks each, else gloo; elastic.in_job always uses gloo)", one_of({"gloo", "mpi", "shm", "hierarchical", "auto"})),
      field("world.device", &TC::world, &WorldConfig::device, "where each rank's model, batches and gradients live: \"cpu\", \"cuda\" (GPU number LOCAL_RANK modulo the GPUs seen; needs a CUDA build of LibTorch, scripts/cuda-build.sh; ddp, zero stage 1-2 and megatron without pp for now; collectives staged through host memory) or \"auto\" (cuda when this build has CUDA and sees a GPU, else cpu)", one_of({"cpu", "cuda", "auto"})),
      field("world.timeout_s", &TC::world, &WorldConfig::timeout_s, "seconds before a stalled collective fails", in_range<int64_t>(1, kMaxTimeoutS)),
      field("world.doctor_records", &TC::world, &WorldConfig::doctor_records, "hang doctor: the last N collectives each rank records (op, group, sequence number, sizes, start/end) and dumps to <run_dir>/doctor/ on a timeout, SIGUSR1 or `paratrain doctor` (0 = off)", in_range<int64_t>(0, 1 << 20)),
      field("world.heartbeat_s", &TC::world, &WorldConfig::heartbeat_s, "seconds between heartbeats from each rank to `paratrain launch`, or to the other ranks where no launcher sees them all (torchrun, mpirun, srun, by hand, several nodes; 0 = none); a thread sends them, so a long collective keeps beating", in_range_finite(0.0, 3600.0, "seconds: 0 (off) to 3600")),
      field("world.heartbeat_timeout_s", &TC::world, &WorldConfig::heartbeat_timeout_s, "`paratrain launch` fails the job (or restarts it under --max-restarts), or the other ranks abort their collectives, when a rank's heartbeat is older than this: a stopped (SIGSTOP), frozen or cut-off process, named with its last collective", in_range_finite(0.1, 86400.0, "seconds: 0.1 to 86400")),

      field("elastic.keep_global_batch", &TC::elastic, &ElasticConfig::keep_global_batch, "when a restarted generation (`paratrain launch --nnodes MIN:MAX`) or the survivors of an in-job recovery (elastic.in_job) run at another world size than the run started with, keep the starting global batch by changing the per-rank batch (train.accumulate when it does not divide), so steps per epoch and the LR schedule stay; a ConfigError when neither divides"),
      field("elastic.in_job", &TC::elastic, &ElasticConfig::in_job, "in-job recovery: when a rank dies mid-step (or inside an evaluation or a checkpoint save), the survivors abort the world group, agree on the new membership through the store, rebuild the group and redo the failed step from memory (DDP) or roll back to the run's latest complete checkpoint, resharded to the survivors (zero.stage 1-3), without restarting processes; the remaining samples of the epoch are split among them (not with parallel.tp/pp/cp > 1 or parameter servers)"),

      field("ddp.mode", &TC::ddp, &DdpConfig::mode, "\"bucketed\", \"naive\" or \"none\"", one_of({"bucketed", "naive", "none"})),
      field("ddp.bucket_cap_mb", &TC::ddp, &DdpConfig::bucket_cap_mb, "gradient bucket size (MiB)", in_range_finite(kMinBucketMiB, kMaxBucketMiB, "MiB: 1 byte to 1 TiB")),
      field("ddp.first_bucket_cap_mb", &TC::ddp, &DdpConfig::first_bucket_cap_mb, "first bucket size (MiB): small so its all-reduce starts early", in_range_finite(kMinBucketMiB, kMaxBucketMiB, "MiB: 1 byte to 1 TiB")),
      field("ddp.find_unused_parameters", &TC::ddp, &DdpConfig::find_unused_parameters, "tolerate parameters without gradients"),
      field("ddp.broadcast_buffers", &TC::ddp, &DdpConfig::broadcast_buffers, "copy rank 0's buffers before each forward"),
      field("ddp.compression", &TC::ddp, &DdpConfig::compression, "gradient compression of the bucketed all-reduce: \"none\", \"fp16\" / \"bf16\" (16-bit wire, fp32 sums; also ZeRO-1/2's all-reduce / reduce-scatter) or \"powersgd\" (rank-r factors, error feedback; DDP only)", one_of({"none", "fp16", "bf16", "powersgd"})),
      field("ddp.powersgd_rank", &TC::ddp, &DdpConfig::powersgd_rank, "PowerSGD: columns of the factors each gradient matrix is sent as (higher: closer to exact, more bytes)", at_least<int64_t>(1)),
      field("ddp.powersgd_start_step", &TC::ddp, &DdpConfig::powersgd_start_step, "PowerSGD: synchronized steps sent uncompressed before compression starts (PyTorch suggests ~10% of training)", at_least<int64_t>(0)),

      field("parallel.dp", &TC::parallel, &ParallelConfig::dp, "data-parallel size (0 = world / (tp * pp * cp))", in_range<int64_t>(0, kMaxRanks)),
      field("parallel.tp", &TC::parallel, &ParallelConfig::tp, "tensor-parallel size", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.pp", &TC::parallel, &ParallelConfig::pp, "pipeline-parallel stages", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.cp", &TC::parallel, &ParallelConfig::cp, "context (sequence) parallel size: ring self-attention over cp ranks (GPT)", in_range<int64_t>(1, kMaxRanks)),
      field("parallel.megatron_sp", &TC::parallel, &ParallelConfig::megatron_sp, "Megatron sequence parallelism inside the tp group (GPT, needs parallel.tp > 1)"),

      field("zero.stage", &TC::zero, &ZeroConfig::stage, "0 = DDP, 1 = shard optimizer state, 2 = + gradients, 3 = + parameters (FSDP)", in_range<int64_t>(0, 3)),
      field("zero.unit_min_params", &TC::zero, &ZeroConfig::unit_min_params, "stage 3: parameter elements per wrapping unit", in_range<int64_t>(1, kMaxCount)),
      field("zero.unit_modules", &TC::zero, &ZeroConfig::unit_modules, "stage 3: comma-separated child modules, one unit each (overrides unit_min_params)", module_list()),
      field("zero.reshard_after_forward", &TC::zero, &ZeroConfig::reshard_after_forward, "stage 3: free gathered parameters between forward and backward"),
      field("zero.prefetch", &TC::zero, &ZeroConfig::prefetch, "stage 3: gather the next unit while this one computes"),

      field("pipeline.schedule", &TC::pipeline, &PipelineConfig::schedule, "\"gpipe\", \"1f1b\" or \"interleaved_1f1b\"", one_of({"gpipe", "1f1b", "interleaved_1f1b"})),
      field("pipeline.microbatches", &TC::pipeline, &PipelineConfig::microbatches, "micro-batches per step (divides the per-replica batch)", in_range<int64_t>(1, kMaxCount)),
      field("pipeline.virtual_stages", &TC::pipeline, &PipelineConfig::virtual_stages, "model chunks per rank (interleaved_1f1b: >= 2)", in_range<int64_t>(1, 1024)),
      field("pipeline.split", &TC::pipeline, &PipelineConfig::split, "layers per chunk, e.g. [5, 3] (empty = balanced)", widths(0)),
      field("pipeline.balance", &TC::pipeline, &PipelineConfig::balance, "\"parameters\" or \"time\": how an empty split balances chunks", one_of({"parameters", "time"})),
      field("pipeline.checkpoint_activations", &TC::pipeline, &PipelineConfig::checkpoint_activations, "recompute each chunk's forward during backward"),
      field("pipeline.trace_steps", &TC::pipeline, &PipelineConfig::trace_steps, "steps recorded for `paratrain trace` (0 = none)", in_range<int64_t>(0, kMaxCount)),

      field("precision.compute", &TC::precision, &PrecisionConfig::compute, "\"fp32\", \"bf16\" (autocast; no loss scaling needed) or \"fp16\" (CUDA builds; needs loss_scale)", one_of({"fp32", "bf16", "fp16"})),
      field("precision.loss_scale", &TC::precision, &PrecisionConfig::loss_scale, "\"dynamic\", \"none\", or a number string for a static scale", loss_scale_form()),
      field("precision.init_scale", &TC::precision, &PrecisionConfig::init_scale, "dynamic loss scaling: first scale", in_range_finite(1e-30, 1e30)),
      field("precision.growth_factor", &TC::precision, &PrecisionConfig::growth_factor, "dynamic: scale x this after growth_interval good steps", in_range_finite(1.0 + 1e-9, 1e6, "> 1")),
      field("precision.backoff_factor", &TC::precision, &PrecisionConfig::backoff_factor, "dynamic: scale x this on an inf/nan step", in_range_finite(1e-9, 1.0 - 1e-9, "in (0, 1)")),
      field("precision.growth_interval", &TC::precision, &PrecisionConfig::growth_interval, "dynamic: good steps in a row before growing", in_range<int64_t>(1, kMaxCount)),
      field("precision.comm_dtype", &TC::precision, &PrecisionConfig::comm_dtype, "DDP and ZeRO-1/2 gradient collectives on the wire: \"fp32\", or \"bf16\" / \"fp16\" (half the bytes, summed in fp32)", one_of({"fp32", "bf16", "fp16"})),

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

      field("federated.clients", &TC::federated, &FederatedConfig::clients, "simulated clients, spread over the ranks", in_range<int64_t>(1, kMaxRanks)),
      field("federated.rounds", &TC::federated, &FederatedConfig::rounds, "communication rounds", in_range<int64_t>(1, kMaxCount)),
      field("federated.partition", &TC::federated, &FederatedConfig::partition, "\"iid\", \"dirichlet\" (label skew by federated.alpha) or \"shards\" (McMahan's label-sorted shards)", one_of({"iid", "dirichlet", "shards"})),
      field("federated.alpha", &TC::federated, &FederatedConfig::alpha, "dirichlet: concentration (small = each client sees few labels, large = IID)", in_range_finite(1e-6, 1e9, "> 0")),
      field("federated.shards_per_client", &TC::federated, &FederatedConfig::shards_per_client, "shards: label-sorted shards per client", in_range<int64_t>(1, kMaxCount)),
      field("federated.fraction", &TC::federated, &FederatedConfig::fraction, "clients sampled per round (at least one), seeded by run.seed", in_range_finite(1e-9, 1.0, "in (0, 1]")),
      field("federated.min_clients", &TC::federated, &FederatedConfig::min_clients, "updates a round needs; with fewer (dropouts) the round is skipped and logged", in_range<int64_t>(1, kMaxRanks)),
      field("federated.dropout", &TC::federated, &FederatedConfig::dropout, "experiments: probability that a sampled client fails to report", in_range_finite(0.0, 1.0)),
      field("federated.local_epochs", &TC::federated, &FederatedConfig::local_epochs, "passes over the client's data per round", in_range<int64_t>(1, kMaxCount)),
      field("federated.local_steps", &TC::federated, &FederatedConfig::local_steps, "> 0: exactly this many client mini-batches per round instead of local_epochs", in_range<int64_t>(0, kMaxCount)),
      field("federated.algorithm", &TC::federated, &FederatedConfig::algorithm, "\"fedavg\" or \"fedprox\" (proximal term federated.mu)", one_of({"fedavg", "fedprox"})),
      field("federated.mu", &TC::federated, &FederatedConfig::mu, "fedprox: weight of mu/2 ||w - w_global||^2 in the client loss", in_range_finite(0.0, 1e6)),
      field("federated.server_optimizer", &TC::federated, &FederatedConfig::server_optimizer, "\"sgd\" (lr 1 = plain FedAvg), or \"adam\", \"yogi\", \"adagrad\" (Reddi et al., arXiv 2003.00295)", one_of({"sgd", "adam", "yogi", "adagrad"})),
      field("federated.server_lr", &TC::federated, &FederatedConfig::server_lr, "server learning rate applied to the mean client update", in_range_finite(1e-12, 1e6)),
      field("federated.server_momentum", &TC::federated, &FederatedConfig::server_momentum, "sgd: server momentum (FedAvgM; 0 = none)", in_range_finite(0.0, 1.0 - 1e-9, "in [0, 1)")),
      field("federated.server_betas", &TC::federated, &FederatedConfig::server_betas, "adam/yogi: [beta1, beta2]; adagrad uses beta1", adam_betas()),
      field("federated.server_tau", &TC::federated, &FederatedConfig::server_tau, "adaptive server optimizers: added to sqrt(v) (Reddi et al.'s tau)", in_range_finite(1e-12, 1e6)),
      field("federated.secure_aggregation", &TC::federated, &FederatedConfig::secure_aggregation, "the server learns only the sum of the updates: pairwise X25519 masks that cancel in the sum (Bonawitz et al. 2017), dropped clients' masks recovered from the survivors; needs libsodium"),
      field("federated.dp.clip", &TC::federated, &FederatedConfig::dp_clip, "DP-FedAvg: clip each client update to this L2 norm; clients then weigh 1 each (0 = off)", in_range_finite(0.0, 1e9)),
      field("federated.dp.noise_multiplier", &TC::federated, &FederatedConfig::dp_noise_multiplier, "DP-FedAvg: Gaussian noise std = this x dp.clip on the sum (0 = none)", in_range_finite(0.0, 1e6)),
      field("federated.dp.delta", &TC::federated, &FederatedConfig::dp_delta, "DP-FedAvg: the delta at which epsilon is reported", in_range_finite(1e-30, 0.5, "in (0, 0.5]")),
      field("federated.eval_every", &TC::federated, &FederatedConfig::eval_every, "rounds between test evaluations of the global model (0 = only the last)", in_range<int64_t>(0, kMaxCount)),
      field("federated.checkpoint_every", &TC::federated, &FederatedConfig::checkpoint_every, "rounds between global-model checkpoints (0 = only the last)", in_range<int64_t>(0, kMaxCount)),
      field("federated.round_timeout_s", &TC::federated, &FederatedConfig::round_timeout_s, "round deadline (multi-process): after it, with at least min_clients updates, the round closes and late clients are dropped from it (0 = wait for every client on a live process)", in_range_finite(0.0, 1e9)),
      field("federated.client_optimizer_state", &TC::federated, &FederatedConfig::client_optimizer_state, "\"reset\": a fresh client optimizer each round (FedAvg); \"keep\": a client selected again continues its own optimizer state", one_of({"reset", "keep"})),
      field("federated.test_kill_process_at_round", &TC::federated, &FederatedConfig::test_kill_process_at_round, "fault injection for tests: > 0 makes the last rank SIGKILL itself in this round (0 = off)", in_range<int64_t>(0, kMaxCount)),
  };
  return fields;
}

const FieldSpec* find_field(std::string_view key) {
  for (const auto& f : schema())
    if (f.key == key) return &f;
  return nullptr;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& f : schema())
    if (out.empty() || out.back() != f.section()) out.emplace_back(f.section());
  return out;
}


std::string_view type_name(ValueType type) {
  switch (type) {
    case ValueType::Int: return "an integer";
    case ValueType::Double: return "a number";
    case ValueType::Bool: return "a boolean (true or false)";
    case ValueType::String: return "a string";
    case ValueType::IntList: return "a list of integers, e.g. [256, 128]";
    case ValueType::DoubleList: return "a list of numbers, e.g. [0.9, 0.999]";
  }
  return "?";
}

}  // namespace paratrain::train::detail
