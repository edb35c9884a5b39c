// The MPI backend; see mpi_group.h. Compiled to stubs that explain how to get
// MPI when the build found none (PARATRAIN_HAVE_MPI unset).
#include "paratrain/comm/mpi/mpi_group.h"

#include <cstdlib>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"

#ifdef PARATRAIN_HAVE_MPI
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "paratrain/comm/mpi/mpi_types.h"
#endif

namespace paratrain::comm {

bool launched_by_mpi() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr;
}

#ifndef PARATRAIN_HAVE_MPI

bool mpi_compiled() { return false; }

std::shared_ptr<ProcessGroup> make_mpi_world_group(const MpiOptions&) {
  throw ConfigError(
      "backend \"mpi\": this paratrain was built without MPI. Install it (./scripts/install-deps.sh installs "
      "Debian's libopenmpi-dev and openmpi-bin) and rebuild, or use world.backend = \"gloo\"");
}

#else

bool mpi_compiled() { return true; }

namespace {

using mpi_detail::check;
using mpi_detail::mpi_op;
using mpi_detail::mpi_type;

// Shared by a communicator's group and its Works: abort() flips it.
struct Signal {
  std::atomic<bool> aborted{false};
  int rank = 0;
};

// One MPI request as our Work: wait() polls MPI_Test, runs the finishing
// step once, and fails on timeout or abort.
class MpiWork final : public Work {
 public:
  MpiWork(MPI_Request request, std::string what, std::function<void()> finish, std::shared_ptr<Signal> signal,
          std::chrono::milliseconds timeout, std::vector<at::Tensor> keep)
      : request_(request), what_(std::move(what)), finish_(std::move(finish)), signal_(std::move(signal)),
        timeout_(timeout), keep_(std::move(keep)) {}

  ~MpiWork() override {
    // A request still in flight cannot be dropped: MPI would write into
    // tensors we no longer hold. Freeing it lets MPI complete it on its own
    // while `keep_` ... is released, so wait for it instead, bounded.
    std::lock_guard lock(mu_);
    if (!done_ && !signal_->aborted.load()) {
      try {
        poll_until_locked(RunningDeadline(timeout_));
      } catch (...) {
      }
    }
  }

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    std::lock_guard lock(mu_);
    if (error_) std::rethrow_exception(error_);
    if (done_) return;
    try {
      poll_until_locked(RunningDeadline(timeout));
    } catch (const TimeoutError&) {
      throw;  // a later wait may still succeed
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }

  bool is_completed() override {
    std::lock_guard lock(mu_);
    if (done_ || error_) return true;
    if (signal_->aborted.load()) return false;
    int flag = 0;
    check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), what_);
    if (flag) complete_locked();
    return done_;
  }

  std::optional<Clock::time_point> completed_at() override {
    std::lock_guard lock(mu_);
    return at_;
  }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  // OpenMPI's non-blocking collectives (libnbc) advance only inside MPI
  // calls: each MPI_Test moves a large all-reduce one round further, so a
  // waiter must keep calling it. Sleeping between calls (tried: up to
  // 500 us) made a 64 MiB all-reduce 10x slower; yielding keeps it moving
  // while still letting the other ranks of an oversubscribed node run.
  // The deadline counts running time (Note [Deadlines that stop with the process]).
  void poll_until_locked(RunningDeadline deadline) {
    while (true) {
      if (signal_->aborted.load())
        throw CommError(fmt::format("{}: the group was aborted while this operation was in flight", what_));
      int flag = 0;
      check(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE), what_);
      if (flag) {
        complete_locked();
        return;
      }
      if (deadline.passed())
        throw TimeoutError(fmt::format("{} did not complete within the timeout: a peer rank may have died, hung, "
                                       "or skipped this operation",
                                       what_));
      std::this_thread::yield();
    }
  }

  void complete_locked() {
    if (finish_) finish_();
    done_ = true;
    at_ = Clock::now();
    keep_.clear();
  }

  MPI_Request request_;
  std::string what_;
  std::function<void()> finish_;
  std::shared_ptr<Signal> signal_;
  std::chrono::milliseconds timeout_;
  std::vector<at::Tensor> keep_;  // buffers MPI reads or writes until done
  std::mutex mu_;
  bool done_ = false;
  std::exception_ptr error_;
  std::optional<Clock::time_point> at_;
};

