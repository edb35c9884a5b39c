// Activation checkpointing: see recompute.h and Note [Recompute in backward].
#include "paratrain/models/recompute.h"

#include <ATen/autocast_mode.h>
#include <ATen/Context.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <fnmatch.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/core/loss_weight.h"

namespace paratrain::models {
namespace {

std::atomic<int64_t> g_recomputed{0};

std::vector<at::Tensor> states_of(const std::vector<at::Generator>& gens) {
  std::vector<at::Tensor> out;
  out.reserve(gens.size());
  for (auto g : gens) {  // a handle: copies share the generator
    std::lock_guard<std::mutex> lock(g.mutex());
    out.push_back(g.get_state());
  }
  return out;
}

void set_states(const std::vector<at::Generator>& gens, const std::vector<at::Tensor>& states) {
  for (size_t i = 0; i < gens.size(); ++i) {
    auto g = gens[i];
    std::lock_guard<std::mutex> lock(g.mutex());
    g.set_state(states[i]);
  }
}

// The autocast dtype the forward ran under (kFloat: none), for the
// recompute to run under the same (core::AutocastGuard sets CPU and CUDA).
at::ScalarType autocast_now() {
  if (at::autocast::is_enabled()) return at::autocast::get_autocast_gpu_dtype();
  if (at::autocast::is_cpu_enabled()) return at::autocast::get_autocast_cpu_dtype();
  return at::kFloat;
}

// What backward needs besides the saved input: the forward to run again,
// the tensors it reads, the random states it started from.
struct Segment : torch::CustomClassHolder {
  std::function<at::Tensor(const at::Tensor&)> fn;
  SegmentState state;
  RandomStates random;
  at::ScalarType autocast = at::kFloat;
  bool input_requires_grad = false;
  // The micro-batch's loss weight the forward saw (core/loss_weight.h): the
  // recompute runs in backward, maybe on the autograd engine's thread, and
  // a layer adding a loss term from inside (a MoE layer) must see it again.
  std::optional<double> loss_weight;
};

struct RecomputeFunction : torch::autograd::Function<RecomputeFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                at::TensorList /*params: edges only*/,
                                                const c10::intrusive_ptr<Segment>& segment) {
    ctx->save_for_backward({x});
    ctx->saved_data["segment"] = c10::IValue::make_capsule(segment);
    // Grad mode is off here (Function::apply). Autocast's cast cache is off
    // too: a cached bf16 copy of a weight made without history would be
    // handed to a later, plain layer reading the same weight, and its
    // gradient lost (pytorch/pytorch#65766).
    const bool cache = at::autocast::is_autocast_cache_enabled();
    at::autocast::set_autocast_cache_enabled(false);
    const auto version = x._version();
    at::Tensor out;
    try {
      out = segment->fn(x);
    } catch (...) {
      at::autocast::set_autocast_cache_enabled(cache);
      throw;
    }
    at::autocast::set_autocast_cache_enabled(cache);
    if (x._version() != version) {
      throw Error(fmt::format(
          "activation checkpointing: layer {} modifies its input in place (an in-place ReLU?), but a recomputed "
          "segment starts again from its input: make the operation out of place, group the layer with the one "
          "before it (train.activation_checkpointing = \"every_k\"), or leave it out of "
          "train.checkpoint_layers",
          segment->state.name));
    }
    return {out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto segment = c10::static_intrusive_pointer_cast<Segment>(ctx->saved_data["segment"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables().at(0);
    at::Tensor input = x.detach();
    if (segment->input_requires_grad) input.requires_grad_(true);

    // Restored after the gradients: BatchNorm's backward reads the running
    // statistics its recompute saved, at the version it saved them.
    const KeepBuffers keep(segment->state.buffers);
    at::Tensor out;
    segment->random.replay([&] {
      torch::AutoGradMode grad(true);
      core::AutocastGuard autocast(segment->autocast);
      std::optional<core::LossWeightScope> weight;
      if (segment->loss_weight) weight.emplace(*segment->loss_weight);
      out = segment->fn(input);
    });
    g_recomputed.fetch_add(1, std::memory_order_relaxed);

    std::vector<at::Tensor> wrt;
    if (segment->input_requires_grad) wrt.push_back(input);
    for (const auto& p : segment->state.params) wrt.push_back(p);
    torch::autograd::variable_list grads;
    if (out.requires_grad() && !wrt.empty()) {
      grads = torch::autograd::grad({out}, wrt, {grad_outputs.at(0)}, /*retain_graph=*/false,
                                    /*create_graph=*/false, /*allow_unused=*/true);
    } else {
      grads.resize(wrt.size());
    }
    // One gradient per forward argument: x, each parameter, the segment.
    torch::autograd::variable_list result;
    size_t k = 0;
    result.push_back(segment->input_requires_grad ? grads[k++] : at::Tensor());
    for (size_t i = 0; i < segment->state.params.size(); ++i) result.push_back(grads[k++]);
    result.emplace_back();
    return result;
  }
};

// The parameters (needing gradients) and buffers of layers [begin, end).
SegmentState state_of(const std::vector<Layer>& layers, size_t begin, size_t end,
                      const std::vector<at::Generator>& generators) {
  SegmentState out;
  out.generators = generators;
  out.name = end - begin == 1 ? layers[begin].name : layers[begin].name + ".." + layers[end - 1].name;
  std::set<const void*> seen;
  auto add = [&](const std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>& modules) {
    for (const auto& [name, module] : modules) {
      for (const auto& p : module->parameters()) {
        if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.params.push_back(p);
      }
      for (const auto& b : module->buffers()) {
        if (seen.insert(b.unsafeGetTensorImpl()).second) out.buffers.push_back(b);
      }
    }
  };
  for (size_t i = begin; i < end; ++i) {
    add(layers[i].modules);
    add(layers[i].reads);
  }
  return out;
}

}  // namespace

RandomStates RandomStates::capture(c10::Device device, const std::vector<at::Generator>& extra) {
  RandomStates out;
  out.generators_.push_back(at::globalContext().defaultGenerator(device.is_cuda() ? device : c10::Device(c10::kCPU)));
  out.generators_.insert(out.generators_.end(), extra.begin(), extra.end());
  out.states_ = states_of(out.generators_);
  return out;
}

void RandomStates::replay(const std::function<void()>& fn) const {
  const std::vector<at::Tensor> now = states_of(generators_);
  set_states(generators_, states_);
  try {
    fn();
  } catch (...) {
    set_states(generators_, now);
    throw;
  }
  set_states(generators_, now);
}

KeepBuffers::KeepBuffers(std::vector<at::Tensor> buffers) : buffers_(std::move(buffers)) {
  torch::NoGradGuard no_grad;
  saved_.reserve(buffers_.size());
  for (const auto& b : buffers_) saved_.push_back(b.clone());
}

KeepBuffers::~KeepBuffers() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < buffers_.size(); ++i) buffers_[i].copy_(saved_[i]);
}

