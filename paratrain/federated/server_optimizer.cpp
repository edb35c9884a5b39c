// Server optimizers: see Note [Server update] in server_optimizer.h.
#include "paratrain/federated/server_optimizer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::federated {

ServerOptimizerKind parse_server_optimizer(std::string_view name) {
  if (name == "sgd") return ServerOptimizerKind::kSgd;
  if (name == "adagrad") return ServerOptimizerKind::kAdagrad;
  if (name == "yogi") return ServerOptimizerKind::kYogi;
  if (name == "adam") return ServerOptimizerKind::kAdam;
  throw ConfigError(fmt::format(
      "federated.server_optimizer = \"{}\": use \"sgd\", \"adagrad\", \"yogi\" or \"adam\"", name));
}

void ServerOptimizer::step(at::Tensor& global, const at::Tensor& delta) {
  TORCH_CHECK(global.sizes() == delta.sizes(), "ServerOptimizer::step: global and delta differ in shape");
  const auto& o = options_;
  if (o.kind == ServerOptimizerKind::kSgd) {
    if (o.momentum == 0) {
      global.add_(delta, o.lr);
      return;
    }
    if (!m_.defined()) m_ = at::zeros_like(delta);
    m_.mul_(o.momentum).add_(delta);
    global.add_(m_, o.lr);
    return;
  }
  if (!m_.defined()) {
    m_ = at::zeros_like(delta);
    v_ = at::full_like(delta, o.tau * o.tau);
  }
  m_.mul_(o.beta1).add_(delta, 1 - o.beta1);
  const at::Tensor d2 = delta * delta;
  switch (o.kind) {
    case ServerOptimizerKind::kAdagrad: v_.add_(d2); break;
    // Yogi moves v toward delta^2 by a fixed step (1 - b2) delta^2 whatever
    // the gap, so v grows slowly instead of forgetting as Adam's does.
    case ServerOptimizerKind::kYogi: v_.sub_(d2 * at::sign(v_ - d2) * (1 - o.beta2)); break;
    case ServerOptimizerKind::kAdam: v_.mul_(o.beta2).add_(d2, 1 - o.beta2); break;
    case ServerOptimizerKind::kSgd: break;
  }
  global.add_(m_ / (v_.sqrt() + o.tau), o.lr);
}

}  // namespace paratrain::federated
