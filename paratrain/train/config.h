// The training configuration: one TrainConfig read from a TOML file plus
// `--set section.key=value` overrides, validated once, saved next to a run.
// Not the CLI (apps/ parses flags) and not the Trainer (trainer.h uses this).
//
// The schema (every key, its type, default check and doc line) lives in one
// table in config_schema.cpp: adding a key is one line there plus the field
// below. Defaults train the MLP on Fashion-MNIST to >= 85% test accuracy in
// 3 epochs on 2 ranks; see Note [Default hyper-parameters] in config_schema.cpp.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "paratrain/data_parallel/ddp/bucket_plan.h"
#include "paratrain/data_parallel/fsdp/unit_plan.h"
#include "paratrain/train/user_table.h"

namespace paratrain::models {
class Model;
}

namespace paratrain::train {

/// `[run]`: where a run writes and how it is seeded.
struct RunConfig {
  std::string name = "fashion_mnist_mlp";  ///< the run's folder name under output_dir
  std::string output_dir = "runs";  ///< the run writes into `<output_dir>/<name>/version_<N>/` (run_dir.h)
  /// -1 = a new version per run (the newest one with train.resume = "auto");
  /// N >= 0 = exactly version_N, e.g. to resume or compare a known run.
  int64_t version = -1;
  int64_t seed = 0;                 ///< model init, sampler shuffles, dropout: one seed for all
  int64_t log_every = 50;           ///< steps between log lines (0 = only per epoch)

  bool operator==(const RunConfig&) const = default;
};

/// `[model]`: which built-in model and its sizes (user models: train/registry.h).
struct ModelConfig {
  std::string kind = "mlp";                 ///< "mlp" | "cnn" | "gpt"
  std::vector<int64_t> hidden{256, 128};    ///< MLP hidden widths
  std::vector<int64_t> channels{32, 64};    ///< CNN conv block channels
  int64_t cnn_hidden = 128;                 ///< CNN fully connected width
  int64_t layers = 4;      ///< GPT (data.dataset = "text"): decoder blocks
  int64_t d_model = 256;  ///< GPT: width of the residual stream
  int64_t heads = 4;      ///< GPT: attention heads (divide d_model)
  int64_t seq_len = 128;  ///< GPT: context length in tokens
  double dropout = 0.1;   ///< GPT: dropout probability
  bool batchnorm = false;                   ///< CNN: BatchNorm2d after each conv
  /// BatchNorm statistics over the whole dp batch (SyncBatchNorm); needs
  /// batchnorm = true. Costs two small all-reduces per BatchNorm layer.
  bool sync_batchnorm = false;

  bool operator==(const ModelConfig&) const = default;
};

/// `[optimizer]`: the optimizer and its hyper-parameters (optim/).
struct OptimizerConfig {
  std::string kind = "sgd";  ///< "sgd" | "adam" | "adamw" | "lars" | "lamb"
  double lr = 0.05;          ///< the base rate of the [lr] schedule
  double momentum = 0.9;     ///< SGD and LARS
  double weight_decay = 0.0;  ///< L2 penalty (decoupled for AdamW/LAMB)
  bool nesterov = false;     ///< SGD only; needs momentum > 0
  std::vector<double> betas{0.9, 0.999};  ///< Adam/AdamW/LAMB
  /// Adam/AdamW/LAMB: added to sqrt(v) (the LAMB paper uses 1e-6); LARS:
  /// added to the trust ratio's denominator.
  double eps = 1e-8;
  /// LARS (arXiv 1708.03888): eta in the trust ratio eta ||w|| / (||g|| + wd ||w||).
  double trust_coefficient = 0.001;
  /// LARS/LAMB: biases and norm weights (tensors whose full shape has <= 1
  /// dim) skip the trust ratio and weight decay, as Goyal et al. and BERT's
  /// LAMB recipe do; false adapts (and decays) every tensor.
  bool exclude_from_adaptation = true;
  /// 0 = off. Else gradients are scaled so their global L2 norm (over every
  /// parameter, across shards) is at most this, before each step.
  double clip_grad_norm = 0.0;

