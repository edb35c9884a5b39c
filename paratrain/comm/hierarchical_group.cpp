#include "paratrain/comm/hierarchical_group.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "paratrain/comm/worker_work.h"
#include "paratrain/core/error.h"
#include "paratrain/core/process_state.h"

namespace paratrain::comm {

// Note [Hierarchical all-reduce]
// On N nodes of L ranks, a flat ring all-reduce sends 2(NL-1)/(NL) of the
// buffer per rank, and every step of the ring crosses the network when
// neighbours sit on different nodes. Reduce-to-leader, leaders' all-reduce,
// broadcast sends the buffer over the network only from the N leaders
// (2(N-1)/N each) and keeps the rest on the node's memory bus, the faster
// link by 10x or more (bench/results/2026-11-24-shm.md). The price: the
// intra-node phases are a reduce and a broadcast, each moving the buffer
// once through the leader, where a node-local ring would share that work;
// for L = 2 and shared memory that is cheap.
// Results are the same on every rank (the leader's sum is broadcast), but
// are summed in another order than a flat all-reduce: float sums may differ
// in the last bits from a flat group's.
// Phases are issued by one thread per group, one all-reduce at a time in
// issue order: a phase issued lazily from whichever thread polls (as the
// 16-bit wire does) could reach the node group in a different order on
// different ranks (Note [Second phases on their own group],
// data_parallel/ddp/compress_hook.h).

namespace {

constexpr std::size_t kNameBytes = 256;

using HierarchicalWork = WorkerWork;  // comm/worker_work.h

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(std::shared_ptr<ProcessGroup> world, NodeLayout layout, std::shared_ptr<ProcessGroup> node,
                    std::shared_ptr<ProcessGroup> leaders, std::chrono::milliseconds timeout)
      : world_(std::move(world)), layout_(std::move(layout)), node_(std::move(node)), leaders_(std::move(leaders)),
        timeout_(timeout), worker_([this] { loop(); }) {}

  ~HierarchicalGroup() override {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }

  int rank() const override { return world_->rank(); }
  int size() const override { return world_->size(); }
  std::string backend() const override {
    return fmt::format("hierarchical({} nodes: {} inside, {} between)", layout_.nodes,
                       node_ ? node_->backend() : "none", world_->backend());
  }
  const std::vector<int>& global_ranks() const override { return world_->global_ranks(); }

  WorkHandle all_reduce(at::Tensor& tensor, ReduceOp op) override {
    TORCH_CHECK(tensor.defined(), "hierarchical all_reduce: tensor must be defined");
    TORCH_CHECK(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()),
                "hierarchical all_reduce: ReduceOp::kAvg needs a floating-point tensor, got ", tensor.scalar_type(),
                "; reduce with kSum and divide yourself");
    if (aborted_.load()) throw CommError(fmt::format("rank {}: all_reduce on an aborted group", rank()));
    auto work = std::make_shared<HierarchicalWork>(
        fmt::format("rank {}: all_reduce({} {}) on {}", rank(), tensor.numel(), c10::toString(tensor.scalar_type()),
                    backend()),
        timeout_);
    {
      std::lock_guard lock(mu_);
      queue_.push_back({tensor, op, work});
    }
    cv_.notify_all();
    return work;
  }

