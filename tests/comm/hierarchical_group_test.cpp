// The hierarchical all-reduce (comm/hierarchical_group.h): 4 rank threads
// over Gloo pretend to be 2 nodes of 2 through the node-name override.
// - The layout every rank learns (nodes, leaders, local ranks), for nodes
//   of contiguous and of interleaved ranks.
// - All-reduce results equal a reference computed in this thread (small
//   integers: exact in any summation order, so equal()), for every op, and
//   with several all-reduces of different sizes in flight at once.
// - Negative control: a node group whose reduce does nothing (the leader
//   keeps only its own values) gives the wrong sum, so the check sees the
//   intra-node phase; a leaders' group missing (every rank its own node)
//   still sums right (the flat degenerate case).
// The whole collective suite also runs over hierarchical groups
// (Hierarchical.CollectiveSuites in tests/CMakeLists.txt), and DDP over them
// equals one process (tests/shm/hierarchical_trainer_test.cpp).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "paratrain/comm/hierarchical_group.h"
#include "tests/support/forwarding_group.h"
#include "tests/support/multi_rank.h"

namespace paratrain::comm {
namespace {

using testing::run_ranks_on;

at::Tensor values(int rank, int64_t n) { return (torch::arange(n, torch::kLong).remainder(7) + rank + 1).to(torch::kFloat); }

at::Tensor reference(ReduceOp op, int world, int64_t n) {
  at::Tensor acc = values(0, n);
  for (int r = 1; r < world; ++r)
    acc = op == ReduceOp::kMax ? torch::maximum(acc, values(r, n))
          : op == ReduceOp::kMin ? torch::minimum(acc, values(r, n))
                                 : acc + values(r, n);
  return op == ReduceOp::kAvg ? acc / world : acc;
}

// `name_of(rank)` names each rank's node; `node_group` (optional) builds the
// node groups, as make_node_group.
void with_hierarchy(const std::function<std::string(int)>& name_of,
                    const std::function<void(ProcessGroup& world, ProcessGroup& h)>& fn,
                    HierarchicalOptions options = {}) {
  run_ranks_on("gloo", 4, [&](ProcessGroup& g) {
    // The flat group is the test harness's; the decorator wants shared
    // ownership of its world, so give it a sub-group of all ranks.
    auto world = g.new_subgroup({0, 1, 2, 3});
    HierarchicalOptions o = options;
    o.node = name_of(g.rank());
    auto h = make_hierarchical_group(world, o);
    fn(g, *h);
  });
}

TEST(HierarchicalGroup, LayoutOfContiguousAndInterleavedNodes) {
  for (bool interleaved : {false, true}) {
    run_ranks_on("gloo", 4, [&](ProcessGroup& g) {
      const int r = g.rank();
      const NodeLayout l = node_layout(g, "node" + std::to_string(interleaved ? r % 2 : r / 2));
      EXPECT_EQ(l.nodes, 2);
      EXPECT_EQ(l.leaders, (interleaved ? std::vector<int>{0, 1} : std::vector<int>{0, 2}));
      EXPECT_EQ(l.node, interleaved ? r % 2 : r / 2);
      const std::vector<int> mine = interleaved ? std::vector<int>{r % 2, r % 2 + 2} : std::vector<int>{r / 2 * 2, r / 2 * 2 + 1};
      EXPECT_EQ(l.local_ranks, mine);
      EXPECT_EQ(l.local_ranks[l.local_rank], r);
    });
  }
}

TEST(HierarchicalGroup, AllReduceEqualsTheReferenceForEveryOpAndLayout) {
  for (bool interleaved : {false, true}) {
    with_hierarchy([&](int r) { return "node" + std::to_string(interleaved ? r % 2 : r / 2); },
                   [&](ProcessGroup&, ProcessGroup& h) {
                     EXPECT_NE(h.backend().find("hierarchical(2 nodes"), std::string::npos) << h.backend();
                     for (auto op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
                       for (int64_t n : {0, 1, 7, 300001}) {
                         at::Tensor t = values(h.rank(), n);
                         h.all_reduce(t, op)->wait();
                         EXPECT_TRUE(torch::equal(t, reference(op, 4, n)))
                             << to_string(op) << " n=" << n << " rank " << h.rank();
                       }
                     }
                   });
  }
}

TEST(HierarchicalGroup, SeveralAllReducesInFlightCompleteInOrder) {
  with_hierarchy([](int r) { return "node" + std::to_string(r / 2); },
                 [](ProcessGroup&, ProcessGroup& h) {
                   std::vector<at::Tensor> ts;
                   std::vector<WorkHandle> works;
                   for (int64_t n : {5, 100000, 3, 70000, 1}) {
                     ts.push_back(values(h.rank(), n));
                     works.push_back(h.all_reduce(ts.back(), ReduceOp::kSum));
                   }
                   for (std::size_t i = 0; i < works.size(); ++i) {
                     works[i]->wait();
                     EXPECT_TRUE(torch::equal(ts[i], reference(ReduceOp::kSum, 4, ts[i].numel()))) << i;
                   }
                 });
}

// A node group whose reduce leaves the root's tensor as it is.
class NoReduceGroup final : public testing::ForwardingGroup {
 public:
  explicit NoReduceGroup(std::shared_ptr<ProcessGroup> inner) : ForwardingGroup(*inner), owned_(std::move(inner)) {}
  WorkHandle reduce(at::Tensor&, int, ReduceOp) override { return inner().barrier(); }

 private:
  std::shared_ptr<ProcessGroup> owned_;
};

TEST(HierarchicalGroup, WithoutTheIntraNodeReduceTheSumIsWrong) {
  bool wrong = false;
  std::mutex mu;
  run_ranks_on("gloo", 4, [&](ProcessGroup& g) {
    auto world = g.new_subgroup({0, 1, 2, 3});
    HierarchicalOptions o;
    o.node = "node" + std::to_string(g.rank() / 2);
    std::vector<std::vector<int>> members{{0, 1}, {2, 3}};
    // make_node_group runs on this rank only: build both nodes' groups over
    // the world (collective), keep this one's, broken.
    o.make_node_group = [&](const NodeLayout& l) -> std::shared_ptr<ProcessGroup> {
      std::shared_ptr<ProcessGroup> mine;
      for (int n = 0; n < 2; ++n) {
        auto sub = world->new_subgroup(members[n]);
        if (n == l.node) mine = std::make_shared<NoReduceGroup>(sub);
      }
      return mine;
    };
    auto h = make_hierarchical_group(world, o);
    at::Tensor t = values(g.rank(), 64);
    h->all_reduce(t, ReduceOp::kSum)->wait();
    std::lock_guard lock(mu);
    wrong = wrong || !torch::equal(t, reference(ReduceOp::kSum, 4, 64));
  });
  EXPECT_TRUE(wrong) << "a broken intra-node reduce went unnoticed: the check cannot fail";
}

TEST(HierarchicalGroup, OneRankPerNodeIsAFlatAllReduce) {
  with_hierarchy([](int r) { return "host" + std::to_string(r); },
                 [](ProcessGroup&, ProcessGroup& h) {
                   at::Tensor t = values(h.rank(), 1000);
                   h.all_reduce(t, ReduceOp::kSum)->wait();
                   EXPECT_TRUE(torch::equal(t, reference(ReduceOp::kSum, 4, 1000)));
                 });
}

}  // namespace
}  // namespace paratrain::comm