  bool operator==(const OptimizerConfig&) const = default;
};

/// The learning-rate schedule (optim/lr_schedule.h): optimizer.lr is the
/// base rate; these keys scale it with the global batch, warm it up and decay
/// it per optimizer step. The defaults keep optimizer.lr constant.
struct LrConfig {
  /// The global batch optimizer.lr was tuned for; 0 = none (lr.scaling must
  /// then be "none").
  int64_t base_batch = 0;
  /// "none" | "linear" | "sqrt": the peak rate is optimizer.lr * k or
  /// optimizer.lr * sqrt(k), k = global batch / base_batch (Goyal et al.,
  /// arXiv 1706.02677: linear for SGD; sqrt for Adam-type optimizers).
  std::string scaling = "none";
  /// Linear warmup to the peak over this many steps (0 = none); or over
  /// warmup_epochs epochs, rounded to whole steps (set one of the two).
  int64_t warmup_steps = 0;
  double warmup_epochs = 0.0;  ///< warmup length in epochs (instead of warmup_steps)
  /// Warmup starts at peak * factor, in [0, 1]. Goyal et al. start at the
  /// unscaled rate: factor = base_batch / global batch with linear scaling.
  double warmup_start_factor = 0.0;
  /// "constant" | "cosine" (to min_lr at the run's last step) | "step"
  /// (times gamma every step_size steps or step_epochs epochs).
  std::string decay = "constant";
  double min_lr = 0.0;       ///< cosine: the rate at the last step
  int64_t step_size = 0;     ///< step decay: steps between decays
  double step_epochs = 0.0;  ///< step decay: epochs between decays (instead of step_size)
  double gamma = 0.1;        ///< step decay: the factor per decay

  bool operator==(const LrConfig&) const = default;
};

/// `[data]`: the dataset and how it is batched over the ranks.
struct DataConfig {
  std::string dataset = "fashion_mnist";  ///< "fashion_mnist" | "synthetic" | "text"
  std::string dir = "/usr/share/datasets/fashion-mnist";  ///< Fashion-MNIST's IDX files (Debian's dataset-fashion-mnist)
  /// Text: a file or a folder of text files, tokenized as bytes into
  /// `<run.output_dir>/.cache/` once (data/text.h).
  std::string path = "/usr/share/games/fortunes";
  /// Per data-parallel rank and micro-batch: the global batch per optimizer
  /// step is batch_size * dp * train.accumulate.
  int64_t batch_size = 64;
  /// 0 = unset. Else the global batch per optimizer step; the per-rank batch is
  /// derived from it (global / (dp * train.accumulate)) and must divide evenly.
  /// Overrides batch_size.
  int64_t global_batch_size = 0;
  bool shuffle = true;      ///< reshuffle the training set every epoch (seeded by run.seed)
  bool drop_last = true;    ///< equal batch counts on every rank (no uneven last step)
  int64_t prefetch = 2;     ///< batches prepared ahead by the loader thread (0 = none)
  /// Synthetic data: images of synthetic_channels x synthetic_image_size^2
  /// labelled with synthetic_classes classes (the Fashion-MNIST shape by default).
  int64_t synthetic_train_size = 8192;
  int64_t synthetic_test_size = 2048;  ///< synthetic: examples in the test split
  int64_t synthetic_channels = 1;      ///< synthetic: image channels
  int64_t synthetic_image_size = 28;   ///< synthetic: image height and width
  int64_t synthetic_classes = 10;      ///< synthetic: label classes

