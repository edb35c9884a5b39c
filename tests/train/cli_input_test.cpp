// `paratrain` given input a hostile-but-fair user would try (issue 23,
// item 11): devices where files belong, signals mid-run, malformed command
// lines. Each case is one real CLI process with a bounded wait.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>
#include <zlib.h>

#include "paratrain/core/error.h"
#include "paratrain/core/exit_codes.h"
#include "paratrain/data/idx.h"
#include "tests/support/multi_rank.h"
#include "tests/support/spawn.h"

extern char** environ;

namespace {

using paratrain::testing::read_file;

namespace fs = std::filesystem;
using paratrain::testing::run_cli;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Reading /dev/zero "to its end" never ends; run_cli's bound (exit code -1)
// fails the test instead of hanging it.
TEST(CliInput, CheckpointInspectRefusesADeviceInsteadOfReadingIt) {
  for (const char* sub : {"inspect", "consolidate"}) {
    std::vector<std::string> args{"checkpoint", sub, "/dev/zero"};
    if (std::string(sub) == "consolidate") args.insert(args.end(), {"-o", paratrain::testing::temp_dir("ck") + "/o"});
    const auto r = run_cli(args, std::chrono::seconds(60));
    EXPECT_EQ(r.exit_code, 1) << r.output;
    EXPECT_TRUE(contains(r.output, "cannot read checkpoint '/dev/zero': it is a character device, not a regular "
                                   "file")) << r.output;
  }
}

// A synthetic job that runs far longer than the test waits for it.
std::string long_job(const std::string& dir) {
  const auto path = dir + "/long.toml";
  std::ofstream(path) << "[run]\nname = \"long\"\noutput_dir = \"" << dir << "/runs\"\n"
                      << "[model]\nhidden = [16]\n"
                      << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = 512\nsynthetic_test_size = 64\n"
                      << "synthetic_image_size = 8\nbatch_size = 16\n[train]\nepochs = 100000\n";
  return path;
}

nlohmann::json run_status(const std::string& run_dir) {
  auto j = nlohmann::json::parse(read_file(run_dir + "/run.json"), nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : nlohmann::json::object();
}

// Starts the long job (`extra` added to its command line), waits until it is
// training, sends `sig`, and returns its wait status; a run that never
// starts or never ends fails the test (bounded waits).
std::optional<int> signal_long_job(const std::string& dir, const std::vector<std::string>& extra, int sig) {
  const std::string log = dir + "/log", run_dir = dir + "/runs/long/version_0";
  std::vector<std::string> args{PARATRAIN_CLI, "train", "--config", long_job(dir)};
  args.insert(args.end(), extra.begin(), extra.end());
  const pid_t pid = paratrain::testing::spawn_logged(args, log);
  EXPECT_GT(pid, 0);
  if (pid <= 0) return std::nullopt;
  const bool running = paratrain::testing::wait_until(
      pid, [&] { return run_status(run_dir).value("status", "") == "running"; }, std::chrono::seconds(120));
  EXPECT_TRUE(running) << read_file(log);
  if (!running) return std::nullopt;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // into the training loop
  kill(pid, sig);
  const auto exit = paratrain::testing::wait_exit(pid, std::chrono::seconds(60));
  EXPECT_TRUE(exit) << "train still running 60 s after signal " << sig << ":\n" << read_file(log);
  return exit;
}

// Issue 23: after SIGTERM or SIGINT run.json still said "running", so
// `paratrain runs` called the run "died". With preemption off (it is on by
// default: the next test), the process must still end by the signal (what
// launchers and shells look at).
TEST(CliInput, ASignalledTrainRecordsStoppedInRunJson) {
  for (int sig : {SIGTERM, SIGINT}) {
    const auto dir = paratrain::testing::temp_dir("cli-signal");
    const std::string run_dir = dir + "/runs/long/version_0";
    const auto exit = signal_long_job(dir, {"--set", "train.preempt_signals="}, sig);
    ASSERT_TRUE(exit);
    const int status = *exit;
    ASSERT_TRUE(WIFSIGNALED(status)) << read_file(dir + "/log");
    EXPECT_EQ(WTERMSIG(status), sig);
    const auto j = run_status(run_dir);
    EXPECT_EQ(j.value("status", ""), "stopped") << j.dump();
    EXPECT_EQ(j.value("signal", ""), sig == SIGTERM ? "SIGTERM" : "SIGINT") << j.dump();
    EXPECT_GE(j.value("ended", 0.0), j.value("started", 1e300)) << j.dump();
    const auto runs = run_cli({"runs", dir + "/runs"});
    EXPECT_EQ(runs.exit_code, 0) << runs.output;
    EXPECT_TRUE(contains(runs.output, "stopped")) << runs.output;
    EXPECT_FALSE(contains(runs.output, "died")) << runs.output;
  }
}

// Issue 28: by default (train.preempt_signals = "auto") Ctrl-C or a
// scheduler's SIGTERM preempts: one process stops at a step boundary,
// writes a checkpoint, records "preempted" and exits 75. SIGHUP is not in
// the default and still stops the run as before.
TEST(CliInput, ByDefaultCtrlCPreemptsWithACheckpointAndSigHupStops) {
  for (int sig : {SIGINT, SIGHUP}) {
    const auto dir = paratrain::testing::temp_dir("cli-preempt");
    const std::string log = dir + "/log", run_dir = dir + "/runs/long/version_0";
    const auto exit = signal_long_job(dir, {}, sig);
    ASSERT_TRUE(exit);
    const auto j = run_status(run_dir);
    if (sig == SIGHUP) {
      EXPECT_TRUE(WIFSIGNALED(*exit) && WTERMSIG(*exit) == SIGHUP) << read_file(log);
      EXPECT_EQ(j.value("status", ""), "stopped") << j.dump();
      continue;
    }
    ASSERT_TRUE(WIFEXITED(*exit)) << read_file(log);
    EXPECT_EQ(WEXITSTATUS(*exit), paratrain::kPreemptedExitCode) << read_file(log);
    EXPECT_EQ(j.value("status", ""), "preempted") << j.dump();
    EXPECT_EQ(j.value("signal", ""), "SIGINT") << j.dump();
    const std::string checkpoint = j.value("checkpoint", "");
    EXPECT_TRUE(std::filesystem::exists(checkpoint + "/index.json")) << j.dump();
  }
}

// A usage error exits 2, like a configuration error, not CLI11's own codes
// (106 for a missing option, 104 for a bad number, 109 for extras).
TEST(CliInput, UsageErrorsExit2AndAMistypedCommandGetsASuggestion) {
  auto r = run_cli({"train"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--config is required")) << r.output;
  r = run_cli({"launch", "--nproc-per-node", "abc", "--", "true"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "abc")) << r.output;
  r = run_cli({"trian", "-c", "x.toml"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "paratrain: unknown command 'trian' (did you mean 'train'?)")) << r.output;
  r = run_cli({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "paratrain: unknown command 'frobnicate'; the commands are launch, train")) << r.output;
  r = run_cli({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  r = run_cli({"train", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

// Durations are checked as typed: nan was reported as "-0.001 s", and a
// negative --rdzv-timeout passed outside --nnodes MIN:MAX.
TEST(CliInput, LaunchDurationsAreCheckedAsTyped) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--monitor-interval", "nan"}, "--monitor-interval nan s must be > 0"},
      {{"--rdzv-timeout", "-5"}, "--rdzv-timeout -5 s must be > 0"},
      {{"--kill-grace", "1e300"}, "--kill-grace 1e+300 s must be >= 0 and at most 604800"},
      {{"--rdzv-last-call", "inf"}, "--rdzv-last-call inf s must be >= 0"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args{"launch"};
    args.insert(args.end(), flags.begin(), flags.end());
    args.insert(args.end(), {"--", "true"});
    const auto r = run_cli(args);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "paratrain: configuration error: paratrain launch: " + message)) << r.output;
  }
}

// `paratrain launch --backend` reaches the workers as PARATRAIN_BACKEND; a
// bad value names the variable, not a --set the user never typed.
TEST(CliInput, ABadBackendFromTheEnvironmentNamesTheVariable) {
  const auto dir = paratrain::testing::temp_dir("cli-env-backend");
  ::setenv("PARATRAIN_BACKEND", "bogus", 1);
  const auto r = run_cli({"train", "--config", long_job(dir)});
  ::unsetenv("PARATRAIN_BACKEND");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "environment variable PARATRAIN_BACKEND='bogus' (which `paratrain launch "
                                 "--backend` sets): world.backend = \"bogus\" is not allowed")) << r.output;
  EXPECT_FALSE(contains(r.output, "--set world.backend")) << r.output;
}

TEST(CliInput, RunsOfAMissingFolderFailsNamingIt) {
  auto r = run_cli({"runs", "/nonexistent-paratrain-runs"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "paratrain runs: '/nonexistent-paratrain-runs' does not exist")) << r.output;
  r = run_cli({"runs", "/dev/null"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "'/dev/null' is not a folder")) << r.output;
  const auto empty = paratrain::testing::temp_dir("cli-runs-empty");
  r = run_cli({"runs", empty});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "no runs")) << r.output;
}

TEST(CliInput, RunNameWithANewlineIsRefused) {
  const auto dir = paratrain::testing::temp_dir("cli-name-nl");
  const auto r = run_cli({"train", "--config", long_job(dir), "--set", "run.name=a\nb"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "is not allowed: must be one folder name without control characters")) << r.output;
  EXPECT_FALSE(fs::exists(dir + "/runs/a\nb")) << r.output;
}

TEST(CliInput, ADataDirThatIsAFileSaysSo) {
  const auto dir = paratrain::testing::temp_dir("cli-datadir-file");
  std::ofstream(dir + "/file") << "x";
  const auto r = run_cli({"train", "--config", long_job(dir), "--set", "data.dataset=fashion_mnist", "--set",
                          "data.dir=" + dir + "/file"});
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "Fashion-MNIST directory " + dir + "/file is not a directory")) << r.output;
}

