// Launcher pieces that need no worker processes: option validation, the
// worker environment, program lookup, free-port selection, line prefixing
// and the summary wording.
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <functional>
#include <thread>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "paratrain/core/error.h"
#include "paratrain/launch/free_port.h"
#include "paratrain/launch/launcher.h"
#include "paratrain/launch/line_prefixer.h"
#include "paratrain/launch/report.h"
#include "paratrain/launch/worker_env.h"
#include "launch_test_util.h"
#include "tests/support/multi_rank.h"

namespace paratrain::launch {
namespace {

LaunchOptions valid() {
  LaunchOptions o;
  o.nproc_per_node = 2;
  o.command = {"/bin/true"};
  return o;
}

// The ConfigError message validate() throws, or "" when it accepts.
std::string rejection(const LaunchOptions& o) {
  try {
    validate(o);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchValidate, AcceptsSingleAndMultiNodeSetups) {
  EXPECT_EQ(rejection(valid()), "");
  LaunchOptions multi = valid();
  multi.nnodes = 3;
  multi.node_rank = 2;
  multi.master_addr = "10.0.0.1";
  multi.master_port = 29500;
  EXPECT_EQ(rejection(multi), "");
}

TEST(LaunchValidate, BackendMpiPointsToMpirunAndShmNeedsOneHost) {
  LaunchOptions o = valid();
  for (const char* ok : {"", "gloo", "shm", "nccl", "auto"}) {
    o.backend = ok;
    EXPECT_EQ(rejection(o), "") << ok;
  }
  o.backend = "mpi";
  EXPECT_NE(rejection(o).find("mpirun -np"), std::string::npos) << rejection(o);
  o.backend = "ncl";
  EXPECT_NE(rejection(o).find("--backend 'ncl' is not a backend"), std::string::npos) << rejection(o);
  o.backend = "shm";
  o.nnodes = 2;
  o.master_addr = "10.0.0.1";
  o.master_port = 29500;
  EXPECT_NE(rejection(o).find("--backend shm needs every rank on one host"), std::string::npos) << rejection(o);
}

TEST(WorkerEnvironment, BackendReachesTheWorkersOnlyWhenGiven) {
  LaunchOptions o = valid();
  o.master_addr = "127.0.0.1";
  o.master_port = 1234;
  const char* base[] = {nullptr};
  auto has = [&](const LaunchOptions& opts, const std::string& entry) {
    const auto env = worker_environment(opts, 0, base);
    return std::count(env.begin(), env.end(), entry) == 1;
  };
  EXPECT_FALSE(has(o, "PARATRAIN_BACKEND="));
  for (const auto& entry : worker_environment(o, 0, base)) EXPECT_EQ(entry.rfind("PARATRAIN_BACKEND", 0), std::string::npos);
  o.backend = "shm";
  EXPECT_TRUE(has(o, "PARATRAIN_BACKEND=shm"));
}

TEST(LaunchValidate, MessagesNameTheFlagsAndEveryValue) {
  struct Case {
    std::function<void(LaunchOptions&)> edit;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {[](auto& o) { o.nproc_per_node = 0; }, "--nproc-per-node 0 must be >= 1"},
      {[](auto& o) { o.nnodes = -1; }, "--nnodes -1 must be >= 1"},
      {[](auto& o) { o.nnodes = 2, o.node_rank = 2, o.master_addr = "h", o.master_port = 1; },
       "--node-rank 2 must be >= 0 and < --nnodes 2"},
      {[](auto& o) { o.node_rank = -1; }, "--node-rank -1 must be >= 0 and < --nnodes 1"},
      {[](auto& o) { o.master_port = 70000; }, "--master-port 70000 must be in 1..65535"},
      {[](auto& o) { o.nnodes = 2, o.master_addr = "h"; }, "--nnodes 2 needs --master-port"},
      {[](auto& o) { o.nnodes = 2, o.master_port = 29500; }, "--nnodes 2 needs --master-addr"},
      {[](auto& o) { o.kill_grace = std::chrono::milliseconds(-1500); }, "--kill-grace -1.5 s must be >= 0"},
      {[](auto& o) { o.command.clear(); }, "no program to launch: put it after `--`"},
      {[](auto& o) { o.nproc_per_node = 1 << 20, o.nnodes = 1 << 12, o.master_addr = "h", o.master_port = 1; },
       "--nproc-per-node 1048576 * --nnodes 4096 ranks is too many"},
  };
  for (const auto& c : cases) {
    LaunchOptions o = valid();
    c.edit(o);
    EXPECT_NE(rejection(o).find(c.expected), std::string::npos)
        << "expected '" << c.expected << "' in '" << rejection(o) << "'";
  }
}

// Note [Local rank limits] in launcher.cpp: refused before any fork, naming the limit.
TEST(LaunchValidate, RanksBeyondWhatTheMachineHoldsAreRefusedUpFront) {
  LaunchOptions huge = valid();
  huge.nproc_per_node = 100000000;
  const auto msg = rejection(huge);
  EXPECT_NE(msg.find("--nproc-per-node 100000000 is more than the 4096"), std::string::npos) << msg;

  // Lower this process's open-file limit for the check, then restore it.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = 128;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  LaunchOptions many = valid();
  many.nproc_per_node = 100;  // 2 pipes each + 64 > 128
  const auto files = rejection(many);
  many.prefix_output = false;  // no pipes: only the process limits apply
  const auto unprefixed = rejection(many);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &saved), 0);
  EXPECT_NE(files.find("--nproc-per-node 100 needs about 264 open files"), std::string::npos) << files;
  EXPECT_NE(files.find("may open 128 (RLIMIT_NOFILE, `ulimit -n`)"), std::string::npos) << files;
  EXPECT_EQ(unprefixed, "");
}

TEST(WorkerEnvironment, SetsTorchrunVariablesAndKeepsTheRest) {
  LaunchOptions o = valid();
  o.nproc_per_node = 4;
  o.nnodes = 3;
  o.node_rank = 2;
  o.master_addr = "node0.cluster";
  o.master_port = 29511;
  o.restart_count = 2;
  o.max_restarts = 3;
  o.rdzv_id = "job7";
  o.launch_id = "job7";
  const char* base[] = {"PATH=/bin", "RANK=99", "FOO=a=b", "OMP_NUM_THREADS=8", "TORCHELASTIC_USE_AGENT_STORE=True",
                        nullptr};
  const auto env = worker_environment(o, 1, base);
  auto count = [&](const std::string& entry) { return std::count(env.begin(), env.end(), entry); };
  for (const char* expected :
       {"PATH=/bin", "FOO=a=b", "RANK=9", "WORLD_SIZE=12", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
        "GROUP_RANK=2", "GROUP_WORLD_SIZE=3", "NODE_RANK=2", "MASTER_ADDR=node0.cluster",
        "MASTER_PORT=29511", "OMP_NUM_THREADS=8", "OPENBLAS_NUM_THREADS=1", "TORCHELASTIC_RESTART_COUNT=2",
        "TORCHELASTIC_MAX_RESTARTS=3", "TORCHELASTIC_RUN_ID=job7", "PARATRAIN_LAUNCH_ID=job7"}) {
    EXPECT_EQ(count(expected), 1) << expected;
  }
  // The launcher names itself: its repeats of a preemption signal are copies.
  EXPECT_EQ(count("PARATRAIN_LAUNCHER_PID=" + std::to_string(getpid())), 1);
  EXPECT_EQ(count("RANK=99"), 0);
  // Our rank 0 serves the store: an outer torchrun's agent-store flag must not reach the workers.
  EXPECT_EQ(count("TORCHELASTIC_USE_AGENT_STORE=True"), 0);
  EXPECT_EQ(env.size(), 18u);
}

TEST(WorkerEnvironment, PassesTheJobTokenInPlaceOfAnInheritedOne) {
  LaunchOptions o = valid();
  o.master_addr = "127.0.0.1";
  o.master_port = 1234;
  const char* base[] = {"PARATRAIN_JOB_TOKEN=inherited", nullptr};
  o.job_token = "the-job-secret";
  auto env = worker_environment(o, 0, base);
  EXPECT_EQ(std::count(env.begin(), env.end(), "PARATRAIN_JOB_TOKEN=the-job-secret"), 1);
  EXPECT_EQ(std::count(env.begin(), env.end(), "PARATRAIN_JOB_TOKEN=inherited"), 0);
  // Control: without a token set on the options the environment's is kept as is.
  o.job_token.clear();
  env = worker_environment(o, 0, base);
  EXPECT_EQ(std::count(env.begin(), env.end(), "PARATRAIN_JOB_TOKEN=inherited"), 1);
}

TEST(WorkerEnvironment, LeavesThreadCountsAloneForOneProcessPerNode) {
  LaunchOptions o = valid();
  o.nproc_per_node = 1;
  o.master_addr = "127.0.0.1";
  o.master_port = 1234;
  const char* base[] = {nullptr};
  for (const auto& entry : worker_environment(o, 0, base)) {
    EXPECT_EQ(entry.rfind("OMP_NUM_THREADS", 0), std::string::npos) << entry;
    EXPECT_EQ(entry.rfind("OPENBLAS_NUM_THREADS", 0), std::string::npos) << entry;
  }
}

TEST(ResolveProgram, SearchesPathAndExplainsFailures) {
  EXPECT_EQ(resolve_program("sh", "/nonexistent:/bin:/usr/bin"), "/bin/sh");
  EXPECT_EQ(resolve_program("/bin/sh", nullptr), "/bin/sh");

  const std::string dir = testing::temp_dir("launch-resolve");
  const std::string plain = dir + "/plain";
  std::ofstream(plain) << "#!/bin/sh\n";
  chmod(plain.c_str(), 0644);
  auto message = [](const std::string& name, const char* path) {
    try {
      resolve_program(name, path);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message("no-such-program-xyz", "/bin").find("no executable of that name on PATH"),
            std::string::npos);
  EXPECT_NE(message("no-such-program-xyz", "/bin").find("[PATH=/bin]"), std::string::npos);
  EXPECT_NE(message(plain, nullptr).find("is not executable"), std::string::npos);
  EXPECT_NE(message("plain", dir.c_str()).find("'" + plain + "' is not executable"), std::string::npos);
  EXPECT_NE(message(dir, nullptr).find("is a directory"), std::string::npos);
  EXPECT_NE(message(dir + "/missing", nullptr).find("No such file or directory"), std::string::npos);
  EXPECT_NE(message("", nullptr).find("empty"), std::string::npos);

  chmod(plain.c_str(), 0755);
  EXPECT_EQ(resolve_program("plain", (std::string("/nonexistent:") + dir).c_str()), dir + "/plain");
}

TEST(FreePort, ReturnsAPortThatCanBeBoundAndListenedOn) {
  for (int attempt = 0; attempt < 3; ++attempt) {
    const int port = find_free_port();
    ASSERT_GT(port, 0);
    ASSERT_LE(port, 65535);
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << "port " << port;
    EXPECT_EQ(listen(fd, 1), 0);
    close(fd);
  }
}

// Feeds chunks through a LinePrefixer writing into a pipe; returns what came out.
std::string prefixed(const std::vector<std::string>& chunks, bool finish, bool terminal = false) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  {
    LinePrefixer p("[3]: ", fds[1], terminal);
    for (const auto& c : chunks) p.feed(c);
    if (finish) p.finish();
  }
  close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  return out;
}

TEST(LinePrefixer, JoinsChunksIntoWholePrefixedLines) {
  EXPECT_EQ(prefixed({"ab", "c\nde\n", "\n", "f"}, false), "[3]: abc\n[3]: de\n[3]: \n");
  EXPECT_EQ(prefixed({"ab", "c\nde\n", "\n", "f"}, true), "[3]: abc\n[3]: de\n[3]: \n[3]: f\n");
  EXPECT_EQ(prefixed({""}, true), "");
}

// On a terminal a worker's progress bar ("\r\x1b[K" + text, no newline) is
// drawn with the prefix as it comes, redrawn in place, and each line clears
// whatever bar is on screen first; ordinary lines are unchanged otherwise.
TEST(LinePrefixer, DrawsAWorkersStatusLineOnATerminal) {
  const std::string clear = "\r\x1b[K";
  EXPECT_EQ(prefixed({"a\n"}, false, true), clear + "[3]: a\n");
  // Bar 1 drawn; bar 2 arrives in two chunks (drawn at each); a log line
  // clears the bar; the bar is redrawn; the epoch's end leaves it on screen.
  EXPECT_EQ(prefixed({clear + "bar 1", clear + "ba", "r 2", clear + "log\n" + clear + "bar 3", "\n"}, true, true),
            clear + "[3]: bar 1" + clear + "[3]: ba" + clear + "[3]: bar 2" + clear + "[3]: log\n" + clear +
                "[3]: bar 3" + clear + "[3]: bar 3\n");
  // Not a terminal: bytes pass through line by line as before.
  EXPECT_EQ(prefixed({"x\ry\n"}, false, false), "[3]: x\ry\n");
}

TEST(LinePrefixer, SplitsARunawayLineIntoBoundedPieces) {
  const std::size_t n = 2 * LinePrefixer::kMaxLine + 100;
  // Written from a thread-free loop: the pipe must hold it all, so read concurrently.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  std::string out;
  std::thread reader([&] {
    char buf[65536];
    for (ssize_t r; (r = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, static_cast<size_t>(r));
  });
  {
    LinePrefixer p("[0]: ", fds[1]);
    p.feed(std::string(n, 'x'));
    p.finish();
  }
  close(fds[1]);
  reader.join();
  close(fds[0]);
  const auto lines = test::lines_of(out);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "[0]: " + std::string(LinePrefixer::kMaxLine, 'x'));
  EXPECT_EQ(lines[1], "[0]: " + std::string(LinePrefixer::kMaxLine, 'x'));
  EXPECT_EQ(lines[2], "[0]: " + std::string(100, 'x'));
}

TEST(LinePrefixer, SurvivesAReaderThatWentAway) {
  struct sigaction ign {}, old {};
  ign.sa_handler = SIG_IGN;
  sigaction(SIGPIPE, &ign, &old);  // as the launcher does while it runs
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  close(fds[0]);
  LinePrefixer p("[0]: ", fds[1]);
  p.feed("one\ntwo\n");
  p.feed("three\n");
  p.finish();
  close(fds[1]);
  sigaction(SIGPIPE, &old, nullptr);
  EXPECT_FALSE(write_all(-1, "x"));
}

TEST(LaunchReportWords, RankListsAreCompact) {
  EXPECT_EQ(rank_list({}), "none");
  EXPECT_EQ(rank_list({3}), "rank 3");
  EXPECT_EQ(rank_list({0, 1, 2, 5, 7, 8}), "ranks 0-2, 5, 7-8");
  EXPECT_EQ(rank_list({0, 2, 4, 6, 8, 10, 12, 14, 16, 18}), "ranks 0, 2, 4, 6, 8, 10, 12, 14 ... and 2 more");
}

TEST(LaunchReportWords, SummaryNamesTheCauseAndNeverReportsZeroOnFailure) {
  LaunchReport r;
  r.workers.resize(3);
  for (int i = 0; i < 3; ++i) {
    r.workers[i].rank = 4 + i;
    r.workers[i].local_rank = i;
    r.workers[i].pid = 100 + i;
    r.workers[i].exited = true;
  }
  EXPECT_EQ(summarize(r), "paratrain launch: all 3 ranks succeeded (ranks 4-6)");
  EXPECT_EQ(r.exit_code, 0);

  r.workers[1].exit_code = 3;
  r.first_failed = 1;
  r.workers[2].exited = false;
  r.workers[2].signal = SIGTERM;
  r.workers[2].stopped_by_launcher = true;
  EXPECT_EQ(summarize(r),
            "paratrain launch: FAILED with exit code 3: rank 5 (pid 101) exited with code 3 first; "
            "stopped by the launcher: rank 6 (pid 102) was killed by SIGTERM; succeeded: rank 4");
  EXPECT_EQ(r.exit_code, 3);

  r.workers[1].exited = false;
  r.workers[1].signal = SIGSEGV;
  summarize(r);
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV);