  bool operator==(const DataConfig&) const = default;
};

/// `[train]`: the loop: length, evaluation, checkpoints, resume, accumulation,
/// monitoring and early stopping.
struct TrainLoopConfig {
  int64_t epochs = 3;  ///< passes over the training set
  int64_t max_steps = 0;               ///< 0 = no limit; else stop after this many optimizer steps
  int64_t eval_every_epochs = 1;       ///< 0 = never evaluate
  int64_t checkpoint_every_steps = 0;  ///< 0 = only at the end of each epoch
  std::string resume;                  ///< "" = fresh start, "auto" = latest in the run dir, or a path
  int64_t keep_checkpoints = 0;        ///< 0 = keep all; else only the newest N
  /// Write checkpoints in the background: a save copies this rank's state and
  /// training goes on while a thread writes the files and commits index.json
  /// last (as atomic as a synchronous save); the next save waits for it.
  bool async_checkpoint = false;
  /// Micro-batches per optimizer step (gradient accumulation): the first
  /// accumulate - 1 backwards accumulate locally (no_sync), the last reduces
  /// the sum; each micro-batch loss is divided by accumulate, so one step
  /// equals one step on the accumulate-times larger batch. Steps, max_steps
  /// and checkpoint_every_steps count optimizer steps; the last batches of an
  /// epoch that do not fill a whole step are dropped.
  int64_t accumulate = 1;
  /// A metric of the evaluation ("test_loss", "test_accuracy", "perplexity",
  /// "train_loss"); "" = none. When set, checkpoints/best links to the
  /// checkpoint with its best value (callbacks.h).
  std::string monitor;
  std::string mode = "auto";  ///< "min" | "max" | "auto" (max for accuracies)
  /// Early stopping: stop after this many evaluations without an improvement
  /// of the monitored metric by more than min_delta; 0 = never.
  int64_t patience = 0;
  double min_delta = 0.0;  ///< smallest change that counts as an improvement

  bool operator==(const TrainLoopConfig&) const = default;
};

/// `[world]`: how the processes talk.
struct WorldConfig {
  /// "auto" (the default: mpi under mpirun, shm on one host, hierarchical
  /// over several hosts with several ranks each, else gloo; rank 0 logs the
  /// choice, comm/rendezvous.cpp) | "gloo" | "mpi" | "shm" | "hierarchical"
  std::string backend = "auto";
  /// "cpu" | "cuda" (GPU LOCAL_RANK % GPUs; needs a CUDA build) | "auto" (core/device.h)
  std::string device = "cpu";
  int64_t timeout_s = 300;  ///< collectives and rendezvous give up after this
  /// Hang doctor: collectives each rank keeps in its ring buffer (comm/doctor/flight_recorder.h); 0 = off.
  int64_t doctor_records = 256;
  /// Seconds between a rank's heartbeats to `paratrain launch` (launch/heartbeat_monitor.h); 0 = none.
  double heartbeat_s = 1.0;
  /// The launcher fails the job when a rank's heartbeat is this many seconds old (stopped or hung process).
  double heartbeat_timeout_s = 15.0;

  bool operator==(const WorldConfig&) const = default;
};

/// `[elastic]`: keeping a job going when ranks or nodes come and go (docs/elastic.md).
struct ElasticConfig {
  /// When a restarted generation runs at another world size than the run
  /// started with (`paratrain launch --nnodes MIN:MAX`), keep the global batch
  /// (and so the steps per epoch and the LR schedule) of the run's start by
  /// changing the per-rank batch, or train.accumulate when that does not
  /// divide; false lets the global batch follow the world size.
  bool keep_global_batch = false;
  /// In-job recovery: survivors of a dead rank re-form the world through the
  /// store and redo the failed step from memory, without restarting (DDP only).
  bool in_job = false;

