// stop_status.h. A signal handler may only do async-signal-safe work, and
// writing JSON is not: the handler writes the signal's number into a pipe,
// and a thread that waits on the pipe updates run.json and then re-raises
// the signal with its default action.
#include "apps/paratrain/stop_status.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/train/run/run_dir.h"

namespace paratrain::cli {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGHUP};
int g_pipe[2] = {-1, -1};
struct sigaction g_previous[3];

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGHUP: return "SIGHUP";
  }
  return "a signal";
}

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &byte, 1);
  errno = saved;
}

}  // namespace

StopStatusRecorder::StopStatusRecorder(std::filesystem::path run_dir) : run_dir_(std::move(run_dir)) {
  if (::pipe2(g_pipe, O_CLOEXEC) != 0) {
    spdlog::warn("cannot watch for SIGTERM/SIGINT (pipe: {}): a stopped run will show as \"died\" in "
                 "`paratrain runs`",
                 std::strerror(errno));
    return;
  }
  thread_ = std::thread([this] { watch(); });
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    ::sigaction(kSignals[i], nullptr, &g_previous[i]);
    // A signal the parent ignores (nohup's SIGHUP, SIGINT in a background
    // job) stays ignored: it never stopped the run before either.
    if (g_previous[i].sa_handler != SIG_IGN) ::sigaction(kSignals[i], &action, nullptr);
  }
}

StopStatusRecorder::~StopStatusRecorder() {
  if (!thread_.joinable()) return;
  for (size_t i = 0; i < std::size(kSignals); ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
  const unsigned char stop = 0;  // not a signal: ends watch()
  [[maybe_unused]] const ssize_t n = ::write(g_pipe[1], &stop, 1);
  thread_.join();
  ::close(g_pipe[0]);
  ::close(g_pipe[1]);
  g_pipe[0] = g_pipe[1] = -1;
}

void StopStatusRecorder::watch() {
  unsigned char byte = 0;
  ssize_t n = 0;
  do {
    n = ::read(g_pipe[0], &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 1 || byte == 0) return;
  const int sig = byte;
  try {
    train::update_run_status(run_dir_, {{"status", "stopped"},
                                        {"signal", signal_name(sig)},
                                        {"ended", train::unix_time()}});
    spdlog::warn("stopped by {}; {} records it", signal_name(sig), (run_dir_ / "run.json").string());
  } catch (const std::exception& e) {
    spdlog::warn("stopped by {}; could not record it in run.json: {}", signal_name(sig), e.what());
  }
  spdlog::default_logger()->flush();
  // End the process by the signal itself, as without the handler: its
  // default action terminates every thread and the parent sees the signal.
  std::signal(sig, SIG_DFL);
  ::kill(::getpid(), sig);
  // SIGINT or SIGHUP may be blocked or ignored by the parent's setup; a
  // stopped run must still end.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  std::_Exit(128 + sig);
}

}  // namespace paratrain::cli
