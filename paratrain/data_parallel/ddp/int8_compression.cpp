// Int8Compression: see int8_compression.h.
//
// Note [Int8 wire state in checkpoints]
// A step depends on the residuals of the last one (Note [The int8 gradient
// wire]), so they are saved beside the model, named per parameter (a resume
// with other bucket caps still finds them), under the checkpoint's "state/":
//   int8_wire/sent/<param>    [world, numel]: row k is rank k's phase-1
//                             residual for the parameter; each rank writes
//                             its own row. At another world size the shape
//                             differs: those residuals restart at zero (what
//                             they owed, under half a step per element, is
//                             lost, and a log line says so).
//   int8_wire/summed/<param>  [numel]: the phase-2 residual, which lives with
//                             the owner of each slice of the bucket; every
//                             rank writes the part of the parameter in its
//                             slice. Any world size re-cuts it.
// ZeRO-2's reduce-scatter has no phase 2, so no "summed" slots.
#include "paratrain/data_parallel/ddp/int8_compression.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"

namespace paratrain::ddp {
namespace {

std::string sent_name(const std::string& param) { return "int8_wire/sent/" + param; }
std::string summed_name(const std::string& param) { return "int8_wire/summed/" + param; }

}  // namespace

Int8Compression::Int8Compression(Int8CompressionOptions options) : options_(options) {
  if (options_.block < 1)
    throw ConfigError(fmt::format("int8 gradient wire: the block must hold at least one element (got {})",
                                  options_.block));
}

BucketCommHook Int8Compression::hook() {
  auto self = shared_from_this();
  return [self](comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
    return self->start(group, index, buffer);
  };
}

void Int8Compression::attach(const Reducer& reducer, bool reduce_scatter) {
  std::lock_guard lock(mu_);
  buckets_.clear();
  for (const BucketPlan& plan : reducer.plans()) {
    BucketState b;
    b.numel = plan.padded_numel;
    b.device = plan.device;
    b.scatter = reduce_scatter;
    for (std::size_t k = 0; k < plan.params.size(); ++k) {
      const at::Tensor& t = reducer.params()[plan.params[k]].tensor;
      if (t.numel() > 0) b.params.push_back({reducer.params()[plan.params[k]].name, plan.offsets[k], t.numel()});
    }
    buckets_.push_back(std::move(b));
  }
  attached_ = true;
}

Int8Compression::BucketState& Int8Compression::bucket(std::size_t index, int64_t numel, const char* who) {
  if (!attached_)
    throw Error(fmt::format("int8 gradient wire: {} before attach(reducer): call int8->attach(reducer) after "
                            "building DDP or ZeRO, before the first backward",
                            who));
  if (index >= buckets_.size() || numel != buckets_[index].numel)
    throw Error(fmt::format("int8 gradient wire: bucket {} ({} elements) does not match the attached reducer's "
                            "{} buckets; attach() the reducer this hook serves",
                            index, numel, buckets_.size()));
  return buckets_[index];
}

void Int8Compression::ensure_residuals(BucketState& b, int world) {
  if (!options_.error_feedback) return;
  if (b.world == world && b.residuals.sent.defined()) return;
  if (b.world != 0 && b.world != world)
    spdlog::warn("int8 gradient wire: the group changed from {} to {} ranks; error feedback restarts at zero",
                 b.world, world);
  const auto options = at::TensorOptions().dtype(at::kFloat).device(b.device);
  b.world = world;
  b.residuals.sent = at::zeros({b.numel}, options);
  b.residuals.summed = b.scatter ? at::Tensor() : at::zeros({int8_slice_numel(b.numel, world)}, options);
}

comm::WorkHandle Int8Compression::start(comm::ProcessGroup& group, std::size_t index, at::Tensor& buffer) {
  std::lock_guard lock(mu_);
  BucketState& b = bucket(index, buffer.numel(), "hook called");
  if (b.scatter) throw Error("int8 gradient wire: the all-reduce hook called on buckets attached for reduce-scatter");
  pending_.reset();  // a checkpoint's snapshot is written by now
  // On one rank nothing crosses a wire: nothing is quantized.
  if (group.size() == 1) return group.all_reduce(buffer);
  ensure_residuals(b, group.size());
  return all_reduce_int8(group, buffer, b.residuals, second_.of(group), options_.block, b.scratch);
}

comm::WorkHandle Int8Compression::reduce_scatter(comm::ProcessGroup& group, std::size_t index, at::Tensor& shard,
                                                 const at::Tensor& buffer) {
  std::lock_guard lock(mu_);
  BucketState& b = bucket(index, buffer.numel(), "reduce_scatter called");
  if (!b.scatter)
    throw Error("int8 gradient wire: reduce_scatter called on buckets attached for all-reduce (attach(reducer, true))");
  pending_.reset();
  if (group.size() == 1) return group.reduce_scatter(shard, buffer, comm::ReduceOp::kSum);
  ensure_residuals(b, group.size());
  return reduce_scatter_int8(group, shard, buffer, b.residuals.sent, options_.block, b.scratch);
}

int64_t Int8Compression::bytes_per_step(int p) const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const BucketState& b : buckets_) {
    const int64_t phase = p > 1 ? int8_wire_bytes_per_phase(b.numel, p, options_.block) : 0;
    n += b.scatter ? phase : 2 * phase;
  }
  return n;
}

