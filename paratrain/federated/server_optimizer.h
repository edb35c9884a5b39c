// How the server turns the round's mean client update into the next global
// model: plain or momentum SGD (FedAvg, FedAvgM) and the adaptive FedAdagrad,
// FedYogi and FedAdam of Reddi et al., "Adaptive Federated Optimization"
// (arXiv 2003.00295, Algorithm 2). Works on the flat global parameter vector;
// its state is two flat tensors. Not the client optimizer (client.h).
//
// Note [Server update]
// delta_t = sum_k w_k (x_k - x_t) / sum_k w_k is a pseudo-gradient pointing
// downhill (clients' models minus the global one). With it:
//   sgd:      m_t = momentum m_{t-1} + delta_t;       x_{t+1} = x_t + lr m_t
//   adaptive: m_t = b1 m_{t-1} + (1 - b1) delta_t
//             adagrad: v_t = v_{t-1} + delta_t^2
//             yogi:    v_t = v_{t-1} - (1 - b2) delta_t^2 sign(v_{t-1} - delta_t^2)
//             adam:    v_t = b2 v_{t-1} + (1 - b2) delta_t^2
//             x_{t+1} = x_t + lr m_t / (sqrt(v_t) + tau)
// with m_{-1} = 0 and v_{-1} = tau^2 (the paper asks v_{-1} >= tau^2), and no
// bias correction, as in the paper. sgd with lr 1 and no momentum makes
// x_{t+1} the weighted mean of the client models: FedAvg.
#pragma once

#include <ATen/core/Tensor.h>

#include <string_view>

namespace paratrain::federated {

enum class ServerOptimizerKind { kSgd, kAdagrad, kYogi, kAdam };
// "sgd" | "adagrad" | "yogi" | "adam"; ConfigError naming federated.server_optimizer.
ServerOptimizerKind parse_server_optimizer(std::string_view name);

struct ServerOptimizerOptions {
  ServerOptimizerKind kind = ServerOptimizerKind::kSgd;
  double lr = 1.0;        // Reddi et al. tune it on a log grid; 1 = FedAvg for sgd
  double momentum = 0.0;  // sgd only
  double beta1 = 0.9;     // adaptive: first moment decay
  double beta2 = 0.99;    // adam / yogi: second moment decay
  double tau = 1e-3;      // adaptive: the degree of adaptivity (larger = closer to sgd)
};

class ServerOptimizer {
 public:
  explicit ServerOptimizer(ServerOptimizerOptions options) : options_(options) {}
  // Applies Note [Server update] to `global` in place (float32 1-D) with the
  // mean update `delta` (same shape).
  void step(at::Tensor& global, const at::Tensor& delta);
  // State for checkpoints: undefined until the first step.
  const at::Tensor& first_moment() const { return m_; }
  const at::Tensor& second_moment() const { return v_; }
  const ServerOptimizerOptions& options() const { return options_; }
  // Resume: the moments of a checkpoint (either may be undefined, as before
  // the first step).
  void restore(at::Tensor first_moment, at::Tensor second_moment) {
    m_ = std::move(first_moment);
    v_ = std::move(second_moment);
  }

 private:
  ServerOptimizerOptions options_;
  at::Tensor m_, v_;
};

}  // namespace paratrain::federated