  bool operator==(const ElasticConfig&) const = default;
};

/// `[ddp]`: DistributedDataParallel's options (data_parallel/ddp/ddp.h).
struct DdpConfig {
  std::string mode = "bucketed";  ///< "bucketed" | "naive" | "none"
  double bucket_cap_mb = ddp::kDefaultBucketCapBytes / double(1 << 20);  ///< gradients per all-reduce bucket, in MiB
  double first_bucket_cap_mb = ddp::kDefaultFirstBucketCapBytes / double(1 << 20);  ///< small first bucket: its all-reduce starts early
  bool find_unused_parameters = false;  ///< allow parameters the loss did not reach (as in PyTorch)
  bool broadcast_buffers = true;        ///< rank 0's buffers (BatchNorm statistics) before each forward
  /// Gradient compression on the bucketed all-reduce: "none", "fp16"/"bf16"
  /// (as precision.comm_dtype: 16-bit wire, fp32 sums) or "powersgd"
  /// (data_parallel/ddp/powersgd.h: rank-r factors with error feedback).
  std::string compression = "none";
  int64_t powersgd_rank = 1;        ///< PowerSGD: rank r of the factors
  int64_t powersgd_start_step = 0;  ///< synchronized steps sent uncompressed first

  bool operator==(const DdpConfig&) const = default;
};

/// How the world is cut into parallel axes; dp * tp * pp * cp == world size.
struct ParallelConfig {
  int64_t dp = 0;  ///< data-parallel replicas; 0 = world / (tp * pp * cp)
  int64_t tp = 1;  ///< tensor parallel
  int64_t pp = 1;  ///< pipeline stages
  int64_t cp = 1;  ///< context (sequence) parallel: ring self-attention over cp ranks
  /// Megatron sequence parallelism inside the tp group: LayerNorm, dropout and
  /// residuals run on 1/tp of the sequence (needs tp > 1). GPT only.
  bool megatron_sp = false;

  bool operator==(const ParallelConfig&) const = default;
};

/// ZeRO (arXiv 1910.02054) over the dp group: 0 = DDP (full replicas),
/// 1 = optimizer state sharded, 2 = + gradients, 3 = + parameters (FSDP).
struct ZeroConfig {
  int64_t stage = 0;  ///< 0, 1, 2 or 3
  /// Stage 3: a wrapping unit closes once it holds at least this many
  /// parameter elements (walking the model's children in order).
  int64_t unit_min_params = fsdp::kDefaultUnitMinParams;
  /// Stage 3: comma-separated names of child modules ("fc0,fc1"), each its own
  /// unit, the rest in a root unit. Overrides unit_min_params when not empty.
  std::string unit_modules;
  /// Stage 3: free a unit's gathered parameters after its forward and gather
  /// them again for backward (less memory), or keep them until backward.
  bool reshard_after_forward = true;
  /// Stage 3: start the next unit's all-gather while this one computes.
  bool prefetch = true;

  bool operator==(const ZeroConfig&) const = default;
};

/// Pipeline parallelism (parallel.pp > 1): the model's layers are cut into
/// pp * virtual_stages chunks; micro-batches flow through them by a schedule.
struct PipelineConfig {
  /// "gpipe" (all forwards, then all backwards: m micro-batches of activations
  /// alive), "1f1b" (same bubble, at most pp alive), "interleaved_1f1b"
  /// (virtual_stages chunks per rank: bubble / virtual_stages, more messages).
  std::string schedule = "1f1b";
  /// Micro-batches per step; must divide the per-replica batch. More: a
  /// smaller bubble ((pp-1)/(m+pp-1)) but smaller, less efficient kernels.
  int64_t microbatches = 4;
  /// Model chunks per rank for interleaved_1f1b (>= 2); 1 otherwise.
  int64_t virtual_stages = 1;
  /// Layers per chunk, e.g. [5, 3]; empty = balanced by `balance`.
  std::vector<int64_t> split;
  /// How empty `split` balances chunks: "parameters" (parameter count) or
  /// "time" (forward+backward of each layer, measured once on rank 0).
  std::string balance = "parameters";
  /// Recompute each chunk's forward during its backward: activations of a
  /// micro-batch shrink to the chunk's input, for one more forward per step.
  bool checkpoint_activations = false;
  /// Steps recorded in `<run>/trace/rank_<r>.jsonl` for `paratrain trace`
  /// (0 = none); the first steps of each process.
  int64_t trace_steps = 20;

