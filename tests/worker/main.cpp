// paratrain_test_worker: a program the process-level tests start as a worker
// (directly or through `paratrain launch`), so exit codes, signals, hangs and
// output are real processes doing real things. Not a test itself.
//
// Usage: paratrain_test_worker STEP [STEP ...]; steps run left to right:
//   exit <code>              exit now with <code>
//   sleep <seconds>          sleep (fractions allowed)
//   print <n>                n lines "out <rank> <i>" on stdout and "err <rank> <i>" on stderr
//   partial <text>           write <text> to stdout with no newline (flushed)
//   env                      print KEY=VALUE for each launcher variable (<unset> if absent)
//   ignore-term              ignore SIGTERM from now on
//   kill-self <signal>       raise <signal> (a number) with its default action
//   pidfile <path>           append "<pid>\n" to <path>
//   grandchild <path>        start a child that ignores SIGTERM and sleeps an hour,
//                            append its pid to <path>, and go on
//   wait-lines <path> <n>    wait until <path> has >= n lines (exit 98 after 30 s)
//   on-rank <r> STEP         run the next step only if RANK == r, else skip it
//   fail-rank <r> <code>     same as: on-rank <r> exit <code>
//   rendezvous <seconds>     meet the other ranks as `paratrain train` does
//                            (world_from_env, init_process_group over Gloo with
//                            that timeout); on an error print it on stderr
//                            and exit 1
//   die-after-check-in <seconds>
//                            the same, but SIGKILL itself once every rank
//                            checked in, before any group is built
//   elastic-rendezvous <seconds>
//                            the same as elastic.in_job does
//                            (init_elastic_process_group): a rank that died
//                            at start-up is left out
// RANK is read from the environment (0 when unset). Bad usage exits 64.
// To add a mode, add a row to steps() below.
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/comm/rendezvous.h"

namespace {

using Args = std::vector<std::string>;

struct Step {
  int nargs;
  std::function<void(const Args&)> run;
};

int rank() {
  const char* r = std::getenv("RANK");
  return r != nullptr ? std::atoi(r) : 0;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "paratrain_test_worker: %s (see tests/worker/main.cpp for the steps)\n", why.c_str());
  std::exit(64);
}

void sleep_seconds(double s) {
  timespec left{static_cast<time_t>(s), static_cast<long>((s - static_cast<double>(static_cast<time_t>(s))) * 1e9)};
  while (nanosleep(&left, &left) != 0) {
  }
}

void append_line(const std::string& path, const std::string& line) {
  // One write with O_APPEND: lines of concurrent writers never mix.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) usage("cannot open " + path);
  const std::string data = line + "\n";
  if (write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size())) usage("short write to " + path);
  close(fd);
}

int count_lines(const std::string& path) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

void start_grandchild(const std::string& pidfile) {
  const pid_t pid = fork();
  if (pid == 0) {
    // Stays in the worker's process group; ignoring SIGTERM survives exec, so
    // only the launcher's SIGKILL escalation can end it.
    signal(SIGTERM, SIG_IGN);
    execl("/bin/sleep", "sleep", "3600", static_cast<char*>(nullptr));
    _exit(127);
  }
  if (pid < 0) usage("fork failed");
  append_line(pidfile, std::to_string(pid));
}


