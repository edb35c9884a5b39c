// paratrain's public C++ API in one include: join the job
// (init_from_env), wrap your own torch::nn::Module with DDP, ZeRO-1/2 or
// FSDP (ZeRO-3), shard your data (DistributedSampler), scale the loss,
// checkpoint in the sharded format, or hand your own model, loss and data
// to the Trainer (TrainerParts, any_module, Task; or register_model /
// register_dataset for configs to name them). Link paratrain::paratrain.
// The names below are the stable ones; anything reached only through the
// headers they include (reducers, bucket plans, ...) may change.
#pragma once

#include "paratrain/api/checkpoint.h"
#include "paratrain/api/world.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/core/error.h"
#include "paratrain/data/dataset.h"
#include "paratrain/data/loader.h"
#include "paratrain/data/sampler.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/powersgd.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/data_parallel/sync_batchnorm/convert_sync_batchnorm.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/models/model.h"
#include "paratrain/models/recompute.h"
#include "paratrain/moe/expert_parallel.h"
#include "paratrain/moe/moe.h"
#include "paratrain/optim/grad_scaler.h"
#include "paratrain/parallelize/plan.h"
#include "paratrain/parallelize/sites.h"
#include "paratrain/topology/device_mesh.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/registry.h"
#include "paratrain/train/task.h"
#include "paratrain/train/trainer.h"
#include "paratrain/train/user_module.h"
#include "paratrain/train/config/user_table.h"

namespace paratrain {

/// The job: init_from_env(), World, InitOptions (api/world.h); the collectives.
using comm::ProcessGroup;
using comm::ReduceOp;
/// Device mesh: dp x tp x pp x cp groups of the world.
using topology::DeviceMesh;
using topology::ParallelDims;

/// Wrappers for a user module (each header shows its training loop).
using ddp::DdpOptions;
using ddp::DistributedDataParallel;
using fsdp::FsdpOptions;
using fsdp::FullyShardedDataParallel;
using zero::ZeroDataParallel;
using zero::ZeroOptions;

// Gradient compression: DDP's per-bucket comm hook (write your own as a
// BucketCommHook), PowerSGD, and the 16-bit wire with fp32 sums.
using ddp::BucketCommHook;
using ddp::low_precision_hook;
using ddp::PowerSgd;
using ddp::PowerSgdOptions;

/// Data: in-memory datasets, the strided per-rank sampler, a batch loader.
using data::Batch;
using data::DistributedSampler;
using data::Loader;
using data::LoaderOptions;
using data::SamplerOptions;
using data::TensorDataset;

/// Mixed precision: dynamic loss scaling agreed across ranks.
using optim::GradScaler;
using optim::GradScalerOptions;

/// The Trainer, its TOML config, and names for user models and datasets.
using models::Layer;  ///< a Model's layers() (pipeline stages)
using models::Model;
using train::DatasetBuilder;
using train::Datasets;
using train::load_config;
using train::ModelBuilder;
using train::register_dataset;
using train::register_model;
using train::TrainConfig;
using train::Trainer;
using train::TrainResult;
using train::UserTable;

/// Activation checkpointing in your own loop: a model whose layers() are
/// recomputed in backward (the Trainer's train.activation_checkpointing).
using models::RecomputedModel;
using models::RecomputeMode;
using models::RecomputePolicy;
using models::recompute_in_backward;
using models::SegmentState;

/// The Trainer on your own module and loss: any_module() adopts any
/// torch::nn::Module, a Task scores its output, TrainerParts hands both
/// (and your datasets) to the Trainer.
using train::any_module;
using train::classification_task;
using train::EvalSums;
using train::language_model_task;
using train::Task;
using train::TrainerParts;

/// Tensor parallelism for your own module: a plan of module names and
/// styles (parallel.tp_plan in a config), its layers run at the sites
/// (paratrain::parallelize::linear, embedding, ...; sites.h).
using parallelize::parallelize_module;
using parallelize::PlanContext;
using parallelize::TpPlan;

}  // namespace paratrain
