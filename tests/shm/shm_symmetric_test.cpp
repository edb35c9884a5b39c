// Symmetric memory of the shm backend (ProcessGroup::allocate_symmetric) and
// the in-place all-reduce over it (Note [Reducing in place]):
// - the in-place path gives the same bits as the slot path and as a
//   reduction in rank order, for every op, several dtypes, sizes around the
//   chunk size, 2-4 ranks, and a piece of an allocation;
// - ranks that disagree (one passes symmetric memory, the other not; or
//   different sizes) fail naming the rank, instead of reading garbage;
// - nothing stays in /dev/shm, and a tensor outlives its group;
// - DDP's bucket buffers live there: with gradient_as_bucket_view a
//   parameter's .grad lies in a /dev/shm mapping of the job (read from
//   /proc/self/maps; the negative control, symmetric_buffers off, does not),
//   and both train the same parameters bit for bit.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "paratrain/comm/shm/shm_group.h"
#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/ddp.h"
#include "tests/support/multi_rank.h"

namespace {

using paratrain::comm::ProcessGroup;
using paratrain::comm::ReduceOp;
using paratrain::testing::run_ranks_on;

// Rank r's input: deterministic per rank, with a fractional part so the
// summation order would show in the bits. A generator of its own: rank
// threads drawing from the global one would race.
at::Tensor input_of(int rank, int64_t n, at::ScalarType type) {
  auto gen = at::detail::createCPUGenerator(1234 + rank);
  auto t = torch::randn({n}, gen, torch::kDouble) * 100;
  return at::isIntegralType(type, false) ? t.round().to(type) : t.to(type);
}

// op over the ranks' inputs in rank order, as both shm paths sum (16-bit
// floats in fp32, rounded once).
at::Tensor reference(int world, int64_t n, at::ScalarType type, ReduceOp op) {
  const bool narrow16 = type == at::kBFloat16 || type == at::kHalf;
  at::Tensor acc = input_of(0, n, type).to(narrow16 ? at::kFloat : type);
  for (int r = 1; r < world; ++r) {
    auto x = input_of(r, n, type).to(acc.scalar_type());
    if (op == ReduceOp::kMax) acc = at::maximum(acc, x);
    else acc = acc + x;
  }
  if (op == ReduceOp::kAvg) acc = acc / world;
  return acc.to(type);
}

std::vector<std::string> job_segments(const std::string& job) {
  std::vector<std::string> found;
  const std::string prefix = paratrain::comm::shm_segment_prefix(job);
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
    if (e.path().filename().string().rfind(prefix, 0) == 0) found.push_back(e.path().string());
  return found;
}

// The file backing the mapping that holds address p ("" for anonymous
// memory), from /proc/self/maps.
std::string mapping_of(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    std::istringstream in(line);
    std::string range, perms, offset, dev, inode, path;
    in >> range >> perms >> offset >> dev >> inode;
    std::getline(in >> std::ws, path);
    const auto dash = range.find('-');
    const auto lo = std::stoull(range.substr(0, dash), nullptr, 16);
    const auto hi = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (a >= lo && a < hi) return path;
  }
  return "";
}

struct Case {
  int world;
  at::ScalarType type;
  ReduceOp op;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.world << " ranks, " << c10::toString(c.type) << ", op " << static_cast<int>(c.op);
}

class SymmetricAllReduce : public ::testing::TestWithParam<Case> {};

