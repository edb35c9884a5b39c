// Reading a process's state letter from /proc (see process_state.h).
#include "paratrain/core/process_state.h"

#include <unistd.h>

#include <fstream>
#include <iterator>

namespace paratrain {

std::string process_state(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: read from its end.
  const auto paren = stat.rfind(')');
  if (paren == std::string::npos || paren + 2 >= stat.size()) return "gone";
  switch (stat[paren + 2]) {
    case 'T': return "stopped (SIGSTOP, or a debugger)";
    case 't': return "stopped by a debugger";
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible I/O (D)";
    case 'Z': return "a zombie (dead)";
    default: return std::string("in state ") + stat[paren + 2];
  }
}

std::string host_name() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0) return "";
  return host;
}

}  // namespace paratrain