  bool operator==(const PipelineConfig&) const = default;
};

/// Mixed precision (see docs/notes/precision.md). bf16 has fp32's exponent
/// range, so it trains without loss scaling; fp16 underflows small gradients
/// and needs loss_scale = "dynamic" (or a static number).
struct PrecisionConfig {
  /// "fp32", "bf16" (CPU autocast) or "fp16" (CUDA builds only). Autocast
  /// covers forward and loss; parameters, gradients and optimizer state stay
  /// fp32.
  std::string compute = "fp32";
  /// "dynamic", "none", or a number string ("1024": a static scale).
  std::string loss_scale = "none";
  double init_scale = 65536.0;     ///< dynamic: first scale (static: the number itself)
  double growth_factor = 2.0;      ///< dynamic: x this after growth_interval good steps
  double backoff_factor = 0.5;     ///< dynamic: x this on an inf/nan step (skipped)
  int64_t growth_interval = 2000;  ///< dynamic: good steps in a row before growing
  /// DDP's gradient all-reduce on the wire: "fp32", or "bf16" / "fp16" (half
  /// the bytes, added in fp32: comm/low_precision_all_reduce.h).
  std::string comm_dtype = "fp32";

  bool operator==(const PrecisionConfig&) const = default;
};

/// What the run reports besides metrics.jsonl and the log lines.
struct LogConfig {
  /// TensorBoard scalar event files in `<run_dir>/tensorboard/` (tensorboard.h).
  bool tensorboard = false;
  /// "auto" = an updating progress bar when rank 0 writes to a terminal
  /// (also through `paratrain launch` on one), log lines otherwise; "on"; "off".
  std::string progress = "auto";

  bool operator==(const LogConfig&) const = default;
};

/// Parameter servers (param_server/): the last `servers` ranks hold the
/// parameters and the optimizer state, the others are workers that push
/// gradients and pull parameters. See Note [Parameter-server modes] in
/// param_server/server.h.
struct PsConfig {
  int64_t servers = 0;         ///< 0 = off (the SPMD strategies); else 1 .. world - 1
  std::string mode = "sync";   ///< "sync" | "async" | "ssp"
  int64_t staleness = 2;       ///< ssp: clocks a worker may run ahead of the slowest
  /// Straggler knob for experiments: worker `slow_worker` (-1 = none) sleeps
  /// slow_ms before each of its forward passes.
  int64_t slow_worker = -1;
  double slow_ms = 0.0;  ///< the straggler's sleep before each forward, in ms
  /// "always": worker slow_worker sleeps before every forward (a slower
  /// machine); "random": every worker sleeps before each of its forwards with
  /// probability 1 / workers, seeded by run.seed (a straggler that comes and
  /// goes; slow_worker stays -1). See param_server/straggler.h.
  std::string slow_pattern = "always";
  /// Gradient pushes on the wire: "fp32", or "fp16" (half the bytes; the
  /// server widens each push to fp32 before adding, so only the rounding of
  /// each worker's gradient to fp16 is lost). Parameters come back in fp32.
  std::string push_dtype = "fp32";
  /// Push each tensor's gradient from its backward hook (overlapping backward)
  /// and wait for each layer's pulled parameters just before it runs in the
  /// next forward; false pushes after backward and pulls at once (naive twin).
  bool overlap = true;
  /// async: workers take the epoch's batches from a queue on server 0, so a
  /// fast worker trains more of them (Note [Dynamic batches] in
  /// param_server/server.h); false keeps each worker's fixed share, as sync
  /// and ssp always do.
  bool dynamic_batches = true;
  /// async and ssp: each update's rate divided by its staleness, lr /
  /// max(tau, 1) (Note [Staleness-aware learning rate] in
  /// param_server/server.cpp); false applies every update at the full rate.
  bool staleness_aware_lr = true;
  /// Messages between a worker and a server carry buckets of that server's
  /// neighbouring key ranges: each layer's ranges (what the forward's
  /// layer-wise pull waits for; each tensor's without Model::layers()),
  /// merged with neighbouring layers while the bucket stays within
  /// bucket_kb KiB (a layer larger than that travels alone). One push and one
  /// reply message per bucket and step, so small tensors (biases) do not
  /// travel alone. 0 = one message per key range. See
  /// param_server/bucket_plan.h.
  int64_t bucket_kb = 256;

