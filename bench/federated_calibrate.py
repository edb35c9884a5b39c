#!/usr/bin/env python3
"""The DP-FedAvg noise multiplier that spends a target epsilon.

Bisects the noise multiplier z so that `rounds` rounds of the sampled
Gaussian mechanism at sampling rate q reach `epsilon` at `delta`, with the
formulas paratrain/federated/rdp_accountant.h uses (Mironov, Talwar and
Zhang, arXiv 1908.10530, integer orders 2..256; the conversion of Canonne,
Kamath and Steinke, arXiv 2004.00010, Prop. 12). Prints z. The runs print
the epsilon their own accountant reached; this only picks z.

    bench/federated_calibrate.py --q 0.1 --rounds 50 --delta 1e-5 --epsilon 4
"""
import argparse
import math


def log_add(a, b):
    if a == -math.inf:
        return b
    top = max(a, b)
    return top + math.log(math.exp(a - top) + math.exp(b - top))


def sampled_gaussian_rdp(q, z, alpha):
    log_a = -math.inf
    for k in range(alpha + 1):
        term = (math.lgamma(alpha + 1) - math.lgamma(k + 1) - math.lgamma(alpha - k + 1)
                + (alpha - k) * math.log1p(-q) + (k * math.log(q) if k else 0.0)
                + (k * k - k) / (2 * z * z))
        log_a = log_add(log_a, term)
    return log_a / (alpha - 1)


def epsilon(q, z, rounds, delta):
    best = math.inf
    for alpha in range(2, 257):
        rdp = rounds * sampled_gaussian_rdp(q, z, alpha)
        best = min(best, rdp + math.log((alpha - 1) / alpha) - (math.log(delta) + math.log(alpha)) / (alpha - 1))
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--q", type=float, required=True, help="sampling rate: clients per round / clients")
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--epsilon", type=float, required=True)
    args = parser.parse_args()
    if not 0 < args.q <= 1 or args.rounds < 1 or args.epsilon <= 0:
        parser.error("need 0 < q <= 1, rounds >= 1 and epsilon > 0")
    low, high = 0.05, 100.0
    if epsilon(args.q, high, args.rounds, args.delta) > args.epsilon:
        parser.error(f"epsilon {args.epsilon} needs a noise multiplier above {high}")
    for _ in range(50):
        mid = (low + high) / 2
        if epsilon(args.q, mid, args.rounds, args.delta) > args.epsilon:
            low = mid
        else:
            high = mid
    print(f"{high:.4f}")


if __name__ == "__main__":
    main()
