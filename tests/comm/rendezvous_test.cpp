// Rendezvous: environment parsing for torchrun, OpenMPI and Slurm, and the
// check-in that names ranks which never arrive.
#include <cstdlib>
#include <thread>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "paratrain/comm/rendezvous.h"
#include "paratrain/comm/store_checkin.h"
#include "paratrain/core/error.h"
#include "paratrain/launch/free_port.h"

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
                          "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NODELIST", "SLURM_JOB_ID", "TORCHELASTIC_RESTART_COUNT",
                          "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE"}) {
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

// Note [A store port per Slurm job]: two jobs on one node, no MASTER_PORT.
TEST(WorldFromEnv, SlurmJobsTakeTheirOwnStorePort) {
  EnvGuard env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  env.set("SLURM_LOCALID", "0");
  env.set("SLURM_JOB_ID", "123457");
  EXPECT_EQ(world_from_env().master_port, 18457);
  env.set("SLURM_JOB_ID", "42");
  EXPECT_EQ(world_from_env().master_port, 15042);
  env.set("MASTER_PORT", "29600");  // the user's choice wins
  EXPECT_EQ(world_from_env().master_port, 29600);
}

// srun without --mpi=pmix: MPI_Init would abort the process; the error says what to do first.
TEST(WorldFromEnv, MpiUnderSrunWithoutPmixNamesTheFlag) {
  EnvGuard env;
  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "1");
  env.set("SLURM_LOCALID", "0");
  paratrain::comm::InitOptions options;
  options.backend = "mpi";
  try {
    init_process_group(world_from_env(), options);
    FAIL() << "expected a ConfigError";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("srun --mpi=pmix"), std::string::npos) << e.what();
  }
}

TEST(WorldFromEnv, InconsistentValuesAreConfigErrors) {
  EnvGuard env;
  env.set("RANK", "4");
  env.set("WORLD_SIZE", "4");
  EXPECT_THROW(world_from_env(), paratrain::ConfigError);
  env.set("RANK", "x");
  EXPECT_THROW(world_from_env(), paratrain::ConfigError);
}

