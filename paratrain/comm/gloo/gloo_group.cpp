// GlooProcessGroup: our ProcessGroup over c10d's ProcessGroupGloo.
// What c10d's Gloo lacks in 1.13 is built here from what it has:
//   AVG            = SUM, then divide by size once the data arrived;
//   reduce_scatter = all-to-all of the slices, then a local reduction (the
//                    same (n-1)/n traffic per rank as a ring reduce-scatter);
//   all_gather     = c10d allgather into views of the flat output;
//   all_gather_uneven = allgather of inputs zero-padded to the largest count,
//                    then the padding is dropped while copying out (traffic is
//                    size * max instead of the sum: fine for near-equal shards);
//   reduce AVG     = SUM reduce, then the root divides;
//   sub-groups     = a fresh ProcessGroupGloo over a PrefixStore;
//   abort          = c10d has none: we mark the group aborted (waiters wake,
//                    new operations are refused) and put every Gloo pair into
//                    its error state (abortable_gloo.h), which fails this
//                    rank's in-flight ops and closes the sockets, so peers'
//                    ops with us fail too.
// Not here: the Work wrapper (gloo_work.h).
#include "paratrain/comm/gloo/gloo_group.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "paratrain/comm/gloo/abortable_gloo.h"
#include "paratrain/comm/gloo/gloo_work.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

using gloo_detail::AbortableGloo;
using gloo_detail::GlooWork;
using gloo_detail::GroupSignal;
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

