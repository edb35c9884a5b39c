// Attention memory per rank: full attention (plain autograd ops over the
// whole sequence, one process) against ring attention on cp = 1, 2, 4 ranks
// (threads, one Gloo group), forward + backward, at growing sequence length.
// Prints one JSON line per (method, cp, seq_len) and a summary line last: the
// longest sequence whose attention memory fits a fixed budget per rank, from
// the analytic model, checked by a measured run at that length.
// Not a timing benchmark (speed is not reported).
//
// Measured: peak bytes of CPU tensors allocated by a rank's thread above
// what it held before the step (inputs and their copies excluded, outputs
// and gradients included), counted by an allocator wrapped around
// LibTorch's CPU allocator.
// Analytic (fp32, B x H heads, head dim D, chunk c = S / cp):
//   full: 3 B H S^2 * 4 bytes  (softmax output saved for backward, and in
//         backward its gradient and the scores' gradient alive together)
//   ring: 2 B H c^2 * 4 bytes  (one score block and its dP/dS in backward)
//         + the mask of the diagonal block (c^2 bytes)
//         + 14 B H c D * 4: 2 packed key/value chunks (this step's and the
//           next, 4 B H c D), dK/dV accumulators (ours, the incoming one,
//           last step's still being sent: 6 B H c D), fp32 dq and the
//           returned dk, dv and output (4 B H c D).
//
//   ring_attention_memory [--budget-mib 24] [--max-seq 2048]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <limits>
#include <mutex>
#include <thread>
#include <vector>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/core/compat.h"
#include "paratrain/sequence_parallel/ring_attention.h"