TEST_P(SymmetricAllReduce, EqualsTheSlotPathAndTheRankOrderReductionBitForBit) {
  const auto [world, type, op] = GetParam();
  // 1, odd, and more than one 1 MiB chunk of float64 (the slot path's chunking).
  const std::vector<int64_t> sizes = {1, 7, 1000, (int64_t{1} << 17) + 3};
  run_ranks_on("shm", world, [&](ProcessGroup& pg) {
    for (int64_t n : sizes) {
      at::Tensor shared = pg.allocate_symmetric(n, type);
      ASSERT_TRUE(shared.defined());
      EXPECT_TRUE(torch::equal(shared, torch::zeros({n}, type))) << "symmetric memory starts zeroed";
      shared.copy_(input_of(pg.rank(), n, type));
      at::Tensor plain = input_of(pg.rank(), n, type);
      pg.all_reduce(shared, op)->wait();
      pg.all_reduce(plain, op)->wait();
      EXPECT_TRUE(torch::equal(shared, plain)) << "n=" << n << " rank " << pg.rank();
      EXPECT_TRUE(torch::equal(shared, reference(world, n, type, op))) << "n=" << n << " rank " << pg.rank();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Shm, SymmetricAllReduce,
                         ::testing::Values(Case{2, at::kFloat, ReduceOp::kSum}, Case{3, at::kFloat, ReduceOp::kSum},
                                           Case{4, at::kDouble, ReduceOp::kAvg}, Case{3, at::kBFloat16, ReduceOp::kSum},
                                           Case{2, at::kLong, ReduceOp::kMax}, Case{4, at::kFloat, ReduceOp::kMax}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           const char* op = info.param.op == ReduceOp::kSum   ? "sum"
                                            : info.param.op == ReduceOp::kAvg ? "avg"
                                                                               : "max";
                           return std::to_string(info.param.world) + "ranks_" + c10::toString(info.param.type) +
                                  "_" + op;
                         });

TEST(ShmSymmetric, APieceOfAnAllocationIsReducedInPlaceAndTheRestIsLeftAlone) {
  run_ranks_on("shm", 3, [](ProcessGroup& pg) {
    at::Tensor whole = pg.allocate_symmetric(100, at::kFloat);
    whole.fill_(static_cast<float>(pg.rank() + 1));
    at::Tensor piece = whole.narrow(0, 10, 50);
    pg.all_reduce(piece)->wait();
    EXPECT_TRUE(torch::equal(piece, torch::full({50}, 6.0f)));
    EXPECT_TRUE(torch::equal(whole.narrow(0, 0, 10), torch::full({10}, static_cast<float>(pg.rank() + 1))));
    EXPECT_TRUE(torch::equal(whole.narrow(0, 60, 40), torch::full({40}, static_cast<float>(pg.rank() + 1))));
  });
}

// The in-place path is taken only for symmetric tensors: a rank passing one
// while its peer passes ordinary memory is caught by the shape check (and
// fails instead of reducing garbage), which also shows the paths differ.
TEST(ShmSymmetric, RanksThatDisagreeFailNamingTheRank) {
  run_ranks_on("shm", 2, [](ProcessGroup& pg) {
    at::Tensor shared = pg.allocate_symmetric(64, at::kFloat);
    at::Tensor t = pg.rank() == 0 ? shared : torch::ones({64});
    try {
      pg.all_reduce(t)->wait();
      ADD_FAILURE() << "an all-reduce mixing symmetric and ordinary memory succeeded";
    } catch (const paratrain::CommError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(pg.rank() == 0 ? "rank 1" : "rank 0"), std::string::npos) << what;
      EXPECT_NE(what.find("symmetric block"), std::string::npos) << what;
    }
  });
  // Different sizes through the slots: named too (this used to leave the
  // phases out of step).
  run_ranks_on("shm", 2, [](ProcessGroup& pg) {
    at::Tensor t = torch::ones({pg.rank() == 0 ? 8 : 16});
    try {
      pg.all_reduce(t)->wait();
      ADD_FAILURE() << "an all-reduce of 8 against 16 elements succeeded";
    } catch (const paratrain::CommError& e) {
      EXPECT_NE(std::string(e.what()).find(pg.rank() == 0 ? "rank 1 reduces 64 bytes" : "rank 0 reduces 32 bytes"),
                std::string::npos)
          << e.what();
    }
  });
}

TEST(ShmSymmetric, NoSegmentIsLeftAndTheTensorOutlivesItsGroup) {
  const std::string job = "test-" + std::to_string(getpid());  // run_ranks_on's job name
  std::vector<at::Tensor> kept(2);
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    at::Tensor t = pg.allocate_symmetric(1000, at::kFloat);
    EXPECT_NE(mapping_of(t.data_ptr()).find("paratrain-shm." + job), std::string::npos) << mapping_of(t.data_ptr());
    t.fill_(1.0f);
    pg.all_reduce(t)->wait();
    kept[pg.rank()] = t;
  });
  EXPECT_TRUE(job_segments(job).empty());
  for (auto& t : kept) {
    EXPECT_TRUE(torch::equal(t, torch::full({1000}, 2.0f)));
    t.add_(1.0f);  // still mapped after the group is gone
  }
}

// DDP on shm: the bucket buffers are symmetric (a gradient viewed in them
// lies in a /dev/shm mapping of the job), and the run equals the same run on
// ordinary buffers bit for bit. The trainer-level oracle against one process
// is ShmTrainer.DdpEqualsOneProcess (symmetric buffers by default).
std::vector<at::Tensor> train_ddp(ProcessGroup& pg, bool symmetric, const std::string& job) {
  auto model = std::make_shared<torch::nn::SequentialImpl>(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                                                            torch::nn::Linear(64, 5));
  // Own generators throughout (rank threads would race on the global one),
  // so both runs start from and see exactly the same numbers.
  auto init = at::detail::createCPUGenerator(7);
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.copy_(torch::randn(p.sizes(), init) * 0.1);
  }
  paratrain::ddp::DdpOptions options;
  options.reducer.gradient_as_bucket_view = true;
  options.reducer.symmetric_buffers = symmetric;
  options.reducer.buckets.bucket_cap_bytes = 4096;  // several buckets
  options.reducer.buckets.first_bucket_cap_bytes = 4096;
  paratrain::ddp::DistributedDataParallel ddp(model, pg, options);
  torch::optim::SGD sgd(model->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < 5; ++step) {
    auto gen = at::detail::createCPUGenerator(100 * step + pg.rank());
    const auto x = torch::randn({8, 20}, gen);
    const auto y = torch::randint(0, 5, {8}, gen);
    ddp.prepare_forward();
    sgd.zero_grad();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    ddp.finish_backward();
    sgd.step();
  }
  for (const auto& p : model->parameters()) {
    const bool in_job_shm = mapping_of(p.grad().data_ptr()).find("paratrain-shm." + job) != std::string::npos;
    EXPECT_EQ(in_job_shm, symmetric) << mapping_of(p.grad().data_ptr());
  }
  std::vector<at::Tensor> out;
  for (const auto& p : model->parameters()) out.push_back(p.detach().clone());
  return out;
}

TEST(ShmSymmetric, DdpGradientsLandInSharedMemoryAndTrainTheSameBits) {
  const std::string job = "test-" + std::to_string(getpid());
  std::vector<at::Tensor> symmetric, ordinary;
  run_ranks_on("shm", 2, [&](ProcessGroup& pg) {
    auto a = train_ddp(pg, true, job);
    auto b = train_ddp(pg, false, job);
    if (pg.rank() == 0) {
      symmetric = std::move(a);
      ordinary = std::move(b);
    }
  });
  ASSERT_EQ(symmetric.size(), ordinary.size());
  for (std::size_t i = 0; i < symmetric.size(); ++i) EXPECT_TRUE(torch::equal(symmetric[i], ordinary[i])) << i;
}

}  // namespace