  bool operator==(const PsConfig&) const = default;
};

/// Federated learning (`paratrain federated`, federated/): rank 0 is the
/// server, every rank (rank 0 too when it is alone) hosts simulated clients,
/// each with its own partition of the training set. A round: sample clients,
/// send the global model, train locally, aggregate the updates. The clients'
/// optimizer is [optimizer] (clip_grad_norm clips on the client) with
/// data.batch_size; the server's is server_optimizer. See Note [Federated
/// round] in federated/round.h.
struct FederatedConfig {
  int64_t clients = 100;  ///< simulated clients, spread over the ranks
  int64_t rounds = 20;    ///< aggregation rounds of the run
  /// "iid" (a shuffled equal split), "dirichlet" (per class, client shares
  /// drawn from Dirichlet(alpha): Hsu et al. 2019; small alpha = label skew),
  /// "shards" (sorted by label, cut into clients * shards_per_client shards,
  /// each client takes shards_per_client at random: McMahan et al. 2017).
  std::string partition = "iid";
  double alpha = 0.5;             ///< dirichlet: concentration (small = skewed labels)
  int64_t shards_per_client = 2;  ///< shards: label-sorted shards per client
  double fraction = 0.1;       ///< clients sampled per round (at least 1), seeded by run.seed
  /// A round needs this many client updates; fewer (dropouts) fail the round
  /// (the global model is kept) and it is logged.
  int64_t min_clients = 1;
  /// Experiments: each sampled client fails (sends no update) with this
  /// probability, drawn from the round's seed.
  double dropout = 0.0;
  int64_t local_epochs = 1;  ///< passes over the client's data per round
  int64_t local_steps = 0;   ///< > 0: exactly this many mini-batches instead of local_epochs
  /// "fedavg" or "fedprox" (Li et al. 2020: the client loss gets
  /// mu/2 ||w - w_global||^2, limiting client drift on non-IID data).
  std::string algorithm = "fedavg";
  double mu = 0.01;  ///< fedprox: weight of the proximal term
  /// How the server applies the sample-weighted mean update delta:
  /// "sgd" (w += server_lr * delta; server_lr = 1 is FedAvg), or the adaptive
  /// "adam" | "yogi" | "adagrad" of Reddi et al. (arXiv 2003.00295, Alg. 2).
  std::string server_optimizer = "sgd";
  double server_lr = 1.0;  ///< the server optimizer's learning rate
  double server_momentum = 0.0;               ///< sgd: server momentum (FedAvgM)
  std::vector<double> server_betas{0.9, 0.99};  ///< adam/yogi: beta1, beta2 (adagrad: beta1)
  double server_tau = 1e-3;                   ///< adaptivity: added to sqrt(v)
  /// The server learns only the sum of the updates (federated/
  /// secure_aggregation.h: Note [Pairwise masks]); needs libsodium.
  bool secure_aggregation = false;
  /// DP-FedAvg (central DP, McMahan et al., arXiv 1710.06963): each client's
  /// update is clipped to L2 norm dp.clip and weighs 1 (not its row count);
  /// the server adds N(0, (dp.noise_multiplier * dp.clip)^2) to the sum and
  /// divides by the sampled count. Epsilon at dp.delta is printed per round.
  double dp_clip = 0.0;              ///< federated.dp.clip (0 = off)
  double dp_noise_multiplier = 0.0;  ///< federated.dp.noise_multiplier
  double dp_delta = 1e-5;            ///< federated.dp.delta
  int64_t eval_every = 1;            ///< rounds between evaluations of the global model (0 = only the last)
  int64_t checkpoint_every = 0;      ///< rounds between global-model checkpoints (0 = only the last)
  /// Round deadline in seconds (multi-process runs): once it passed and at
  /// least min_clients updates arrived, the round closes and the clients
  /// still training are dropped from it. 0 = no deadline: a round waits for
  /// every selected client on a live process (a dead process never delays it).
  double round_timeout_s = 0.0;
  /// "reset" (a fresh client optimizer every round, as in FedAvg) or "keep"
  /// (a client selected again continues its own optimizer state).
  std::string client_optimizer_state = "reset";
  /// Fault injection for tests only: > 0 makes the last rank SIGKILL itself
  /// in this round, after its first client's update went out.
  int64_t test_kill_process_at_round = 0;

