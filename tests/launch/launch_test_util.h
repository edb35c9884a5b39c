// Helpers for the launcher tests: run launch() with its output captured in
// files, build worker command lines, and tell whether a pid still runs.
// Test-only; the worker program is tests/worker/main.cpp.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "paratrain/launch/launcher.h"

namespace paratrain::launch::test {

struct Captured {
  LaunchReport report;
  std::string out;  // the launcher's stdout: worker stdout lines
  std::string err;  // worker stderr lines and the launcher's own messages
  double seconds = 0;
};

inline std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) lines.push_back(line);
  return lines;
}

// The config the launcher tests train, written to <dir>/<file>: a small MLP
// on synthetic 8x8 images (a fraction of a second per step) with run name
// `name`, `train_size` items and `batch` per rank, then `rest`: the test's
// own [train], [world], [elastic] sections.
inline std::string write_small_mlp_config(const std::string& dir, const std::string& file, const std::string& name,
                                          int train_size, int batch, const std::string& rest) {
  const std::string path = dir + "/" + file;
  std::ofstream(path) << "[run]\nname = \"" << name << "\"\nseed = 3\nlog_every = 1\n"
                      << "[model]\nhidden = [16]\n"
                      << "[data]\ndataset = \"synthetic\"\nsynthetic_train_size = " << train_size
                      << "\nsynthetic_test_size = 64\nsynthetic_image_size = 8\nbatch_size = " << batch << "\n"
                      << rest;
  return path;
}

// The heartbeat tests' sections for write_small_mlp_config: 12 steps, a
// heartbeat every 0.1 s and a 2 s heartbeat timeout, but a collective
// timeout of 10 minutes, so only the heartbeats can end a hang quickly.
inline constexpr const char* kHeartbeatSections = R"([train]
epochs = 3
[world]
timeout_s = 600
heartbeat_s = 0.1
heartbeat_timeout_s = 2
)";

// Runs launch_with_report with out_fd/err_fd sent to files in `dir`.
inline Captured run_captured(LaunchOptions options, const std::string& dir) {
  const std::string out_path = dir + "/launcher.out", err_path = dir + "/launcher.err";
  const int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  options.out_fd = out;
  options.err_fd = err;
  Captured c;
  const auto start = std::chrono::steady_clock::now();
  try {
    c.report = launch_with_report(options);
  } catch (...) {
    close(out);
    close(err);
    throw;
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(out);
  close(err);
  c.out = slurp(out_path);
  c.err = slurp(err_path);
  return c;
}

// {PARATRAIN_TEST_WORKER, steps...}
inline std::vector<std::string> worker(std::vector<std::string> steps) {
  steps.insert(steps.begin(), PARATRAIN_TEST_WORKER);
  return steps;
}

inline std::vector<int> read_pids(const std::string& path) {
  std::vector<int> pids;
  for (const auto& line : lines_of(slurp(path))) pids.push_back(std::atoi(line.c_str()));
  return pids;
}

// Running, sleeping or stopped: anything but gone or a zombie (a zombie has
// exited; it only waits for a parent that may never reap it).
inline bool process_alive(int pid) {
  const std::string stat = slurp("/proc/" + std::to_string(pid) + "/stat");
  const auto paren = stat.rfind(')');
  if (stat.empty() || paren == std::string::npos || paren + 2 >= stat.size()) return false;
  const char state = stat[paren + 2];
  return state != 'Z' && state != 'X';
}

inline int count_lines(const std::string& path) {
  return static_cast<int>(lines_of(slurp(path)).size());
}

// Waits until `path` has >= n lines; false after `timeout`.
inline bool wait_for_lines(const std::string& path, int n,
                           std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (count_lines(path) < n) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Sets (or with nullopt, unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, std::optional<std::string> value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value) {
      setenv(name, value->c_str(), 1);
    } else {
      unsetenv(name);
    }
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace paratrain::launch::test
