// The privacy spent by DP-FedAvg, by Rényi differential privacy (RDP): each
// round is the sampled Gaussian mechanism (a client is in the round with
// probability q, its clipped update is hidden by noise of std z x clip), RDP
// adds up over rounds, and the total converts to (epsilon, delta)-DP.
// Formulas: Mironov, Talwar and Zhang, "Rényi Differential Privacy of the
// Sampled Gaussian Mechanism" (arXiv 1908.10530), integer orders; the
// conversion of Canonne, Kamath and Steinke (arXiv 2004.00010, Prop. 12).
// Not the noise itself (round.cpp adds it).
//
// Note [Sampling in the accountant]
// The analysis is for Poisson sampling with rate q; rounds here sample a
// fixed number m of N clients, and we account with q = m / N as TensorFlow
// Federated and Opacus do. That is the common approximation, not a proof
// for sampling without replacement.
#pragma once

#include <cstdint>
#include <vector>

namespace paratrain::federated {

// RDP of order `alpha` (an integer >= 2) of one round of the sampled Gaussian
// mechanism with sampling rate q in [0, 1] and noise multiplier z > 0:
// log(A_alpha) / (alpha - 1), A_alpha = sum_k C(alpha, k) (1-q)^(alpha-k)
// q^k exp((k^2 - k) / (2 z^2)), summed in log space.
double sampled_gaussian_rdp(double q, double noise_multiplier, int64_t alpha);

// min over orders of rdp(alpha) + log((alpha-1)/alpha) - (log(delta) +
// log(alpha)) / (alpha - 1): the (epsilon, delta) guarantee of RDP values
// `rdp` at `orders`.
double epsilon_from_rdp(const std::vector<int64_t>& orders, const std::vector<double>& rdp, double delta);

class RdpAccountant {
 public:
  // Orders 2 .. 256: wide enough for epsilons from ~0.1 to ~100.
  RdpAccountant();
  // `rounds` more rounds at sampling rate q and noise multiplier z.
  void add_rounds(double q, double noise_multiplier, int64_t rounds = 1);
  double epsilon(double delta) const;
  int64_t rounds() const { return rounds_; }
  // The RDP spent at each order (checkpoints), and the inverse; restore
  // throws CheckpointError when `rdp` does not match the orders.
  const std::vector<double>& rdp() const { return rdp_; }
  void restore(const std::vector<double>& rdp, int64_t rounds);

 private:
  std::vector<int64_t> orders_;
  std::vector<double> rdp_;
  int64_t rounds_ = 0;
};

}  // namespace paratrain::federated