void rendezvous(const std::string& seconds, bool die_after_check_in, bool elastic = false) {
  try {
    paratrain::comm::InitOptions init;
    init.timeout = std::chrono::milliseconds(static_cast<long>(std::atof(seconds.c_str()) * 1000));
    if (die_after_check_in)
      init.after_check_in = [] {
        std::fflush(nullptr);
        raise(SIGKILL);
      };
    auto world = elastic ? paratrain::comm::init_elastic_process_group(paratrain::comm::world_from_env(), init,
                                                                       std::chrono::seconds(5))
                               .group
                         : paratrain::comm::init_process_group(paratrain::comm::world_from_env(), init);
    // Every rank has finished connecting before any leaves (a rank that
    // exits at once could close a connection a slower peer still sets up).
    world->barrier()->wait();
    std::printf("rendezvous done: rank %d of %d\n", world->rank(), world->size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::fflush(nullptr);
    std::exit(1);
  }
}

const std::map<std::string, Step>& steps() {
  static const std::map<std::string, Step> table = {
      {"exit", {1, [](const Args& a) {
         std::fflush(nullptr);
         std::exit(std::atoi(a[0].c_str()));
       }}},
      {"fail-rank", {2, [](const Args& a) {
         if (std::atoi(a[0].c_str()) != rank()) return;
         std::fflush(nullptr);
         std::exit(std::atoi(a[1].c_str()));
       }}},
      {"sleep", {1, [](const Args& a) { sleep_seconds(std::atof(a[0].c_str())); }}},
      {"print", {1, [](const Args& a) {
         const int n = std::atoi(a[0].c_str());
         for (int i = 0; i < n; ++i) {
           std::printf("out %d %d\n", rank(), i);
           std::fprintf(stderr, "err %d %d\n", rank(), i);
         }
         std::fflush(nullptr);
       }}},
      {"partial", {1, [](const Args& a) {
         std::fputs(a[0].c_str(), stdout);
         std::fflush(stdout);
       }}},
      {"env", {0, [](const Args&) {
         for (const char* key : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                 "GROUP_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                                 "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TORCHELASTIC_RESTART_COUNT",
                                 "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID"}) {
           const char* v = std::getenv(key);
           std::printf("%s=%s\n", key, v != nullptr ? v : "<unset>");
         }
         std::fflush(stdout);
       }}},
      {"ignore-term", {0, [](const Args&) { signal(SIGTERM, SIG_IGN); }}},
      {"kill-self", {1, [](const Args& a) {
         const int sig = std::atoi(a[0].c_str());
         std::fflush(nullptr);
         signal(sig, SIG_DFL);
         raise(sig);
       }}},
      {"rendezvous", {1, [](const Args& a) { rendezvous(a[0], false); }}},
      {"die-after-check-in", {1, [](const Args& a) { rendezvous(a[0], true); }}},
      {"elastic-rendezvous", {1, [](const Args& a) { rendezvous(a[0], false, true); }}},
      {"pidfile", {1, [](const Args& a) { append_line(a[0], std::to_string(getpid())); }}},
      {"grandchild", {1, [](const Args& a) { start_grandchild(a[0]); }}},
      {"wait-lines", {2, [](const Args& a) {
         const int want = std::atoi(a[1].c_str());
         const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
         while (count_lines(a[0]) < want) {
           if (std::chrono::steady_clock::now() > deadline) std::exit(98);
           std::this_thread::sleep_for(std::chrono::milliseconds(10));
         }
       }}},
  };
  return table;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args(argv + 1, argv + argc);
  if (args.empty()) usage("no steps given");
  bool skip_next = false;  // set by "on-rank r" on the other ranks
  for (std::size_t i = 0; i < args.size();) {
    const std::string& name = args[i];
    if (name == "on-rank") {
      if (i + 2 > args.size()) usage("on-rank needs a rank and a step");
      skip_next = std::atoi(args[i + 1].c_str()) != rank();
      i += 2;
      continue;
    }
    const auto it = steps().find(name);
    if (it == steps().end()) usage("unknown step '" + name + "'");
    const auto nargs = static_cast<std::size_t>(it->second.nargs);
    if (i + 1 + nargs > args.size()) {
      usage("step '" + name + "' needs " + std::to_string(nargs) + " argument(s)");
    }
    const auto first = args.begin() + static_cast<long>(i) + 1;
    if (!skip_next) it->second.run(Args(first, first + static_cast<long>(nargs)));
    skip_next = false;
    i += 1 + nargs;
  }
  std::fflush(nullptr);
  return 0;
}
