// The shm ProcessGroup: argument checks, a worker thread that runs the
// operations in issue order over the segment, Works that honour timeouts
// and abort, sub-groups, and the Gloo group for send/recv/all_to_all.
// See shm_group.h for what runs where.
#include "paratrain/comm/shm/shm_group.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/shm/shm_collectives.h"
#include "paratrain/comm/shm/shm_segment.h"
#include "paratrain/comm/shm/shm_symmetric.h"
#include "paratrain/comm/worker_work.h"
#include "paratrain/core/env.h"
#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

using shm_detail::Channel;
using shm_detail::Segment;
using shm_detail::WaitContext;

using ShmWork = WorkerWork;  // comm/worker_work.h

class ShmProcessGroup final : public ProcessGroup {
 public:
  ShmProcessGroup(c10::intrusive_ptr<c10d::Store> store, int rank, int size, std::vector<int> global_ranks,
                  ShmOptions options)
      : store_(std::move(store)), rank_(rank), size_(size), global_ranks_(std::move(global_ranks)),
        options_(std::move(options)) {
    TORCH_CHECK(rank_ >= 0 && rank_ < size_, "make_shm_group: rank ", rank_, " outside a group of ", size_);
    TORCH_CHECK(options_.chunk_bytes / 8 / size_ >= 1, "ShmOptions.chunk_bytes (", options_.chunk_bytes,
                ") must hold at least one 8-byte element per rank (", size_, " ranks)");
    std::random_device entropy;
    const uint64_t nonce = (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^ static_cast<uint64_t>(getpid());
    segment_ = std::make_unique<Segment>(*store_, "shm/segment",
                                         shm_detail::segment_name(options_.job, options_.group, nonce), rank_, size_,
                                         options_.chunk_bytes, options_.timeout);
    GlooOptions gloo;
    gloo.timeout = options_.timeout;
    gloo.bind_address = options_.gloo_bind_address;
    gloo.threads = 1;
    gloo_ = make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("gloo", store_), rank_, size_, gloo);
    // Gloo's constructor may return on one rank while a peer still reads the
    // handshake; a barrier makes sure all connected before anyone can leave.
    gloo_->barrier()->wait();
    worker_ = std::thread([this] { run(); });
  }