constexpr auto kBackstop = std::chrono::duration_cast<std::chrono::milliseconds>(gloo_detail::kGlooBackstop);
// How long a group torn down with operations in flight waits for them to end
// once its connections failed: those that can end do so within milliseconds.
constexpr auto kTeardownWait = std::chrono::seconds(5);

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
    signal_->rank = rank_;
    try {
      pg_ = c10::make_intrusive<AbortableGloo>(store_, rank_, size_, opts);
    } catch (...) {
      rethrow_as_comm_error(fmt::format("rank {}: connecting the Gloo group of {} ranks", rank_, size_));
    }
    pg_->use_backstop_timeout();
  }

  // Operations nobody waited for (an error is on its way up) would hold
  // Gloo's threads, which c10d joins here, until the backstop: end them,
  // and wait (bounded) until the threads waiting for sends and receives
  // have let go of Gloo. One that does not end is left behind with c10d's
  // group (Note [Gloo's deadline is ours]).
  ~GlooProcessGroup() override {
    std::unique_lock<std::mutex> lock(signal_->mu);
    if (signal_->in_flight == 0) return;
    lock.unlock();
    pg_->fail_connections();
    lock.lock();
    // Without reach into Gloo nothing was failed: only a moment for an
    // operation that was finishing anyway.
    const std::chrono::milliseconds wait =
        AbortableGloo::kReachesConnections ? std::chrono::milliseconds(kTeardownWait) : std::chrono::milliseconds(100);
    if (signal_->cv.wait_for(lock, wait, [&] { return signal_->in_flight == 0; })) return;
    const int stuck = signal_->in_flight;
    lock.unlock();
    spdlog::warn("rank {}: {} Gloo operation(s) of a group of {} ranks did not end when the group was torn down "
                 "({}); their threads and buffers are left behind rather than joined",
                 rank_, stuck, size_,
                 AbortableGloo::kReachesConnections
                     ? "its connections were closed, but Gloo does not wake a transfer cut in the middle of a message"
                     : "this build cannot close Gloo's connections: Note [Gloo's internals on LibTorch 2.x]");
    // Never destroyed: its destructor would join the stuck thread.
    (void)pg_.release();
  }

  // Gloo's own timeout for each operation: a backstop where abort and
  // teardown can fail the connections (Note [Gloo's deadline is ours]),
  // else world.timeout_s (Note [Gloo's internals on LibTorch 2.x]).
  std::chrono::milliseconds op_timeout() const {
    return AbortableGloo::kReachesConnections ? kBackstop : options_.timeout;
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
    opts.timeout = op_timeout();
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
    if (input.numel() == 0) return empty_exchange(describe("all_gather", std::nullopt, input));
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (auto& slice : output.view({-1}).chunk(size_)) outputs[0].push_back(slice.view(input.sizes()));
    c10d::AllgatherOptions opts;
    opts.timeout = op_timeout();
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
    if (output.numel() == 0) return empty_exchange(describe("reduce_scatter", op, input));
    // Slot j of `received` holds rank j's copy of our slice.
    auto received = at::empty({size_, output.numel()}, input.options());
    auto send = input.view({size_, output.numel()});
    std::vector<int64_t> equal_split;  // empty = equal split
    c10d::AllToAllOptions opts;
    opts.timeout = op_timeout();
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

  // Gloo's allgather and c10d's alltoall_base divide by the element count
  // and die with SIGFPE on empty tensors. With nothing to exchange a barrier
  // keeps the operation a collective (same order, same failure modes).
  WorkHandle empty_exchange(const std::string& what) {
    c10d::BarrierOptions opts;
    opts.timeout = op_timeout();
    return issue(what, {}, [&] { return pg_->barrier(opts); });
  }

  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check_contiguous(tensor, "broadcast");
    check_rank(root, "broadcast root");
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = op_timeout();
    return issue(fmt::format("rank {}: broadcast(root {}, {} elements)", rank_, root, tensor.numel()),
                 {}, [&] { return pg_->broadcast(tensors, opts); });
  }

  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    check_contiguous(tensor, "send");
    check_rank(dst, "send destination");
    std::vector<at::Tensor> tensors{tensor};
    return issue(fmt::format("rank {}: send(to {}, tag {}, {} elements)", rank_, dst, tag, tensor.numel()),
                 {}, [&] { return pg_->send(tensors, dst, tag); }, /*has_future=*/false);
  }

  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    check_contiguous(tensor, "recv");
    check_rank(src, "recv source");
    std::vector<at::Tensor> tensors{tensor};
    return issue(fmt::format("rank {}: recv(from {}, tag {}, {} elements)", rank_, src, tag, tensor.numel()),
                 {}, [&] { return pg_->recv(tensors, src, tag); }, /*has_future=*/false);
  }

  WorkHandle barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = op_timeout();
    return issue(fmt::format("rank {}: barrier", rank_), {}, [&] { return pg_->barrier(opts); });
  }

  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input,
                        std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    check_contiguous(output, "all_to_all output");
    check_contiguous(input, "all_to_all input");
    TORCH_CHECK(output.dim() >= 1 && input.dim() >= 1 && output.sizes().slice(1) == input.sizes().slice(1),
                "all_to_all: input ", input.sizes(), " and output ", output.sizes(),
                " must be split along dim 0 and agree in the other dims");
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_to_all: input is ", input.scalar_type(),
                ", output is ", output.scalar_type());
    check_splits(output_split_sizes, output.size(0), "all_to_all output");
    check_splits(input_split_sizes, input.size(0), "all_to_all input");
    c10d::AllToAllOptions opts;
    opts.timeout = op_timeout();
    at::Tensor in = input;  // c10d takes it by non-const reference
    return issue(describe("all_to_all", std::nullopt, input), {}, [&] {
      return pg_->alltoall_base(output, in, output_split_sizes, input_split_sizes, opts);
    });
  }

  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    check_contiguous(tensor, "reduce");
    check_rank(root, "reduce root");
    check_avg_dtype(op, tensor, "reduce");
    std::vector<at::Tensor> tensors{tensor};
    c10d::ReduceOptions opts;
    opts.reduceOp = to_c10d(op);
    opts.rootRank = root;
    opts.timeout = op_timeout();
    std::function<void()> finish;
    if (op == ReduceOp::kAvg && rank_ == root) finish = [tensor, n = size_]() mutable { tensor.div_(n); };
    return issue(fmt::format("{} to root {}", describe("reduce", op, tensor), root), std::move(finish),
                 [&] { return pg_->reduce(tensors, opts); });
  }

  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    check_contiguous(input, "gather input");
    check_rank(root, "gather root");
    std::vector<at::Tensor> inputs{input};
    std::vector<std::vector<at::Tensor>> outputs;
    if (rank_ == root) {
      check_contiguous(output, "gather output (root)");
      check_numel(output, input, "gather: root's output", "input");
      outputs.resize(1);
      for (auto& slice : output.view({-1}).chunk(size_)) outputs[0].push_back(slice.view(input.sizes()));
    }
    c10d::GatherOptions opts;
    opts.rootRank = root;
    opts.timeout = op_timeout();
    return issue(fmt::format("{} to root {}", describe("gather", std::nullopt, input), root), {},
                 [&] { return pg_->gather(outputs, inputs, opts); });
  }

  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    check_contiguous(output, "scatter output");
    check_rank(root, "scatter root");
    std::vector<at::Tensor> outputs{output};
    std::vector<std::vector<at::Tensor>> inputs;
    if (rank_ == root) {
      check_contiguous(input, "scatter input (root)");
      check_numel(input, output, "scatter: root's input", "output");
      inputs.resize(1);
      for (auto& slice : input.view({-1}).chunk(size_)) inputs[0].push_back(slice.view(output.sizes()));
    }
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = op_timeout();
    return issue(fmt::format("{} from root {}", describe("scatter", std::nullopt, output), root), {},
                 [&] { return pg_->scatter(outputs, inputs, opts); });
  }

  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    check_contiguous(output, "all_gather_uneven output");
    check_contiguous(input, "all_gather_uneven input");
    TORCH_CHECK(static_cast<int>(counts.size()) == size_, "all_gather_uneven: ", counts.size(),
                " counts for a group of ", size_, " ranks");
    TORCH_CHECK(std::all_of(counts.begin(), counts.end(), [](int64_t c) { return c >= 0; }),
                "all_gather_uneven: negative count");
    TORCH_CHECK(input.numel() == counts[rank_], "all_gather_uneven: rank ", rank_, "'s input has ",
                input.numel(), " elements, counts say ", counts[rank_]);
    const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
    TORCH_CHECK(output.numel() == total, "all_gather_uneven: output has ", output.numel(),
                " elements, counts sum to ", total);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_gather_uneven: input is ",
                input.scalar_type(), ", output is ", output.scalar_type());
    // Same counts everywhere, so every rank takes the same branch.
    if (std::all_of(counts.begin(), counts.end(), [&](int64_t c) { return c == counts[0]; }) && counts[0] > 0) {
      return all_gather(output, input);  // no padding, no scratch
    }
    const int64_t widest = *std::max_element(counts.begin(), counts.end());
    auto what = describe("all_gather_uneven", std::nullopt, input);
    if (widest == 0) return issue(std::move(what), {}, [] { return c10::intrusive_ptr<c10d::Work>(); });
    auto padded = at::zeros({widest}, input.options());
    padded.slice(0, 0, counts[rank_]).copy_(input.view({-1}));
    auto rows = at::empty({size_, widest}, input.options());
    std::vector<at::Tensor> inputs{padded};
    std::vector<std::vector<at::Tensor>> outputs(1);
    for (int r = 0; r < size_; ++r) outputs[0].push_back(rows[r]);
    auto finish = [output, rows, counts]() mutable {
      auto flat = output.view({-1});
      int64_t offset = 0;
      for (std::size_t r = 0; r < counts.size(); ++r) {
        flat.slice(0, offset, offset + counts[r]).copy_(rows[static_cast<int64_t>(r)].slice(0, 0, counts[r]));
        offset += counts[r];
      }
    };
    c10d::AllgatherOptions opts;
    opts.timeout = op_timeout();
    return issue(std::move(what), std::move(finish), [&] { return pg_->allgather(outputs, inputs, opts); });
  }

  void abort() override {
    {
      std::lock_guard<std::mutex> lock(signal_->mu);
      if (signal_->aborted) return;
      signal_->aborted = true;
    }
    signal_->cv.notify_all();
    pg_->fail_connections();
    std::vector<std::shared_ptr<GlooProcessGroup>> subgroups;
    {
      std::lock_guard<std::mutex> lock(subgroups_mu_);
      for (auto& weak : subgroups_) {
        if (auto sub = weak.lock()) subgroups.push_back(std::move(sub));
      }
    }
    for (auto& sub : subgroups) sub->abort();
  }

  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    TORCH_CHECK(!ranks.empty(), "new_subgroup: empty rank list");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      check_rank(ranks[i], "new_subgroup member");
      TORCH_CHECK(i == 0 || ranks[i] > ranks[i - 1],
                  "new_subgroup: ranks must be strictly increasing, got [", fmt::format("{}", fmt::join(ranks, ",")), "]");
    }
    throw_if_aborted(fmt::format("rank {}: new_subgroup", rank_));
    // Every member calls new_subgroup in the same order, so the counter names
    // the same sub-store on all of them (torch names its groups the same way).
    const int id = next_subgroup_id_++;
    auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    auto prefix = fmt::format("sub{}[{}]", id, fmt::join(globals, ","));
    auto sub_store = c10::make_intrusive<c10d::PrefixStore>(prefix, store_);
    auto sub = std::make_shared<GlooProcessGroup>(sub_store, static_cast<int>(it - ranks.begin()),
                                                  static_cast<int>(ranks.size()), std::move(globals),
                                                  options_, device_);
    {
      std::lock_guard<std::mutex> lock(subgroups_mu_);
      std::erase_if(subgroups_, [](const auto& weak) { return weak.expired(); });
      subgroups_.push_back(sub);
    }
    // An abort() that ran while we were connecting did not see `sub`.
    if (is_aborted()) sub->abort();
    return sub;
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
  // `whole` must hold size() pieces the size of `piece`.
  void check_numel(const at::Tensor& whole, const at::Tensor& piece, const char* what,
                   const char* piece_name) const {
    TORCH_CHECK(whole.numel() == piece.numel() * size_, what, " has ", whole.numel(),
                " elements, expected size(", size_, ") * ", piece_name, "(", piece.numel(), ")");
    TORCH_CHECK(whole.scalar_type() == piece.scalar_type(), what, " is ", whole.scalar_type(), ", ",
                piece_name, " is ", piece.scalar_type());
  }
  // Empty = equal split; otherwise one non-negative size per rank summing to dim 0.
  void check_splits(const std::vector<int64_t>& splits, int64_t rows, const char* what) const {
    if (splits.empty()) {
      TORCH_CHECK(rows % size_ == 0, what, ": dim 0 (", rows, ") does not split equally over ", size_,
                  " ranks; pass split sizes");
      return;
    }
    TORCH_CHECK(static_cast<int>(splits.size()) == size_, what, ": ", splits.size(),
                " split sizes for a group of ", size_, " ranks");
    TORCH_CHECK(std::all_of(splits.begin(), splits.end(), [](int64_t s) { return s >= 0; }), what,
                ": negative split size");
    TORCH_CHECK(std::accumulate(splits.begin(), splits.end(), int64_t{0}) == rows, what,
                ": split sizes sum to ", std::accumulate(splits.begin(), splits.end(), int64_t{0}),
                ", dim 0 is ", rows);
  }
  std::string describe(const char* op, std::optional<ReduceOp> rop, const at::Tensor& t) const {
    return fmt::format("rank {}: {}({}{} elements of {})", rank_, op,
                       rop ? fmt::format("{}, ", to_string(*rop)) : std::string(), t.numel(),
                       std::string(c10::toString(t.scalar_type())));
  }
  bool is_aborted() const {
    std::lock_guard<std::mutex> lock(signal_->mu);
    return signal_->aborted;
  }
  void throw_if_aborted(const std::string& what) const {
    if (is_aborted()) {
      throw CommError(fmt::format("{} refused: group aborted on rank {} (ProcessGroup::abort was "
                                  "called); build a new group to continue",
                                  what, rank_));
    }
  }
  template <class Issue>
  WorkHandle issue(std::string what, std::function<void()> finish, Issue&& call, bool has_future = true) {
    throw_if_aborted(what);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = call();
    } catch (...) {
      rethrow_as_comm_error(what);
    }
    return std::make_shared<GlooWork>(std::move(work), std::move(what), std::move(finish), signal_,
                                      options_.timeout, has_future);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_;
  int size_;
  std::vector<int> global_ranks_;
  GlooOptions options_;
  std::shared_ptr<::gloo::transport::Device> device_;
  c10::intrusive_ptr<AbortableGloo> pg_;
  std::shared_ptr<GroupSignal> signal_ = std::make_shared<GroupSignal>();
  std::atomic<int> next_subgroup_id_{0};
  std::mutex subgroups_mu_;
  std::vector<std::weak_ptr<GlooProcessGroup>> subgroups_;  // for abort()
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
