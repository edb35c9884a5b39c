// GlooProcessGroup: our ProcessGroup over c10d's ProcessGroupGloo.
// What c10d's Gloo lacks in 1.13 is built here from what it has:
//   AVG            = SUM, then divide by size once the data arrived;
//   reduce_scatter = all-to-all of the slices, then a local reduction (the
//                    same (n-1)/n traffic per rank as a ring reduce-scatter);
//   all_gather     = c10d allgather into views of the flat output;
//   sub-groups     = a fresh ProcessGroupGloo over a PrefixStore.
#include "paratrain/comm/gloo/gloo_group.h"

#include <algorithm>
#include <atomic>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "paratrain/comm/gloo/gloo_work.h"
#include "paratrain/core/compat.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

using gloo_detail::GlooWork;
using gloo_detail::rethrow_as_comm_error;

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
  }
  throw Error("unknown ReduceOp");
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size,
                   std::vector<int> global_ranks, GlooOptions options,
                   std::shared_ptr<::gloo::transport::Device> device)
      : store_(std::move(store)), rank_(rank), size_(size),
        global_ranks_(std::move(global_ranks)), options_(std::move(options)), device_(device) {
    auto opts = c10d::ProcessGroupGloo::Options::create(options_.timeout);
    opts->devices.push_back(device_);
    opts->threads = options_.threads;
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank_, size_, opts);
    } catch (...) {
      rethrow_as_comm_error(fmt::format("rank {}: connecting the Gloo group of {} ranks", rank_, size_));
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "gloo"; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_contiguous(tensor, "all_reduce");
    check_avg_dtype(op, tensor, "all_reduce");
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.timeout = options_.timeout;
    std::function<void()> finish;
    if (op == ReduceOp::kAvg) finish = [tensor, n = size_]() mutable { tensor.div_(n); };
    return issue(describe("all_reduce", op, tensor), std::move(finish),
                 [&] { return pg_->allreduce(tensors, opts); });
  }

  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_contiguous(output, "all_gather output");
    check_contiguous(input, "all_gather input");
    TORCH_CHECK(output.numel() == input.numel() * size_,
                "all_gather: output has ", output.numel(), " elements, expected size(", size_,
                ") * input(", input.numel(), ")");
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (auto& slice : output.view({-1}).chunk(size_)) outputs[0].push_back(slice.view(input.sizes()));
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout;
    return issue(describe("all_gather", std::nullopt, input), {},
                 [&] { return pg_->allgather(outputs, inputs, opts); });
  }

  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_contiguous(output, "reduce_scatter output");
    check_contiguous(input, "reduce_scatter input");
    check_avg_dtype(op, input, "reduce_scatter");
    TORCH_CHECK(input.numel() == output.numel() * size_,
                "reduce_scatter: input has ", input.numel(), " elements, expected size(", size_,
                ") * output(", output.numel(), ")");
    // Slot j of `received` holds rank j's copy of our slice.
    auto received = at::empty({size_, output.numel()}, input.options());
    auto send = input.view({size_, output.numel()});
    std::vector<int64_t> equal_split;  // empty = equal split
    c10d::AllToAllOptions opts;
    opts.timeout = options_.timeout;
    auto finish = [output, received, op, n = size_]() mutable {
      at::Tensor r;
      switch (op) {
        case ReduceOp::kSum: r = received.sum(0); break;
        case ReduceOp::kAvg: r = received.sum(0).div_(n); break;
        case ReduceOp::kMax: r = std::get<0>(received.max(0)); break;
        case ReduceOp::kMin: r = std::get<0>(received.min(0)); break;
      }
      output.view({-1}).copy_(r);
    };
    return issue(describe("reduce_scatter", op, input), std::move(finish), [&] {
      auto flat_in = send.view({-1});
      auto flat_out = received.view({-1});
      return pg_->alltoall_base(flat_out, flat_in, equal_split, equal_split, opts);
    });
  }

  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check_contiguous(tensor, "broadcast");
    check_rank(root, "broadcast root");
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = options_.timeout;
    return issue(fmt::format("rank {}: broadcast(root {}, {} elements)", rank_, root, tensor.numel()),
                 {}, [&] { return pg_->broadcast(tensors, opts); });
  }

  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    check_contiguous(tensor, "send");
    check_rank(dst, "send destination");
    std::vector<at::Tensor> tensors{tensor};
    return issue(fmt::format("rank {}: send(to {}, tag {}, {} elements)", rank_, dst, tag, tensor.numel()),
                 {}, [&] { return pg_->send(tensors, dst, tag); });
  }

  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    check_contiguous(tensor, "recv");
    check_rank(src, "recv source");
    std::vector<at::Tensor> tensors{tensor};
    return issue(fmt::format("rank {}: recv(from {}, tag {}, {} elements)", rank_, src, tag, tensor.numel()),
                 {}, [&] { return pg_->recv(tensors, src, tag); });
  }

  WorkHandle barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = options_.timeout;
    return issue(fmt::format("rank {}: barrier", rank_), {}, [&] { return pg_->barrier(opts); });
  }

  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    TORCH_CHECK(!ranks.empty(), "new_subgroup: empty rank list");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      check_rank(ranks[i], "new_subgroup member");
      TORCH_CHECK(i == 0 || ranks[i] > ranks[i - 1],
                  "new_subgroup: ranks must be strictly increasing, got [", fmt::format("{}", fmt::join(ranks, ",")), "]");
    }
    // Every member calls new_subgroup in the same order, so the counter names
    // the same sub-store on all of them (torch names its groups the same way).
    const int id = next_subgroup_id_++;
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    auto prefix = fmt::format("sub{}[{}]", id, fmt::join(globals, ","));
    auto sub_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    return std::make_shared<GlooProcessGroup>(sub_store, static_cast<int>(it - ranks.begin()),
                                              static_cast<int>(ranks.size()), std::move(globals),
                                              options_, device_);
  }

 private:
  static void check_contiguous(const at::Tensor& t, const char* what) {
    TORCH_CHECK(t.defined() && t.is_contiguous(), what, ": tensor must be defined and contiguous");
  }
  // AVG divides in place once the sum arrived; integers cannot hold the mean.
  static void check_avg_dtype(ReduceOp op, const at::Tensor& t, const char* what) {
    TORCH_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()), what,
                ": ReduceOp::kAvg needs a floating-point tensor, got ", t.scalar_type(),
                "; reduce with kSum and divide yourself");
  }
  void check_rank(int r, const char* what) const {
    TORCH_CHECK(r >= 0 && r < size_, what, " ", r, " is outside the group of ", size_, " ranks");
  }
  std::string describe(const char* op, std::optional<ReduceOp> rop, const at::Tensor& t) const {
    return fmt::format("rank {}: {}({}{} elements of {})", rank_, op,
                       rop ? fmt::format("{}, ", to_string(*rop)) : std::string(), t.numel(),
                       std::string(c10::toString(t.scalar_type())));
  }
  template <class Issue>
  WorkHandle issue(std::string what, std::function<void()> finish, Issue&& call) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = call();
    } catch (...) {
      rethrow_as_comm_error(what);
    }
    return std::make_shared<GlooWork>(std::move(work), std::move(what), std::move(finish));
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::vector<int> global_ranks_;
  GlooOptions options_;
  std::shared_ptr<::gloo::transport::Device> device_;
  c10::intrusive_ptr<compat::C10dBackend> pg_;
  std::atomic<int> next_subgroup_id_{0};
};

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                              int size, const GlooOptions& options) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "make_gloo_group: rank ", rank,
              " must be in [0, size ", size, ")");
  std::shared_ptr<::gloo::transport::Device> device;
  try {
    device = c10d::ProcessGroupGloo::createDeviceForHostname(options.bind_address);
  } catch (...) {
    rethrow_as_comm_error(fmt::format("rank {}: creating a Gloo device on '{}'", rank, options.bind_address));
  }
  std::vector<int> globals(size);
  for (int r = 0; r < size; ++r) globals[r] = r;
  return std::make_shared<GlooProcessGroup>(store, rank, size, std::move(globals), options, device);
}

}  // namespace paratrain::comm