// A Work with nothing to exchange.
class DoneWork final : public Work {
 public:
  using Work::wait;
  void wait(std::chrono::milliseconds) override {}
  bool is_completed() override { return true; }
  std::optional<Clock::time_point> completed_at() override { return at_; }

 private:
  Clock::time_point at_ = Clock::now();
};

int count_of(int64_t n, const std::string& what) {
  if (n > INT_MAX)
    throw Error(fmt::format("{}: {} elements exceed MPI's int count; split the tensor", what, n));
  return static_cast<int>(n);
}

class MpiProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<MpiProcessGroup> {
 public:
  MpiProcessGroup(MPI_Comm comm, std::vector<int> global_ranks, MpiOptions options)
      : comm_(comm), global_ranks_(std::move(global_ranks)), options_(options) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // Errors come back as codes we turn into CommError, instead of MPI's
    // default of aborting the whole job from inside the library.
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    signal_->rank = rank_;
  }

  ~MpiProcessGroup() override {
    if (comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_NULL && !mpi_detail::finalized()) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    check_avg(op, tensor, "all_reduce");
    const std::string what = describe("all_reduce", tensor);
    MPI_Request req;
    check(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), count_of(tensor.numel(), what), mpi_type(tensor),
                         mpi_op(op, tensor), comm_, &req),
          what);
    return work(req, what, average(op, tensor), {tensor});
  }

  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_tensor(output, "all_gather output");
    check_tensor(input, "all_gather input");
    check_pieces(output, input, "all_gather output", "input");
    const std::string what = describe("all_gather", input);
    MPI_Request req;
    const int n = count_of(input.numel(), what);
    check(MPI_Iallgather(input.data_ptr(), n, mpi_type(input), output.data_ptr(), n, mpi_type(output), comm_,
                         &req),
          what);
    return work(req, what, {}, {output, input});
  }

  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_tensor(output, "reduce_scatter output");
    check_tensor(input, "reduce_scatter input");
    check_avg(op, input, "reduce_scatter");
    check_pieces(input, output, "reduce_scatter input", "output");
    const std::string what = describe("reduce_scatter", input);
    MPI_Request req;
    check(MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(), count_of(output.numel(), what),
                                    mpi_type(input), mpi_op(op, input), comm_, &req),
          what);
    return work(req, what, average(op, output), {output, input});
  }

  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast");
    check_rank(root, "broadcast root");
    const std::string what = fmt::format("{} from root {}", describe("broadcast", tensor), root);
    MPI_Request req;
    check(MPI_Ibcast(tensor.data_ptr(), count_of(tensor.numel(), what), mpi_type(tensor), root, comm_, &req), what);
    return work(req, what, {}, {tensor});
  }

  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    check_tensor(tensor, "send");
    check_rank(dst, "send destination");
    const std::string what = fmt::format("{} to rank {} (tag {})", describe("send", tensor), dst, tag);
    MPI_Request req;
    check(MPI_Isend(tensor.data_ptr(), count_of(tensor.numel(), what), mpi_type(tensor), dst, tag, comm_, &req),
          what);
    return work(req, what, {}, {tensor});
  }

  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    check_tensor(tensor, "recv");
    check_rank(src, "recv source");
    const std::string what = fmt::format("{} from rank {} (tag {})", describe("recv", tensor), src, tag);
    MPI_Request req;
    check(MPI_Irecv(tensor.data_ptr(), count_of(tensor.numel(), what), mpi_type(tensor), src, tag, comm_, &req),
          what);
    return work(req, what, {}, {tensor});
  }

  WorkHandle barrier() override {
    const std::string what = fmt::format("rank {}: barrier", rank_);
    MPI_Request req;
    check(MPI_Ibarrier(comm_, &req), what);
    return work(req, what, {}, {});
  }

  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    check_tensor(output, "all_to_all output");
    check_tensor(input, "all_to_all input");
    const std::string what = describe("all_to_all", input);
    // Splits count rows of dim 0; MPI counts elements.
    const int64_t in_row = input.dim() > 0 && input.size(0) > 0 ? input.numel() / input.size(0) : 1;
    const int64_t out_row = output.dim() > 0 && output.size(0) > 0 ? output.numel() / output.size(0) : 1;
    const auto counts = [&](const std::vector<int64_t>& splits, const at::Tensor& t, int64_t row, const char* name) {
      std::vector<int> c(size_), d(size_);
      if (splits.empty()) {
        TORCH_CHECK(t.dim() > 0 && t.size(0) % size_ == 0, "all_to_all ", name, ": dim 0 (",
                    t.dim() > 0 ? t.size(0) : 0, ") must divide by the group size ", size_,
                    " without split sizes");
        std::fill(c.begin(), c.end(), count_of(t.numel() / size_, what));
      } else {
        TORCH_CHECK(static_cast<int>(splits.size()) == size_, "all_to_all ", name, ": ", splits.size(),
                    " split sizes for a group of ", size_);
        int64_t rows = 0;
        for (int j = 0; j < size_; ++j) {
          c[j] = count_of(splits[j] * row, what);
          rows += splits[j];
        }
        TORCH_CHECK(t.dim() > 0 ? rows == t.size(0) : rows == 0, "all_to_all ", name, ": split sizes add up to ",
                    rows, " rows, the tensor has ", t.dim() > 0 ? t.size(0) : 0);
      }
      int64_t at = 0;
      for (int j = 0; j < size_; ++j) {
        d[j] = count_of(at, what);
        at += c[j];
      }
      return std::make_pair(c, d);
    };
    auto [send_counts, send_displs] = counts(input_split_sizes, input, in_row, "input");
    auto [recv_counts, recv_displs] = counts(output_split_sizes, output, out_row, "output");
    auto state = std::make_shared<std::vector<std::vector<int>>>(
        std::vector<std::vector<int>>{send_counts, send_displs, recv_counts, recv_displs});
    MPI_Request req;
    check(MPI_Ialltoallv(input.data_ptr(), (*state)[0].data(), (*state)[1].data(), mpi_type(input),
                         output.data_ptr(), (*state)[2].data(), (*state)[3].data(), mpi_type(output), comm_, &req),
          what);
    // The count arrays must outlive the request.
    return work(req, what, [state] {}, {output, input});
  }

  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    check_tensor(tensor, "reduce");
    check_rank(root, "reduce root");
    check_avg(op, tensor, "reduce");
    const std::string what = fmt::format("{} to root {}", describe("reduce", tensor), root);
    MPI_Request req;
    const bool me = rank_ == root;
    check(MPI_Ireduce(me ? MPI_IN_PLACE : tensor.data_ptr(), me ? tensor.data_ptr() : nullptr,
                      count_of(tensor.numel(), what), mpi_type(tensor), mpi_op(op, tensor), root, comm_, &req),
          what);
    return work(req, what, me ? average(op, tensor) : std::function<void()>{}, {tensor});
  }

  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    check_tensor(input, "gather input");
    check_rank(root, "gather root");
    const bool me = rank_ == root;
    if (me) {
      check_tensor(output, "gather output");
      check_pieces(output, input, "gather output", "input");
    }
    const std::string what = fmt::format("{} to root {}", describe("gather", input), root);
    MPI_Request req;
    const int n = count_of(input.numel(), what);
    check(MPI_Igather(input.data_ptr(), n, mpi_type(input), me ? output.data_ptr() : nullptr, n, mpi_type(input),
                      root, comm_, &req),
          what);
    return work(req, what, {}, me ? std::vector<at::Tensor>{output, input} : std::vector<at::Tensor>{input});
  }

  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    check_tensor(output, "scatter output");
    check_rank(root, "scatter root");
    const bool me = rank_ == root;
    if (me) {
      check_tensor(input, "scatter input");
      check_pieces(input, output, "scatter input", "output");
    }
    const std::string what = fmt::format("{} from root {}", describe("scatter", output), root);
    MPI_Request req;
    const int n = count_of(output.numel(), what);
    check(MPI_Iscatter(me ? input.data_ptr() : nullptr, n, mpi_type(output), output.data_ptr(), n, mpi_type(output),
                       root, comm_, &req),
          what);
    return work(req, what, {}, me ? std::vector<at::Tensor>{output, input} : std::vector<at::Tensor>{output});
  }

  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    check_tensor(output, "all_gather_uneven output");
    check_tensor(input, "all_gather_uneven input");
    TORCH_CHECK(static_cast<int>(counts.size()) == size_, "all_gather_uneven: ", counts.size(),
                " counts for a group of ", size_);
    TORCH_CHECK(input.numel() == counts[rank_], "all_gather_uneven: rank ", rank_, " passes ", input.numel(),
                " elements but counts say ", counts[rank_]);
    const std::string what = describe("all_gather_uneven", input);
    auto arrays = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>();
    int64_t total = 0;
    for (int j = 0; j < size_; ++j) {
      arrays->first.push_back(count_of(counts[j], what));
      arrays->second.push_back(count_of(total, what));
      total += counts[j];
    }
    TORCH_CHECK(output.numel() == total, "all_gather_uneven: output has ", output.numel(),
                " elements, the counts add up to ", total);
    MPI_Request req;
    check(MPI_Iallgatherv(input.data_ptr(), static_cast<int>(input.numel()), mpi_type(input), output.data_ptr(),
                          arrays->first.data(), arrays->second.data(), mpi_type(output), comm_, &req),
          what);
    return work(req, what, [arrays] {}, {output, input});
  }

  void abort() override {
    signal_->aborted.store(true);
    std::lock_guard lock(subgroups_mu_);
    for (auto& weak : subgroups_)
      if (auto g = weak.lock()) g->abort();
  }

  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    if (signal_->aborted.load()) throw CommError(fmt::format("rank {}: new_subgroup on an aborted group", rank_));
    TORCH_CHECK(!ranks.empty(), "new_subgroup: the rank list is empty");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      check_rank(ranks[i], "new_subgroup member");
      TORCH_CHECK(i == 0 || ranks[i] > ranks[i - 1], "new_subgroup: ranks must be strictly increasing");
    }
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    const bool member = it != ranks.end();
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, static_cast<int>(it - ranks.begin()), &sub),
          fmt::format("rank {}: new_subgroup (MPI_Comm_split)", rank_));
    if (!member) return nullptr;
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    auto group = std::make_shared<MpiProcessGroup>(sub, std::move(globals), options_);
    std::lock_guard lock(subgroups_mu_);
    subgroups_.push_back(group);
    return group;
  }

 private:
  WorkHandle work(MPI_Request req, const std::string& what, std::function<void()> finish,
                  std::vector<at::Tensor> keep) {
    return std::make_shared<MpiWork>(req, what, std::move(finish), signal_, options_.timeout, std::move(keep));
  }

  std::function<void()> average(ReduceOp op, const at::Tensor& t) const {
    if (op != ReduceOp::kAvg) return {};
    return [t, n = size_]() mutable { t.div_(n); };
  }

  std::string describe(const char* op, const at::Tensor& t) const {
    return fmt::format("rank {}: {}({} {})", rank_, op, t.numel(), c10::toString(t.scalar_type()));
  }

  void check_tensor(const at::Tensor& t, const char* what) const {
    if (signal_->aborted.load()) throw CommError(fmt::format("rank {}: {} on an aborted group", rank_, what));
    TORCH_CHECK(t.defined() && t.is_contiguous(), what, ": tensor must be defined and contiguous");
    TORCH_CHECK(t.device().is_cpu(), what, ": the MPI backend takes CPU tensors, got ", t.device());
  }
  static void check_avg(ReduceOp op, const at::Tensor& t, const char* what) {
    TORCH_CHECK(op != ReduceOp::kAvg || at::isFloatingType(t.scalar_type()), what,
                ": ReduceOp::kAvg needs a floating-point tensor, got ", t.scalar_type(),
                "; reduce with kSum and divide yourself");
  }
  void check_rank(int r, const char* what) const {
    TORCH_CHECK(r >= 0 && r < size_, what, " ", r, " is outside the group of ", size_, " ranks");
  }
  void check_pieces(const at::Tensor& whole, const at::Tensor& piece, const char* what, const char* piece_name) const {
    TORCH_CHECK(whole.numel() == piece.numel() * size_, what, " has ", whole.numel(), " elements, expected size(",
                size_, ") * ", piece_name, "(", piece.numel(), ")");
    TORCH_CHECK(whole.scalar_type() == piece.scalar_type(), what, " is ", whole.scalar_type(), ", ", piece_name,
                " is ", piece.scalar_type());
  }

  MPI_Comm comm_;
  std::vector<int> global_ranks_;
  MpiOptions options_;
  int rank_ = 0, size_ = 1;
  std::shared_ptr<Signal> signal_ = std::make_shared<Signal>();
  std::mutex subgroups_mu_;
  std::vector<std::weak_ptr<MpiProcessGroup>> subgroups_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_world_group(const MpiOptions& options) {
  mpi_detail::ensure_initialized();
  int size = 0;
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  std::vector<int> globals(size);
  for (int r = 0; r < size; ++r) globals[r] = r;
  return std::make_shared<MpiProcessGroup>(MPI_COMM_WORLD, std::move(globals), options);
}

#endif

}  // namespace paratrain::comm
