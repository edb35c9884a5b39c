// A child process for the tests that signal one (a CLI run stopped by
// SIGTERM, a launcher interrupted): started with its output in a log file,
// waited on with bounds, so a hung child fails the test instead of hanging it.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace paratrain::testing {

// Starts `args` (args[0]: the program's path) with stdout and stderr in
// `log`. SIGINT and SIGTERM start at their default action: a test run in
// the background inherits SIGINT ignored, while a user's Ctrl-C reaches the
// program with the default. `extra_env` ("NAME=value") is added to this
// process's environment. Returns the pid, or -1 when the start failed.
pid_t spawn_logged(const std::vector<std::string>& args, const std::string& log,
                   const std::vector<std::string>& extra_env = {});

// Polls `ready` every 20 ms: true once it holds; false when `pid` exited
// first or `timeout` passed.
bool wait_until(pid_t pid, const std::function<bool()>& ready, std::chrono::milliseconds timeout);

// The wait status of `pid` once it exits; after `timeout` it is SIGKILLed,
// reaped, and the result is empty.
std::optional<int> wait_exit(pid_t pid, std::chrono::milliseconds timeout);

// The whole text of `path` (a child's log); "" when it cannot be read.
std::string read_file(const std::string& path);

// `command` run by /bin/sh (bound it with `timeout N` inside): its wait
// status and what it wrote to stdout (add 2>&1 for stderr too). A status
// of -1: it could not be started.
struct ShellRun {
  int status = -1;
  std::string output;
};
ShellRun run_shell(const std::string& command);

}  // namespace paratrain::testing
