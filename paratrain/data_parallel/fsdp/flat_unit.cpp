// FlatUnit: flat layout, shard pieces, and freeing/re-filling the full buffer
// without touching the parameters' TensorImpls. See flat_unit.h.
#include "paratrain/data_parallel/fsdp/flat_unit.h"

#include <torch/torch.h>

#include <algorithm>

namespace paratrain::fsdp {

// Note [Freeing in place]
// Autograd keeps tensors for backward that alias a parameter's memory (the
// parameter itself, or views such as weight.t()). They all share the unit's
// StorageImpl. Freeing swaps that StorageImpl's DataPtr for an empty one and
// sets its size to 0; gathering allocates new memory into the same
// StorageImpl. Tensor objects, sizes, strides and offsets never change, so a
// saved tensor is valid again as soon as its unit is gathered, and the
// parameters stay the same autograd leaves with the same AccumulateGrad.
// Between a free and the next gather the memory must not be read: the engine
// gathers a unit before any operation touches it (see fsdp.cpp).

const char* to_string(UnitState state) {
  switch (state) {
    case UnitState::kFreed: return "freed";
    case UnitState::kGathering: return "gathering";
    case UnitState::kGathered: return "gathered";
  }
  return "?";
}

FlatUnit::FlatUnit(std::string name, std::vector<UnitParam> params, int rank, int world)
    : name_(std::move(name)), params_(std::move(params)), world_(world) {
  TORCH_CHECK(!params_.empty(), "FSDP unit '", name_, "' has no parameters");
  TORCH_CHECK(world >= 1 && rank >= 0 && rank < world, "FSDP unit: rank ", rank, " of ", world);
  const auto options = params_.front().tensor.options();
  for (auto& p : params_) {
    TORCH_CHECK(p.tensor.options().type_equal(options), "FSDP unit '", name_, "': parameter '", p.name,
                "' has ", p.tensor.options(), ", the unit's first has ", options,
                "; a unit holds one dtype and device");
    p.offset = numel_;
    p.numel = p.tensor.numel();
    numel_ += p.numel;
  }
  padded_ = (numel_ + world - 1) / world * world;
  full_ = at::zeros({padded_}, options.requires_grad(false));
  {
    at::NoGradGuard no_grad;
    for (auto& p : params_) {
      // A skeleton's placeholder (one element broadcast: Note [Skeleton
      // models]) leaves its zeros: reshaping it would make it whole.
      const bool placeholder =
          p.tensor.numel() > 1 && p.tensor.storage().nbytes() <= static_cast<size_t>(p.tensor.element_size());
      if (!placeholder) full_.narrow(0, p.offset, p.numel).copy_(p.tensor.detach().reshape({-1}));
      // set_data keeps the TensorImpl (leaf, grad accumulator, hooks) and
      // makes its data a view of the full buffer.
      p.tensor.set_data(full_.narrow(0, p.offset, p.numel).view(p.tensor.sizes()));
    }
  }
  const int64_t per_rank = padded_ / world;
  const int64_t begin = rank * per_rank;
  shard_ = full_.narrow(0, begin, per_rank).clone();
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const int64_t lo = std::max(begin, params_[i].offset);
    const int64_t hi = std::min(begin + per_rank, params_[i].offset + params_[i].numel);
    if (hi > lo) pieces_.push_back({i, lo - params_[i].offset, lo - begin, hi - lo});
  }
}

c10::StorageImpl* FlatUnit::storage() const { return full_.storage().unsafeGetStorageImpl(); }

std::size_t FlatUnit::gathered_bytes() const { return storage()->nbytes(); }

void FlatUnit::allocate() {
  c10::StorageImpl* s = storage();
  const std::size_t bytes = static_cast<std::size_t>(padded_) * full_.element_size();
  if (s->nbytes() == bytes) return;
  s->set_data_ptr_noswap(s->allocator()->allocate(bytes));
  s->set_nbytes(bytes);
}

void FlatUnit::start_gather(comm::ProcessGroup& group) {
  TORCH_CHECK(state_ == UnitState::kFreed, "FSDP unit '", name_, "': start_gather while ", to_string(state_));
  allocate();
  at::Tensor out = full_;
  work_ = group.all_gather(out, shard_);
  state_ = UnitState::kGathering;
}

void FlatUnit::wait_gathered(comm::ProcessGroup& group, std::chrono::milliseconds timeout) {
  if (state_ == UnitState::kGathered) return;
  if (state_ == UnitState::kFreed) start_gather(group);
  wait_in_flight(timeout);
}

// If the wait fails (timeout, peer gone) the backend may still write into
// the memory: it is set aside for the unit's lifetime, and the unit counts as
// gathered with zeroed fresh memory so nothing reads freed memory.
void FlatUnit::wait_in_flight(std::chrono::milliseconds timeout) {
  auto work = std::move(work_);
  state_ = UnitState::kGathered;
  try {
    work->wait(timeout);
  } catch (...) {
    c10::StorageImpl* s = storage();
    abandoned_.push_back(s->set_data_ptr(at::DataPtr(nullptr, full_.device())));
    s->set_nbytes(0);
    state_ = UnitState::kFreed;
    fill_zeros_if_freed();
    throw;
  }
}

void FlatUnit::free(std::chrono::milliseconds timeout) {
  if (state_ == UnitState::kFreed) return;
  // The collective writes into this memory until it completes.
  if (state_ == UnitState::kGathering) wait_in_flight(timeout);
  c10::StorageImpl* s = storage();
  s->set_data_ptr_noswap(at::DataPtr(nullptr, full_.device()));
  s->set_nbytes(0);
  state_ = UnitState::kFreed;
}

void FlatUnit::fill_zeros_if_freed() {
  if (state_ != UnitState::kFreed) return;
  allocate();
  // zero_() and not memset: the memory may be a GPU's.
  full_.zero_();
  state_ = UnitState::kGathered;
}

}  // namespace paratrain::fsdp
