// save_checkpoint / load_checkpoint: lays a model, its optimizer and the loop
// position out as named safetensors entries and back. File layout:
//   model/<param or buffer name>            the module's state
//   optimizer/<param name>/<state field>    e.g. optimizer/fc0.weight/exp_avg
//   rng/cpu                                 default CPU generator state (U8)
//   __metadata__: format, step, epoch, batch_in_epoch, sampler_seed, config
//                 (JSON), optimizer (kind), optimizer_options (JSON), extra.*
#include "paratrain/checkpoint/checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/checkpoint_metadata.h"
#include "paratrain/checkpoint/optimizer_state.h"
#include "paratrain/checkpoint/safetensors.h"

namespace paratrain::checkpoint {
namespace {

std::string shape_str(at::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

// Parameters then buffers, by their dotted module path ("fc0.weight").
std::vector<std::pair<std::string, at::Tensor>> module_tensors(torch::nn::Module& model) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : model.named_parameters()) out.emplace_back(item.key(), item.value());
  for (const auto& item : model.named_buffers()) out.emplace_back(item.key(), item.value());
  return out;
}

int64_t metadata_int(const std::map<std::string, std::string>& metadata, const std::string& key,
                     const std::string& file) {
  auto it = metadata.find(key);
  if (it == metadata.end())
    throw CheckpointError(fmt::format("checkpoint '{}' lacks metadata '{}'", file, key));
  try {
    size_t used = 0;
    const long long v = std::stoll(it->second, &used);
    if (used == it->second.size()) return v;
  } catch (const std::exception&) {
  }
  throw CheckpointError(fmt::format("checkpoint '{}': metadata '{}' = '{}' is not an integer", file, key, it->second));
}

// Checks every model tensor against the file (names first, then shapes and
// dtypes) before touching any, so a mismatch leaves the model as it was.
void check_module(const SafetensorsContents& contents, torch::nn::Module& model, const std::string& file) {
  const auto targets = module_tensors(model);
  std::set<std::string> wanted;
  for (const auto& [name, target] : targets) {
    const std::string key = std::string(kModelPrefix) + name;
    wanted.insert(key);
    if (!contents.tensors.count(key))
      throw CheckpointError(fmt::format(
          "checkpoint '{}' has no tensor '{}' that the model needs: was it saved from a different model? "
          "(check the [model] section of the config)",
          file, key));
  }
  for (const auto& [key, tensor] : contents.tensors)
    if (key.starts_with(kModelPrefix) && !wanted.count(key))
      throw CheckpointError(fmt::format(
          "checkpoint '{}' has tensor '{}' that the model lacks: was it saved from a different model?", file, key));
  for (const auto& [name, target] : targets) {
    const std::string key = std::string(kModelPrefix) + name;
    const at::Tensor& saved = contents.tensors.at(key);
    if (saved.sizes() != target.sizes() || saved.scalar_type() != target.scalar_type())
      throw CheckpointError(fmt::format("checkpoint '{}': tensor '{}' is {} {} in the file but {} {} in the model",
                                        file, key, c10::toString(saved.scalar_type()), shape_str(saved.sizes()),
                                        c10::toString(target.scalar_type()), shape_str(target.sizes())));
  }
}

// In place (copy_), so optimizers and DDP hooks holding the tensors stay valid.
void copy_module(const SafetensorsContents& contents, torch::nn::Module& model) {
  torch::NoGradGuard no_grad;
  for (auto& [name, target] : module_tensors(model)) target.copy_(contents.tensors.at(std::string(kModelPrefix) + name));
}

}  // namespace

std::map<std::string, std::string> training_metadata(const TrainingState& state, const OptimizerStateIo* io,
                                                     const torch::optim::Optimizer* optimizer) {
  std::map<std::string, std::string> m = {{"format", std::string(kCheckpointFormat)},
                                          {"step", std::to_string(state.step)},
                                          {"epoch", std::to_string(state.epoch)},
                                          {"batch_in_epoch", std::to_string(state.batch_in_epoch)},
                                          {"sampler_seed", std::to_string(static_cast<int64_t>(state.sampler_seed))},
                                          {"config", state.config.is_null() ? "{}" : state.config.dump()},
                                          {"torch_version", TORCH_VERSION}};
  if (io != nullptr && optimizer != nullptr) {
    m.emplace("optimizer", io->kind);
    m.emplace("optimizer_options", io->options_json(*optimizer).dump());
  }
  for (const auto& [k, v] : state.extra) m.emplace("extra." + k, v);
  return m;
}

TrainingState training_state_from_metadata(const std::map<std::string, std::string>& metadata,
                                           const std::string& file) {
  auto format = metadata.find("format");
  if (format == metadata.end() || format->second != kCheckpointFormat)
    throw CheckpointError(fmt::format("'{}' is not a paratrain checkpoint (metadata format = '{}', expected '{}')",
                                      file, format == metadata.end() ? "" : format->second, kCheckpointFormat));
  TrainingState s;
  s.step = metadata_int(metadata, "step", file);
  s.epoch = metadata_int(metadata, "epoch", file);
  s.batch_in_epoch = metadata_int(metadata, "batch_in_epoch", file);
  s.sampler_seed = static_cast<uint64_t>(metadata_int(metadata, "sampler_seed", file));
  if (s.step < 0 || s.epoch < 0 || s.batch_in_epoch < 0)
    throw CheckpointError(fmt::format("checkpoint '{}': negative step/epoch/batch_in_epoch in its metadata", file));
  if (auto it = metadata.find("config"); it != metadata.end()) {
    try {
      s.config = nlohmann::json::parse(it->second);
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("checkpoint '{}': metadata 'config' is not JSON: {}", file, e.what()));
    }
  }
  for (const auto& [k, v] : metadata)
    if (k.starts_with("extra.")) s.extra.emplace(k.substr(6), v);
  return s;
}