  bool operator==(const FederatedConfig&) const = default;
};

/// A whole configuration: one member per TOML section. Every key, its type,
/// default and meaning: `paratrain config --list` (docs/config-reference.md).
struct TrainConfig {
  RunConfig run;                ///< [run]
  ModelConfig model;            ///< [model]
  OptimizerConfig optimizer;    ///< [optimizer]
  LrConfig lr;                  ///< [lr]
  DataConfig data;              ///< [data]
  TrainLoopConfig train;        ///< [train]
  WorldConfig world;            ///< [world]
  ElasticConfig elastic;        ///< [elastic]
  DdpConfig ddp;                ///< [ddp]
  ParallelConfig parallel;      ///< [parallel]
  ZeroConfig zero;              ///< [zero]
  PipelineConfig pipeline;      ///< [pipeline]
  PrecisionConfig precision;    ///< [precision]
  LogConfig log;                ///< [log]
  PsConfig ps;                  ///< [ps]
  FederatedConfig federated;    ///< [federated]
  UserTable user;               ///< [user]: the program's own keys

  bool operator==(const TrainConfig&) const = default;
};

/// Reads `path`, then applies `overrides` ("optimizer.lr=0.01",
/// "model.hidden=[256,128]") in order, then validates. Every failure is a
/// ConfigError naming the file or override, the full key, and what to do.
TrainConfig load_config(const std::filesystem::path& path,
                        const std::vector<std::string>& overrides = {});

/// The same from TOML text; `source_name` names it in errors ("<string>").
TrainConfig config_from_toml_string(std::string_view toml_text,
                                    const std::vector<std::string>& overrides = {},
                                    std::string_view source_name = "<string>");

/// Applies one `key=value` override to `config` (validates only that key's type;
/// call validate_config afterwards).
void apply_override(TrainConfig& config, std::string_view assignment);

/// Checks every value range and cross-key rule; throws ConfigError.
void validate_config(const TrainConfig& config);

/// Every section and key, in schema order, with a doc comment per key: the
/// result parses back to an equal TrainConfig.
std::string to_toml(const TrainConfig& config);
nlohmann::json to_json(const TrainConfig& config);
/// Inverse of to_json (a checkpoint's metadata); same errors as a TOML file.
TrainConfig config_from_json(const nlohmann::json& json);

/// All valid keys ("run.name", ...), in schema order.
std::vector<std::string> config_keys();

/// True when the config's model is the built-in GPT (model.kind = "gpt"):
/// a language model over byte tokens, the one the megatron strategy cuts.
/// The one place that compares model.kind with "gpt".
bool builds_gpt(const TrainConfig& config);

/// Builds the model the config asks for, with input/output sizes taken from
/// the dataset (Fashion-MNIST: 1x28x28, 10 classes). Seed torch first.
std::shared_ptr<models::Model> make_model(const TrainConfig& config);
/// The shape of one example as the dataset gives it to the model
/// ([channels, height, width]): pipeline stages infer their boundary shapes
/// from it.
std::vector<int64_t> model_input_shape(const TrainConfig& config);

}  // namespace paratrain::train
