// Megatron-SP mappings: three autograd functions, each a collective along the
// sequence forward and its adjoint backward. See megatron_sp.h.
#include "paratrain/sequence_parallel/megatron_sp.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::sequence_parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t seq_dim_of(const at::Tensor& x, const SequenceParallelContext& sp) {
  const int64_t d = sp.seq_dim < 0 ? sp.seq_dim + x.dim() : sp.seq_dim;
  TORCH_CHECK(d >= 0 && d < x.dim(), "Megatron-SP: seq_dim ", sp.seq_dim, " out of range for a tensor of shape ",
              x.sizes());
  return d;
}

void check_divisible(int64_t seq_len, const comm::ProcessGroup& group, const char* op) {
  if (seq_len % group.size() != 0) {
    throw Error(fmt::format("Megatron-SP {} (tp rank {}): sequence length {} is not divisible by tp = {}; each "
                            "rank holds an equal chunk of the sequence. Use a sequence length that is a multiple "
                            "of {} or another tp",
                            op, group.rank(), seq_len, group.size(), group.size()));
  }
}

// The collectives cut contiguous first-dimension blocks: bring the sequence
// to the front (a copy unless it is there already) and back.
at::Tensor seq_first(const at::Tensor& x, int64_t d) { return (d == 0 ? x : x.movedim(d, 0)).contiguous(); }
at::Tensor seq_back(const at::Tensor& x, int64_t d) { return d == 0 ? x : x.movedim(0, d).contiguous(); }

std::vector<int64_t> with_first(at::IntArrayRef sizes, int64_t first) {
  std::vector<int64_t> s = sizes.vec();
  s[0] = first;
  return s;
}

// [S/tp, ...] on each rank -> [S, ...], chunks in rank order.
at::Tensor all_gather_seq(const at::Tensor& x, const SequenceParallelContext& sp) {
  const int64_t d = seq_dim_of(x, sp);
  comm::ProcessGroup& g = *sp.group;
  at::Tensor front = seq_first(x, d);
  at::Tensor out = at::empty(with_first(front.sizes(), front.size(0) * g.size()), front.options());
  g.all_gather(out, front)->wait(sp.timeout);
  return seq_back(out, d);
}

// [S, ...] partial sums on each rank -> this rank's chunk [S/tp, ...] of the total.
at::Tensor reduce_scatter_seq(const at::Tensor& x, const SequenceParallelContext& sp, const char* op) {
  const int64_t d = seq_dim_of(x, sp);
  comm::ProcessGroup& g = *sp.group;
  check_divisible(x.size(d), g, op);
  at::Tensor front = seq_first(x, d);
  at::Tensor out = at::empty(with_first(front.sizes(), front.size(0) / g.size()), front.options());
  g.reduce_scatter(out, front, comm::ReduceOp::kSum)->wait(sp.timeout);
  return seq_back(out, d);
}

// [S, ...] -> this rank's chunk [S/tp, ...] (a copy, no communication).
at::Tensor split_seq(const at::Tensor& x, const SequenceParallelContext& sp, const char* op) {
  const int64_t d = seq_dim_of(x, sp);
  check_divisible(x.size(d), *sp.group, op);
  const int64_t len = x.size(d) / sp.group->size();
  at::Tensor chunk = x.narrow(d, sp.group->rank() * len, len);
  return chunk.is_contiguous() ? chunk.clone() : chunk.contiguous();
}

// saved_data holds IValues only; the group outlives backward by contract.
void save_context(AutogradContext* ctx, const SequenceParallelContext& sp) {
  ctx->saved_data["group"] = reinterpret_cast<int64_t>(sp.group);
  ctx->saved_data["seq_dim"] = sp.seq_dim;
  ctx->saved_data["timeout_ms"] = static_cast<int64_t>(sp.timeout.count());
}
SequenceParallelContext load_context(AutogradContext* ctx) {
  SequenceParallelContext sp;
  sp.group = reinterpret_cast<comm::ProcessGroup*>(ctx->saved_data["group"].toInt());
  sp.seq_dim = ctx->saved_data["seq_dim"].toInt();
  sp.timeout = std::chrono::milliseconds(ctx->saved_data["timeout_ms"].toInt());
  return sp;
}

class ScatterToSequence : public torch::autograd::Function<ScatterToSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, SequenceParallelContext sp) {
    save_context(ctx, sp);
    return split_seq(x, sp, "scatter_to_sequence_region");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_seq(grads[0], load_context(ctx)), at::Tensor()};
  }
};

class GatherFromSequence : public torch::autograd::Function<GatherFromSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, SequenceParallelContext sp) {
    save_context(ctx, sp);
    return all_gather_seq(x, sp);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {reduce_scatter_seq(grads[0], load_context(ctx), "gather_from_sequence_region backward"), at::Tensor()};
  }
};

class ReduceScatterToSequence : public torch::autograd::Function<ReduceScatterToSequence> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, SequenceParallelContext sp) {
    save_context(ctx, sp);
    return reduce_scatter_seq(x, sp, "reduce_scatter_to_sequence_region");
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {all_gather_seq(grads[0], load_context(ctx)), at::Tensor()};
  }
};

void check_context(const SequenceParallelContext& sp, const char* op) {
  TORCH_CHECK(sp.group != nullptr, op, ": SequenceParallelContext::group is not set");
}

}  // namespace

at::Tensor scatter_to_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp) {
  check_context(sp, "scatter_to_sequence_region");
  if (sp.group->size() == 1) return input;
  return ScatterToSequence::apply(input, sp);
}

at::Tensor gather_from_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp) {
  check_context(sp, "gather_from_sequence_region");
  if (sp.group->size() == 1) return input;
  return GatherFromSequence::apply(input, sp);
}

at::Tensor reduce_scatter_to_sequence_region(const at::Tensor& input, const SequenceParallelContext& sp) {
  check_context(sp, "reduce_scatter_to_sequence_region");
  if (sp.group->size() == 1) return input;
  return ReduceScatterToSequence::apply(input, sp);
}

void sync_sequence_parallel_grads(const std::vector<at::Tensor>& params, const SequenceParallelContext& sp) {
  check_context(sp, "sync_sequence_parallel_grads");
  if (sp.group->size() == 1 || params.empty()) return;
  std::vector<at::Tensor> flat;
  flat.reserve(params.size());
  for (const auto& p : params) {
    flat.push_back(p.grad().defined() ? p.grad().reshape(-1) : at::zeros({p.numel()}, p.options()));
  }
  at::Tensor packed = at::cat(flat);
  sp.group->all_reduce(packed, comm::ReduceOp::kSum)->wait(sp.timeout);
  int64_t offset = 0;
  for (const auto& p : params) {
    at::Tensor sum = packed.narrow(0, offset, p.numel()).view(p.sizes());
    offset += p.numel();
    at::Tensor& grad = p.mutable_grad();
    if (grad.defined()) {
      grad.copy_(sum);
    } else {
      grad = sum.clone();
    }
  }
}

}  // namespace paratrain::sequence_parallel