void check_optimizer_kind(const std::map<std::string, std::string>& metadata, const OptimizerStateIo& io,
                          const std::string& file) {
  const auto saved_kind = metadata.find("optimizer");
  if (saved_kind == metadata.end())
    throw CheckpointError(fmt::format("checkpoint '{}' lacks metadata 'optimizer'", file));
  if (saved_kind->second != io.kind)
    throw CheckpointError(fmt::format(
        "checkpoint '{}' holds {} optimizer state but the optimizer is {}: set optimizer.kind = \"{}\" to resume it",
        file, saved_kind->second, io.kind, saved_kind->second));
}

void save_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state,
                     const SaveCheckpointOptions& options) {
  SafetensorsContents c;
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, tensor] : module_tensors(model)) {
    c.tensors.emplace(std::string(kModelPrefix) + name, tensor);
    names.emplace(tensor.unsafeGetTensorImpl(), name);  // tied weights keep their first name
  }
  const OptimizerStateIo& io = optimizer_state_io(optimizer, path.string());
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      if (name == names.end())
        throw CheckpointError(fmt::format(
            "cannot save checkpoint '{}': the optimizer holds a parameter of shape {} that is not in the model "
            "(optimizer state is keyed by the model's parameter names)",
            path.string(), shape_str(p.sizes())));
      auto it = optimizer.state().find(optimizer_state_key(p));
      if (it == optimizer.state().end()) continue;  // not stepped yet
      for (auto& [field, t] : io.save(*it->second))
        c.tensors.emplace(fmt::format("{}{}/{}", kOptimizerPrefix, name->second, field), t);
    }
  }
  if (options.save_rng) {
    auto gen = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(gen.mutex());
    c.tensors.emplace(std::string(kRngKey), gen.get_state());
  }
  c.metadata = training_metadata(state, &io, &optimizer);
  SafetensorsWriteOptions write_options;
  write_options.sync = options.sync;
  write_safetensors(path, c, write_options);
}

TrainingState load_checkpoint(const std::filesystem::path& path, torch::nn::Module& model,
                              torch::optim::Optimizer& optimizer, const LoadCheckpointOptions& options) {
  const std::string file = path.string();
  const SafetensorsContents c = read_safetensors(path);
  TrainingState state = training_state_from_metadata(c.metadata, file);
  check_module(c, model, file);
  const OptimizerStateIo& io = optimizer_state_io(optimizer, file);
  check_optimizer_kind(c.metadata, io, file);

  // Build all new optimizer states (validating them) before changing anything.
  std::map<std::string, at::Tensor> param_by_name;
  for (const auto& [name, tensor] : module_tensors(model)) param_by_name.emplace(name, tensor);
  std::map<const c10::TensorImpl*, std::string> names;
  for (const auto& [name, tensor] : param_by_name) names.emplace(tensor.unsafeGetTensorImpl(), name);
  std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>> new_states;
  std::set<std::string> used;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& p : group.params()) {
      auto name = names.find(p.unsafeGetTensorImpl());
      if (name == names.end())
        throw CheckpointError(fmt::format("cannot load checkpoint '{}': the optimizer holds a parameter of shape "
                                          "{} that is not in the model",
                                          file, shape_str(p.sizes())));
      const std::string prefix = fmt::format("{}{}/", kOptimizerPrefix, name->second);
      std::map<std::string, at::Tensor> fields;
      for (auto it = c.tensors.lower_bound(prefix); it != c.tensors.end() && it->first.starts_with(prefix); ++it) {
        fields.emplace(it->first.substr(prefix.size()), it->second);
        used.insert(it->first);
      }
      if (fields.empty()) continue;  // saved before this parameter's first step
      new_states.emplace_back(optimizer_state_key(p), io.load(fields, p, group.options(), prefix, file));
    }
  }
  for (const auto& [key, tensor] : c.tensors)
    if (key.starts_with(kOptimizerPrefix) && !used.count(key))
      throw CheckpointError(fmt::format("checkpoint '{}' has optimizer state '{}' for no parameter of this optimizer",
                                        file, key));
  copy_module(c, model);
  optimizer.state().clear();
  for (auto& [key, s] : new_states) optimizer.state()[key] = std::move(s);
  if (options.restore_rng) {
    if (auto it = c.tensors.find(std::string(kRngKey)); it != c.tensors.end()) {
      auto gen = at::detail::getDefaultCPUGenerator();
      std::lock_guard<std::mutex> lock(gen.mutex());
      try {
        gen.set_state(it->second);
      } catch (const c10::Error& e) {
        throw CheckpointError(fmt::format("checkpoint '{}': '{}' is not a CPU generator state of this LibTorch: {}",
                                          file, kRngKey, e.what_without_backtrace()));
      }
    }
  }
  return state;
}

TrainingState load_model_weights(const std::filesystem::path& path, torch::nn::Module& model) {
  const SafetensorsContents c = read_safetensors(path);
  TrainingState state = training_state_from_metadata(c.metadata, path.string());
  check_module(c, model, path.string());
  copy_module(c, model);
  return state;
}

}  // namespace paratrain::checkpoint