void count_recompute() { g_recomputed.fetch_add(1, std::memory_order_relaxed); }

RecomputeMode parse_recompute_mode(const std::string& name) {
  if (name == "none") return RecomputeMode::kNone;
  if (name == "blocks") return RecomputeMode::kBlocks;
  if (name == "every_k") return RecomputeMode::kEveryK;
  throw Error(fmt::format("activation checkpointing \"{}\": allowed are \"none\", \"blocks\", \"every_k\"", name));
}

std::vector<int> recompute_segments(const std::vector<std::string>& names, const RecomputePolicy& policy) {
  std::vector<int> out(names.size(), -1);
  if (!policy.enabled() || names.empty()) return out;
  if (policy.mode == RecomputeMode::kEveryK && policy.every_k < 1) {
    throw Error(fmt::format("activation checkpointing every_k: k = {} must be at least 1", policy.every_k));
  }
  std::vector<bool> chosen(names.size(), policy.layers.empty());
  if (policy.layers.empty()) {
    chosen.back() = false;
  } else {
    for (const auto& pattern : policy.layers) {
      bool any = false;
      for (size_t i = 0; i < names.size(); ++i) {
        if (fnmatch(pattern.c_str(), names[i].c_str(), 0) == 0) chosen[i] = any = true;
      }
      if (!any) {
        throw Error(fmt::format("activation checkpointing: the layer pattern \"{}\" matches none of the model's "
                                "layers ({}); name layers as the model's layers() does",
                                pattern, fmt::join(names, ", ")));
      }
    }
  }
  const int64_t k = policy.mode == RecomputeMode::kEveryK ? policy.every_k : 1;
  int segment = -1;
  int64_t in_segment = k;  // layers already in the current segment
  for (size_t i = 0; i < names.size(); ++i) {
    if (!chosen[i]) {
      in_segment = k;  // an unchosen layer ends the run
      continue;
    }
    if (in_segment >= k) {
      ++segment;
      in_segment = 0;
    }
    out[i] = segment;
    ++in_segment;
  }
  return out;
}

