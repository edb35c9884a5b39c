// Shared pieces of the data-parallel strategy adapters: see common.h.
#include "paratrain/train/strategies/common.h"

#include <torch/torch.h>

#include <cmath>
#include <map>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "paratrain/data_parallel/ddp/int8_compression.h"
#include "paratrain/data_parallel/fsdp/fsdp.h"
#include "paratrain/data_parallel/sync_batchnorm/convert_sync_batchnorm.h"
#include "paratrain/data_parallel/zero/zero.h"
#include "paratrain/models/model.h"
#include "paratrain/optim/grad_scaler.h"

namespace paratrain::train::strategies {
namespace {

TensorSlot full_slot(const std::string& name, const at::Tensor& t, bool write) {
  return TensorSlot{name, t.sizes().vec(), 0, t, write};
}

}  // namespace

std::vector<TensorSlot> buffer_slots(torch::nn::Module& module, bool write) {
  std::vector<TensorSlot> out;
  for (const auto& item : module.named_buffers()) out.push_back(full_slot(item.key(), item.value(), write));
  return out;
}

std::vector<TensorSlot> frozen_parameter_slots(torch::nn::Module& module, bool write) {
  std::vector<TensorSlot> out;
  for (const auto& item : module.named_parameters())
    if (!item.value().requires_grad()) out.push_back(full_slot(item.key(), item.value(), write));
  return out;
}

std::vector<TensorSlot> replicated_slots(torch::nn::Module& module, bool write) {
  std::vector<TensorSlot> out;
  for (const auto& item : module.named_parameters()) out.push_back(full_slot(item.key(), item.value(), write));
  auto buffers = buffer_slots(module, write);
  out.insert(out.end(), buffers.begin(), buffers.end());
  return out;
}

std::vector<checkpoint::OptimizerSlot> replicated_optimizer_slots(torch::nn::Module& module, bool write) {
  std::vector<checkpoint::OptimizerSlot> out;
  // A tied weight (one tensor under two names, e.g. an embedding reused as
  // the output layer) has one optimizer state: key it by its first name, on
  // save and on load alike, as the reducer and ZeRO also list it once.
  std::set<const c10::TensorImpl*> seen;
  for (const auto& item : module.named_parameters()) {
    if (!item.value().requires_grad()) continue;
    if (!seen.insert(item.value().unsafeGetTensorImpl()).second) continue;
    out.push_back(checkpoint::OptimizerSlot{item.value(), full_slot(item.key(), item.value(), write)});
  }
  return out;
}

std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  std::set<const c10::TensorImpl*> seen;
  for (const auto& p : module.parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> clone_parameters(torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value().detach().clone());
  return out;
}

ddp::BucketPlanOptions bucket_options(const TrainConfig& config) {
  ddp::BucketPlanOptions b;
  b.bucket_cap_bytes = static_cast<int64_t>(config.ddp.bucket_cap_mb * 1024 * 1024);
  b.first_bucket_cap_bytes = static_cast<int64_t>(config.ddp.first_bucket_cap_mb * 1024 * 1024);
  return b;
}

void check_bucketed_mode(const TrainConfig& config, const std::string& strategy) {
  if (config.ddp.mode == "bucketed") return;
  throw ConfigError(fmt::format("zero.stage = {} ({}) reduces gradients with the bucketed reducer, but ddp.mode = "
                                "\"{}\"; set ddp.mode = \"bucketed\" (or zero.stage = 0 for the naive twin or "
                                "local training)",
                                config.zero.stage, strategy, config.ddp.mode));
}

void require_data_parallel_only(const topology::DeviceMesh& mesh, const std::string& strategy) {
  for (topology::Axis axis : topology::kAxes) {
    if (axis == topology::Axis::kDp || mesh.size(axis) == 1) continue;
    throw ConfigError(fmt::format(
        "parallel.{} = {}: the {} strategy shards over the data-parallel axis only, and no strategy for the {} "
        "axis is built yet; set parallel.{} = 1",
        topology::to_string(axis), mesh.size(axis), strategy, topology::to_string(axis), topology::to_string(axis)));
  }
}

LayerwiseParams sharded_layerwise_params(comm::ProcessGroup& dp, torch::nn::Module& module,
                                         const std::vector<std::pair<at::Tensor, TensorSlot>>& pieces) {
  std::map<std::string, int64_t> index;  // a tied weight keeps its first name, as the slots do
  const auto named = module.named_parameters();
  for (const auto& item : named) index.emplace(item.key(), static_cast<int64_t>(index.size()));
  LayerwiseParams out;
  std::vector<std::pair<at::Tensor, int64_t>> owners;
  for (const auto& [param, slot] : pieces) {
    auto it = index.find(slot.name);
    TORCH_CHECK(it != index.end(), "sharded_layerwise_params: optimizer piece of '", slot.name,
                "' is not a parameter of the module");
    out.full_dims.push_back(static_cast<int64_t>(slot.global_shape.size()));
    owners.emplace_back(param, it->second);
  }
  out.norm_reducer = optim::sharded_norm_reducer(dp, owners, static_cast<int64_t>(index.size()));
  return out;
}

SyncStats sync_stats(const ddp::StepStats& s) { return {s.backward_ms, s.comm_ms(), s.hidden_share(), s.wait_ms}; }

std::vector<at::Tensor> grads_of(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad());
  return out;
}

