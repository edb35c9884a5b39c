// load_trained_model, quantize_checkpoint, evaluate_trained_model (trained_model.h).
#include "paratrain/train/inference/trained_model.h"

#include <torch/torch.h>

#include <functional>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_index.h"
#include "paratrain/checkpoint/safetensors.h"
#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/quant/activation_observers.h"
#include "paratrain/quant/int8_kernels.h"
#include "paratrain/train/builders.h"
#include "paratrain/train/qat/fake_quant_model.h"
#include "paratrain/train/rng_guard.h"
#include "paratrain/train/task.h"

namespace paratrain::train {
namespace fs = std::filesystem;
namespace {

constexpr const char* kModelPrefix = "model/";
constexpr const char* kScalePrefix = "scale/";
constexpr const char* kRangePrefix = "act_range/";
constexpr int kActivationBits = 8;  // post-training activation quantization

// The model of an int8 file with quantized activations: its forward runs
// the inner model with an ActivationQuantizer installed (Note [Activation
// sites]); the children are adopted under their own names.
class ActivationQuantModel final : public models::Model {
 public:
  // `make` builds the observer over the inner model.
  ActivationQuantModel(std::shared_ptr<models::Model> inner,
                       const std::function<std::shared_ptr<quant::ActivationObserver>(models::Model&)>& make)
      : Model(inner->name()), inner_(std::move(inner)) {
    for (const auto& p : inner_->named_parameters(/*recurse=*/false))
      register_parameter(p.key(), p.value(), p.value().requires_grad());
    for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
    for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
    observer_ = make(*inner_);
  }
  at::Tensor forward(const at::Tensor& x) override {
    quant::ObserveActivations observe(observer_.get());
    return inner_->forward(x);
  }
  void train(bool on = true) override {
    torch::nn::Module::train(on);
    inner_->train(on);
  }