  r.received_signal = SIGINT;
  r.first_failed = -1;
  EXPECT_NE(summarize(r).find("interrupted by SIGINT"), std::string::npos);
  EXPECT_EQ(r.exit_code, 130);
}

// Note [Naming the first failure] in supervisor.cpp.
TEST(LaunchReportWords, TheNamedFailureIsTheEarliestThatFailedOnItsOwn) {
  using Clock = std::chrono::steady_clock;
  const auto t0 = Clock::time_point{} + std::chrono::seconds(100);
  std::vector<WorkerOutcome> w(4);
  for (int i = 0; i < 4; ++i) {
    w[i].rank = w[i].local_rank = i;
    w[i].exited = true;
    w[i].ended_at = t0;
  }
  EXPECT_EQ(pick_first_failure(w), -1);  // all succeeded

  // Two failures on their own: the earlier one, whatever its rank.
  w[1].exit_code = 2;
  w[1].ended_at = t0 + std::chrono::milliseconds(50);
  w[3].exit_code = 4;
  EXPECT_EQ(pick_first_failure(w), 3);
  // Seen in the same sweep: the lower local rank.
  w[1].ended_at = t0;
  EXPECT_EQ(pick_first_failure(w), 1);

  // An earlier exit that blames a peer loses to a later one that does not.
  w = std::vector<WorkerOutcome>(w.begin(), w.begin() + 2);
  w[0].exit_code = 1;
  w[0].peer_error = true;
  w[1].exit_code = 3;
  w[1].ended_at = t0 + std::chrono::milliseconds(50);
  w[1].stopped_by_launcher = true;  // reaped after the stop, but it exited with its own code
  EXPECT_EQ(pick_first_failure(w), 1);

  // A crash (signal nobody sent) beats a non-zero exit after our SIGTERM, and
  // a rank killed by our own SIGTERM is never preferred.
  w[0] = WorkerOutcome{.rank = 0, .local_rank = 0, .exited = false, .signal = SIGSEGV, .ended_at = t0 + std::chrono::seconds(1)};
  EXPECT_EQ(pick_first_failure(w), 0);
  w[0].stopped_by_launcher = true;
  w[0].signal = SIGTERM;
  w[0].ended_at = t0;
  EXPECT_EQ(pick_first_failure(w), 1);

  EXPECT_TRUE(mentions_lost_peer("...\nRuntimeError: Connection reset by peer\n"));
  EXPECT_TRUE(mentions_lost_peer("gloo: Connection closed by peer [127.0.0.1]:1234"));
  EXPECT_FALSE(mentions_lost_peer("loss is nan at step 3"));
}

}  // namespace
}  // namespace paratrain::launch