bool unscale_found_inf(optim::GradScaler* scaler, const std::vector<at::Tensor>& grads,
                       const std::vector<comm::ProcessGroup*>& groups, std::chrono::milliseconds timeout) {
  if (scaler == nullptr) return false;
  return scaler->unscale_(grads, groups, timeout);
}

at::ScalarType compute_dtype(const TrainConfig& config) { return core::parse_compute_dtype(config.precision.compute); }

void convert_batchnorm(const TrainConfig& config, models::Model& model, comm::ProcessGroup& dp,
                       std::chrono::milliseconds timeout) {
  if (!config.model.sync_batchnorm) return;
  sync_batchnorm::ConvertOptions options;
  options.timeout = timeout;
  // The models keep BatchNorm layers in containers (see models/cnn.cpp), so
  // the model itself is never replaced.
  auto converted = sync_batchnorm::convert_sync_batchnorm(model.shared_from_this(), dp, options);
  TORCH_CHECK(converted.get() == &model, "convert_batchnorm: the model itself was replaced");
}

DataParallelStrategy::DataParallelStrategy(const StrategyContext& context, const std::string& strategy)
    : config_(context.config), compute_(compute_dtype(context.config)), dp_(context.mesh.group(topology::Axis::kDp)), timeout_(context.timeout) {
  require_data_parallel_only(context.mesh, strategy);
}

std::vector<TensorSlot> DataParallelStrategy::with_replicated_slots(std::vector<TensorSlot> params) const {
  auto frozen = frozen_parameter_slots(*model_, dp_.rank() == 0);
  if (experts_) frozen = experts_->checkpoint_slots(std::move(frozen));  // a frozen expert: its holder writes it
  params.insert(params.end(), frozen.begin(), frozen.end());
  auto buffers = buffer_slots(*model_, dp_.rank() == 0);
  params.insert(params.end(), buffers.begin(), buffers.end());
  return params;
}

std::vector<at::Tensor> DataParallelStrategy::split_experts() {
  if (config_.parallel.ep <= 1) return {};
  experts_ = std::make_unique<moe::ExpertParallel>(*model_, dp_, static_cast<int>(config_.parallel.ep), timeout_);
  if (dp_.rank() == 0) {
    int64_t numel = 0;
    for (const auto& p : experts_->local_parameters()) numel += p.numel();
    spdlog::info("expert parallelism: {} ep groups of {} ranks; each rank holds 1/{} of every MoE layer's experts "
                 "({} expert parameters here)",
                 dp_.size() / experts_->ep(), experts_->ep(), experts_->ep(), numel);
  }
  return experts_->local_parameters();
}