// The message of the ConfigError that world_from_env() throws, or "".
std::string env_error() {
  try {
    world_from_env();
  } catch (const paratrain::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(WorldFromEnv, TorchelasticRestartEnvironmentKeysTheRendezvousByJobAndGeneration) {
  EnvGuard env;
  env.set("RANK", "1");
  env.set("WORLD_SIZE", "2");
  auto plain = world_from_env();
  EXPECT_EQ(plain.restart_count, 0);
  EXPECT_EQ(plain.run_id, "none");
  EXPECT_FALSE(plain.use_agent_store);
  EXPECT_EQ(paratrain::comm::rendezvous_prefix(plain), "paratrain/none/gen0");
  env.set("TORCHELASTIC_RESTART_COUNT", "2");
  env.set("TORCHELASTIC_RUN_ID", "job7");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "True");
  auto w = world_from_env();
  EXPECT_EQ(w.restart_count, 2);
  EXPECT_EQ(w.run_id, "job7");
  EXPECT_TRUE(w.use_agent_store);
  EXPECT_EQ(paratrain::comm::rendezvous_prefix(w), "paratrain/job7/gen2");
  env.set("TORCHELASTIC_USE_AGENT_STORE", "False");
  EXPECT_FALSE(world_from_env().use_agent_store);
}

TEST(WorldFromEnv, MalformedTorchelasticAndSlurmVariablesAreNamed) {
  EnvGuard env;
  env.set("TORCHELASTIC_USE_AGENT_STORE", "maybe");
  EXPECT_NE(env_error().find("TORCHELASTIC_USE_AGENT_STORE='maybe' is not True or False"), std::string::npos)
      << env_error();
  unsetenv("TORCHELASTIC_USE_AGENT_STORE");
  env.set("TORCHELASTIC_RESTART_COUNT", "one");
  EXPECT_NE(env_error().find("TORCHELASTIC_RESTART_COUNT='one' is not an integer"), std::string::npos)
      << env_error();
  env.set("TORCHELASTIC_RESTART_COUNT", "-1");
  EXPECT_NE(env_error().find("TORCHELASTIC_RESTART_COUNT='-1' is out of range 0..1000000"), std::string::npos)
      << env_error();
  unsetenv("TORCHELASTIC_RESTART_COUNT");

  env.set("SLURM_PROCID", "0");
  env.set("SLURM_NTASKS", "2");
  for (const char* bad : {"abc", "(x2)", "2x", ""}) {
    env.set("SLURM_NTASKS_PER_NODE", bad);
    if (*bad == '\0') {
      EXPECT_EQ(env_error(), "");  // empty: not given, the world size is used
      continue;
    }
    EXPECT_NE(env_error().find(std::string("SLURM_NTASKS_PER_NODE='") + bad + "' is not a task count"),
              std::string::npos)
        << env_error();
  }
  env.set("SLURM_NTASKS_PER_NODE", "2,1");
  EXPECT_EQ(world_from_env().local_world_size, 2);
  env.set("SLURM_JOB_NODELIST", ",node2");
  EXPECT_NE(env_error().find("SLURM_JOB_NODELIST=',node2' names no first host"), std::string::npos)
      << env_error();
  env.set("SLURM_PROCID", "x");
  EXPECT_NE(env_error().find("SLURM_PROCID='x' is not an integer"), std::string::npos) << env_error();
}

// Every count and index is range-checked before it becomes an int: these
// values used to wrap silently (4294967298 -> 2, 4294967297 -> 1) or make
// the check-in allocate gigabytes. One short line names the variable, its
// value and the range.
TEST(WorldFromEnv, EveryCountAndIndexIsCheckedAgainstItsRangeInOneShortLine) {
  struct Case {
    std::vector<std::pair<const char*, const char*>> vars;
    const char* named;  // the variable the error must name, with its value and range
  };
  const std::vector<Case> cases = {
      {{{"RANK", "0"}, {"WORLD_SIZE", "4294967298"}}, "WORLD_SIZE='4294967298' is out of range 1..1048576"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "99999999999"}}, "WORLD_SIZE='99999999999' is out of range 1..1048576"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2147483647"}}, "WORLD_SIZE='2147483647' is out of range 1..1048576"},
      {{{"RANK", "4294967297"}, {"WORLD_SIZE", "2"}}, "RANK='4294967297' is out of range 0..1"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "4294967296"}}, "LOCAL_RANK='4294967296' is out of range"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "4294967298"}},
       "LOCAL_WORLD_SIZE='4294967298' is out of range 1..2"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "4294967297"}}, "MASTER_PORT='4294967297' is out of range 1..65535"},
      {{{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4294967298"}},
       "OMPI_COMM_WORLD_SIZE='4294967298' is out of range 1..1048576"},
      {{{"OMPI_COMM_WORLD_RANK", "4294967296"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
       "OMPI_COMM_WORLD_RANK='4294967296' is out of range 0..1"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4294967298"}}, "SLURM_NTASKS='4294967298' is out of range 1..1048576"},
      {{{"SLURM_PROCID", "4294967297"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID='4294967297' is out of range 0..1"},
      {{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "4294967296"}},
       "SLURM_LOCALID='4294967296' is out of range"},
      {{{"RANK", "0"}, {"WORLD_SIZE", "123456789012345678901234567890"}},
       "WORLD_SIZE='123456789012345678901234567890' is out of range 1..1048576"},
  };
  for (const auto& c : cases) {
    EnvGuard env;
    for (const auto& [k, v] : c.vars) env.set(k, v);
    const std::string e = env_error();
    EXPECT_NE(e.find(c.named), std::string::npos) << c.named << "\n" << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    EXPECT_LT(e.size(), 300u) << e;
  }
  EnvGuard env;
  env.set("RANK", "0");
  env.set("WORLD_SIZE", std::string(100000, '7').c_str());  // a long value is quoted short
  EXPECT_LT(env_error().size(), 300u) << env_error().substr(0, 300);
}

TEST(WorldFromEnv, AnUnresolvableSlurmHostIsNamedAsSuch) {
  EnvGuard env;
  env.set("SLURM_PROCID", "1");
  env.set("SLURM_NTASKS", "2");
  // .invalid never resolves (RFC 6761).
  env.set("SLURM_JOB_NODELIST", "ghost-node.invalid,other.invalid");
  const auto w = world_from_env();
  EXPECT_EQ(w.master_addr, "ghost-node.invalid");
  std::string message;
  try {
    paratrain::comm::check_master_resolves(w);
  } catch (const paratrain::ConfigError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("the store host 'ghost-node.invalid' (the first host of "
                         "SLURM_JOB_NODELIST='ghost-node.invalid,other.invalid') does not resolve"),
            std::string::npos)
      << message;
  // init_process_group says the same before it touches the store.
  EXPECT_THROW(paratrain::comm::init_process_group(w), paratrain::ConfigError);
}

TEST(InitProcessGroup, ShmAcrossHostsIsAConfigErrorSayingWhatToUse) {
  paratrain::comm::WorldInfo w;
  w.rank = 0;
  w.world_size = 4;
  w.local_world_size = 2;  // two hosts of two ranks
  paratrain::comm::InitOptions init;
  init.backend = "shm";
  try {
    paratrain::comm::init_process_group(w, init);
    FAIL() << "expected a ConfigError";
  } catch (const paratrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs every rank on one host"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("world.backend = \"gloo\""), std::string::npos) << e.what();
  }
}

// auto and shm over a real TCPStore: ranks on this host get shm groups.
TEST(InitProcessGroup, AutoPicksShmForRanksOfOneHost) {
  for (const char* backend : {"auto", "shm"}) {
    const int port = paratrain::launch::find_free_port();
    std::vector<std::thread> ranks;
    std::vector<std::string> chosen(2);
    for (int r = 0; r < 2; ++r) {
      ranks.emplace_back([&, r] {
        paratrain::comm::WorldInfo w;
        w.rank = r;
        w.world_size = 2;
        w.local_rank = r;
        w.local_world_size = 2;
        w.master_port = port;
        w.run_id = std::string("shm-") + backend;
        paratrain::comm::InitOptions init;
        init.timeout = std::chrono::seconds(30);
        init.backend = backend;
        auto group = paratrain::comm::init_process_group(w, init);
        auto t = torch::ones({5});
        group->all_reduce(t)->wait();
        EXPECT_TRUE(torch::equal(t, torch::full({5}, 2.0f)));
        chosen[r] = group->backend();
        group->barrier()->wait();
      });
    }
    for (auto& t : ranks) t.join();
    EXPECT_EQ(chosen[0], "shm") << backend;
    EXPECT_EQ(chosen[1], "shm") << backend;
  }
}

TEST(InitProcessGroup, UnderTorchrunsAgentStoreEveryRankIsAClientAndKeysCarryTheGeneration) {
  // Stands in for torchrun's agent: it serves the store; no rank may.
  c10d::TCPStoreOptions agent_opts;
  agent_opts.port = static_cast<std::uint16_t>(paratrain::launch::find_free_port());
  agent_opts.isServer = true;
  agent_opts.waitWorkers = false;
  auto agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", agent_opts);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      paratrain::comm::WorldInfo w;
      w.rank = r;
      w.world_size = 2;
      w.local_rank = r;
      w.local_world_size = 2;
      w.master_port = agent_opts.port;
      w.restart_count = 3;
      w.run_id = "job";
      w.use_agent_store = true;
      paratrain::comm::InitOptions init;
      init.timeout = std::chrono::seconds(30);
      std::shared_ptr<paratrain::comm::ProcessGroup> group;
      // Rank 0 serving too would fail here: the agent holds the port.
      ASSERT_NO_THROW(group = paratrain::comm::init_process_group(w, init));
      group->barrier()->wait();
    });
  }
  for (auto& t : ranks) t.join();
  EXPECT_TRUE(agent->check({"paratrain/job/gen3/paratrain/checkin/0", "paratrain/job/gen3/paratrain/checkin/1"}));
  EXPECT_FALSE(agent->check({"paratrain/checkin/0"}));
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

// 99999 missing ranks make one short line, not 589 KB.
TEST(CheckIn, ManyMissingRanksAreNamedInOneShortLine) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string message;
  try {
    paratrain::comm::check_in(*store, 0, 100000, std::chrono::milliseconds(100), "test store");
  } catch (const paratrain::TimeoutError& e) {
    message = e.what();
  }
  EXPECT_NE(message.find("rank(s) 1,2,3,4,5,6,7,8 ... and 99991 more of world size 100000 never arrived"),
            std::string::npos)
      << message.substr(0, 400);
  EXPECT_LT(message.size(), 500u) << message.substr(0, 400);
}

// Whoever sees a rank die (the launcher) ends the check-in: a rank waiting
// in it stops with the reason instead of at its timeout. The 120 s timeout
// is the guard: hitting it throws TimeoutError, which fails the test.
TEST(CheckIn, AbortCheckInEndsTheWaitWithTheReason) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::string message;
  std::thread r0([&] {
    try {
      paratrain::comm::check_in(*store, 0, 2, std::chrono::seconds(120), "test store");
    } catch (const paratrain::TimeoutError& e) {
      message = std::string("timeout: ") + e.what();
    } catch (const paratrain::CommError& e) {
      message = e.what();
    }
  });
  while (!store->check({"paratrain/checkin/0"})) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  paratrain::comm::abort_check_in(*store, "rank 1 (pid 42) was killed by SIGKILL");
  r0.join();
  EXPECT_EQ(message.rfind("rank 0: the rendezvous (test store) was ended before every rank arrived: rank 1 (pid 42) "
                          "was killed by SIGKILL",
                          0),
            0u)
      << message;
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