at::Tensor recompute_in_backward(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& x,
                                 SegmentState state) {
  bool needs = x.requires_grad();
  for (const auto& p : state.params) needs = needs || p.requires_grad();
  if (!torch::GradMode::is_enabled() || !needs) return fn(x);
  auto segment = c10::make_intrusive<Segment>();
  segment->fn = std::move(fn);
  segment->random = RandomStates::capture(x.device(), state.generators);
  segment->state = std::move(state);
  segment->autocast = autocast_now();
  segment->input_requires_grad = x.requires_grad();
  segment->loss_weight = core::loss_weight();
  const std::vector<at::Tensor> params = segment->state.params;
  return RecomputeFunction::apply(x, at::TensorList(params), segment).at(0);
}

at::Tensor run_layers(const std::vector<Layer>& layers, const at::Tensor& x, const std::vector<int>& segment_of,
                      const std::vector<at::Generator>& generators, int64_t* kept_bytes) {
  auto keep = [kept_bytes](const at::Tensor& t) {
    if (kept_bytes != nullptr) *kept_bytes += t.numel() * static_cast<int64_t>(t.element_size());
  };
  TORCH_CHECK(segment_of.empty() || segment_of.size() == layers.size(), "run_layers: ", segment_of.size(),
              " segment ids for ", layers.size(), " layers");
  at::Tensor h = x;
  for (size_t i = 0; i < layers.size();) {
    const int id = segment_of.empty() ? -1 : segment_of[i];
    if (id < 0) {
      h = layers[i].forward(h);
      keep(h);
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < layers.size() && segment_of[end] == id) ++end;
    std::vector<std::function<at::Tensor(const at::Tensor&)>> fns;
    for (size_t j = i; j < end; ++j) fns.push_back(layers[j].forward);
    auto run = [fns = std::move(fns)](const at::Tensor& in) {
      at::Tensor out = in;
      for (const auto& f : fns) out = f(out);
      return out;
    };
    keep(h);
    h = recompute_in_backward(std::move(run), h, state_of(layers, i, end, generators));
    i = end;
  }
  return h;
}

int64_t recomputed_segments() { return g_recomputed.load(std::memory_order_relaxed); }

RecomputedModel::RecomputedModel(std::shared_ptr<Model> inner, RecomputePolicy policy)
    : Model(inner->name()), inner_(std::move(inner)), policy_(std::move(policy)) {
  std::vector<std::string> names;
  for (const auto& layer : inner_->layers()) names.push_back(layer.name);
  if (names.empty()) {
    throw Error(fmt::format("activation checkpointing needs the model as a list of layers, and {} lists none: "
                            "give it layers() (a paratrain::Model), build it as a torch::nn::Sequential, or set "
                            "train.activation_checkpointing = \"none\"",
                            inner_->name()));
  }
  segment_of_ = recompute_segments(names, policy_);
  for (const auto& p : inner_->named_parameters(/*recurse=*/false))
    register_parameter(p.key(), p.value(), p.value().requires_grad());
  for (const auto& b : inner_->named_buffers(/*recurse=*/false)) register_buffer(b.key(), b.value());
  for (const auto& child : inner_->named_children()) register_module(child.key(), child.value());
}

at::Tensor RecomputedModel::forward(const at::Tensor& x) {
  return run_layers(inner_->layers(), x, segment_of_, policy_.generators);
}

void RecomputedModel::train(bool on) {
  torch::nn::Module::train(on);
  inner_->train(on);
}

}  // namespace paratrain::models
