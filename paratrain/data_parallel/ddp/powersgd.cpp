#include "paratrain/data_parallel/ddp/powersgd.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "paratrain/comm/two_phase_work.h"
#include "paratrain/core/error.h"

namespace paratrain::ddp {

// The compressed step of one bucket as one Work: phase 1 all-reduces the
// plain tensors and the P factors together in flight, phase 2 the Q factors;
// the orthonormalization and G^T P between them run on whichever thread polls
// or waits first (comm/two_phase_work.h).
// Phase 2 goes to the follow-up group (Note [Second phases on their own
// group], compress_hook.h), which is created here, at launch, in the same
// order on every rank; never lazily.
class PowerSgd::StepWork final : public comm::TwoPhaseWork {
 public:
  StepWork(std::shared_ptr<PowerSgd> owner, comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer)
      : owner_(std::move(owner)), group_(owner_->second_.of(group)), state_(owner_->buckets_[index]),
        buffer_(buffer) {
    const auto& o = owner_->options_;
    // Compute in fp32 at least: QR has no 16-bit kernels, and the error
    // accumulates small differences.
    compute_ = buffer.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
    const double world = group.size();
    // The reducer pre-divides by the world size (sum of buckets = average);
    // PowerSGD works on each rank's own gradient, so undo it for the factors.
    const at::Tensor flat = buffer.view({-1}).to(compute_);
    if (o.error_feedback && !state_.error.defined()) state_.error = at::zeros({state_.numel}, flat.options());
    if (state_.qs.empty() || !o.warm_start) draw_qs(flat.options());

    std::vector<at::Tensor> ps;
    for (std::size_t i = 0; i < state_.matrices.size(); ++i) {
      const Matrix& m = state_.matrices[i];
      at::Tensor g = flat.narrow(0, m.offset, m.rows * m.cols).mul(world);
      if (o.error_feedback) g.add_(state_.error.narrow(0, m.offset, m.rows * m.cols));
      gs_.push_back(g.view({m.rows, m.cols}));
      ps.push_back(at::mm(gs_.back(), state_.qs[i]).view({-1}));
    }
    p_flat_ = at::cat(ps);
    std::vector<at::Tensor> plain;
    for (const Plain& p : state_.plain) plain.push_back(flat.narrow(0, p.offset, p.numel));
    comm::WorkHandle plain_work;
    if (!plain.empty()) {
      plain_flat_ = at::cat(plain);
      plain_work = group.all_reduce(plain_flat_);
    }
    begin(group.all_reduce(p_flat_), std::move(plain_work));
  }

 private:
  comm::WorkHandle after_first() override { return start_q(); }
  void after_second() override { finish(); }

  void draw_qs(const at::TensorOptions& options) {
    state_.qs.clear();
    for (const Matrix& m : state_.matrices)
      state_.qs.push_back(at::randn({m.cols, m.rank}, owner_->generator_, options.device(at::kCPU)).to(options));
  }

  comm::WorkHandle start_q() {
    std::vector<at::Tensor> qs;
    int64_t at_p = 0;
    for (std::size_t i = 0; i < gs_.size(); ++i) {
      const Matrix& m = state_.matrices[i];
      const at::Tensor p = p_flat_.narrow(0, at_p, m.rows * m.rank).view({m.rows, m.rank});
      at_p += m.rows * m.rank;
      // Every rank holds the same summed P, so every rank gets the same
      // basis. Reduced QR's Q is orthonormal even when P is rank-deficient
      // (a zero gradient): its extra columns only widen the projection.
      ps_hat_.push_back(std::get<0>(at::linalg_qr(p, "reduced")));
      qs.push_back(at::mm(gs_[i].t(), ps_hat_.back()).reshape({-1}));
    }
    q_flat_ = at::cat(qs);
    return group_.all_reduce(q_flat_);
  }

  void finish() {
    const auto& o = owner_->options_;
    at::Tensor out = buffer_.view({-1});
    q_flat_.div_(group_.size());
    int64_t at_q = 0;
    for (std::size_t i = 0; i < gs_.size(); ++i) {
      const Matrix& m = state_.matrices[i];
      at::Tensor q = q_flat_.narrow(0, at_q, m.cols * m.rank).view({m.cols, m.rank});
      at_q += m.cols * m.rank;
      const at::Tensor approx = at::mm(ps_hat_[i], q.t());
      if (o.error_feedback) state_.error.narrow(0, m.offset, m.rows * m.cols).copy_((gs_[i] - approx).view({-1}));
      out.narrow(0, m.offset, m.rows * m.cols).copy_(approx.view({-1}));
      if (o.warm_start) state_.qs[i] = q.clone();
    }
    int64_t at_plain = 0;
    for (const Plain& p : state_.plain) {
      out.narrow(0, p.offset, p.numel).copy_(plain_flat_.narrow(0, at_plain, p.numel));
      at_plain += p.numel;
    }
    gs_.clear();
  }

