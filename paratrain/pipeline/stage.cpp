// StageModule and the helpers that cut a model into chunks: see stage.h.
#include "paratrain/pipeline/stage.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "paratrain/models/recompute.h"

namespace paratrain::pipeline {
namespace {

// Registers `module` under a dotted path ("blocks.3"): torch names a child
// without dots, so each part before the last becomes a plain container module
// (created on first use, shared by later layers: blocks.3 and blocks.4 end up
// in one "blocks"), and parameters read "blocks.3.attn.qkv.weight" as in the
// whole model. A module already registered under the same path (a tied layer
// two layers of one rank share) is kept once.
void register_path(torch::nn::Module& root, const std::string& path, const std::shared_ptr<torch::nn::Module>& module) {
  torch::nn::Module* parent = &root;
  std::string rest = path;
  for (size_t dot = rest.find('.'); dot != std::string::npos; dot = rest.find('.')) {
    const std::string part = rest.substr(0, dot);
    rest = rest.substr(dot + 1);
    const auto children = parent->named_children();
    if (const auto* found = children.find(part)) {
      parent = found->get();
    } else {
      parent = parent->register_module(part, std::make_shared<torch::nn::Module>(part)).get();
    }
  }
  const auto siblings = parent->named_children();
  if (const auto* existing = siblings.find(rest)) {
    TORCH_CHECK(existing->get() == module.get(), "pipeline: two different modules are both named ", path);
    return;
  }
  parent->register_module(rest, module);
}

}  // namespace

StageModule::StageModule(std::vector<models::Layer> layers, std::vector<int> segment_of,
                         std::vector<at::Generator> generators)
    : torch::nn::Module("PipelineStage"),
      layers_(std::move(layers)),
      segment_of_(std::move(segment_of)),
      generators_(std::move(generators)) {
  TORCH_CHECK(!layers_.empty(), "a pipeline chunk needs at least one layer");
  TORCH_CHECK(segment_of_.empty() || segment_of_.size() == layers_.size(), "a pipeline chunk of ", layers_.size(),
              " layers got ", segment_of_.size(), " recompute segment ids");
  for (const auto& layer : layers_) {
    for (const auto& [name, module] : layer.modules) register_path(*this, name, module);
  }
}

at::Tensor StageModule::forward(const at::Tensor& x, int64_t* activation_bytes) {
  return models::run_layers(layers_, x, segment_of_, generators_, activation_bytes);
}

std::string StageModule::describe() const {
  if (layers_.size() == 1) return layers_.front().name;
  return fmt::format("{}..{}", layers_.front().name, layers_.back().name);
}

std::shared_ptr<torch::nn::Module> merge_chunks(const std::vector<std::shared_ptr<StageModule>>& chunks) {
  auto merged = std::make_shared<torch::nn::Module>("PipelineRank");
  for (const auto& chunk : chunks) {
    for (const auto& layer : chunk->layers()) {
      for (const auto& [name, module] : layer.modules) register_path(*merged, name, module);
    }
  }
  return merged;
}

BoundaryShapes infer_boundary_shapes(const std::vector<models::Layer>& layers,
                                     const std::vector<int64_t>& example_shape, at::ScalarType input_dtype) {
  torch::NoGradGuard no_grad;
  std::vector<int64_t> batch_shape{1};
  batch_shape.insert(batch_shape.end(), example_shape.begin(), example_shape.end());
  at::Tensor h = torch::zeros(batch_shape, torch::TensorOptions().dtype(input_dtype).device(layers_device(layers)));
  BoundaryShapes out;
  auto add = [&out](const at::Tensor& t) {
    out.shapes.emplace_back(t.sizes().begin() + 1, t.sizes().end());
    out.dtypes.push_back(t.scalar_type());
  };
  add(h);
  for (const auto& layer : layers) {
    h = layer.forward(h);
    TORCH_CHECK(h.dim() >= 1 && h.size(0) == 1, "pipeline: layer ", layer.name,
                " is not row-wise (one example in, got output of shape ", h.sizes(), ")");
    add(h);
  }
  return out;
}

c10::Device stage_device(const torch::nn::Module& module) {
  for (const auto& p : module.parameters()) return p.device();
  for (const auto& b : module.buffers()) return b.device();
  return c10::Device(c10::kCPU);
}

c10::Device layers_device(const std::vector<models::Layer>& layers) {
  for (const auto& layer : layers) {
    for (const auto& [name, module] : layer.modules) {
      const c10::Device d = stage_device(*module);
      if (!d.is_cpu()) return d;
    }
  }
  return c10::Device(c10::kCPU);
}

std::vector<double> layer_parameter_counts(const std::vector<models::Layer>& layers) {
  std::vector<double> out;
  for (const auto& layer : layers) {
    double n = 0;
    for (const auto& [name, module] : layer.modules) {
      for (const auto& p : module->parameters()) n += static_cast<double>(p.numel());
    }
    out.push_back(n);
  }
  return out;
}

std::vector<double> measure_layer_times(const std::vector<models::Layer>& layers, const BoundaryShapes& shapes,
                                        int64_t rows, const OutputLoss& loss, int repeats) {
  TORCH_CHECK(shapes.shapes.size() == layers.size() + 1, "measure_layer_times: ", shapes.shapes.size(),
              " boundary shapes for ", layers.size(), " layers");
  TORCH_CHECK(rows >= 1 && repeats >= 1, "measure_layer_times: rows ", rows, " and repeats ", repeats, " must be >= 1");
  // Drawing from the global generator would shift every later draw on the
  // measuring rank only (and, with ranks as threads, race them).
  auto generator = at::make_generator<at::CPUGeneratorImpl>(0);
  const c10::Device device = layers_device(layers);
  auto with_rows = [rows](const std::vector<int64_t>& per_example) {
    std::vector<int64_t> shape{rows};
    shape.insert(shape.end(), per_example.begin(), per_example.end());
    return shape;
  };
  struct Probe {
    at::Tensor x;     // the layer's input (requires grad unless it is the data)
    at::Tensor grad;  // what the next stage would send back (empty on the last layer)
  };
  std::vector<Probe> probes;
  for (size_t j = 0; j < layers.size(); ++j) {
    Probe pr;
    const auto dtype = shapes.dtypes[j];
    if (at::isFloatingType(dtype)) {
      pr.x = torch::randn(with_rows(shapes.shapes[j]), generator, at::TensorOptions().dtype(dtype)).to(device);
      // Layer 0's input is the data: the step computes no gradient for it.
      if (j > 0) pr.x.requires_grad_(true);
    } else {
      pr.x = torch::zeros(with_rows(shapes.shapes[j]), at::TensorOptions().dtype(dtype).device(device));  // token ids
    }
    if (j + 1 < layers.size()) pr.grad = torch::randn(with_rows(shapes.shapes[j + 1]), generator).to(device);
    probes.push_back(std::move(pr));
  }
  // Rounds over all layers rather than all repeats of one layer after the
  // other: a burst of load from other processes then slows one run of every
  // layer, not every run of one layer, and the minimum stays fair.
  std::vector<double> out(layers.size(), 1e30);
  for (int rep = 0; rep <= repeats; ++rep) {
    for (size_t j = 0; j < layers.size(); ++j) {
      Probe& pr = probes[j];
      const auto start = std::chrono::steady_clock::now();
      at::Tensor y = layers[j].forward(pr.x);
      if (!pr.grad.defined()) {
        loss(y).backward();
      } else {
        y.backward(pr.grad.to(y.scalar_type()));
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (rep > 0) out[j] = std::min(out[j], s);  // round 0 allocates
      if (pr.x.requires_grad()) pr.x.mutable_grad() = at::Tensor();
    }
  }
  // The probe's gradients must not leak into training.
  for (const auto& layer : layers) {
    for (const auto& [name, module] : layer.modules) {
      for (auto& p : module->parameters()) p.mutable_grad() = at::Tensor();
    }
  }
  return out;
}

}  // namespace paratrain::pipeline