namespace {

namespace sp = paratrain::sequence_parallel;

constexpr int64_t kBatch = 1, kHeads = 4, kHeadDim = 32;

// ---- counting allocator: live and peak bytes per thread

struct Counter {
  std::atomic<int64_t> live{0};  // freed from any thread
  int64_t peak = 0;              // updated by the owning thread only
};
thread_local Counter* t_counter = nullptr;

class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
#if PARATRAIN_TORCH_AT_LEAST(2, 3)
  c10::DataPtr allocate(size_t n) override { return wrap(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
#else
  c10::DataPtr allocate(size_t n) const override { return wrap(n); }
#endif

 private:
  // The base allocation and the counter it was charged to; a tensor freed on
  // another thread is still credited back to the thread that allocated it.
  // Counters are never freed (tensors may outlive their measurement).
  struct Ctx {
    c10::DataPtr inner;
    Counter* counter;
    int64_t bytes;
  };
  static void release(void* p) {
    auto* ctx = static_cast<Ctx*>(p);
    if (ctx->counter) ctx->counter->live -= ctx->bytes;
    delete ctx;
  }
  c10::DataPtr wrap(size_t n) const {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* ctx = new Ctx{std::move(inner), t_counter, static_cast<int64_t>(n)};
    if (t_counter) {
      const int64_t live = t_counter->live += static_cast<int64_t>(n);
      t_counter->peak = std::max(t_counter->peak, live);
    }
    return {data, ctx, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::Allocator* base_;
};

// Peak bytes above the level at entry while fn runs on this thread.
template <typename Fn>
int64_t measure(Fn&& fn) {
  auto* counter = new Counter;  // leaked on purpose: see CountingAllocator::Ctx
  t_counter = counter;
  fn();
  t_counter = nullptr;
  return counter->peak;
}

// ---- the two methods

double analytic_full(int64_t s) { return 3.0 * kBatch * kHeads * double(s) * double(s) * 4; }
double analytic_ring(int64_t s, int cp) {
  const double c = double(s) / cp, bh = double(kBatch * kHeads);
  return 2 * bh * c * c * 4 + c * c + 14 * bh * c * kHeadDim * 4;
}

struct Inputs {
  at::Tensor q, k, v, grad;
};
Inputs make_inputs(int64_t s) {
  torch::manual_seed(1);
  return {torch::randn({kBatch, kHeads, s, kHeadDim}), torch::randn({kBatch, kHeads, s, kHeadDim}),
          torch::randn({kBatch, kHeads, s, kHeadDim}), torch::randn({kBatch, kHeads, s, kHeadDim})};
}

int64_t measure_full(const Inputs& in) {
  at::Tensor q = in.q.clone().requires_grad_(), k = in.k.clone().requires_grad_(),
             v = in.v.clone().requires_grad_();
  const int64_t s = q.size(2);
  at::Tensor mask = at::ones({s, s}, at::kBool).triu_(1);
  return measure([&] {
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)).mul_(1.0 / std::sqrt(double(kHeadDim)));
    scores.masked_fill_(mask, -std::numeric_limits<float>::infinity());
    at::Tensor out = at::matmul(at::softmax(scores, -1), v);
    scores.reset();
    out.backward(in.grad);
  });
}

int64_t measure_ring(const Inputs& in, int cp) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<int64_t> peaks(cp, 0);
  std::vector<std::thread> threads;
  std::mutex mu;
  std::exception_ptr error;
  for (int r = 0; r < cp; ++r) {
    threads.emplace_back([&, r] {
      try {
        at::set_num_threads(1);
        auto group = paratrain::comm::make_gloo_group(store, r, cp, {});
        auto chunk = [&](const at::Tensor& t) { return sp::sequence_chunk(t, 2, *group).clone(); };
        at::Tensor q = chunk(in.q).requires_grad_(), k = chunk(in.k).requires_grad_(),
                   v = chunk(in.v).requires_grad_(), g = chunk(in.grad);
        peaks[r] = measure([&] {
          at::Tensor out = sp::ring_attention(q, k, v, *group);
          out.backward(g);
        });
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  return *std::max_element(peaks.begin(), peaks.end());
}

// Longest multiple of `step` whose analytic bytes fit the budget.
template <typename F>
int64_t longest_fitting(F bytes, double budget, int64_t step) {
  int64_t s = step;
  while (bytes(s + step) <= budget) s += step;
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Attention memory per rank: full attention vs ring attention at cp = 1, 2, 4"};
  double budget_mib = 24;
  int64_t max_seq = 2048;
  app.add_option("--budget-mib", budget_mib, "attention memory budget per rank for the longest-sequence summary");
  app.add_option("--max-seq", max_seq, "longest sequence of the sweep (powers of two from 256)");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);

  static CountingAllocator counting(c10::GetDefaultCPUAllocator());
  c10::SetCPUAllocator(&counting, /*priority=*/100);

  const std::vector<int> cps{1, 2, 4};
  for (int64_t s = 256; s <= max_seq; s *= 2) {
    const Inputs in = make_inputs(s);
    nlohmann::json full{{"method", "full"}, {"cp", 1}, {"seq_len", s}, {"analytic_bytes", analytic_full(s)},
                        {"measured_peak_bytes", measure_full(in)}};
    std::printf("%s\n", full.dump().c_str());
    for (int cp : cps) {
      nlohmann::json ring{{"method", "ring"}, {"cp", cp}, {"seq_len", s}, {"analytic_bytes", analytic_ring(s, cp)},
                          {"measured_peak_bytes", measure_ring(in, cp)}};
      std::printf("%s\n", ring.dump().c_str());
    }
    std::fflush(stdout);
  }

  // The longest sequence within the budget per rank (multiples of 64 * cp),
  // from the analytic model, then measured at that length.
  const double budget = budget_mib * 1024 * 1024;
  nlohmann::json summary{{"summary", "longest sequence within the attention memory budget per rank"},
                         {"budget_bytes", budget}, {"batch", kBatch}, {"heads", kHeads}, {"head_dim", kHeadDim}};
  const int64_t full_len = longest_fitting(analytic_full, budget, 64);
  summary["full"] = {{"seq_len", full_len}, {"measured_peak_bytes", measure_full(make_inputs(full_len))}};
  for (int cp : cps) {
    const int64_t len = longest_fitting([&](int64_t s) { return analytic_ring(s, cp); }, budget, 64 * cp);
    summary["ring_cp" + std::to_string(cp)] = {{"seq_len", len},
                                               {"vs_full", double(len) / double(full_len)},
                                               {"measured_peak_bytes", measure_ring(make_inputs(len), cp)}};
  }
  std::printf("%s\n", summary.dump().c_str());
  return 0;
}