  std::shared_ptr<PowerSgd> owner_;
  comm::ProcessGroup& group_;  // the second group: Q's all-reduce, issued lazily
  BucketState& state_;
  at::Tensor buffer_;
  at::ScalarType compute_ = at::kFloat;
  std::vector<at::Tensor> gs_, ps_hat_;
  at::Tensor p_flat_, q_flat_, plain_flat_;
};

PowerSgd::PowerSgd(PowerSgdOptions options)
    : options_(options), generator_(at::make_generator<at::CPUGeneratorImpl>(options.seed)) {
  if (options_.rank < 1)
    throw ConfigError(fmt::format("PowerSGD rank must be >= 1 (got {}): it is the number of columns of the "
                                  "factors each gradient matrix is sent as",
                                  options_.rank));
  if (options_.start_step < 0)
    throw ConfigError(fmt::format("PowerSGD start_step must be >= 0 (got {})", options_.start_step));
  if (!(options_.min_compression_rate >= 0))
    throw ConfigError(fmt::format("PowerSGD min_compression_rate must be >= 0 (got {})",
                                  options_.min_compression_rate));
}

BucketCommHook PowerSgd::hook() {
  auto self = shared_from_this();
  return [self](comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
    return self->start(group, index, buffer);
  };
}

void PowerSgd::attach(const Reducer& reducer) {
  std::lock_guard lock(mu_);
  buckets_.clear();
  for (const BucketPlan& plan : reducer.plans()) {
    BucketState b;
    b.numel = plan.padded_numel;
    b.compute = plan.dtype == at::kDouble ? at::kDouble : at::kFloat;
    b.device = plan.device;
    for (std::size_t k = 0; k < plan.params.size(); ++k) {
      const at::Tensor& t = reducer.params()[plan.params[k]].tensor;
      const int64_t offset = plan.offsets[k];
      if (t.dim() >= 2) {
        // [n, ...] as n x (the rest): a conv kernel's output channels by its
        // fan-in, as PyTorch's hook views it.
        const int64_t rows = t.size(0), cols = t.numel() / std::max<int64_t>(rows, 1);
        const int64_t r = std::min({options_.rank, rows, cols});
        const double rate = r > 0 ? static_cast<double>(rows * cols) / static_cast<double>(r * (rows + cols)) : 0;
        if (r > 0 && rate >= options_.min_compression_rate) {
          b.matrices.push_back({reducer.params()[plan.params[k]].name, offset, rows, cols, r});
          continue;
        }
      }
      if (t.numel() > 0) b.plain.push_back({offset, t.numel()});
    }
    // Padding past the parameters (ZeRO-style plans) stays zero: not sent.
    buckets_.push_back(std::move(b));
  }
  attached_ = true;
}

comm::WorkHandle PowerSgd::start(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
  std::lock_guard lock(mu_);
  if (!attached_)
    throw Error("PowerSGD hook called before attach(reducer): call powersgd->attach(ddp.reducer()) after "
                "building DDP, before the first backward");
  if (index >= buckets_.size() || buffer.numel() != buckets_[index].numel)
    throw Error(fmt::format("PowerSGD hook: bucket {} ({} elements) does not match the attached reducer's {} "
                            "buckets; attach() the reducer this hook serves",
                            index, buffer.numel(), buckets_.size()));
  pending_.reset();  // a checkpoint's snapshot is written by now (saves copy or finish before the next step)
  BucketState& b = buckets_[index];
  const bool warming_up = b.steps++ < options_.start_step;
  if (warming_up || b.matrices.empty()) return group.all_reduce(buffer);
  return std::make_shared<StepWork>(shared_from_this(), group, index, buffer);
}

int64_t PowerSgd::floats_sent_per_step() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& b : buckets_) {
    for (const auto& m : b.matrices) n += m.rank * (m.rows + m.cols);
    for (const auto& p : b.plain) n += p.numel;
  }
  return n;
}

int64_t PowerSgd::floats_uncompressed_per_step() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& b : buckets_) {
    for (const auto& m : b.matrices) n += m.rows * m.cols;
    for (const auto& p : b.plain) n += p.numel;
  }
  return n;
}

at::Tensor PowerSgd::error(std::size_t bucket) const {
  std::lock_guard lock(mu_);
  TORCH_CHECK(bucket < buckets_.size(), "PowerSgd::error: bucket ", bucket, " of ", buckets_.size());
  return buckets_[bucket].error;
}

}  // namespace paratrain::ddp
