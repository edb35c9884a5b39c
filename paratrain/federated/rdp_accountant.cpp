// RDP accounting for DP-FedAvg: see rdp_accountant.h.
#include "paratrain/federated/rdp_accountant.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include <c10/util/Exception.h>

namespace paratrain::federated {
namespace {

double log_add(double a, double b) {
  if (a == -std::numeric_limits<double>::infinity()) return b;
  if (b == -std::numeric_limits<double>::infinity()) return a;
  const double hi = std::max(a, b);
  return hi + std::log1p(std::exp(std::min(a, b) - hi));
}

double log_binomial(int64_t n, int64_t k) {
  return std::lgamma(static_cast<double>(n + 1)) - std::lgamma(static_cast<double>(k + 1)) -
         std::lgamma(static_cast<double>(n - k + 1));
}

}  // namespace

double sampled_gaussian_rdp(double q, double noise_multiplier, int64_t alpha) {
  TORCH_CHECK(alpha >= 2, "sampled_gaussian_rdp: integer order >= 2 expected, got ", alpha);
  TORCH_CHECK(q >= 0 && q <= 1, "sampled_gaussian_rdp: q must be in [0, 1], got ", q);
  if (q == 0) return 0.0;
  if (noise_multiplier <= 0) return std::numeric_limits<double>::infinity();
  const double z2 = noise_multiplier * noise_multiplier;
  // q = 1 is the plain Gaussian mechanism: alpha / (2 z^2) exactly.
  if (q == 1) return static_cast<double>(alpha) / (2 * z2);
  double log_a = -std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k <= alpha; ++k) {
    const double kk = static_cast<double>(k);
    log_a = log_add(log_a, log_binomial(alpha, k) + static_cast<double>(alpha - k) * std::log1p(-q) +
                               kk * std::log(q) + (kk * kk - kk) / (2 * z2));
  }
  return log_a / static_cast<double>(alpha - 1);
}

double epsilon_from_rdp(const std::vector<int64_t>& orders, const std::vector<double>& rdp, double delta) {
  TORCH_CHECK(orders.size() == rdp.size() && !orders.empty(), "epsilon_from_rdp: one RDP value per order");
  TORCH_CHECK(delta > 0 && delta < 1, "epsilon_from_rdp: delta must be in (0, 1), got ", delta);
  double best = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < orders.size(); ++i) {
    const double a = static_cast<double>(orders[i]);
    const double eps = rdp[i] + std::log1p(-1 / a) - (std::log(delta) + std::log(a)) / (a - 1);
    best = std::min(best, eps);
  }
  return std::max(best, 0.0);
}

RdpAccountant::RdpAccountant() {
  for (int64_t a = 2; a <= 256; ++a) orders_.push_back(a);
  rdp_.assign(orders_.size(), 0.0);
}

void RdpAccountant::add_rounds(double q, double noise_multiplier, int64_t rounds) {
  for (size_t i = 0; i < orders_.size(); ++i)
    rdp_[i] += static_cast<double>(rounds) * sampled_gaussian_rdp(q, noise_multiplier, orders_[i]);
  rounds_ += rounds;
}

double RdpAccountant::epsilon(double delta) const { return epsilon_from_rdp(orders_, rdp_, delta); }

void RdpAccountant::restore(const std::vector<double>& rdp, int64_t rounds) {
  if (rdp.size() != rdp_.size())
    throw CheckpointError(fmt::format("the privacy accountant's state has {} orders, this build uses {}",
                                      rdp.size(), rdp_.size()));
  rdp_ = rdp;
  rounds_ = rounds;
}

}  // namespace paratrain::federated
