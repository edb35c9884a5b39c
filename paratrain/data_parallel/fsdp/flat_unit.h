// FlatUnit: one FSDP wrapping unit's memory. Its parameters live as views in
// one flat "full" buffer (padded to a multiple of the group size); rank r owns
// slice r of it as the "shard", the master copy the optimizer updates. The
// full buffer's memory is freed between uses and re-filled by an all-gather,
// while every parameter keeps its TensorImpl (see Note [Freeing in place]).
// Not here: when to gather or free (fsdp.cpp), gradients (grad_sink.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace c10 {
struct StorageImpl;
}

namespace paratrain::fsdp {

struct UnitParam {
  std::string name;    // as in the root module's named_parameters()
  at::Tensor tensor;   // the user's parameter (its data is a view of the full buffer)
  int64_t offset = 0;  // first element in the unit's flat buffer
  int64_t numel = 0;
};

// This rank's share of one parameter: elements [param_begin, param_begin +
// numel) of the flattened parameter, stored at [shard_begin, ...) of the shard.
struct ShardPiece {
  std::size_t param = 0;  // index into FlatUnit::params()
  int64_t param_begin = 0;
  int64_t shard_begin = 0;
  int64_t numel = 0;
};

enum class UnitState { kFreed, kGathering, kGathered };
const char* to_string(UnitState state);

class FlatUnit {
 public:
  // Takes the parameters' current values as the unit's content (the caller
  // makes them equal on every rank first) and re-points each parameter at
  // its view of the full buffer. Leaves the unit gathered.
  FlatUnit(std::string name, std::vector<UnitParam> params, int rank, int world);
  FlatUnit(const FlatUnit&) = delete;
  FlatUnit& operator=(const FlatUnit&) = delete;
  FlatUnit(FlatUnit&&) = default;

  const std::string& name() const { return name_; }
  const std::vector<UnitParam>& params() const { return params_; }
  const std::vector<ShardPiece>& pieces() const { return pieces_; }
  int64_t numel() const { return numel_; }
  int64_t padded_numel() const { return padded_; }
  int64_t shard_numel() const { return padded_ / world_; }

  // The flat buffer every parameter is a view of; its storage may be freed.
  const at::Tensor& full() const { return full_; }
  at::Tensor& shard() { return shard_; }
  const at::Tensor& shard() const { return shard_; }
  c10::StorageImpl* storage() const;
  std::size_t gathered_bytes() const;
  UnitState state() const { return state_; }

  // kFreed -> kGathering: allocates the full buffer and starts the
  // all-gather of every rank's shard into it.
  void start_gather(comm::ProcessGroup& group);
  // -> kGathered, waiting for an all-gather in flight (gathering first when freed).
  void wait_gathered(comm::ProcessGroup& group, std::chrono::milliseconds timeout);
  // -> kFreed: releases the full buffer's memory (waits for a gather in flight).
  void free(std::chrono::milliseconds timeout);
  // Error path: gives the freed buffer zeroed memory so an operation that
  // already started on it reads zeros instead of freed memory.
  void fill_zeros_if_freed();

 private:
  void allocate();
  void wait_in_flight(std::chrono::milliseconds timeout);

  std::string name_;
  std::vector<UnitParam> params_;
  std::vector<ShardPiece> pieces_;
  int world_ = 1;
  int64_t numel_ = 0;
  int64_t padded_ = 0;
  at::Tensor full_;
  at::Tensor shard_;
  UnitState state_ = UnitState::kGathered;
  comm::WorkHandle work_;
  std::vector<at::DataPtr> abandoned_;  // memory a failed collective may still write
};

}  // namespace paratrain::fsdp