int64_t Int8Compression::fp32_bytes_per_step(int p) const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const BucketState& b : buckets_) {
    // A ring reduce-scatter sends (p - 1) / p of the buffer; an all-reduce twice that.
    const int64_t phase = 4 * b.numel * (p - 1) / std::max(p, 1);
    n += b.scatter ? phase : 2 * phase;
  }
  return n;
}

Int8Residuals Int8Compression::residuals(std::size_t bucket) const {
  std::lock_guard lock(mu_);
  TORCH_CHECK(bucket < buckets_.size(), "Int8Compression::residuals: bucket ", bucket, " of ", buckets_.size());
  return buckets_[bucket].residuals;
}

std::vector<TensorSlot> Int8Compression::state_slots(int rank, int world) {
  std::lock_guard lock(mu_);
  TORCH_CHECK(attached_, "Int8Compression::state_slots before attach(reducer)");
  TORCH_CHECK(rank >= 0 && rank < world, "Int8Compression::state_slots: rank ", rank, " of ", world);
  std::vector<TensorSlot> slots;
  std::vector<Int8Residuals> snapshot;
  if (!options_.error_feedback) {
    pending_ = std::move(snapshot);
    pending_rank_ = rank;
    return slots;
  }
  for (BucketState& b : buckets_) {
    // Before the first step (a resume at start-up) the residuals are made
    // for this world.
    ensure_residuals(b, world);
    Int8Residuals s{b.residuals.sent.cpu().clone(),
                    b.residuals.summed.defined() ? b.residuals.summed.cpu().clone() : at::Tensor()};
    const int64_t slice = s.summed.defined() ? s.summed.numel() : 0;
    for (const Param& p : b.params) {
      slots.push_back(TensorSlot{sent_name(p.name), {world, p.numel}, rank * p.numel,
                                 s.sent.narrow(0, p.offset, p.numel), true});
      if (!s.summed.defined()) continue;
      const int64_t lo = std::max(p.offset, rank * slice), hi = std::min(p.offset + p.numel, (rank + 1) * slice);
      if (hi <= lo) continue;
      slots.push_back(
          TensorSlot{summed_name(p.name), {p.numel}, lo - p.offset, s.summed.narrow(0, lo - rank * slice, hi - lo), true});
    }
    snapshot.push_back(std::move(s));
  }
  pending_ = std::move(snapshot);
  pending_rank_ = rank;
  return slots;
}

void Int8Compression::state_loaded(const std::vector<std::string>& missing) {
  std::lock_guard lock(mu_);
  TORCH_CHECK(pending_.has_value(), "Int8Compression::state_loaded without state_slots() first");
  if (!options_.error_feedback) {
    pending_.reset();
    return;
  }
  const std::set<std::string> absent(missing.begin(), missing.end());
  std::vector<std::string> restarted;
  std::size_t asked = 0, sent_missing = 0, summed_asked = 0, summed_missing = 0;
  for (std::size_t k = 0; k < buckets_.size(); ++k) {
    BucketState& b = buckets_[k];
    Int8Residuals& s = (*pending_)[k];
    const int64_t slice = s.summed.defined() ? s.summed.numel() : 0;
    for (const Param& p : b.params) {
      ++asked;
      if (absent.count(sent_name(p.name))) {
        s.sent.narrow(0, p.offset, p.numel).zero_();
        restarted.push_back(sent_name(p.name));
        ++sent_missing;
      }
      if (!s.summed.defined()) continue;
      const int64_t lo = std::max(p.offset, pending_rank_ * slice);
      const int64_t hi = std::min(p.offset + p.numel, (pending_rank_ + 1) * slice);
      if (hi <= lo) continue;
      ++summed_asked;
      if (!absent.count(summed_name(p.name))) continue;
      s.summed.narrow(0, lo - pending_rank_ * slice, hi - lo).zero_();
      restarted.push_back(summed_name(p.name));
      ++summed_missing;
    }
    b.residuals.sent.copy_(s.sent);
    if (s.summed.defined()) b.residuals.summed.copy_(s.summed);
  }
  if (sent_missing == asked && summed_missing == summed_asked && asked > 0) {
    // Nothing of the wire's state fits: another ddp.compression, or (with no
    // per-slice residuals to tell by: ZeRO-2) another world size.
    spdlog::warn("the checkpoint has no int8 gradient wire state for this world size (saved with another "
                 "ddp.compression or at another world size?): error feedback starts at zero");
  } else if (sent_missing == asked && summed_missing == 0 && asked > 0) {
    spdlog::warn("int8 gradient wire: the checkpoint was saved at another world size: each rank's residuals "
                 "restart at zero (what they owed, under half a quantization step per element, is lost); the "
                 "per-slice ones are re-cut");
  } else if (!restarted.empty()) {
    spdlog::warn("int8 gradient wire: error feedback only partly restored: {} restart at zero",
                 fmt::join(restarted, ", "));
  }
  pending_.reset();
}

}  // namespace paratrain::ddp
