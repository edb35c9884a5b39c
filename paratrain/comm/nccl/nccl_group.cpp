// NcclGroup: c10d's ProcessGroupNCCL behind our ProcessGroup, beside a host
// group for what NCCL does not carry (see nccl_group.h).
#include "paratrain/comm/nccl/nccl_group.h"

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"

#include <torch/cuda.h>

#include <algorithm>

#if PARATRAIN_HAVE_NCCL && defined(USE_C10D_NCCL)

#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <atomic>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace paratrain::comm {

// Note [NCCL beside a host group]
// NCCL moves GPU memory between GPUs, on its own CUDA stream, ordered after
// the work already queued on the caller's stream. Three kinds of traffic it
// should not carry go to the host group built from the same ranks:
// - CPU tensors: the loop agrees on small values (losses, flags, step
//   counters) in host memory; NCCL refuses them.
// - barriers: a host barrier is what a barrier means to the host code
//   around it; NCCL's is an all-reduce on a guessed GPU.
// - send/recv: NCCL ignores tags and matches a pair's messages by order;
//   pipelines and ring attention post receives by tag. Through the host
//   group (staged, comm/host_staging_group.h) tags keep their meaning.
// Two channels never reorder each other's traffic: each carries one
// sequence that every rank issues in the same order.
//
// Work::wait() blocks the host until the GPU finished the collective
// (polling the work's CUDA event, so the deadline and abort are honoured),
// then orders the caller's stream after it: what our other backends promise
// ("the data is there when wait returns"), so every strategy runs unchanged.

namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return c10d::ReduceOp(c10d::ReduceOp::SUM);
    case ReduceOp::kAvg: return c10d::ReduceOp(c10d::ReduceOp::AVG);
    case ReduceOp::kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
    case ReduceOp::kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
  }
  return c10d::ReduceOp(c10d::ReduceOp::SUM);
}

