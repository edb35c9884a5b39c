// What /proc says about a process of this machine (why it went silent), and
// the machine's name.
// Shared by the launcher's heartbeat monitor (launch/heartbeat_monitor.h)
// and the ranks' own peer watch (comm/peer_watch.h). std + POSIX only.
#pragma once

#include <sys/types.h>

#include <string>

namespace paratrain {

/// "stopped (SIGSTOP, or a debugger)", "running", "sleeping", "gone", ...
/// from /proc/<pid>/stat. Only meaningful for a process of this machine (and
/// this pid namespace).
std::string process_state(pid_t pid);

/// This machine's name (gethostname; "" when it fails).
std::string host_name();

}  // namespace paratrain