  WorkHandle all_gather(at::Tensor& out, const at::Tensor& in) override { return world_->all_gather(out, in); }
  WorkHandle reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op) override {
    return world_->reduce_scatter(out, in, op);
  }
  WorkHandle broadcast(at::Tensor& t, int root) override { return world_->broadcast(t, root); }
  WorkHandle send(const at::Tensor& t, int dst, int tag) override { return world_->send(t, dst, tag); }
  WorkHandle recv(at::Tensor& t, int src, int tag) override { return world_->recv(t, src, tag); }
  WorkHandle barrier() override { return world_->barrier(); }
  WorkHandle all_to_all(at::Tensor& out, const at::Tensor& in, std::vector<int64_t> out_splits,
                        std::vector<int64_t> in_splits) override {
    return world_->all_to_all(out, in, std::move(out_splits), std::move(in_splits));
  }
  WorkHandle reduce(at::Tensor& t, int root, ReduceOp op) override { return world_->reduce(t, root, op); }
  WorkHandle gather(at::Tensor& out, const at::Tensor& in, int root) override { return world_->gather(out, in, root); }
  WorkHandle scatter(at::Tensor& out, const at::Tensor& in, int root) override {
    return world_->scatter(out, in, root);
  }
  WorkHandle all_gather_uneven(at::Tensor& out, const at::Tensor& in, const std::vector<int64_t>& counts) override {
    return world_->all_gather_uneven(out, in, counts);
  }
  void abort() override {
    aborted_ = true;
    cv_.notify_all();
    world_->abort();
    if (node_) node_->abort();
    if (leaders_) leaders_->abort();
  }
  // Sub-groups are flat: they span fewer nodes, usually one.
  std::shared_ptr<ProcessGroup> new_subgroup(const std::vector<int>& ranks) override {
    return world_->new_subgroup(ranks);
  }

 private:
  struct Job {
    at::Tensor tensor;
    ReduceOp op;
    std::shared_ptr<HierarchicalWork> work;
  };

  void loop() {
    while (true) {
      Job job;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [&] { return stop_ || aborted_.load() || !queue_.empty(); });
        if (queue_.empty()) return;  // stop or abort with nothing left
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      // Released before the waiter wakes: Note [A finished job holds no
      // tensors] in shm/shm_group.cpp.
      auto finish = [&job](std::exception_ptr error) {
        job.tensor = at::Tensor();
        job.work->finish(std::move(error));
      };
      if (aborted_.load() || !broken_.empty()) {
        finish(std::make_exception_ptr(CommError(fmt::format(
            "rank {}: hierarchical all_reduce not run: {}", rank(),
            aborted_.load() ? "the group was aborted" : "an earlier one failed (" + broken_ + "); build a new group"))));
        continue;
      }
      try {
        run(job.tensor, job.op);
        finish(nullptr);
      } catch (const std::exception& e) {
        broken_ = e.what();
        finish(std::current_exception());
      }
    }
  }

  // The three phases; see Note [Hierarchical all-reduce].
  void run(at::Tensor& t, ReduceOp op) {
    const ReduceOp sum_like = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    const bool inside = node_ && node_->size() > 1;
    if (inside) node_->reduce(t, 0, sum_like)->wait(timeout_);
    if (leaders_) {
      if (leaders_->size() > 1) leaders_->all_reduce(t, sum_like)->wait(timeout_);
      if (op == ReduceOp::kAvg) t.div_(size());
    }
    if (inside) node_->broadcast(t, 0)->wait(timeout_);
  }

  std::shared_ptr<ProcessGroup> world_;
  NodeLayout layout_;
  std::shared_ptr<ProcessGroup> node_;     // this node's ranks; rank 0 leads
  std::shared_ptr<ProcessGroup> leaders_;  // one rank per node; null off the leaders
  std::chrono::milliseconds timeout_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  std::string broken_;  // worker only
  std::thread worker_;  // last: starts after every member above exists
};

}  // namespace

NodeLayout node_layout(ProcessGroup& world, const std::string& node_name) {
  TORCH_CHECK(!node_name.empty() && node_name.size() < kNameBytes, "node_layout: the node name must have 1 to ",
              kNameBytes - 1, " bytes, got '", node_name, "'");
  at::Tensor mine = at::zeros({static_cast<int64_t>(kNameBytes)}, at::kByte);
  std::memcpy(mine.data_ptr(), node_name.data(), node_name.size());
  at::Tensor all = at::empty({world.size() * static_cast<int64_t>(kNameBytes)}, at::kByte);
  world.all_gather(all, mine)->wait();
  NodeLayout layout;
  layout.name = node_name;
  std::map<std::string, int> index;  // name -> node index, in order of first (lowest) rank
  std::vector<int>& node_of = layout.node_of;
  node_of.resize(world.size());
  for (int r = 0; r < world.size(); ++r) {
    const char* p = static_cast<const char*>(all.data_ptr()) + r * kNameBytes;
    const std::string name(p, strnlen(p, kNameBytes));
    auto [it, added] = index.emplace(name, static_cast<int>(index.size()));
    if (added) layout.leaders.push_back(r);
    node_of[r] = it->second;
  }
  layout.nodes = static_cast<int>(index.size());
  layout.node = node_of[world.rank()];
  for (int r = 0; r < world.size(); ++r) {
    if (node_of[r] != layout.node) continue;
    if (r == world.rank()) layout.local_rank = static_cast<int>(layout.local_ranks.size());
    layout.local_ranks.push_back(r);
  }
  return layout;
}

std::shared_ptr<ProcessGroup> make_hierarchical_group(std::shared_ptr<ProcessGroup> world,
                                                      const HierarchicalOptions& options) {
  TORCH_CHECK(world != nullptr, "make_hierarchical_group: no world group");
  NodeLayout layout = node_layout(*world, options.node.empty() ? host_name() : options.node);
  std::shared_ptr<ProcessGroup> node;
  if (options.make_node_group) {
    node = options.make_node_group(layout);
  } else {
    // new_subgroup is collective over the world: every rank builds every
    // node's group, in node order, and keeps its own.
    std::vector<std::vector<int>> members(layout.nodes);
    for (int r = 0; r < world->size(); ++r) members[layout.node_of[r]].push_back(r);
    for (int n = 0; n < layout.nodes; ++n) {
      auto g = world->new_subgroup(members[n]);
      if (n == layout.node) node = std::move(g);
    }
  }
  if (node && node->size() != static_cast<int>(layout.local_ranks.size()))
    throw CommError(fmt::format("rank {}: the node group of '{}' has {} ranks, the layout {}", world->rank(),
                                layout.name, node->size(), layout.local_ranks.size()));
  std::shared_ptr<ProcessGroup> leaders = world->new_subgroup(layout.leaders);
  return std::make_shared<HierarchicalGroup>(std::move(world), std::move(layout), std::move(node), std::move(leaders),
                                             options.timeout);
}

}  // namespace paratrain::comm
