// Shard layouts: slicing a full tensor into a rank's shard and putting the
// gathered shards back together. See shards.h for the layout.
#include "paratrain/tensor_parallel/shards.h"
#include "paratrain/tensor_parallel/attached.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <unordered_map>

#include "paratrain/core/error.h"
#include "paratrain/tensor_parallel/mappings.h"

namespace paratrain::tensor_parallel {
namespace {

// The full tensor's shape with `dim` opened into [groups, tp, chunk].
std::vector<int64_t> opened_shape(const std::vector<int64_t>& full, const ShardSpec& spec, int tp) {
  const int64_t part = full[spec.dim] / spec.groups;
  const int64_t chunk = part / tp;
  std::vector<int64_t> out(full.begin(), full.begin() + spec.dim);
  out.insert(out.end(), {spec.groups, static_cast<int64_t>(tp), chunk});
  out.insert(out.end(), full.begin() + spec.dim + 1, full.end());
  return out;
}

void check_divisible(const ShardSpec& spec, int tp) {
  TORCH_CHECK(spec.dim < static_cast<int64_t>(spec.full_shape.size()), "ShardSpec::dim ", spec.dim,
              " out of range for shape ", at::IntArrayRef(spec.full_shape));
  const int64_t size = spec.full_shape[spec.dim];
  TORCH_CHECK(spec.groups > 0 && size % spec.groups == 0, "ShardSpec: size ", size, " of dim ", spec.dim,
              " is not divisible by groups ", spec.groups);
  divide_evenly(size / spec.groups, tp, "sharded dimension");
}

}  // namespace

std::vector<ShardPiece> pieces(const ShardSpec& spec, int rank, int tp) {
  if (spec.replicated()) return {};
  check_divisible(spec, tp);
  const int64_t part = spec.full_shape[spec.dim] / spec.groups;
  const int64_t chunk = part / tp;
  std::vector<ShardPiece> out;
  for (int64_t g = 0; g < spec.groups; ++g) out.push_back({g * chunk, g * part + rank * chunk, chunk});
  return out;
}

std::vector<SlotSegment> slot_segments(const ShardSpec& spec, int rank, int tp) {
  const auto& shape = spec.full_shape;
  int64_t outer = 1, inner = 1;
  for (int64_t i = 0; i < spec.dim; ++i) outer *= shape[i];
  for (size_t i = spec.dim + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t full_dim = shape[spec.dim], local_dim = full_dim / tp;
  std::vector<SlotSegment> out;
  for (int64_t o = 0; o < outer; ++o) {
    for (const ShardPiece& p : pieces(spec, rank, tp)) {
      out.push_back({(o * local_dim + p.local_offset) * inner, (o * full_dim + p.full_offset) * inner,
                     p.length * inner});
    }
  }
  return out;
}

at::Tensor shard_of(const at::Tensor& full, const ShardSpec& spec, int rank, int tp) {
  TORCH_CHECK(full.sizes() == at::IntArrayRef(spec.full_shape), "shard_of: tensor of shape ", full.sizes(),
              " where the layout expects ", at::IntArrayRef(spec.full_shape));
  if (spec.replicated()) return full.clone();
  check_divisible(spec, tp);
  std::vector<int64_t> local = spec.full_shape;
  local[spec.dim] /= tp;
  return full.reshape(opened_shape(spec.full_shape, spec, tp)).select(spec.dim + 1, rank).reshape(local).clone();
}

at::Tensor unshard(const at::Tensor& stacked, const ShardSpec& spec) {
  const int tp = static_cast<int>(stacked.size(0));
  if (spec.replicated()) return stacked[0].clone();
  check_divisible(spec, tp);
  // stacked: [tp, pre..., groups * chunk, post...] -> [tp, pre..., groups,
  // chunk, post...] -> the rank axis moved between groups and chunk.
  std::vector<int64_t> opened = opened_shape(spec.full_shape, spec, tp);
  std::vector<int64_t> ranked{tp};
  for (size_t i = 0; i < opened.size(); ++i) {
    if (static_cast<int64_t>(i) != spec.dim + 1) ranked.push_back(opened[i]);
  }
  return stacked.reshape(ranked).movedim(0, spec.dim + 1).reshape(spec.full_shape);
}

torch::OrderedDict<std::string, ShardSpec> parameter_layout(const torch::nn::Module& root) {
  std::unordered_map<std::string, ShardSpec> sharded;
  auto collect = [&](const std::string& prefix, const torch::nn::Module& m) {
    std::vector<std::pair<std::string, ShardSpec>> specs;
    if (const auto* s = dynamic_cast<const ShardedModule*>(&m)) {
      specs = s->shard_specs();
    } else if (const auto state = attached_state(m)) {  // a stock layer a plan sliced
      specs = state->shard_specs();
    }
    for (auto& [name, spec] : specs) sharded[prefix.empty() ? name : prefix + "." + name] = spec;
  };
  collect("", root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) collect(item.key(), *item.value());

  torch::OrderedDict<std::string, ShardSpec> out;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    auto it = sharded.find(p.key());
    if (it != sharded.end()) {
      out.insert(p.key(), it->second);
    } else {
      ShardSpec replicated;
      replicated.full_shape = p.value().sizes().vec();
      out.insert(p.key(), replicated);
    }
  }
  return out;
}

void load_full_parameters(torch::nn::Module& root, const torch::OrderedDict<std::string, at::Tensor>& full,
                          const TpContext& ctx) {
  const auto layout = parameter_layout(root);
  at::NoGradGuard no_grad;
  for (auto& p : root.named_parameters(/*recurse=*/true)) {
    const ShardSpec& spec = layout[p.key()];
    const at::Tensor* src = full.find(p.key());
    if (src == nullptr) {
      throw Error(fmt::format("load_full_parameters: no full tensor named '{}' (the tensor-parallel module's "
                              "parameter); the full model must use the same parameter names",
                              p.key()));
    }
    if (src->sizes() != at::IntArrayRef(spec.full_shape)) {
      throw Error(fmt::format("load_full_parameters: '{}' has shape [{}] but the tensor-parallel layer expects "
                              "the full shape [{}]",
                              p.key(), fmt::join(src->sizes(), ", "), fmt::join(spec.full_shape, ", ")));
    }
    p.value().copy_(shard_of(*src, spec, ctx.rank(), ctx.size()));
  }
}

namespace {
// `local` (contiguous) in full: replicated as is, a shard all-gathered over
// ctx.group and put together.
at::Tensor gather_full(const at::Tensor& local, const ShardSpec& spec, const TpContext& ctx) {
  if (spec.replicated() || ctx.size() == 1) return spec.replicated() ? local.clone() : unshard(local.unsqueeze(0), spec);
  std::vector<int64_t> stacked_shape{ctx.size()};
  stacked_shape.insert(stacked_shape.end(), local.sizes().begin(), local.sizes().end());
  at::Tensor stacked = at::empty(stacked_shape, local.options());
  ctx.group->all_gather(stacked, local)->wait(ctx.timeout);
  return unshard(stacked, spec);
}
}  // namespace

torch::OrderedDict<std::string, at::Tensor> gather_full_parameters(const torch::nn::Module& root,
                                                                   const TpContext& ctx, Gather what) {
  const auto layout = parameter_layout(root);
  torch::OrderedDict<std::string, at::Tensor> out;
  for (const auto& p : root.named_parameters(/*recurse=*/true)) {
    at::Tensor local = what == Gather::kValues ? p.value().detach() : p.value().grad();
    if (!local.defined()) local = at::zeros_like(p.value());
    out.insert(p.key(), gather_full(local.contiguous(), layout[p.key()], ctx));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> gather_full_tensors(
    const std::vector<std::pair<std::string, at::Tensor>>& local,
    const torch::OrderedDict<std::string, ShardSpec>& layout, const TpContext& ctx) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(local.size());
  for (const auto& [name, t] : local) {
    const ShardSpec* spec = layout.find(name);
    if (spec == nullptr)
      throw Error(fmt::format("gather_full_tensors: '{}' is not in the tensor-parallel layout", name));
    out.emplace_back(name, gather_full(t.contiguous(), *spec, ctx));
  }
  return out;
}

}  // namespace paratrain::tensor_parallel
