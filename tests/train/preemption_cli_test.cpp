// train.preempt_signals as a scheduler drives it, in real processes under
// `paratrain launch`: a SIGTERM to one rank (or to the launcher) mid-epoch
// makes every rank stop at the same step, write a complete checkpoint, mark
// run.json "preempted" and exit 75, which the launcher passes on; the run
// resumed with train.resume = "auto" ends equal to the uninterrupted run.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/core/exit_codes.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/run/preemption.h"
#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

namespace {

using paratrain::testing::read_file;

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

nlohmann::json run_status(const fs::path& run_dir) {
  std::ifstream in(run_dir / "run.json");
  if (!in) return nlohmann::json::object();
  try {
    return nlohmann::json::parse(in);
  } catch (...) {
    return nlohmann::json::object();
  }
}

// 64 epochs of 16 steps at 2 ranks (1024 steps, a second or two): long
// enough to be signalled mid-run, short enough to run twice more.
std::string job(const std::string& dir) {
  const auto path = dir + "/job.toml";
  std::ofstream(path) << "[run]\nname = \"job\"\noutput_dir = \"" << dir << "/runs\"\nlog_every = 10\nseed = 4\n"
                      << "[model]\nhidden = [32]\n"
                      << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 512\n"
                      << "synthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = 16\n"
                      << "[train]\nepochs = 64\neval_every_epochs = 0\n[world]\ntimeout_s = 30\n";
  return path;
}

// The launcher's child that runs `rank` (its environment says RANK=<rank>).
pid_t rank_pid(pid_t launcher, int rank) {
  std::ifstream children(fmt::format("/proc/{}/task/{}/children", launcher, launcher));
  pid_t pid = 0;
  while (children >> pid) {
    std::ifstream env(fmt::format("/proc/{}/environ", pid), std::ios::binary);
    std::string entry;
    while (std::getline(env, entry, '\0'))
      if (entry == "RANK=" + std::to_string(rank)) return pid;
  }
  return -1;
}

struct Preempted {
  int64_t step = 0;
  std::string log;
};

// Starts the job under the launcher, signals `target` (a rank, or -1 for the
// launcher) once training is under way, and checks what a preemption leaves.
// `also_ranks`: the ranks get the signal too, as when a scheduler signals
// every process of the job and the launcher passes its own copy on.
Preempted preempt(const std::string& dir, int target, bool also_ranks = false, int sig = SIGTERM) {
  const std::string log = dir + "/launch.log";
  const pid_t launcher = paratrain::testing::spawn_logged(
      {PARATRAIN_CLI, "launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", job(dir), "--set",
       "train.preempt_signals=SIGTERM,SIGUSR2"},
      log);
  EXPECT_GT(launcher, 0);
  const fs::path run = dir + "/runs/job/version_0";
  const bool training = paratrain::testing::wait_until(
      launcher, [&] { return fs::exists(run / "metrics.jsonl") && fs::file_size(run / "metrics.jsonl") > 200; },
      std::chrono::seconds(120));
  EXPECT_TRUE(training) << read_file(log);
  const pid_t victim = target < 0 ? launcher : rank_pid(launcher, target);
  EXPECT_GT(victim, 0) << "no rank " << target << " under the launcher";
  const pid_t ranks[2] = {rank_pid(launcher, 0), rank_pid(launcher, 1)};
  kill(victim, sig);
  if (also_ranks)
    for (pid_t r : ranks) kill(r, sig);
  const auto exit = paratrain::testing::wait_exit(launcher, std::chrono::seconds(60));
  Preempted out;
  out.log = read_file(log);
  EXPECT_TRUE(exit) << out.log;
  if (!exit) return out;
  EXPECT_TRUE(WIFEXITED(*exit)) << out.log;
  EXPECT_EQ(WEXITSTATUS(*exit), paratrain::kPreemptedExitCode) << out.log;
  EXPECT_NE(out.log.find("paratrain launch: preempted (exit code 75): ranks 0-1 stopped at a checkpoint"),
            std::string::npos) << out.log;
  const auto status = run_status(run);
  EXPECT_EQ(status.value("status", ""), "preempted") << status.dump();
  EXPECT_EQ(status.value("signal", ""), sig == SIGTERM ? "SIGTERM" : "SIGUSR2") << status.dump();
  out.step = status.value("steps", int64_t{0});
  EXPECT_GT(out.step, 0) << status.dump();
  EXPECT_LT(out.step, 1024) << "the run ended before the signal took effect: " << status.dump();
  // The checkpoint of that step is complete (every rank's file and the index).
  const fs::path checkpoint = run / "checkpoints" / fmt::format("step_{:08d}", out.step);
  EXPECT_EQ(status.value("checkpoint", ""), checkpoint.string()) << status.dump();
  for (const char* file : {"index.json", "rank_0.safetensors", "rank_1.safetensors"})
    EXPECT_TRUE(fs::exists(checkpoint / file)) << checkpoint / file;
  return out;
}

}  // namespace

