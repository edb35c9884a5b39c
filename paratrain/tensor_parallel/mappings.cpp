// The Megatron mappings as torch::autograd::Functions: each forward is one
// collective (or none) and its backward the conjugate one. See mappings.h.
#include "paratrain/tensor_parallel/mappings.h"

#include <torch/autograd.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::tensor_parallel {

int64_t divide_evenly(int64_t total, int tp, std::string_view what) {
  if (tp <= 0 || total % tp != 0) {
    throw Error(fmt::format("{} ({}) is not divisible by tensor-parallel size ({}); choose a tensor-parallel "
                            "size that divides {}",
                            what, total, tp, what));
  }
  return total / tp;
}

at::Tensor all_reduce_sum(const at::Tensor& x, const TpContext& ctx) {
  if (ctx.size() == 1) return x;
  at::Tensor out = x.contiguous().clone();
  ctx.group->all_reduce(out, comm::ReduceOp::kSum)->wait(ctx.timeout);
  return out;
}

at::Tensor all_gather_last_dim(const at::Tensor& x, const TpContext& ctx) {
  const int tp = ctx.size();
  if (tp == 1) return x;
  const at::Tensor in = x.contiguous();
  // The group gathers flat slices in rank order: [tp, *x.shape], then each
  // rank's block moves to its place along the last dimension.
  std::vector<int64_t> stacked{tp};
  stacked.insert(stacked.end(), in.sizes().begin(), in.sizes().end());
  at::Tensor out = at::empty(stacked, in.options());
  ctx.group->all_gather(out, in)->wait(ctx.timeout);
  std::vector<at::Tensor> parts = out.unbind(0);
  return at::cat(parts, -1);
}

at::Tensor split_last_dim(const at::Tensor& x, const TpContext& ctx) {
  const int tp = ctx.size();
  if (tp == 1) return x;
  const int64_t chunk = divide_evenly(x.size(-1), tp, "last dimension");
  return x.narrow(-1, chunk * ctx.rank(), chunk).contiguous();
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// saved_data holds IValues only, so the context travels as the group's
// address and the timeout in milliseconds (as SyncBatchNorm does); apply()
// takes them as int64 arguments for the same reason.
TpContext load_context(AutogradContext* autograd) {
  return TpContext{reinterpret_cast<comm::ProcessGroup*>(autograd->saved_data["group"].toInt()),
                   std::chrono::milliseconds(autograd->saved_data["timeout_ms"].toInt())};
}

class CopyToRegion : public torch::autograd::Function<CopyToRegion> {
 public:
  static at::Tensor forward(AutogradContext* autograd, const at::Tensor& x, int64_t group, int64_t timeout_ms) {
    autograd->saved_data["group"] = group;
    autograd->saved_data["timeout_ms"] = timeout_ms;
    // Returning an input is allowed: Function::apply wraps it as a new
    // variable whose grad_fn is this node.
    return x;
  }
  static variable_list backward(AutogradContext* autograd, variable_list grads) {
    return {all_reduce_sum(grads[0], load_context(autograd)), at::Tensor(), at::Tensor()};
  }
};

class ReduceFromRegion : public torch::autograd::Function<ReduceFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* autograd, const at::Tensor& x, int64_t group, int64_t timeout_ms) {
    (void)autograd;
    const TpContext ctx{reinterpret_cast<comm::ProcessGroup*>(group), std::chrono::milliseconds(timeout_ms)};
    return all_reduce_sum(x, ctx);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor(), at::Tensor()};
  }
};

class ScatterToRegion : public torch::autograd::Function<ScatterToRegion> {
 public:
  static at::Tensor forward(AutogradContext* autograd, const at::Tensor& x, int64_t group, int64_t timeout_ms) {
    autograd->saved_data["group"] = group;
    autograd->saved_data["timeout_ms"] = timeout_ms;
    return split_last_dim(x, load_context(autograd));
  }
  static variable_list backward(AutogradContext* autograd, variable_list grads) {
    return {all_gather_last_dim(grads[0], load_context(autograd)), at::Tensor(), at::Tensor()};
  }
};

class GatherFromRegion : public torch::autograd::Function<GatherFromRegion> {
 public:
  static at::Tensor forward(AutogradContext* autograd, const at::Tensor& x, int64_t group, int64_t timeout_ms) {
    autograd->saved_data["group"] = group;
    autograd->saved_data["timeout_ms"] = timeout_ms;
    return all_gather_last_dim(x, load_context(autograd));
  }
  static variable_list backward(AutogradContext* autograd, variable_list grads) {
    return {split_last_dim(grads[0], load_context(autograd)), at::Tensor(), at::Tensor()};
  }
};

int64_t group_arg(const TpContext& ctx) {
  TORCH_CHECK(ctx.group != nullptr, "TpContext::group is null: pass the tensor-parallel group");
  return reinterpret_cast<int64_t>(ctx.group);
}

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, const TpContext& ctx) {
  return CopyToRegion::apply(x, group_arg(ctx), static_cast<int64_t>(ctx.timeout.count()));
}

at::Tensor reduce_from_region(const at::Tensor& x, const TpContext& ctx) {
  return ReduceFromRegion::apply(x, group_arg(ctx), static_cast<int64_t>(ctx.timeout.count()));
}

at::Tensor scatter_to_region(const at::Tensor& x, const TpContext& ctx) {
  return ScatterToRegion::apply(x, group_arg(ctx), static_cast<int64_t>(ctx.timeout.count()));
}

at::Tensor gather_from_region(const at::Tensor& x, const TpContext& ctx) {
  return GatherFromRegion::apply(x, group_arg(ctx), static_cast<int64_t>(ctx.timeout.count()));
}

}  // namespace paratrain::tensor_parallel