std::string first_line(std::string s) {
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

class NcclWork final : public Work {
 public:
  NcclWork(c10::intrusive_ptr<c10d::Work> work, std::string what, std::function<void()> finish,
           std::shared_ptr<std::atomic<bool>> aborted, std::chrono::milliseconds timeout)
      : work_(std::move(work)), what_(std::move(what)), finish_(std::move(finish)), aborted_(std::move(aborted)),
        timeout_(timeout) {}

  using Work::wait;
  void wait(std::chrono::milliseconds timeout) override {
    RunningDeadline deadline(timeout);  // Note [Deadlines that stop with the process]
    while (!poll()) {
      if (aborted_->load()) throw CommError(fmt::format("{}: the NCCL group was aborted", what_));
      if (deadline.passed())
        throw TimeoutError(fmt::format("{}: not complete after {} ms (NCCL); a peer is probably gone or stuck "
                                       "(world.timeout_s)",
                                       what_, timeout.count()));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    try {
      work_->wait();  // rethrows NCCL's error; orders the current stream after the collective
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{}: {}", what_, first_line(e.what())));
    }
    std::call_once(finished_, [&] {
      if (finish_) finish_();
      finish_ = nullptr;
    });
  }
  bool is_completed() override { return poll(); }
  std::optional<Clock::time_point> completed_at() override {
    std::lock_guard<std::mutex> lock(mu_);
    return done_at_;
  }

 protected:
  std::chrono::milliseconds default_timeout() const override { return timeout_; }

 private:
  bool poll() {
    if (!work_->isCompleted()) return false;
    std::lock_guard<std::mutex> lock(mu_);
    if (!done_at_) done_at_ = Clock::now();
    return true;
  }

  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::function<void()> finish_;
  std::shared_ptr<std::atomic<bool>> aborted_;
  std::chrono::milliseconds timeout_;
  std::once_flag finished_;
  std::mutex mu_;
  std::optional<Clock::time_point> done_at_;
};

class NcclGroup final : public ProcessGroup, public std::enable_shared_from_this<NcclGroup> {
 public:
  NcclGroup(c10::intrusive_ptr<c10d::Store> store, c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg,
            std::shared_ptr<ProcessGroup> host, NcclOptions options)
      : store_(std::move(store)), pg_(std::move(pg)), host_(std::move(host)), options_(options),
        aborted_(std::make_shared<std::atomic<bool>>(false)) {}

  ~NcclGroup() override {
    if (aborted_->load()) return;
    try {
      pg_->shutdown();  // LibTorch 2.x warns when a group is destroyed without it
    } catch (...) {
    }
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  std::string backend() const override { return "nccl"; }
  const std::vector<int>& global_ranks() const override { return host_->global_ranks(); }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    if (!on_gpu(tensor)) return host_->all_reduce(tensor, op);
    std::vector<at::Tensor> v{tensor};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    return track(issue([&] { return pg_->allreduce(v, o); }, "all_reduce", op, tensor));
  }
  WorkHandle all_gather(at::Tensor& output, const at::Tensor& input) override {
    if (!on_gpu(output, input)) return host_->all_gather(output, input);
    at::Tensor in = input;
    return track(issue([&] { return pg_->_allgather_base(output, in); }, "all_gather", std::nullopt, input));
  }
  WorkHandle reduce_scatter(at::Tensor& output, const at::Tensor& input, ReduceOp op) override {
    if (!on_gpu(output, input)) return host_->reduce_scatter(output, input, op);
    at::Tensor in = input;
    c10d::ReduceScatterOptions o;
    o.reduceOp = to_c10d(op);
    return track(issue([&] { return pg_->_reduce_scatter_base(output, in, o); }, "reduce_scatter", op, input));
  }
  WorkHandle broadcast(at::Tensor& tensor, int root) override {
    if (!on_gpu(tensor)) return host_->broadcast(tensor, root);
    std::vector<at::Tensor> v{tensor};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    return track(issue([&] { return pg_->broadcast(v, o); }, "broadcast", std::nullopt, tensor));
  }
  // Tags matter: through the host group (Note [NCCL beside a host group]).
  WorkHandle send(const at::Tensor& tensor, int dst, int tag) override { return host_->send(tensor, dst, tag); }
  WorkHandle recv(at::Tensor& tensor, int src, int tag) override { return host_->recv(tensor, src, tag); }
  WorkHandle barrier() override { return host_->barrier(); }
  WorkHandle all_to_all(at::Tensor& output, const at::Tensor& input, std::vector<int64_t> output_split_sizes,
                        std::vector<int64_t> input_split_sizes) override {
    if (!on_gpu(output, input))
      return host_->all_to_all(output, input, std::move(output_split_sizes), std::move(input_split_sizes));
    at::Tensor in = input;
    return track(issue(
        [&] { return pg_->alltoall_base(output, in, output_split_sizes, input_split_sizes); }, "all_to_all",
        std::nullopt, input));
  }
  WorkHandle reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    if (!on_gpu(tensor)) return host_->reduce(tensor, root, op);
    std::vector<at::Tensor> v{tensor};
    c10d::ReduceOptions o;
    o.rootRank = root;
    o.reduceOp = to_c10d(op);
    return track(issue([&] { return pg_->reduce(v, o); }, "reduce", op, tensor));
  }
  // c10d's gather and scatter take a list of per-rank tensors on the root
  // and none elsewhere: slices of our flat output/input.
  WorkHandle gather(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!on_gpu(output, input)) return host_->gather(output, input, root);
    std::vector<at::Tensor> in{input};
    std::vector<std::vector<at::Tensor>> out;
    if (rank() == root) out.push_back(slices(output, input));
    c10d::GatherOptions o;
    o.rootRank = root;
    return track(issue([&] { return pg_->gather(out, in, o); }, "gather", std::nullopt, input));
  }
  WorkHandle scatter(at::Tensor& output, const at::Tensor& input, int root) override {
    if (!on_gpu(output, input)) return host_->scatter(output, input, root);
    std::vector<at::Tensor> out{output};
    std::vector<std::vector<at::Tensor>> in;
    if (rank() == root) in.push_back(slices(input, output));
    c10d::ScatterOptions o;
    o.rootRank = root;
    return track(issue([&] { return pg_->scatter(out, in, o); }, "scatter", std::nullopt, output));
  }
  // Uneven counts: every rank's piece padded to the largest, one all-gather,
  // then the pieces packed into `output` once it completed (in wait(), on
  // the waiter's stream, which the collective is ordered before).
  WorkHandle all_gather_uneven(at::Tensor& output, const at::Tensor& input,
                               const std::vector<int64_t>& counts) override {
    if (!on_gpu(output, input)) return host_->all_gather_uneven(output, input, counts);
    TORCH_CHECK(static_cast<int>(counts.size()) == size() && counts[rank()] == input.numel(),
                "all_gather_uneven: counts do not match the group or this rank's input");
    const int64_t most = *std::max_element(counts.begin(), counts.end());
    at::Tensor padded_in = at::zeros({most}, input.options());
    padded_in.narrow(0, 0, input.numel()).copy_(input.reshape({-1}));
    at::Tensor padded_out = at::empty({most * size()}, input.options());
    auto work = issue([&] { return pg_->_allgather_base(padded_out, padded_in); }, "all_gather_uneven",
                      std::nullopt, input);
    at::Tensor flat = output.view({-1});
    auto finish = [flat, padded_out, padded_in, counts, most]() mutable {
      int64_t at = 0;
      for (std::size_t r = 0; r < counts.size(); ++r) {
        flat.narrow(0, at, counts[r]).copy_(padded_out.narrow(0, static_cast<int64_t>(r) * most, counts[r]));
        at += counts[r];
      }
    };
    return track(std::move(work), std::move(finish));
  }

  // The host group and the sub-groups first: c10d's abort can wait for its
  // own work up to the timeout, and waiters on host operations must not.
  void abort() override {
    if (aborted_->exchange(true)) return;
    host_->abort();
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& weak : children_)
        if (auto child = weak.lock()) child->abort();
    }
    try {
      pg_->abort();
    } catch (...) {
    }
  }

  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    if (aborted_->load()) throw CommError(fmt::format("rank {}: new_subgroup on an aborted NCCL group", rank()));
    // Every member of this group calls new_subgroup in the same order, so the
    // counter names the same sub-group on every rank.
    const int serial = next_subgroup_++;
    auto host = host_->new_subgroup(ranks);
    if (!host) return nullptr;
    auto store = c10::make_intrusive<c10d::PrefixStore>(fmt::format("sub{}", serial), store_);
    // Connected now, while every member is here: a first collective that had
    // to connect would block in NCCL where no paratrain deadline reaches.
    auto pg = make_backend(store, host->rank(), host->size(), options_, /*connect_now=*/true);
    auto child = std::make_shared<NcclGroup>(store, std::move(pg), std::move(host), options_);
    std::lock_guard<std::mutex> lock(mu_);
    children_.push_back(child);
    return child;
  }

  static c10::intrusive_ptr<c10d::ProcessGroupNCCL> make_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                                 int rank, int size, const NcclOptions& options,
                                                                 bool connect_now) {
    auto o = c10d::ProcessGroupNCCL::Options::create();
    // c10d's watchdog tears the process down when a collective exceeds its
    // timeout; a minute later than ours, so NcclWork::wait's TimeoutError
    // (and the hang doctor behind it) come first. It counts wall time: a
    // job suspended for longer than this still ends on waking (docs/launchers.md).
    o->timeout = options.timeout + std::chrono::minutes(1);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, o);
    const at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(options.device_index));
    pg->setBoundDeviceId(device);
    if (connect_now) pg->eagerConnectSingleDevice(device);
    return pg;
  }

 private:
  static bool on_gpu(const at::Tensor& t) {
    if (!t.defined() || !t.is_cuda()) return false;
    // c10d's NCCL checks sizes, not layout: a strided tensor would be read
    // as if contiguous. Our contract (process_group.h) says contiguous.
    TORCH_CHECK(t.is_contiguous(), "NCCL group: tensors must be contiguous (got sizes ", t.sizes(), ", strides ",
                t.strides(), ")");
    return true;
  }
  // NCCL only when every tensor given is on the GPU; the host group (staged)
  // handles CPU and mixed cases correctly, if slower.
  static bool on_gpu(const at::Tensor& a, const at::Tensor& b) {
    const bool ga = on_gpu(a), gb = on_gpu(b);
    return (ga || gb) && (!a.defined() || ga) && (!b.defined() || gb);
  }

  static std::vector<at::Tensor> slices(const at::Tensor& whole, const at::Tensor& like) {
    std::vector<at::Tensor> out;
    at::Tensor flat = whole.view({-1});
    const int64_t n = like.numel();
    TORCH_CHECK(n > 0 || flat.numel() == 0, "NCCL gather/scatter: empty per-rank piece of a non-empty tensor");
    for (int64_t r = 0; n > 0 && r * n < flat.numel(); ++r) out.push_back(flat.narrow(0, r * n, n).view(like.sizes()));
    return out;
  }

  struct Issued {
    c10::intrusive_ptr<c10d::Work> work;
    std::string what;
  };
  template <class F>
  Issued issue(F&& call, const char* op, std::optional<ReduceOp> reduce, const at::Tensor& t) {
    std::string what = fmt::format("rank {}: {}{}({} x {})", rank(), op,
                                   reduce ? fmt::format(" {}", to_string(*reduce)) : std::string(), t.numel(),
                                   c10::toString(t.scalar_type()));
    if (aborted_->load()) throw CommError(fmt::format("{}: the NCCL group was aborted", what));
    try {
      return {call(), std::move(what)};
    } catch (const std::exception& e) {
      throw CommError(fmt::format("{}: {}", what, first_line(e.what())));
    }
  }
  WorkHandle track(Issued issued, std::function<void()> finish = nullptr) {
    return std::make_shared<NcclWork>(std::move(issued.work), std::move(issued.what), std::move(finish), aborted_,
                                      options_.timeout);
  }

  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg_;
  std::shared_ptr<ProcessGroup> host_;
  NcclOptions options_;
  std::shared_ptr<std::atomic<bool>> aborted_;
  int next_subgroup_ = 0;
  std::mutex mu_;
  std::vector<std::weak_ptr<NcclGroup>> children_;
};

}  // namespace

