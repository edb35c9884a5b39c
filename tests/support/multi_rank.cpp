// Multi-rank harness: ranks as threads (shared HashStore) or as processes
// through the real CLI. See multi_rank.h.
#include "tests/support/multi_rank.h"

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <exception>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "paratrain/comm/gloo/gloo_group.h"
#include "paratrain/comm/hierarchical_group.h"
#include "paratrain/comm/host_staging_group.h"
#include "paratrain/comm/mpi/mpi_group.h"
#include "paratrain/comm/shm/shm_group.h"

extern char** environ;

namespace paratrain::testing {

namespace {

// Under `mpirun -np N test_X` with PARATRAIN_TEST_BACKEND=mpi, the ranks are
// the MPI processes: each runs fn for its own rank, over a fresh
// communicator of the first `world_size` processes (the others skip it), so
// the same collective suites test the MPI backend. See tests/CMakeLists.txt.
bool mpi_mode() {
  const char* backend = std::getenv("PARATRAIN_TEST_BACKEND");
  return backend != nullptr && std::string(backend) == "mpi";
}

void run_ranks_mpi(int world_size, const std::function<void(comm::ProcessGroup&)>& fn,
                   std::chrono::milliseconds timeout) {
  comm::MpiOptions options;
  options.timeout = timeout;
  auto world = comm::make_mpi_world_group(options);
  if (world_size > world->size())
    throw std::runtime_error("run_ranks(" + std::to_string(world_size) + "): mpirun started only " +
                             std::to_string(world->size()) + " processes");
  std::vector<int> members(world_size);
  for (int r = 0; r < world_size; ++r) members[r] = r;
  auto group = world->new_subgroup(members);
  if (!group) return;
  group->barrier()->wait();
  fn(*group);
}

// PARATRAIN_TEST_BACKEND=shm: the rank threads build shm groups instead of
// Gloo ones (threads of one process map the segment as processes would),
// so the same suites test the shm backend. See tests/CMakeLists.txt.
std::string thread_backend() {
  const char* backend = std::getenv("PARATRAIN_TEST_BACKEND");
  if (backend != nullptr && (std::string(backend) == "shm" || std::string(backend) == "hierarchical")) return backend;
  return "gloo";
}

// PARATRAIN_TEST_STAGING=1: every tensor staged; =thread: and every
// operation started on the group's issuing thread, as a GPU tensor's is.
bool staging_every_tensor() {
  const char* v = std::getenv("PARATRAIN_TEST_STAGING");
  return v != nullptr && (std::string(v) == "1" || std::string(v) == "thread");
}
bool staging_on_thread() {
  const char* v = std::getenv("PARATRAIN_TEST_STAGING");
  return v != nullptr && std::string(v) == "thread";
}

std::shared_ptr<comm::ProcessGroup> hierarchical_group(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                       int world_size, std::chrono::milliseconds timeout) {
  comm::GlooOptions gloo;
  gloo.timeout = timeout;
  auto world = comm::make_gloo_group(store, rank, world_size, gloo);
  comm::HierarchicalOptions options;
  options.timeout = timeout;
  options.node = "node" + std::to_string(rank / 2);
  options.make_node_group = [&](const comm::NodeLayout& layout) {
    comm::ShmOptions shm;
    shm.timeout = timeout;
    shm.job = "test-" + std::to_string(getpid());
    shm.group = "node" + std::to_string(layout.node);
    auto node_store = c10::make_intrusive<c10d::PrefixStore>(shm.group, store);
    return comm::make_shm_group(node_store, layout.local_rank, static_cast<int>(layout.local_ranks.size()), shm);
  };
  return comm::make_hierarchical_group(std::move(world), options);
}

}  // namespace

void run_ranks(int world_size, const std::function<void(comm::ProcessGroup&)>& fn,
               std::chrono::milliseconds timeout) {
  if (mpi_mode()) return run_ranks_mpi(world_size, fn, timeout);
  run_ranks_on(thread_backend(), world_size, fn, timeout);
}

void run_ranks_on(const std::string& backend, int world_size, const std::function<void(comm::ProcessGroup&)>& fn,
                  std::chrono::milliseconds timeout) {
  if (backend != "gloo" && backend != "shm" && backend != "hierarchical")
    throw std::invalid_argument("run_ranks_on: backend '" + backend + "' is not gloo, shm or hierarchical");
  auto store = c10::make_intrusive<c10d::HashStore>();
  std::mutex mu;
  std::exception_ptr first_error;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        std::shared_ptr<comm::ProcessGroup> group;
        if (backend == "shm") {
          comm::ShmOptions options;
          options.timeout = timeout;
          options.job = "test-" + std::to_string(getpid());
          group = comm::make_shm_group(store, rank, world_size, options);
        } else if (backend == "hierarchical") {
          group = hierarchical_group(store, rank, world_size, timeout);
        } else {
          comm::GlooOptions options;
          options.timeout = timeout;
          group = comm::make_gloo_group(store, rank, world_size, options);
        }
        // As init_process_group does for GPU runs: tensors off the CPU go
        // through host copies (comm/host_staging_group.h); CPU tensors pass
        // untouched, unless PARATRAIN_TEST_STAGING=1 stages them too, so the
        // CPU suites exercise the decorator (tests/CMakeLists.txt).
        comm::StagingOptions staging;
        staging.timeout = timeout;
        staging.stage_cpu_tensors = staging_every_tensor();
        staging.issue_on_thread = staging_on_thread();
        group = comm::stage_through_host(std::move(group), staging);
        // Gloo's constructor can return on one rank while a peer still reads
        // the connection handshake; a rank whose fn runs no collective would
        // then close its sockets under that peer ("Connection closed by
        // peer"). Leaving this barrier means every rank finished connecting.
        group->barrier()->wait();
        fn(*group);
      } catch (...) {
        // Every rank's error goes to stderr: the one rethrown is the first
        // to reach this lock, which may be a peer's consequence (a closed
        // connection) rather than the cause.
        std::lock_guard<std::mutex> lock(mu);
        try {
          throw;
        } catch (const std::exception& e) {
          std::cerr << "run_ranks: rank " << rank << " threw: " << e.what() << "\n";
        } catch (...) {
          std::cerr << "run_ranks: rank " << rank << " threw a non-std exception\n";
        }
        if (!first_error) first_error = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

ProcessResult run_cli(const std::vector<std::string>& args, std::chrono::milliseconds timeout) {
  std::vector<std::string> argv_storage{PARATRAIN_CLI};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = 0;
  const auto start = std::chrono::steady_clock::now();
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error(std::string("could not start ") + PARATRAIN_CLI);
  }

  ProcessResult result;
  const auto deadline = start + timeout;
  bool timed_out = false;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(std::min<long>(left.count(), 200)));
    if (n > 0) {
      ssize_t got = read(fds[0], buf, sizeof buf);
      if (got <= 0) break;  // EOF: the launcher and everything it started closed the pipe
      result.output.append(buf, static_cast<size_t>(got));
    }
  }
  close(fds[0]);
  if (timed_out) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (timed_out) {
    result.exit_code = -1;
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  } else {
    result.exit_code = 128 + WTERMSIG(status);
  }
  return result;
}

namespace {
// Removes the temp dirs handed out by temp_dir() when the test binary exits.
struct TempDirs {
  std::mutex mu;
  std::vector<std::string> dirs;
  ~TempDirs() {
    std::error_code ec;
    for (auto& d : dirs) std::filesystem::remove_all(d, ec);
  }
};
TempDirs& temp_dirs() {
  static TempDirs t;
  return t;
}
}  // namespace

std::string temp_dir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  std::lock_guard<std::mutex> lock(temp_dirs().mu);
  temp_dirs().dirs.push_back(pattern);
  return pattern;
}

}  // namespace paratrain::testing