// Note [Bytes after the gzip stream] in data/idx.cpp: zlib alone reads
// past junk after the stream as if the file ended there.
TEST(CliInput, BytesAfterTheGzipStreamOfADatasetFileAreRefused) {
  const auto dir = paratrain::testing::temp_dir("idx-junk");
  const std::string path = dir + "/labels-idx1-ubyte.gz";
  const unsigned char idx[] = {0, 0, 8, 1, 0, 0, 0, 3, 1, 2, 3};  // uint8, rank 1, 3 labels
  auto write_gz = [&](const std::string& tail) {
    gzFile f = gzopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, idx, sizeof idx), static_cast<int>(sizeof idx));
    gzclose(f);
    std::ofstream(path, std::ios::app | std::ios::binary) << tail;
  };
  write_gz("");
  EXPECT_EQ(paratrain::data::read_idx(path).numel(), 3);
  for (const std::string junk : {std::string("garbage after the stream"), std::string("\x1f"),
                                 std::string("\x1f\x8b\x08 half a member")}) {
    write_gz(junk);
    try {
      paratrain::data::read_idx(path);
      ADD_FAILURE() << "junk accepted: " << junk;
    } catch (const paratrain::DataError& e) {
      // zlib itself reports a broken second member; the check here the rest.
      const bool member = junk[0] == '\x1f' && junk.size() > 1;
      EXPECT_TRUE(contains(e.what(), "IDX file " + path + (member ? " has " : " has bytes after its gzip stream (from byte ")))
          << e.what();
    }
  }
}

