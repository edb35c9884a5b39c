// load_trained_model, quantize_checkpoint, evaluate_trained_model (trained_model.h).
#include "paratrain/train/inference/trained_model.h"

#include <torch/torch.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/rng_guard.h"
#include "paratrain/train/task.h"

namespace paratrain::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kModelPrefix = "model/";
constexpr const char* kScalePrefix = "scale/";

TrainConfig config_of(checkpoint::ShardedReader& reader) {
  const auto& metadata = reader.index().metadata;
  const auto it = metadata.find("config");
  if (it == metadata.end() || it->second == "{}") {
    throw ConfigError(fmt::format("{} holds no config to build its model from (a checkpoint of a program's own "
                                  "model?); only checkpoints paratrain train wrote can be loaded by themselves",
                                  reader.where()));
  }
  try {
    TrainConfig c = config_from_json(nlohmann::json::parse(it->second));
    // Inference trains nothing; a QAT run's model keeps its fake
    // quantization (its forward is what it learned with).
    c.freeze = FreezeConfig{};
    c.distill = DistillConfig{};
    c.quant.start_step = 0;
    return c;
  } catch (const std::exception& e) {
    throw ConfigError(fmt::format("the config saved with {} does not load: {}", reader.where(), e.what()));
  }
}

// "conv0.weight", "fc1.weight", ...: the weights of Linear and Conv2d modules.
std::vector<std::string> quantizable_weights(models::Model& model) {
  std::vector<std::string> out;
  for (const auto& item : model.named_modules("", /*include_self=*/false)) {
    const auto& m = item.value();
    if (m->as<torch::nn::Linear>() || m->as<torch::nn::Conv2d>()) out.push_back(item.key() + ".weight");
  }
  return out;
}

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.numel()) * t.element_size(); }

}  // namespace

TrainedModel load_trained_model(const fs::path& checkpoint) {
  checkpoint::ShardedReader reader(checkpoint);
  TrainedModel out;
  out.config = config_of(reader);
  const auto& metadata = reader.index().metadata;
  out.quantized = metadata.count(kQuantFormatKey) > 0;
  if (out.quantized && metadata.at(kQuantFormatKey) != kQuantFormat) {
    throw CheckpointError(fmt::format("{}: {} = \"{}\" is not a format this paratrain reads ({}); quantize the "
                                      "float checkpoint again",
                                      reader.where(), kQuantFormatKey, metadata.at(kQuantFormatKey), kQuantFormat));
  }
  if (auto step = metadata.find("step"); step != metadata.end()) out.step = std::stoll(step->second);
  if (auto bits = metadata.find("quant.bits"); out.quantized && bits != metadata.end()) out.bits = std::stoi(bits->second);
  {
    CpuRngGuard keep_rng;  // the values are replaced; the caller's random stream stays
    out.model = seeded_model_factory(out.config, c10::Device(c10::kCPU))();
  }
  const auto& tensors = reader.index().tensors;
  torch::NoGradGuard no_grad;
  auto load = [&](const std::string& name, at::Tensor& t) {
    const std::string key = kModelPrefix + name;
    if (!tensors.count(key)) {
      throw CheckpointError(fmt::format("{} has no tensor '{}' that its model ({}) needs", reader.where(), key,
                                        out.config.model.kind));
    }
    at::Tensor value = reader.read_whole(key);
    if (value.scalar_type() == at::kChar) {
      const std::string scale_key = kScalePrefix + name;
      if (!tensors.count(scale_key)) {
        throw CheckpointError(fmt::format("{}: '{}' is int8 but its scales '{}' are missing", reader.where(), key,
                                          scale_key));
      }
      quant::QuantizedTensor q;
      q.values = value;
      q.scales = reader.read_whole(scale_key);
      if (q.scales.numel() != 1 && (value.dim() == 0 || q.scales.numel() != value.size(0))) {
        throw CheckpointError(fmt::format("{}: '{}' has {} scales for a tensor of shape [{}]", reader.where(),
                                          scale_key, q.scales.numel(), fmt::join(value.sizes(), ", ")));
      }
      value = quant::dequantize(q);
    }
    if (value.sizes() != t.sizes()) {
      throw CheckpointError(fmt::format("{}: '{}' is [{}] but its model's is [{}]", reader.where(), key,
                                        fmt::join(value.sizes(), ", "), fmt::join(t.sizes(), ", ")));
    }
    t.copy_(value);
  };
  for (auto& item : out.model->named_parameters()) load(item.key(), item.value());
  for (auto& item : out.model->named_buffers()) load(item.key(), item.value());
  out.model->eval();
  return out;
}

