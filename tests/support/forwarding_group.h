// ForwardingGroup: a ProcessGroup that forwards every call to another group.
// Tests derive from it and override the one or two calls they count, break
// or replace (a group that fails its second all_gather, one whose
// reduce-scatter does not reduce), instead of each re-listing the interface.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "paratrain/comm/process_group.h"

namespace paratrain::testing {

class ForwardingGroup : public comm::ProcessGroup {
 public:
  explicit ForwardingGroup(comm::ProcessGroup& inner) : inner_(inner) {}
  comm::ProcessGroup& inner() const { return inner_; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::string backend() const override { return inner_.backend(); }
  const std::vector<int>& global_ranks() const override { return inner_.global_ranks(); }
  comm::WorkHandle all_reduce(at::Tensor& t, comm::ReduceOp op) override { return inner_.all_reduce(t, op); }
  comm::WorkHandle all_gather(at::Tensor& out, const at::Tensor& in) override { return inner_.all_gather(out, in); }
  comm::WorkHandle reduce_scatter(at::Tensor& out, const at::Tensor& in, comm::ReduceOp op) override {
    return inner_.reduce_scatter(out, in, op);
  }
  comm::WorkHandle broadcast(at::Tensor& t, int root) override { return inner_.broadcast(t, root); }
  comm::WorkHandle send(const at::Tensor& t, int dst, int tag) override { return inner_.send(t, dst, tag); }
  comm::WorkHandle recv(at::Tensor& t, int src, int tag) override { return inner_.recv(t, src, tag); }
  comm::WorkHandle barrier() override { return inner_.barrier(); }
  comm::WorkHandle all_to_all(at::Tensor& out, const at::Tensor& in, std::vector<int64_t> out_splits,
                              std::vector<int64_t> in_splits) override {
    return inner_.all_to_all(out, in, std::move(out_splits), std::move(in_splits));
  }
  comm::WorkHandle reduce(at::Tensor& t, int root, comm::ReduceOp op) override { return inner_.reduce(t, root, op); }
  comm::WorkHandle gather(at::Tensor& out, const at::Tensor& in, int root) override {
    return inner_.gather(out, in, root);
  }
  comm::WorkHandle scatter(at::Tensor& out, const at::Tensor& in, int root) override {
    return inner_.scatter(out, in, root);
  }
  comm::WorkHandle all_gather_uneven(at::Tensor& out, const at::Tensor& in,
                                     const std::vector<int64_t>& counts) override {
    return inner_.all_gather_uneven(out, in, counts);
  }
  void abort() override { inner_.abort(); }
  std::shared_ptr<comm::ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    return inner_.new_subgroup(ranks);
  }

 private:
  comm::ProcessGroup& inner_;
};

}  // namespace paratrain::testing