  ~ShmProcessGroup() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
    // A peer still waiting for this rank would never be answered: tell it.
    segment_->mark_aborted();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "shm"; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check_tensor(tensor, "all_reduce");
    check_reduce(op, tensor, "all_reduce");
    const auto nbytes = static_cast<std::size_t>(tensor.numel()) * tensor.element_size();
    if (nbytes > 0) {
      std::lock_guard lock(symmetric_mu_);
      for (const auto& weak : symmetric_) {
        const auto block = weak.lock();  // alive while a tensor of it is
        if (!block) continue;
        if (const auto offset = block->offset_in_mine(tensor.data_ptr(), nbytes))
          return enqueue(describe("all_reduce", tensor) + " in place",
                         [tensor, op, block, at = *offset](Channel ch) mutable {
                           shm_detail::all_reduce_symmetric(ch, *block, at, tensor, op);
                         });
      }
    }
    return enqueue(describe("all_reduce", tensor),
                   [tensor, op](Channel ch) mutable { shm_detail::all_reduce(ch, tensor, op, true); });
  }

  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    check_tensor(tensor, "reduce");
    check_rank(root, "reduce root");
    check_reduce(op, tensor, "reduce");
    const bool me = rank_ == root;
    return enqueue(fmt::format("{} to root {}", describe("reduce", tensor), root),
                   [tensor, op, me](Channel ch) mutable { shm_detail::all_reduce(ch, tensor, op, me); });
  }

  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    check_tensor(output, "reduce_scatter output");
    check_tensor(input, "reduce_scatter input");
    check_reduce(op, input, "reduce_scatter");
    check_pieces(input, output, "reduce_scatter input", "output");
    return enqueue(describe("reduce_scatter", input), [output, input, op](Channel ch) mutable {
      shm_detail::reduce_scatter(ch, output, input, op);
    });
  }

  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_tensor(output, "all_gather output");
    check_tensor(input, "all_gather input");
    check_pieces(output, input, "all_gather output", "input");
    std::vector<int64_t> counts(size_, input.numel());
    return enqueue(describe("all_gather", input), [output, input, counts](Channel ch) mutable {
      shm_detail::all_gather(ch, output, input, counts, true);
    });
  }

  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    check_tensor(output, "all_gather_uneven output");
    check_tensor(input, "all_gather_uneven input");
    TORCH_CHECK(static_cast<int>(counts.size()) == size_, "all_gather_uneven: ", counts.size(),
                " counts for a group of ", size_);
    TORCH_CHECK(input.numel() == counts[rank_], "all_gather_uneven: rank ", rank_, " passes ", input.numel(),
                " elements but counts say ", counts[rank_]);
    int64_t total = 0;
    for (auto c : counts) total += c;
    TORCH_CHECK(output.numel() == total, "all_gather_uneven: output has ", output.numel(),
                " elements, the counts add up to ", total);
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), "all_gather_uneven: output is ", output.scalar_type(),
                ", input is ", input.scalar_type());
    return enqueue(describe("all_gather_uneven", input), [output, input, counts](Channel ch) mutable {
      shm_detail::all_gather(ch, output, input, counts, true);
    });
  }

  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    check_tensor(input, "gather input");
    check_rank(root, "gather root");
    const bool me = rank_ == root;
    if (me) {
      check_tensor(output, "gather output");
      check_pieces(output, input, "gather output", "input");
    }
    std::vector<int64_t> counts(size_, input.numel());
    return enqueue(fmt::format("{} to root {}", describe("gather", input), root),
                   [output, input, counts, me](Channel ch) mutable {
                     shm_detail::all_gather(ch, output, input, counts, me);
                   });
  }

  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    check_tensor(output, "scatter output");
    check_rank(root, "scatter root");
    if (rank_ == root) {
      check_tensor(input, "scatter input");
      check_pieces(input, output, "scatter input", "output");
    }
    return enqueue(fmt::format("{} from root {}", describe("scatter", output), root),
                   [output, input, root](Channel ch) mutable { shm_detail::scatter(ch, output, input, root); });
  }

  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast");
    check_rank(root, "broadcast root");
    return enqueue(fmt::format("{} from root {}", describe("broadcast", tensor), root),
                   [tensor, root](Channel ch) mutable { shm_detail::broadcast(ch, tensor, root); });
  }

  WorkHandle barrier() override {
    check_usable("barrier");
    return enqueue(fmt::format("rank {}: barrier", rank_), [](Channel ch) { shm_detail::barrier(ch); });
  }

  // Point-to-point and all_to_all: Gloo over loopback (see shm_group.h).
  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override {
    check_usable("send");
    return gloo_->send(tensor, dst, tag);
  }
  WorkHandle recv(at::Tensor& tensor, int src, int tag) override {
    check_usable("recv");
    return gloo_->recv(tensor, src, tag);
  }
  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    check_usable("all_to_all");
    return gloo_->all_to_all(output, input, std::move(output_split_sizes), std::move(input_split_sizes));
  }

  void abort() override {
    aborted_.store(true);
    segment_->mark_aborted();
    gloo_->abort();
    cv_.notify_all();
    std::lock_guard lock(subgroups_mu_);
    for (auto& weak : subgroups_)
      if (auto g = weak.lock()) g->abort();
  }

  // One symmetric block per call (shm_symmetric.h), numbered by how many
  // this group made (the same on every rank: the call is collective). The
  // tensor keeps its block mapped, also after the group is gone; the group
  // only watches it (weakly) to recognise its tensors in all_reduce, so a
  // block is unmapped when its last tensor goes (DDP's buckets of a
  // wrapper built again, e.g. after adaptive freezing, do not pile up).
  at::Tensor allocate_symmetric(int64_t numel, at::ScalarType dtype) override {
    check_usable("allocate_symmetric");
    TORCH_CHECK(numel >= 0, "allocate_symmetric: numel ", numel, " is negative");
    const uint64_t id = ++symmetric_count_;
    std::random_device entropy;
    const uint64_t nonce = (static_cast<uint64_t>(entropy()) << 32) ^ entropy() ^ static_cast<uint64_t>(getpid());
    auto block = std::make_shared<shm_detail::SymmetricBlock>(
        *store_, fmt::format("shm/symmetric{}", id),
        shm_detail::segment_name(options_.job, fmt::format("{}.sym{}", options_.group, id), nonce), id, rank_, size_,
        static_cast<std::size_t>(numel) * c10::elementSize(dtype), options_.timeout);
    {
      std::lock_guard lock(symmetric_mu_);
      std::erase_if(symmetric_, [](const auto& weak) { return weak.expired(); });
      symmetric_.push_back(block);
    }
    return at::from_blob(
        block->copy_of(rank_), {numel}, [block](void*) {}, at::TensorOptions().dtype(dtype));
  }

  // Members build a fresh shm group (own segment, own Gloo group) under a
  // store prefix numbered by how many sub-groups this group made, which is
  // the same on every rank because new_subgroup is collective.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    check_usable("new_subgroup");
    TORCH_CHECK(!ranks.empty(), "new_subgroup: the rank list is empty");
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      check_rank(ranks[i], "new_subgroup member");
      TORCH_CHECK(i == 0 || ranks[i] > ranks[i - 1], "new_subgroup: ranks must be strictly increasing");
    }
    const int index = subgroup_count_++;
    const auto it = std::find(ranks.begin(), ranks.end(), rank_);
    if (it == ranks.end()) return nullptr;
    std::vector<int> globals;
    for (int r : ranks) globals.push_back(global_ranks_[r]);
    ShmOptions sub = options_;
    sub.group = fmt::format("{}.sub{}", options_.group, index);
    auto group = std::make_shared<ShmProcessGroup>(
        c10::make_intrusive<c10d::PrefixStore>(fmt::format("sub{}", index), store_),
        static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()), std::move(globals), std::move(sub));
    std::lock_guard lock(subgroups_mu_);
    subgroups_.push_back(group);
    return group;
  }

 private:
  struct Job {
    std::function<void(Channel)> run;
    std::shared_ptr<ShmWork> work;
  };

  WorkHandle enqueue(std::string what, std::function<void(Channel)> fn) {
    auto work = std::make_shared<ShmWork>(std::move(what), options_.timeout);
    {
      std::lock_guard lock(mu_);
      queue_.push_back(Job{std::move(fn), work});
    }
    cv_.notify_one();
    return work;
  }

  // Runs jobs in issue order. After a failure the segment's phases are out
  // of step between ranks, so every later job fails with the first error.
  //
  // Note [A finished job holds no tensors]
  // A caller that waited for an operation may drop its tensors and expect
  // the memory back. Were the job (whose closure holds the tensors) only
  // destroyed at the end of this loop's iteration, after finish() has woken
  // the caller, a worker thread the scheduler parks right there would keep
  // them alive into the caller's next phase: measured on 2 cores, ZeRO-2's
  // parameter all-gather buffers (4 Psi + 4 Psi / N) outlived the step into
  // the next backward in most steps, its peak 1.3x the planned one
  // (bench/results/2026-11-28-memory-plan.md). So the closure is released
  // before finish(). The hierarchical group does the same.
  void run() {
    at::NoGradGuard no_grad;
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      // The job's closure holds the operation's tensors: dropped before the
      // waiter wakes (Note [A finished job holds no tensors]).
      auto finish = [&job](std::exception_ptr error) {
        job.run = nullptr;
        job.work->finish(std::move(error));
      };
      if (aborted_.load()) {
        finish(std::make_exception_ptr(
            CommError(fmt::format("{}: the group was aborted before this operation ran", job.work->what()))));
        continue;
      }
      if (broken_) {
        finish(std::make_exception_ptr(CommError(fmt::format(
            "{}: an earlier operation of this shm group failed ({}); the group is unusable, build a new one",
            job.work->what(), broken_reason_))));
        continue;
      }
      WaitContext ctx;
      ctx.aborted = [this] { return aborted_.load() || stop_flag(); };
      ctx.deadline = RunningDeadline(options_.timeout);
      ctx.what = &job.work->what();
      try {
        job.run(Channel{*segment_, chunk_, ctx});
        finish(nullptr);
      } catch (const std::exception& e) {
        broken_ = true;
        broken_reason_ = e.what();
        if (!aborted_.load()) segment_->mark_failed();
        finish(std::current_exception());
      }
    }
  }

  bool stop_flag() {
    std::lock_guard lock(mu_);
    return stop_;
  }

  std::string describe(const char* op, const at::Tensor& t) const {
    return fmt::format("rank {}: {}({} {}) on shm", rank_, op, t.numel(), c10::toString(t.scalar_type()));
  }
  void check_usable(const char* what) const {
    if (aborted_.load()) throw CommError(fmt::format("rank {}: {} on an aborted group", rank_, what));
  }
  void check_tensor(const at::Tensor& t, const char* what) const {
    check_usable(what);
    TORCH_CHECK(t.defined() && t.is_contiguous(), what, ": tensor must be defined and contiguous");
    TORCH_CHECK(t.device().is_cpu(), what, ": the shm backend takes CPU tensors, got ", t.device(),
                "; use world.backend = \"gloo\" (or nccl) for device tensors");
  }
  static void check_reduce(ReduceOp op, const at::Tensor& t, const char* what) {
    TORCH_CHECK(shm_detail::reducible(t.scalar_type()), what, ": the shm backend cannot reduce ", t.scalar_type());
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

  c10::intrusive_ptr<c10d::Store> store_;
  int rank_, size_;
  std::vector<int> global_ranks_;
  ShmOptions options_;
  std::unique_ptr<Segment> segment_;
  std::shared_ptr<ProcessGroup> gloo_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  // Worker-only state.
  uint64_t chunk_ = 0;
  bool broken_ = false;
  std::string broken_reason_;
  std::thread worker_;

  uint64_t symmetric_count_ = 0;
  std::mutex symmetric_mu_;
  std::vector<std::weak_ptr<shm_detail::SymmetricBlock>> symmetric_;

  int subgroup_count_ = 0;
  std::mutex subgroups_mu_;
  std::vector<std::weak_ptr<ShmProcessGroup>> subgroups_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_shm_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                             const ShmOptions& options) {
  std::vector<int> globals(size);
  for (int r = 0; r < size; ++r) globals[r] = r;
  return std::make_shared<ShmProcessGroup>(store, rank, size, std::move(globals), options);
}

std::size_t shm_chunk_bytes_from_env(std::size_t fallback) {
  const auto kib = env::get_int("PARATRAIN_SHM_CHUNK_KB");
  if (!kib) return fallback;
  if (*kib < 1 || *kib > (1L << 20))
    throw ConfigError(fmt::format("PARATRAIN_SHM_CHUNK_KB = {} must be a whole number of KiB in [1, 1048576] "
                                  "(the shm backend's chunk per rank; unset it for the default {} KiB)",
                                  *kib, fallback >> 10));
  return static_cast<std::size_t>(*kib) << 10;
}

std::string shm_segment_prefix(const std::string& job) {
  // segment_name() with an empty group and no nonce, cut after the job part.
  const auto full = shm_detail::segment_name(job, "", 0);
  return full.substr(0, full.size() - std::string(".0").size());
}

}  // namespace paratrain::comm