QuantizeReport quantize_checkpoint(const fs::path& checkpoint, const fs::path& out, const QuantizeOptions& given) {
  if (given.bits != 0) quant::max_level(given.bits);  // checks the bits
  checkpoint::ShardedReader reader(checkpoint);
  if (reader.index().metadata.count(kQuantFormatKey)) {
    throw ConfigError(fmt::format("{} is quantized already; quantize the float checkpoint it came from",
                                  reader.where()));
  }
  const TrainedModel trained = load_trained_model(checkpoint);
  QuantizeOptions options = given;
  if (options.bits == 0) options.bits = trained.config.quant.qat ? static_cast<int>(trained.config.quant.weight_bits) : 8;
  checkpoint::SafetensorsContents file;
  for (const auto& [key, value] : reader.index().metadata) {
    if (key != checkpoint::kDataChecksumKey && key != "optimizer" && key != "optimizer_options") file.metadata[key] = value;
  }
  file.metadata[kQuantFormatKey] = kQuantFormat;
  file.metadata["quant.bits"] = std::to_string(options.bits);
  file.metadata["quant.granularity"] =
      options.granularity == quant::Granularity::kPerChannel ? "per_channel" : "per_tensor";
  QuantizeReport report;
  report.bits = options.bits;
  const auto weights = quantizable_weights(*trained.model);
  auto add = [&](const std::string& name, const at::Tensor& t) {
    report.float_bytes += bytes_of(t);
    if (std::find(weights.begin(), weights.end(), name) == weights.end()) {
      file.tensors[kModelPrefix + name] = t.detach().to(at::kFloat).contiguous();
      report.file_bytes += bytes_of(t);
      return;
    }
    const quant::QuantizedTensor q = quant::quantize_symmetric(t, options.bits, options.granularity);
    file.tensors[kModelPrefix + name] = q.values;
    file.tensors[kScalePrefix + name] = q.scales;
    report.file_bytes += bytes_of(q.values) + bytes_of(q.scales);
    report.quantized.push_back(name);
  };
  for (const auto& item : trained.model->named_parameters()) add(item.key(), item.value());
  for (const auto& item : trained.model->named_buffers()) add(item.key(), item.value());
  file.metadata["quant.quantized"] = nlohmann::json(report.quantized).dump();
  checkpoint::write_safetensors(out, file);
  return report;
}

EvalResult evaluate_trained_model(const TrainedModel& trained) {
  const Datasets data = load_datasets(trained.config);
  const auto task = task_for_config(trained.config);
  torch::NoGradGuard no_grad;
  trained.model->eval();
  EvalSums sums;
  const int64_t chunk = std::max<int64_t>(1, task->eval_rows_per_chunk());
  for (int64_t begin = 0; begin < data.test.size(); begin += chunk) {
    const auto rows = torch::arange(begin, std::min(begin + chunk, data.test.size()), torch::kLong);
    const auto batch = data::gather(data.test, rows);
    const EvalSums part = task->eval_sums(trained.model->forward(batch.inputs), batch.targets);
    for (const auto& [name, v] : part.sums) sums.add(name, v);
    sums.count += part.count;
  }
  EvalResult r;
  r.count = static_cast<int64_t>(sums.count);
  const double n = static_cast<double>(std::max<int64_t>(r.count, 1));
  for (const auto& [name, total] : sums.sums) {
    r.metrics.emplace_back("test_" + name, total / n);
    if (name == "loss") r.loss = total / n;
    if (name == "accuracy") r.accuracy = total / n;
  }
  for (auto& [name, v] : task->derived(r.metrics)) {
    if (name == "perplexity") r.perplexity = v;
    r.metrics.emplace_back(std::move(name), v);
  }
  return r;
}

}  // namespace paratrain::train
