// The sites of sites.h: each reads the plan attached to its layer.
#include "paratrain/parallelize/sites.h"

#include <ATen/ATen.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "paratrain/core/error.h"
#include "paratrain/parallelize/planned_module.h"
#include "paratrain/sequence_parallel/megatron_sp.h"
#include "paratrain/tensor_parallel/layers.h"
#include "paratrain/tensor_parallel/mappings.h"

namespace paratrain::parallelize {

namespace detail {
std::shared_ptr<PlannedModule> planned(const torch::nn::Module& module) {
  return std::dynamic_pointer_cast<PlannedModule>(tensor_parallel::attached_state(module));
}
}  // namespace detail

namespace {

namespace tpl = tensor_parallel;
namespace sp = sequence_parallel;
using detail::PlannedModule;
using detail::PlanState;

sp::SequenceParallelContext sequence_context(const PlanState& p) {
  return {.group = p.ctx.tp.group, .seq_dim = p.seq_dim, .timeout = p.ctx.tp.timeout};
}

// Replicated activations entering a parallel layer: copy_to_region, or under
// Megatron-SP the gather of the sequence parts (whose backward reduce-scatter
// already sums the ranks' partial input gradients).
at::Tensor enter_region(const PlanState& p, const at::Tensor& x) {
  if (p.sequence_parallel) return sp::gather_from_sequence_region(x, sequence_context(p));
  if (p.defect_skip_input_gradient_sum) return x;
  return tpl::copy_to_region(x, p.ctx.tp);
}

// The partial sums of a rowwise layer (or a vocabulary lookup) leaving it.
at::Tensor leave_region(const PlanState& p, const at::Tensor& partial) {
  if (p.sequence_parallel) return sp::reduce_scatter_to_sequence_region(partial, sequence_context(p));
  return tpl::reduce_from_region(partial, p.ctx.tp);
}

at::Tensor colwise(const PlannedModule& m, torch::nn::LinearImpl& layer, const at::Tensor& x) {
  if (x.dim() == 0 || x.size(-1) != m.full_in) {
    throw Error(fmt::format("tensor-parallel plan: colwise layer '{}' takes the full (replicated) input of "
                            "in_features = {} in its last dimension, got shape [{}]",
                            m.name, m.full_in, fmt::join(x.sizes(), ", ")));
  }
  at::Tensor y = at::linear(enter_region(*m.plan, x), layer.weight, layer.bias);
  return m.style.gather_output ? tpl::gather_from_region(y, m.plan->ctx.tp) : y;
}

at::Tensor rowwise(const PlannedModule& m, torch::nn::LinearImpl& layer, const at::Tensor& x) {
  const int64_t local = layer.weight.size(1);
  if (x.dim() == 0 || x.size(-1) != local) {
    throw Error(fmt::format(
        "tensor-parallel plan: rowwise layer '{}' takes this rank's part of its input, {} of in_features = {} "
        "(the output of a colwise layer before it), got shape [{}]{}",
        m.name, local, m.full_in, fmt::join(x.sizes(), ", "),
        x.dim() > 0 && x.size(-1) == m.full_in
            ? ": a full input means the layer feeding it is not split; plan that one colwise, or this one replicate"
            : ""));
  }
  at::Tensor y = leave_region(*m.plan, at::linear(x, layer.weight));
  return layer.bias.defined() ? y + layer.bias : y;
}

// The plan of `module`, or of its first planned child: a program's root
// module is adopted by the Trainer (Note [Adopting a module]), which plans
// the adopter's tree, the root's children and not the root itself.
std::shared_ptr<PlannedModule> plan_holder(const torch::nn::Module& module) {
  if (auto m = detail::planned(module)) return m;
  for (const auto& child : module.children()) {
    if (auto m = detail::planned(*child)) return m;
  }
  return nullptr;
}

}  // namespace

at::Tensor linear(torch::nn::LinearImpl& layer, const at::Tensor& x) {
  const auto m = detail::planned(layer);
  if (m && !m->runs_at_site() && x.dim() > 0 && x.size(-1) != layer.weight.size(1)) {
    // A whole layer fed a split activation: what LibTorch would report as a
    // shape mismatch, said in the plan's terms.
    throw Error(fmt::format("tensor-parallel plan: '{}' is replicated (in_features = {}) but got input of shape "
                            "[{}]: the layer before it is split (colwise) and nothing gathers its output; plan "
                            "'{}' rowwise, or the layer before it colwise[gather]",
                            m->name, layer.weight.size(1), fmt::join(x.sizes(), ", "), m->name));
  }
  if (!m || !m->runs_at_site()) return layer.forward(x);
  ++m->calls;
  return m->style.style == Style::kColwise ? colwise(*m, layer, x) : rowwise(*m, layer, x);
}

at::Tensor embedding(torch::nn::EmbeddingImpl& layer, const at::Tensor& ids) {
  const auto m = detail::planned(layer);
  if (!m || !m->runs_at_site()) return layer.forward(ids);
  ++m->calls;
  return tpl::vocab_parallel_lookup(ids.to(at::kLong), layer.weight, m->full_out, m->plan->ctx.tp);
}

at::Tensor tied_logits(torch::nn::EmbeddingImpl& embedding, const at::Tensor& x, bool gather) {
  const auto m = detail::planned(embedding);
  if (!m || !m->runs_at_site()) return at::linear(x, embedding.weight);
  ++m->calls;
  at::Tensor y = at::linear(enter_region(*m->plan, x), embedding.weight);
  return gather ? tpl::gather_from_region(y, m->plan->ctx.tp) : y;
}

at::Tensor enter_sequence_parallel(const torch::nn::Module& module, const at::Tensor& x) {
  const auto m = plan_holder(module);
  if (!m || !m->plan->sequence_parallel) return x;
  ++m->plan->entered;
  return sp::scatter_to_sequence_region(x, sequence_context(*m->plan));
}

at::Tensor leave_sequence_parallel(const torch::nn::Module& module, const at::Tensor& x) {
  const auto m = plan_holder(module);
  if (!m || !m->plan->sequence_parallel) return x;
  // The sequence parts gathered; what follows is whole on every rank and
  // computes the same gradient there, so backward keeps this rank's part
  // (no sum): gather_from_region along the sequence dimension.
  const int64_t dim = m->plan->seq_dim < 0 ? m->plan->seq_dim + x.dim() : m->plan->seq_dim;
  const at::Tensor last = x.transpose(dim, -1).contiguous();
  return tpl::gather_from_region(last, m->plan->ctx.tp).transpose(dim, -1).contiguous();
}

const PlanContext* plan_context(const torch::nn::Module& module) {
  const auto m = plan_holder(module);
  // The state lives as long as any module of the tree: the pointer as long
  // as `module`.
  return m ? &m->plan->ctx : nullptr;
}

int tp_size(const torch::nn::Module& module) {
  const PlanContext* c = plan_context(module);
  return c ? c->tp.size() : 1;
}

int64_t local_share(const torch::nn::Module& module, int64_t total, std::string_view what) {
  return tpl::divide_evenly(total, tp_size(module), what);
}

at::Generator* region_generator(const torch::nn::Module& module) {
  const auto m = plan_holder(module);
  return m ? &m->plan->region : nullptr;
}

}  // namespace paratrain::parallelize