bool nccl_compiled() { return true; }

std::shared_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                              std::shared_ptr<ProcessGroup> host, const NcclOptions& options) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(options.device_index));
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
  try {
    pg = NcclGroup::make_backend(store, rank, size, options, /*connect_now=*/true);
  } catch (const std::exception& e) {
    throw CommError(fmt::format("rank {}: world.backend = \"nccl\": connecting GPU {} failed: {}", rank,
                                options.device_index, first_line(e.what())));
  }
  return std::make_shared<NcclGroup>(store, std::move(pg), std::move(host), options);
}

}  // namespace paratrain::comm

#else  // no NCCL in this build

namespace paratrain::comm {

bool nccl_compiled() { return false; }

std::shared_ptr<ProcessGroup> make_nccl_group(const c10::intrusive_ptr<c10d::Store>&, int, int,
                                              std::shared_ptr<ProcessGroup>, const NcclOptions&) {
  throw ConfigError("world.backend = \"nccl\" needs a CUDA build of LibTorch with NCCL, and this paratrain is "
                    "built against one without (Debian's libtorch-dev is CPU-only): build with "
                    "scripts/cuda-build.sh on a GPU machine, or use world.backend = \"gloo\", \"shm\" or \"auto\"");
}

}  // namespace paratrain::comm

