// Starting one worker process and signalling its process group. Each worker
// leads its own group so one killpg() reaches its children too, and the
// terminal's Ctrl-C reaches only the launcher, which decides what to forward.
// Not supervision: supervisor.h decides when to call these.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace paratrain::launch {

struct SpawnSpec {
  std::string path;               // what to exec (resolved, see resolve_program)
  std::vector<std::string> argv;  // argv[0] included
  std::vector<std::string> env;   // "KEY=VALUE"
  int stdout_fd = 1;              // become the child's fd 1 and 2
  int stderr_fd = 2;
  // Signals the child starts with ignored (SIG_IGN survives exec: a worker of
  // a launcher run under nohup keeps ignoring SIGHUP). All others: SIG_DFL.
  std::vector<int> ignored_signals;
};

// fork + exec, with only async-signal-safe calls in between (the launcher may
// have threads; see Note [Spawning a worker] in spawn.cpp). The child leads a
// new process group (pgid == pid), reads /dev/null as stdin (a background
// group reading the terminal would be stopped), starts with an empty signal
// mask, and is SIGKILLed if the launcher dies without cleaning up. Throws
// Error with the exec errno (ENOEXEC, EACCES...) if the program did not start.
pid_t spawn_in_new_group(const SpawnSpec& spec);

// kill(-pgid, sig), ignoring a group that is already gone.
void signal_group(pid_t pgid, int sig);

// Whether any process of the group still runs. Zombies do not count: an
// orphaned grandchild is reparented to PID 1, and a PID 1 that never reaps
// (as in some containers) would otherwise keep the group "alive" forever.
bool group_has_live_members(pid_t pgid);

// "SIGTERM", "SIGKILL", ... or "signal 42".
std::string signal_name(int sig);

}  // namespace paratrain::launch