namespace paratrain::launch {
namespace {

TEST(ElasticFlags, NnodesTakesACountOrARangeAsTorchrunDoes) {
  EXPECT_EQ(parse_nnodes("2"), std::make_pair(2, 2));
  EXPECT_EQ(parse_nnodes("1:4"), std::make_pair(1, 4));
  for (const char* bad : {"", "0", "2:1", "a:b", "1:", ":2", "-1", "1:2:3", "99999999999"}) {
    try {
      parse_nnodes(bad);
      ADD_FAILURE() << "accepted --nnodes '" << bad << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--nnodes '") + bad + "'"), std::string::npos) << e.what();
    }
  }
}

TEST(ElasticFlags, RdzvEndpointIsHostWithAnOptionalPort) {
  EXPECT_EQ(parse_endpoint("node0:29500"), std::make_pair(std::string("node0"), 29500));
  EXPECT_EQ(parse_endpoint("node0"), std::make_pair(std::string("node0"), 29400));  // torchrun's default
  EXPECT_EQ(parse_endpoint("[fe80::1]:7"), std::make_pair(std::string("fe80::1"), 7));
  EXPECT_EQ(parse_endpoint("[::1]"), std::make_pair(std::string("::1"), 29400));
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"", "the host is empty"},           {":29400", "the host is empty"},
      {"h:", "the port after ':' is missing"}, {"h:70000", "port '70000' is not a number in 1..65535"},
      {"h:x", "port 'x' is not a number"}, {"fe80::1:29400", "needs brackets"},
      {"[::1", "needs its ']'"},
  };
  for (const auto& [text, why] : bad) {
    try {
      parse_endpoint(text);
      ADD_FAILURE() << "accepted --rdzv-endpoint '" << text << "'";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(ElasticFlags, ValidateNamesBadRestartAndRangeValues) {
  auto rejection = [](const LaunchOptions& o) -> std::string {
    try {
      validate(o);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "";
  };
  LaunchOptions o;
  o.command = {"/bin/true"};
  EXPECT_EQ(rejection(o), "");
  LaunchOptions restarts = o;
  restarts.max_restarts = -1;
  EXPECT_NE(rejection(restarts).find("--max-restarts -1 must be >= 0"), std::string::npos);
  LaunchOptions both = o;
  both.keep_going = true;
  both.max_restarts = 2;
  EXPECT_NE(rejection(both).find("--keep-going with --max-restarts 2"), std::string::npos);
  LaunchOptions monitor = o;
  monitor.monitor_interval = std::chrono::milliseconds(0);
  EXPECT_NE(rejection(monitor).find("--monitor-interval 0 s must be > 0"), std::string::npos);
  LaunchOptions range = o;
  range.nnodes_min = 1;
  range.nnodes_max = 2;
  EXPECT_EQ(rejection(range), "");  // this node alone, said at start
  range.nnodes_min = 2;
  range.nnodes_max = 3;
  EXPECT_NE(rejection(range).find("needs a multi-agent rendezvous: give --rdzv-endpoint"), std::string::npos)
      << rejection(range);
  // With the agents' rendezvous (--rdzv-endpoint) MIN > 1 runs.
  range.multi_agent = true;
  range.master_addr = "127.0.0.1";
  range.master_port = 29400;
  EXPECT_EQ(rejection(range), "");
  range.rdzv_last_call = std::chrono::milliseconds(-1000);
  EXPECT_NE(rejection(range).find("--rdzv-last-call -1 s >= 0"), std::string::npos) << rejection(range);
  range.rdzv_last_call = std::chrono::milliseconds(0);
  range.keep_going = true;
  EXPECT_NE(rejection(range).find("--keep-going with --rdzv-endpoint"), std::string::npos) << rejection(range);
  LaunchOptions id = o;
  id.rdzv_id = "a/b";
  EXPECT_NE(rejection(id).find("--rdzv-id 'a/b' may hold only"), std::string::npos);
}

}  // namespace
}  // namespace paratrain::launch