#endif

namespace paratrain::comm {

int gpus_on_this_host() { return static_cast<int>(torch::cuda::device_count()); }

// NCCL gives each rank a GPU of its own: it refuses two ranks on one device
// ("Duplicate GPU detected", NVIDIA/nccl#418). Ranks pick GPU LOCAL_RANK
// modulo the GPUs seen (core/device.h), so more ranks than GPUs on a host
// means two on one: a ConfigError before any connection is made.
void check_nccl_fits(int rank, int local_rank, int local_world_size, bool cpu_tensors) {
  if (cpu_tensors)
    throw ConfigError("world.backend = \"nccl\" carries GPU tensors, and this job's live in CPU memory "
                      "(world.device = \"cpu\"): set world.device = \"cuda\", or use world.backend = \"gloo\", "
                      "\"shm\" or \"auto\"");
  if (!nccl_compiled()) make_nccl_group({}, rank, 1, nullptr, {});  // throws: names the build
  const int gpus = gpus_on_this_host();
  if (local_world_size > gpus)
    throw ConfigError(fmt::format(
        "world.backend = \"nccl\": {} ranks on this host share {} GPU(s) (rank {} would use GPU {}), and NCCL "
        "refuses two ranks on one GPU (\"Duplicate GPU detected\"). Start at most {} rank(s) per host "
        "(--nproc-per-node {}), or use world.backend = \"gloo\" or \"shm\", which share a GPU through host "
        "memory",
        local_world_size, gpus, rank, local_rank % std::max(1, gpus), gpus, gpus));
}

}  // namespace paratrain::comm