// PARATRAIN_PARSE_ONLY=1 (apps/paratrain/commands.h), which
// tests/docs/doc_commands_test.py runs every documented command under:
// the config is loaded and validated, nothing runs and nothing is written.
TEST(CliInput, ParseOnlyValidatesWithoutRunning) {
  const auto dir = paratrain::testing::temp_dir("cli-parse-only");
  ::setenv("PARATRAIN_PARSE_ONLY", "1", 1);
  const auto ok = run_cli({"train", "--config", long_job(dir)});
  const auto bad = run_cli({"train", "--config", long_job(dir), "--set", "optimizer.lr=-1"});
  const auto worker = run_cli({"launch", "--nproc-per-node", "2", "--", "false"});  // `false` would fail
  const auto flags = run_cli({"launch", "--kill-grace", "-1", "--", "true"});
  const auto other = run_cli({"checkpoint", "inspect", dir + "/no-such-checkpoint"});
  ::unsetenv("PARATRAIN_PARSE_ONLY");
  EXPECT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_FALSE(fs::exists(dir + "/runs")) << ok.output;
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "optimizer.lr = -1")) << bad.output;
  EXPECT_EQ(worker.exit_code, 0) << worker.output;
  EXPECT_EQ(flags.exit_code, 2) << flags.output;
  EXPECT_EQ(other.exit_code, 0) << other.output;  // CLI11 parsing only: the path is not read
}

}  // namespace