TEST(Preemption, ASignalToOneRankStopsEveryRankAtOneCheckpointAndResumingEqualsTheUninterruptedRun) {
  const auto dir = paratrain::testing::temp_dir("preempt-rank");
  const Preempted p = preempt(dir, /*target=*/1);
  // Requeued: the same command with train.resume = "auto" finishes the run.
  auto resumed = run_cli({"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", job(dir),
                          "--set", "train.resume=auto"});
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find(fmt::format("step_{:08d}", p.step)), std::string::npos) << resumed.output;
  auto whole = run_cli({"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", job(dir),
                        "--set", "run.name=whole"});
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  const std::string last = "checkpoints/step_00001024";
  auto compare = run_cli({"checkpoint", "compare", "--all", dir + "/runs/job/version_0/" + last,
                          dir + "/runs/whole/version_0/" + last});
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  std::printf("[ measured ] %s", compare.output.substr(compare.output.rfind('\n', compare.output.size() - 2) + 1).c_str());
  // At another world size: the preemption checkpoint resumed by one process
  // on the same global batch, to the next epoch end (at most 16 steps: one
  // process sums in another order, so the comparison stays well before the
  // float-order horizon), equals the resumed 2-rank run there.
  const int64_t epoch_end = (p.step / 16 + 1) * 16;
  auto alone = run_cli({"train", "--config", job(dir), "--set", "run.name=alone", "--set", "data.batch_size=32",
                        "--set", "ddp.mode=none", "--set", "train.max_steps=" + std::to_string(epoch_end), "--set",
                        "train.resume=" + dir + fmt::format("/runs/job/version_0/checkpoints/step_{:08d}", p.step)});
  ASSERT_EQ(alone.exit_code, 0) << alone.output;
  const std::string at_end = fmt::format("checkpoints/step_{:08d}", epoch_end);
  compare = run_cli({"checkpoint", "compare", dir + "/runs/alone/version_0/" + at_end,
                     dir + "/runs/job/version_0/" + at_end});
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  std::printf("[ measured ] %s", compare.output.substr(compare.output.rfind('\n', compare.output.size() - 2) + 1).c_str());
}

// Like scancel: the launcher and every rank get SIGTERM, so each rank gets it
// twice (Note [A signal that insists]): still one preemption, exit 75.
TEST(Preemption, ASignalToTheLauncherAndEveryRankIsOnePreemption) {
  const auto dir = paratrain::testing::temp_dir("preempt-launcher");
  const Preempted p = preempt(dir, /*target=*/-1, /*also_ranks=*/true);
  EXPECT_NE(p.log.find("after the launcher passed on SIGTERM"), std::string::npos) << p.log;
}