void DataParallelStrategy::clip_with_experts(double dense_square_sum, double max_norm,
                                             const std::function<void(double)>& scale_dense) {
  const double total = std::sqrt(dense_square_sum + experts_->grad_square_sum());
  // torch::nn::utils::clip_grad_norm_'s coefficient.
  const double coef = max_norm / (total + 1e-6);
  if (coef >= 1) return;
  scale_dense(coef);
  experts_->scale_gradients(coef);
}

std::vector<TensorSlot> DataParallelStrategy::expert_slots() const {
  std::vector<TensorSlot> out;
  if (!experts_) return out;
  for (const auto& item : model_->named_parameters()) {
    if (experts_->holds(item.value()) && item.value().requires_grad()) out.push_back(full_slot(item.key(), item.value(), experts_->writes()));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> DataParallelStrategy::whole_parameters() {
  return experts_ ? experts_->gather(clone_parameters(*model_)) : clone_parameters(*model_);
}

zero::ZeroOptions zero_options(const TrainConfig& config, std::chrono::milliseconds timeout) {
  zero::ZeroOptions options;
  options.stage = static_cast<int>(config.zero.stage);
  options.buckets = bucket_options(config);
  options.find_unused_parameters = config.ddp.find_unused_parameters;
  options.broadcast_buffers = config.ddp.broadcast_buffers;
  options.timeout = timeout;
  options.offload = config.zero.offload == "cpu";
  return options;
}

void log_int8_wire(const ddp::Int8Compression& int8, comm::ProcessGroup& dp) {
  if (dp.rank() != 0) return;
  if (dp.size() == 1) {
    spdlog::info("int8 gradient wire: one rank, nothing crosses a wire, nothing is quantized");
    return;
  }
  const int64_t sent = int8.bytes_per_step(dp.size()), full = int8.fp32_bytes_per_step(dp.size());
  spdlog::info("int8 gradient wire: {} bytes sent per rank and step, {} with fp32 ({:.3f}x); blocks of {}, error "
               "feedback {}",
               sent, full, full > 0 ? static_cast<double>(sent) / static_cast<double>(full) : 1.0,
               int8.options().block, int8.options().error_feedback ? "on" : "off");
}

namespace {
// "fc0, fc1" -> {"fc0", "fc1"}; the config check already vetted the syntax.
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> out;
  std::string current;
  for (char ch : list + ",") {
    if (ch == ',') {
      if (!current.empty()) out.push_back(current);
      current.clear();
    } else if (ch != ' ') {
      current += ch;
    }
  }
  return out;
}
}  // namespace

fsdp::FsdpOptions fsdp_options(const TrainConfig& config, std::chrono::milliseconds timeout) {
  fsdp::FsdpOptions options;
  options.unit_min_params = config.zero.unit_min_params;
  options.unit_modules = split_names(config.zero.unit_modules);
  options.reshard_after_forward = config.zero.reshard_after_forward;
  options.prefetch = config.zero.prefetch;
  options.find_unused_parameters = config.ddp.find_unused_parameters;
  options.timeout = timeout;
  options.offload = config.zero.offload == "cpu";
  return options;
}

ddp::DdpOptions ddp_options(const TrainConfig& config, std::chrono::milliseconds timeout) {
  ddp::DdpOptions options;
  options.broadcast_buffers = config.ddp.broadcast_buffers;
  options.reducer.buckets = bucket_options(config);
  options.reducer.find_unused_parameters = config.ddp.find_unused_parameters;
  options.reducer.timeout = timeout;
  return options;
}

ModelStateBytes zero_chunks_memory(const std::vector<std::unique_ptr<zero::ZeroDataParallel>>& engines,
                                   const torch::optim::Optimizer& optimizer) {
  ModelStateBytes m;
  for (const auto& z : engines) {
    if (!z) continue;  // a frozen pipeline chunk
    const ModelStateBytes b = z->model_state_bytes(nullptr);
    m.params += b.params;
    m.grads += b.grads;
    m.comm_buffers += b.comm_buffers;
  }
  m.optimizer_state = tensor_bytes(optimizer_state_tensors(optimizer));
  return m;
}

}  // namespace paratrain::train::strategies