 private:
  std::shared_ptr<models::Model> inner_;
  std::shared_ptr<quant::ActivationObserver> observer_;
};

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

// The activations an int8 file gets (QuantizeOptions::activations).
struct ActivationPlan {
  std::string mode = "none";
  int bits = 0;
  std::map<std::string, quant::ActivationRange> ranges;  // static only
  int64_t calibrated_batches = 0;
};

// Min and max of every quantized layer's inputs over the first `batches`
// batches of the training split (data.batch_size each, in order).
std::map<std::string, quant::ActivationRange> calibrate(const TrainedModel& trained, int64_t batches) {
  const Datasets data = load_datasets(trained.config);
  const int64_t batch = std::max<int64_t>(1, trained.config.data.batch_size);
  const int64_t rows = std::min(data.train.size(), batches * batch);
  quant::RangeRecorder recorder;
  torch::NoGradGuard no_grad;
  trained.model->eval();
  {
    quant::ObserveActivations observe(&recorder);
    for (int64_t begin = 0; begin < rows; begin += batch) {
      const auto index = torch::arange(begin, std::min(begin + batch, rows), torch::kLong);
      trained.model->forward(data::gather(data.train, index).inputs);
    }
  }
  return recorder.ranges(*trained.model);
}

ActivationPlan plan_activations(const TrainedModel& trained, const QuantizeOptions& options) {
  const auto* qat = dynamic_cast<const FakeQuantModel*>(trained.model.get());
  const bool learned = qat && qat->activation_bits() > 0;
  ActivationPlan plan;
  plan.mode = options.activations;
  if (plan.mode.empty()) plan.mode = qat ? (learned ? "static" : "none") : (options.calibrate > 0 ? "static" : "dynamic");
  if (plan.mode != "none" && plan.mode != "dynamic" && plan.mode != "static")
    throw ConfigError(fmt::format("activations \"{}\": choose none, dynamic or static", plan.mode));
  if (options.calibrate < 0) throw ConfigError(fmt::format("--calibrate {}: a number of batches >= 1", options.calibrate));
  if (options.calibrate > 0 && (plan.mode != "static" || learned))
    throw ConfigError(learned ? "--calibrate measures ranges for a float run; this QAT run learned its own "
                                "(quant.activation_bits), which its file keeps"
                              : "--calibrate measures static activation ranges; it cannot go with " + plan.mode +
                                    " activations");
  if (learned && plan.mode != "static")
    throw ConfigError(fmt::format("this run trained its activations on learned ranges (quant.activation_bits = "
                                  "{}): its file keeps them (static), not {} activations",
                                  qat->activation_bits(), plan.mode));
  if (options.activation_bits != 0) quant::activation_grid({0, 1}, options.activation_bits);  // checks them
  if (learned && options.activation_bits != 0 && options.activation_bits != qat->activation_bits())
    throw ConfigError(fmt::format("this run learned its activation ranges at {} bits (quant.activation_bits); its "
                                  "file keeps them, not {} bits",
                                  qat->activation_bits(), options.activation_bits));
  if (plan.mode == "none") {
    if (options.activation_bits != 0)
      throw ConfigError("activation bits given with float activations (--activations none)");
    return plan;
  }
  plan.bits = learned ? qat->activation_bits() : (options.activation_bits != 0 ? options.activation_bits : kActivationBits);
  if (plan.mode == "dynamic") return plan;
  if (learned) {
    plan.ranges = qat->activation_ranges();
  } else {
    if (options.calibrate == 0)
      throw ConfigError("static activations need their ranges: calibrate on N training batches (--calibrate N)");
    plan.ranges = calibrate(trained, options.calibrate);
    plan.calibrated_batches = options.calibrate;
  }
  for (const auto& [name, layer] : quant::quantized_layers(*trained.model)) {
    if (!plan.ranges.count(name))
      throw ConfigError(fmt::format("no activation range for layer {}: {}", name,
                                    learned ? "the QAT run never fake-quantized it (it stopped before "
                                              "quant.start_step, or the layer never ran)"
                                            : "it saw no input in the calibration batches"));
  }
  return plan;
}

}  // namespace

TrainedModel load_trained_model(const fs::path& checkpoint, const LoadOptions& options) {
  checkpoint::ShardedReader reader(checkpoint);
  TrainedModel out;
  out.config = config_of(reader);
  const auto& metadata = reader.index().metadata;
  out.quantized = metadata.count(kQuantFormatKey) > 0;
  out.kernels = out.quantized ? "simulated" : "float32";
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
  if (const auto* qat = dynamic_cast<const FakeQuantModel*>(out.model.get()); qat && qat->activation_bits() > 0) {
    // A QAT run's model fake-quantizes its activations itself, on the ranges
    // just loaded with its buffers: what its static file records too.
    out.activations = "static";
    out.activation_bits = qat->activation_bits();
  } else if (auto mode = metadata.find("quant.activations"); out.quantized && mode != metadata.end()) {
    out.activations = mode->second;
    if (out.activations != "none" && out.activations != "dynamic" && out.activations != "static")
      throw CheckpointError(fmt::format("{}: quant.activations = \"{}\" is not none, dynamic or static",
                                        reader.where(), out.activations));
    if (out.activations != "none") {
      out.activation_bits = kActivationBits;
      if (auto b = metadata.find("quant.activation_bits"); b != metadata.end()) out.activation_bits = std::stoi(b->second);
      std::map<std::string, quant::ActivationRange> ranges;
      if (out.activations == "static") {
        for (const auto& [name, layer] : quant::quantized_layers(*out.model)) {
          const std::string key = kRangePrefix + name;
          if (!tensors.count(key))
            throw CheckpointError(fmt::format("{} has static activations but no range '{}' for layer {}",
                                              reader.where(), key, name));
          const at::Tensor r = reader.read_whole(key).to(at::kFloat);
          if (r.numel() != 2 || !(r[0].item<float>() <= r[1].item<float>()))
            throw CheckpointError(fmt::format("{}: '{}' must hold [min, max] with min <= max", reader.where(), key));
          ranges[name] = {r[0].item<float>(), r[1].item<float>()};
        }
      }
      // Note [Int8 kernels]: dynamic 8-bit activations with 8-bit weights per
      // output channel run their Linears on LibTorch's int8 kernels where it
      // has one; the rest, and everything of a static file, is simulated.
      const int bits = out.activation_bits;
      // Per-channel files only: the kernel's weights are quantized per
      // output channel again from the dequantized ones, which gives back the
      // file's integers exactly when its scales were per channel too.
      const auto granularity = metadata.find("quant.granularity");
      const bool per_channel = granularity != metadata.end() && granularity->second == "per_channel";
      const bool kernels = options.int8_kernels && out.activations == "dynamic" && out.bits == 8 && bits == 8 &&
                           per_channel && !quant::int8_engine().empty();
      out.model = std::make_shared<ActivationQuantModel>(
          out.model, [&](models::Model& inner) -> std::shared_ptr<quant::ActivationObserver> {
            auto simulated = std::make_shared<quant::ActivationQuantizer>(inner, bits, ranges);
            if (!kernels) return simulated;
            return std::make_shared<quant::Int8LinearKernels>(inner, simulated);
          });
      if (kernels) out.kernels = "int8 Linear (" + quant::int8_engine() + ")";
      out.model->eval();
    }
  }
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
  const ActivationPlan acts = plan_activations(trained, options);
  report.activations = acts.mode;
  report.activation_bits = acts.bits;
  report.calibrated_batches = acts.calibrated_batches;
  file.metadata["quant.activations"] = acts.mode;
  file.metadata["quant.activation_bits"] = std::to_string(acts.bits);
  for (const auto& [name, r] : acts.ranges) file.tensors[kRangePrefix + name] = torch::tensor({r.min, r.max}, torch::kFloat);
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