// Note [A signal that insists]: a repeat of the first signal from the
// process that forwards signals to this one (paratrain launch, named by
// PARATRAIN_LAUNCHER_PID) is the same request however late it comes; the
// same repeat from anyone else after the two-second window ends the process
// (143). The child reports through a pipe when its handlers are installed
// and again when the first signal arrived, so the window is measured from
// the handler, not from kill().
TEST(PreemptionSignals, TheLaunchersLateRepeatIsTheSameRequestAnyoneElsesInsists) {
  for (const bool from_launcher : {true, false}) {
    const std::string who = from_launcher ? "the launcher" : "another process";
    int up[2], down[2];
    ASSERT_EQ(pipe(up), 0);
    ASSERT_EQ(pipe(down), 0);
    const pid_t launcher = getpid();
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      close(up[0]);
      close(down[1]);
      setenv("PARATRAIN_LAUNCHER_PID", std::to_string(launcher).c_str(), 1);
      paratrain::train::PreemptionSignals::clear();
      paratrain::train::PreemptionSignals signals({SIGTERM});
      char c = 1;
      if (write(up[1], &c, 1) != 1) _exit(2);  // installed
      while (paratrain::train::PreemptionSignals::received() == 0) usleep(1000);
      if (write(up[1], &c, 1) != 1) _exit(2);  // the first signal arrived
      while (read(down[0], &c, 1) < 0) {        // a signal interrupts read: read again
      }
      _exit(paratrain::train::PreemptionSignals::received() == SIGTERM ? 0 : 3);
    }
    close(up[1]);
    close(down[0]);
    struct Reap {  // whatever fails below, no child outlives the test
      pid_t pid;
      ~Reap() {
        if (pid > 0 && waitpid(pid, nullptr, WNOHANG) == 0) {
          kill(pid, SIGKILL);
          waitpid(pid, nullptr, 0);
        }
      }
    } reap{child};
    char c = 0;
    ASSERT_EQ(read(up[0], &c, 1), 1) << who;
    kill(child, SIGTERM);
    ASSERT_EQ(read(up[0], &c, 1), 1) << who;
    std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // past the window
    if (from_launcher) {
      kill(child, SIGTERM);
    } else {
      const pid_t other = fork();  // not the launcher
      if (other == 0) _exit(kill(child, SIGTERM) == 0 ? 0 : 1);
      waitpid(other, nullptr, 0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    c = 1;
    {
      // The child may be gone already (the insisting case): no SIGPIPE.
      struct sigaction ignore {}, previous {};
      ignore.sa_handler = SIG_IGN;
      sigaction(SIGPIPE, &ignore, &previous);
      (void)!write(down[1], &c, 1);
      sigaction(SIGPIPE, &previous, nullptr);
    }
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    reap.pid = 0;
    for (int fd : {up[0], down[1]}) close(fd);
    ASSERT_TRUE(WIFEXITED(status)) << who;
    EXPECT_EQ(WEXITSTATUS(status), from_launcher ? 0 : 128 + SIGTERM) << who;
  }
}

// Slurm's early warning (--signal=USR2@60) sent to the launcher: it passes
// SIGUSR2 on without stopping anyone, and the ranks preempt.
TEST(Preemption, SigUsr2ToTheLauncherIsPassedOnAndPreempts) {
  const auto dir = paratrain::testing::temp_dir("preempt-usr2");
  const Preempted p = preempt(dir, /*target=*/-1, /*also_ranks=*/false, SIGUSR2);
  EXPECT_NE(p.log.find("got SIGUSR2; passing it on to the workers"), std::string::npos) << p.log;
}

TEST(Preemption, SignalNamesAreChecked) {
  auto c = paratrain::train::TrainConfig{};
  paratrain::train::apply_override(c, "train.preempt_signals=TERM, sigusr2");
  EXPECT_EQ(c.train.preempt_signals, "TERM, sigusr2");
  EXPECT_THROW(paratrain::train::apply_override(c, "train.preempt_signals=SIGFOO"), paratrain::ConfigError);
  c.elastic.in_job = true;
  EXPECT_THROW(paratrain::train::validate_config(c), paratrain::ConfigError);
}

namespace {

// Gang scheduling (Slurm's PreemptMode=SUSPEND,GANG) or Ctrl-Z: the whole
// job, launcher included, stopped for longer than world.heartbeat_timeout_s
// and world.timeout_s, then continued, goes on training (Note [A suspended
// job] in launch/supervisor.cpp, Note [Deadlines that stop with the
// process] in core/running_deadline.h) and ends equal to a run never
// stopped. A single stopped rank is still caught (Launch.* and
// ShmProcesses.* tests). `extra`: the layout and backend under test.
void stop_the_whole_job_and_compare(const std::string& dir, const std::vector<std::string>& extra, int steps) {
  // 1024 (or 256) steps paced to at least 3 ms each (rank 0 sleeps before each
  // step): still training a second after it started on any machine.
  std::vector<std::string> settings{"--set", "world.heartbeat_s=0.2", "--set", "world.heartbeat_timeout_s=2",
                                    "--set", "world.timeout_s=3",     "--set", "profile.test_slow_rank=0",
                                    "--set", "profile.test_slow_ms=3"};
  settings.insert(settings.end(), extra.begin(), extra.end());
  std::vector<std::string> args{PARATRAIN_CLI, "launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train",
                                "--config", job(dir)};
  args.insert(args.end(), settings.begin(), settings.end());
  const std::string log = dir + "/launch.log";
  const pid_t launcher = paratrain::testing::spawn_logged(args, log);
  ASSERT_GT(launcher, 0);
  const fs::path run = dir + "/runs/job/version_0";
  ASSERT_TRUE(paratrain::testing::wait_until(
      launcher, [&] { return fs::exists(run / "metrics.jsonl") && fs::file_size(run / "metrics.jsonl") > 200; },
      std::chrono::seconds(120)))
      << read_file(log);
  std::this_thread::sleep_for(std::chrono::seconds(1));  // the launcher has followed their beats
  const pid_t ranks[2] = {rank_pid(launcher, 0), rank_pid(launcher, 1)};
  ASSERT_GT(ranks[0], 0);
  ASSERT_GT(ranks[1], 0);
  // The workers stop first (each leads its own process group) and the
  // launcher half a second later, after it read their last beats.
  for (pid_t r : ranks) kill(-r, SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  kill(launcher, SIGSTOP);
  // More than twice the heartbeat timeout and the collective timeout: every
  // collective in flight passed its wall-clock deadline while stopped.
  std::this_thread::sleep_for(std::chrono::seconds(7));
  // The launcher wakes first, as any process of a job may: for a moment it
  // sees only beats as old as the pause. Then the ranks, one after the
  // other: rank 1 first, which was most likely waiting in a collective for
  // the slower rank 0, and now waits 300 ms more, past its wall-clock
  // deadline.
  kill(launcher, SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(-ranks[1], SIGCONT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(-ranks[0], SIGCONT);
  const auto exit = paratrain::testing::wait_exit(launcher, std::chrono::seconds(120));
  ASSERT_TRUE(exit) << read_file(log);
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << read_file(log);
  EXPECT_NE(read_file(log).find("did not run for"), std::string::npos) << read_file(log);

  std::vector<std::string> whole{"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config",
                                 job(dir), "--set", "run.name=whole"};
  whole.insert(whole.end(), settings.begin(), settings.end());
  const auto never_stopped = run_cli(whole);
  ASSERT_EQ(never_stopped.exit_code, 0) << never_stopped.output;
  const auto last = fmt::format("checkpoints/step_{:08d}", steps);
  const auto compare =
      run_cli({"checkpoint", "compare", "--all", "--rtol", "0", (run / last).string(),
               dir + "/runs/whole/version_0/" + last});
  EXPECT_EQ(compare.exit_code, 0) << compare.output;  // bitwise: the same ranks, backend and order
}

}  // namespace

// Data parallel over the default backend (shared memory on one host).
TEST(Suspension, TheWholeJobStoppedAndContinuedFinishesAsIfNeverStopped) {
  stop_the_whole_job_and_compare(paratrain::testing::temp_dir("suspend"), {}, 1024);
}

// Two pipeline stages over Gloo: its collectives and its sends and receives
// (Note [Gloo's deadline is ours] in comm/gloo/gloo_work.h). Before, the
// rank that woke first failed its receive at Gloo's own deadline.
TEST(Suspension, PipelineStagesOverGlooStoppedLongerThanTheTimeoutGoOn) {
  stop_the_whole_job_and_compare(paratrain::testing::temp_dir("suspend-gloo"),
                                 {"--set", "world.backend=gloo", "--set", "parallel.pp=2", "--set", "train.epochs=8"},
                                 256);
}

// A second signal ends the process at once (the user or the scheduler
// insists), possibly in the middle of the preemption checkpoint: nothing
// half-written may count as a checkpoint, and train.resume = "auto" goes on
// from a complete one.
TEST(Preemption, ASecondSignalExitsAtOnceAndLeavesNoHalfCheckpoint) {
  const auto dir = paratrain::testing::temp_dir("preempt-twice");
  const std::string log = dir + "/launch.log";
  const pid_t launcher = paratrain::testing::spawn_logged(
      {PARATRAIN_CLI, "launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", job(dir), "--set",
       "train.preempt_signals=SIGTERM,SIGUSR2", "--set", "train.checkpoint_every_steps=50"},
      log);
  ASSERT_GT(launcher, 0);
  const fs::path run = dir + "/runs/job/version_0";
  ASSERT_TRUE(paratrain::testing::wait_until(
      launcher, [&] { return fs::exists(run / "checkpoints" / "step_00000100" / "index.json"); },
      std::chrono::seconds(120)))
      << read_file(log);
  const pid_t rank0 = rank_pid(launcher, 0);
  ASSERT_GT(rank0, 0);
  // Another preemption signal insists (a repeat of the same one within two
  // seconds would be the same request twice); two different signals never
  // merge into one delivery.
  kill(rank0, SIGTERM);
  kill(rank0, SIGUSR2);
  const auto exit = paratrain::testing::wait_exit(launcher, std::chrono::seconds(60));
  ASSERT_TRUE(exit) << read_file(log);
  // The second signal ended rank 0 (the handler's _exit(128 + signal), or the
  // signal's default action once the run's handlers were gone), not a
  // preemption exit. Linux delivers pending signals lowest number first, so
  // SIGUSR2 (12) may be the first one and SIGTERM (15) the second.
  const std::string out = read_file(log);
  bool ended_by_the_second = false;
  for (const char* how : {"exited with code 140", "exited with code 143", "was killed by SIGUSR2 first",
                          "was killed by SIGTERM first"})
    ended_by_the_second = ended_by_the_second || out.find(how) != std::string::npos;
  EXPECT_TRUE(ended_by_the_second) << out;
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) != paratrain::kPreemptedExitCode) << read_file(log);
  // Every checkpoint that has its index has every rank's file.
  int complete = 0;
  for (const auto& entry : fs::directory_iterator(run / "checkpoints")) {
    if (!fs::exists(entry.path() / "index.json")) continue;
    ++complete;
    for (const char* file : {"rank_0.safetensors", "rank_1.safetensors"})
      EXPECT_TRUE(fs::exists(entry.path() / file)) << entry.path() / file;
  }
  EXPECT_GE(complete, 2);  // step 50 and step 100 at least
  auto resumed = run_cli({"launch", "--nproc-per-node", "2", "--", PARATRAIN_CLI, "train", "--config", job(dir),
                          "--set", "train.resume=auto"});
  EXPECT_EQ(resumed.exit_code, 0) << resumed.output;
}
