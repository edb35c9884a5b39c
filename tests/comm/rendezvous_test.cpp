// Rendezvous: environment parsing for torchrun, OpenMPI and Slurm, and the
// check-in that names ranks which never arrive.
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "paratrain/comm/rendezvous.h"
#include "paratrain/comm/store_checkin.h"
#include "paratrain/core/error.h"

namespace {

using paratrain::comm::world_from_env;

// Sets variables for one test and clears every rendezvous variable after.
class EnvGuard {
 public:
  EnvGuard() { clear(); }
  ~EnvGuard() { clear(); }
  void set(const char* k, const char* v) { setenv(k, v, 1); }

 private:
  static void clear() {
    for (const char* k : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                          "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
                          "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NODELIST"}) {
      unsetenv(k);
    }
  }
};

TEST(WorldFromEnv, DefaultsToOneProcess) {
  EnvGuard env;
  auto w = world_from_env();
  EXPECT_EQ(w.source, "default");
  EXPECT_EQ(w.world_size, 1);
  EXPECT_EQ(w.rank, 0);
}

TEST(WorldFromEnv, Torchrun) {
  EnvGuard env;
  env.set("RANK", "3");
  env.set("WORLD_SIZE", "4");
  env.set("LOCAL_RANK", "1");
  env.set("LOCAL_WORLD_SIZE", "2");
  env.set("MASTER_ADDR", "10.0.0.7");
  env.set("MASTER_PORT", "29999");
  auto w = world_from_env();
  EXPECT_EQ(w.source, "torchrun");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.master_addr, "10.0.0.7");
  EXPECT_EQ(w.master_port, 29999);
}

TEST(WorldFromEnv, OpenMpi) {
  EnvGuard env;
  env.set("OMPI_COMM_WORLD_RANK", "5");
  env.set("OMPI_COMM_WORLD_SIZE", "8");
  env.set("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  env.set("OMPI_COMM_WORLD_LOCAL_SIZE", "4");
  auto w = world_from_env();
  EXPECT_EQ(w.source, "openmpi");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
}

TEST(WorldFromEnv, SlurmTakesMasterFromNodeList) {
  EnvGuard env;
  env.set("SLURM_PROCID", "2");
  env.set("SLURM_NTASKS", "4");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_NTASKS_PER_NODE", "2(x2)");
  env.set("SLURM_JOB_NODELIST", "gpu[07-08]");
  auto w = world_from_env();
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 2);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.master_addr, "gpu07");
}

TEST(WorldFromEnv, InconsistentValuesAreConfigErrors) {
  EnvGuard env;
  env.set("RANK", "4");
  env.set("WORLD_SIZE", "4");
  EXPECT_THROW(world_from_env(), paratrain::ConfigError);
  env.set("RANK", "x");
  EXPECT_THROW(world_from_env(), paratrain::ConfigError);
}

TEST(CheckIn, NamesTheRanksThatNeverArrived) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string message;
  auto arrive = [&](int rank) {
    try {
      paratrain::comm::check_in(*store, rank, 4, std::chrono::milliseconds(500), "test store");
    } catch (const paratrain::TimeoutError& e) {
      if (rank == 0) message = e.what();
    }
  };
  // Rank 2 checks in first, so rank 0's short window cannot miss it even on
  // a loaded machine.
  std::thread r2(arrive, 2);
  while (!store->check({"paratrain/checkin/2"})) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread r0(arrive, 0);
  r0.join();
  r2.join();
  EXPECT_NE(message.find("rank(s) 1,3 "), std::string::npos) << message;
  EXPECT_NE(message.find("world size 4"), std::string::npos) << message;
}

TEST(CheckIn, ReturnsOnceEveryRankArrived) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r) {
    ranks.emplace_back([&, r] {
      EXPECT_NO_THROW(paratrain::comm::check_in(*store, r, 3, std::chrono::seconds(10), "test store"));
    });
  }
  for (auto& t : ranks) t.join();
}

}  // namespace
