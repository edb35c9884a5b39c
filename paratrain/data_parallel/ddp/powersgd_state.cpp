// PowerSGD's state in checkpoints: PowerSgd::state_slots() and
// state_loaded() (declared in powersgd.h). The compression itself is in
// powersgd.cpp.
//
// Note [PowerSGD state in checkpoints]
// What a step depends on beyond the gradients, and how each is saved (names
// under the checkpoint's "state/" prefix):
//   powersgd/steps              int64 {hook calls, compressed calls} of the
//                               buckets (the same for every bucket): start_step
//                               counts against it; replicated, rank 0 writes.
//   powersgd/generator          the stream Q is drawn from (first compressed
//                               step, and every step without warm start).
//   powersgd/q/<param>          [cols, r] warm-start Q: the same on every rank.
//   powersgd/error/<param>      [world, rows, cols]: row k is rank k's error
//                               feedback (what compression dropped, owed to
//                               the next step); each rank writes its own row.
// Everything is named per parameter, not per bucket, so a resume with other
// bucket caps still finds its state. A Q saved before its bucket's first
// compressed step is zeros and stays undrawn on load (compressed calls = 0).
// A resume at another world size finds error rows of another shape: those
// errors restart at zero (the updates they owed are lost, a log line says
// so); at another rank r the Qs do not fit and are drawn afresh.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/data_parallel/ddp/powersgd.h"

namespace paratrain::ddp {
namespace {

constexpr const char* kSteps = "powersgd/steps";
constexpr const char* kGenerator = "powersgd/generator";

std::string q_name(const std::string& param) { return "powersgd/q/" + param; }
std::string error_name(const std::string& param) { return "powersgd/error/" + param; }

TensorSlot replicated(std::string name, const at::Tensor& t, bool write) {
  return TensorSlot{std::move(name), t.sizes().vec(), 0, t, write};
}

}  // namespace

std::vector<TensorSlot> PowerSgd::state_slots(int rank, int world) {
  std::lock_guard lock(mu_);
  TORCH_CHECK(attached_, "PowerSgd::state_slots before attach(reducer)");
  TORCH_CHECK(rank >= 0 && rank < world, "PowerSgd::state_slots: rank ", rank, " of ", world);
  Pending p;
  // Every bucket is reduced once per synchronized step, so their counts agree.
  const int64_t steps = buckets_.empty() ? 0 : buckets_.front().steps;
  p.steps = at::tensor({steps, std::max<int64_t>(0, steps - options_.start_step)}, at::kLong);
  p.generator = generator_.get_state();
  std::vector<TensorSlot> slots{replicated(kSteps, p.steps, rank == 0),
                                replicated(kGenerator, p.generator, rank == 0)};
  for (const BucketState& b : buckets_) {
    const auto options = at::TensorOptions().dtype(b.compute);
    std::vector<at::Tensor> qs;
    for (std::size_t i = 0; i < b.matrices.size(); ++i) {
      const Matrix& m = b.matrices[i];
      qs.push_back(b.qs.empty() ? at::zeros({m.cols, m.rank}, options) : b.qs[i].cpu().clone());
      slots.push_back(replicated(q_name(m.name), qs.back(), rank == 0));
    }
    p.qs.push_back(std::move(qs));
    if (!options_.error_feedback) continue;
    p.errors.push_back(b.error.defined() ? b.error.cpu().clone() : at::zeros({b.numel}, options));
    for (const Matrix& m : b.matrices) {
      const int64_t n = m.rows * m.cols;
      slots.push_back(TensorSlot{error_name(m.name), {world, m.rows, m.cols}, rank * n,
                                 p.errors.back().narrow(0, m.offset, n), true});
    }
  }
  pending_ = std::move(p);
  return slots;
}

void PowerSgd::state_loaded(const std::vector<std::string>& missing) {
  std::lock_guard lock(mu_);
  TORCH_CHECK(pending_.has_value(), "PowerSgd::state_loaded without state_slots() first");
  const std::set<std::string> absent(missing.begin(), missing.end());
  Pending& p = *pending_;
  if (absent.count(kSteps)) {
    // A checkpoint from before PowerSGD's state was saved (or without
    // PowerSGD): start it as at step 0.
    spdlog::warn("the checkpoint has no PowerSGD state: error feedback, Q and the step count restart from zero, so "
                 "this run will not continue exactly as an uninterrupted one");
    for (BucketState& b : buckets_) {
      b.steps = 0;
      b.qs.clear();
      b.error = at::Tensor();
    }
    generator_ = at::make_generator<at::CPUGeneratorImpl>(options_.seed);
    pending_.reset();
    return;
  }
  const int64_t steps = p.steps[0].item<int64_t>();
  const bool compressed = p.steps[1].item<int64_t>() > 0;
  if (!absent.count(kGenerator)) generator_.set_state(p.generator);
  std::vector<std::string> restarted;
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    BucketState& b = buckets_[k];
    b.steps = steps;
    bool all_qs = compressed;
    for (const Matrix& m : b.matrices) all_qs = all_qs && !absent.count(q_name(m.name));
    b.qs.clear();
    if (all_qs) {
      for (const at::Tensor& q : p.qs[k]) b.qs.push_back(q.to(b.device));
    } else if (compressed && !b.matrices.empty()) {
      restarted.push_back(fmt::format("Q of bucket {}", k));
    }
    if (!options_.error_feedback) continue;
    at::Tensor error = p.errors[k];
    for (const Matrix& m : b.matrices) {
      if (!absent.count(error_name(m.name))) continue;
      error.narrow(0, m.offset, m.rows * m.cols).zero_();
      restarted.push_back(error_name(m.name));
    }
    b.error = error.to(b.device);
  }
  if (!restarted.empty()) {
    spdlog::warn("PowerSGD state only partly restored (another world size or powersgd rank?): {} start afresh",
                 fmt::join(restarted, ", "));
  }
  pending_.reset();
}

}  // namespace paratrain::ddp
