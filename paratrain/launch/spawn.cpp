// Worker process creation and process-group signalling (see spawn.h).
#include "paratrain/launch/spawn.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::launch {
namespace {

// Note [Spawning a worker]
// After fork() in a process with threads, the child owns one thread and
// whatever locks the others held (malloc's, the loader's): it may only make
// async-signal-safe calls until execve. So every string, array and signal set
// is built before the fork, and the child does syscalls only. We use _Fork()
// where glibc has it: it also skips pthread_atfork handlers (OpenBLAS and
// OpenMP register some) that would run library code in the parent and child.
// fork rather than posix_spawn because only code in the child can ask for
// PR_SET_PDEATHSIG, which stops a worker whose launcher was SIGKILLed.
// Errors from execve come back through a close-on-exec pipe: EOF means the
// exec worked, 4 bytes are its errno.
pid_t fork_without_handlers() {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  return _Fork();
#else
  return fork();
#endif
}

std::vector<char*> c_strings(const std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (const auto& s : v) out.push_back(const_cast<char*>(s.c_str()));
  out.push_back(nullptr);
  return out;
}

[[noreturn]] void child_fail(int report_fd, int err) {
  [[maybe_unused]] ssize_t n = write(report_fd, &err, sizeof err);
  _exit(127);
}

// Field 3 (state) and 5 (pgrp) of /proc/<pid>/stat; false if gone.
bool read_stat(const char* pid, char* state, long* pgrp) {
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%s/stat", pid);
  FILE* f = std::fopen(path, "re");
  if (f == nullptr) return false;
  char buf[512];
  const size_t n = std::fread(buf, 1, sizeof buf - 1, f);
  std::fclose(f);
  buf[n] = '\0';
  // The command name (field 2) may hold spaces and ')': skip to the last ')'.
  const char* close_paren = std::strrchr(buf, ')');
  if (close_paren == nullptr) return false;
  int ppid = 0;
  return std::sscanf(close_paren + 1, " %c %d %ld", state, &ppid, pgrp) == 3;
}

}  // namespace

pid_t spawn_in_new_group(const SpawnSpec& spec) {
  std::vector<char*> argv = c_strings(spec.argv);
  std::vector<char*> envp = c_strings(spec.env);
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) throw Error(fmt::format("launcher: cannot open /dev/null: {}", std::strerror(errno)));
  int report[2];
  if (pipe2(report, O_CLOEXEC) != 0) {
    close(null_fd);
    throw Error(fmt::format("launcher: pipe failed: {}", std::strerror(errno)));
  }
  sigset_t empty;
  sigemptyset(&empty);
  struct sigaction dfl {}, ign {};
  dfl.sa_handler = SIG_DFL;
  ign.sa_handler = SIG_IGN;
  // The dispositions the launcher changes (signal_capture.h); exec resets handlers.
  static constexpr int kReset[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE, SIGCHLD};
  const pid_t parent = getpid();

  const pid_t pid = fork_without_handlers();
  if (pid == 0) {
    // Child: async-signal-safe calls only, until execve.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the launcher died before prctl
    for (int sig : kReset) {
      bool ignore = false;
      for (int s : spec.ignored_signals) ignore = ignore || s == sig;
      sigaction(sig, ignore ? &ign : &dfl, nullptr);
    }
    sigprocmask(SIG_SETMASK, &empty, nullptr);
    if (dup2(null_fd, 0) < 0 || dup2(spec.stdout_fd, 1) < 0 || dup2(spec.stderr_fd, 2) < 0) {
      child_fail(report[1], errno);
    }
    execve(spec.path.c_str(), argv.data(), envp.data());
    child_fail(report[1], errno);
  }
  const int fork_errno = errno;
  close(report[1]);
  close(null_fd);
  if (pid < 0) {
    close(report[0]);
    throw Error(fmt::format("launcher: fork failed: {} (too many processes?)", std::strerror(fork_errno)));
  }
  // Also set the group from here: a signal sent right after we return must
  // reach the new group even if the child has not run setpgid yet.
  setpgid(pid, pid);

  int child_errno = 0;
  ssize_t n;
  do {
    n = read(report[0], &child_errno, sizeof child_errno);
  } while (n < 0 && errno == EINTR);
  close(report[0]);
  if (n > 0) {
    waitpid(pid, nullptr, 0);  // it exited with 127 right after writing
    std::string hint;
    if (child_errno == ENOEXEC) hint = " (a script needs a #! line)";
    throw Error(fmt::format("launcher: cannot execute '{}': {}{}", spec.path,
                            std::strerror(child_errno), hint));
  }
  return pid;
}

void signal_group(pid_t pgid, int sig) {
  if (pgid > 0) kill(-pgid, sig);  // ESRCH: already gone, nothing to do
}

bool group_has_live_members(pid_t pgid) {
  if (pgid <= 0) return false;
  if (kill(-pgid, 0) != 0 && errno == ESRCH) return false;
  // Something is in the group; maybe only zombies. Ask /proc.
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return true;  // cannot tell: assume alive
  bool alive = false;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    char state = 0;
    long pgrp = 0;
    if (read_stat(e->d_name, &state, &pgrp) && pgrp == pgid && state != 'Z' && state != 'X') {
      alive = true;
      break;
    }
  }
  closedir(dir);
  return alive;
}

std::string signal_name(int sig) {
  if (const char* abbrev = sigabbrev_np(sig)) return std::string("SIG") + abbrev;
  return fmt::format("signal {}", sig);
}

}  // namespace paratrain::launch
