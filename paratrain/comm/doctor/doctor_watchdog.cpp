// The watchdog thread: SIGUSR1 dumps and heartbeats (see doctor_watchdog.h).
#include "paratrain/comm/doctor/doctor_watchdog.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/core/error.h"

namespace paratrain::comm {
namespace {

// Note [Dumping from a signal]
// A rank that hangs is usually blocked inside a collective, in the backend's
// code, holding whatever locks it holds; formatting JSON or allocating from a
// signal handler could deadlock on them (malloc's lock among them). So the
// handler only writes one byte to a pipe, which is async-signal-safe, and the
// watchdog thread, which blocks on that pipe, does the dump with ordinary
// code. The thread takes no lock the main thread holds for long: the
// recorder's mutex is held only to copy records.
std::atomic<int> g_signal_write_fd{-1};
static_assert(std::atomic<int>::is_always_lock_free, "the handler reads it");

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  const int fd = g_signal_write_fd.load();
  if (fd >= 0) {
    const unsigned char byte = 1;
    [[maybe_unused]] ssize_t n = write(fd, &byte, 1);  // non-blocking: a full pipe already asks for a dump
  }
  errno = saved;
}

int g_signal_read_fd = -1;
struct sigaction g_old_action {};

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;  // paths with control characters lose them here
    out += c;
  }
  return out + "\"";
}

void write_atomically(const std::filesystem::path& path, const std::string& text) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f.flush()) throw std::runtime_error("cannot write " + tmp);
  }
  std::filesystem::rename(tmp, path);
}

}  // namespace

DoctorWatchdog::DoctorWatchdog(std::shared_ptr<FlightRecorder> recorder, WatchdogOptions options)
    : recorder_(std::move(recorder)), options_(std::move(options)) {
  int sig[2];
  if (pipe2(sig, O_CLOEXEC | O_NONBLOCK) != 0 || pipe2(stop_pipe_, O_CLOEXEC) != 0)
    throw Error(fmt::format("hang doctor: cannot create the watchdog's pipes: {}", std::strerror(errno)));
  int expected = -1;
  if (!g_signal_write_fd.compare_exchange_strong(expected, sig[1])) {
    for (int fd : {sig[0], sig[1], stop_pipe_[0], stop_pipe_[1]}) close(fd);
    throw Error("hang doctor: a DoctorWatchdog already runs in this process; keep one per process");
  }
  g_signal_read_fd = sig[0];
  struct sigaction sa {};
  sigemptyset(&sa.sa_mask);
  sa.sa_handler = on_sigusr1;
  sa.sa_flags = SA_RESTART;  // blocked system calls of the main thread go on
  sigaction(SIGUSR1, &sa, &g_old_action);
  if (!options_.heartbeat_file.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.heartbeat_file.parent_path(), ec);
    beat("running");  // the first beat before returning: the launcher watches from now on
  }
  thread_ = std::thread([this] { loop(); });
}

DoctorWatchdog::~DoctorWatchdog() {
  const char byte = 0;
  [[maybe_unused]] ssize_t n = write(stop_pipe_[1], &byte, 1);
  if (thread_.joinable()) thread_.join();
  if (!options_.heartbeat_file.empty()) beat("exiting");
  // A SIGUSR1 sent from the launcher's last look at a "running" beat may
  // still arrive; its default action would kill a process that is exiting
  // cleanly, so the default becomes "ignore" from here on.
  if (g_old_action.sa_handler == SIG_DFL) g_old_action.sa_handler = SIG_IGN;
  sigaction(SIGUSR1, &g_old_action, nullptr);
  const int write_fd = g_signal_write_fd.exchange(-1);
  for (int fd : {g_signal_read_fd, write_fd, stop_pipe_[0], stop_pipe_[1]}) {
    if (fd >= 0) close(fd);
  }
  g_signal_read_fd = -1;
}

int64_t DoctorWatchdog::beats() const { return beats_.load(); }

void DoctorWatchdog::loop() {
  const bool beating = !options_.heartbeat_file.empty();
  auto next_beat = std::chrono::steady_clock::now() + options_.interval;
  while (true) {
    int wait_ms = -1;
    if (beating) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_beat -
                                                                              std::chrono::steady_clock::now());
      wait_ms = static_cast<int>(std::max<int64_t>(0, left.count()));
    }
    pollfd fds[2] = {{stop_pipe_[0], POLLIN, 0}, {g_signal_read_fd, POLLIN, 0}};
    const int ready = poll(fds, 2, wait_ms);
    if (ready < 0 && errno != EINTR) return;
    if (fds[0].revents != 0) return;
    if (fds[1].revents != 0) {
      char drain[64];
      while (read(g_signal_read_fd, drain, sizeof drain) > 0) {
      }
      // Every rank of this process (one, except in tests that run ranks as threads).
      for (const auto& r : live_recorders()) r->dump("SIGUSR1");
    }
    if (beating && std::chrono::steady_clock::now() >= next_beat) {
      beat("running");
      next_beat += options_.interval;
      // After a long stall (the machine suspended) beat at the interval again, not in a burst.
      if (next_beat < std::chrono::steady_clock::now()) next_beat = std::chrono::steady_clock::now() + options_.interval;
    }
  }
}

// The beat is the doctor's dump format with a few fields more: the launcher
// reads "beat", "timeout_ms", "state", "last_op" and "doctor_dir" line by
// line, and saves the whole file as the doctor dump of a rank that stopped.
void DoctorWatchdog::beat(const char* state) {
  const int64_t n = beats_.fetch_add(1) + 1;
  const std::string extra =
      fmt::format("\"beat\": {},\n\"interval_ms\": {},\n\"timeout_ms\": {},\n\"state\": \"{}\",\n\"doctor_dir\": {},\n", n,
                  options_.interval.count(), options_.timeout.count(), state,
                  json_string(recorder_->dump_dir().string()));
  try {
    write_atomically(options_.heartbeat_file, recorder_->to_json("heartbeat", options_.records_per_beat, extra));
  } catch (const std::exception& e) {
    // Logged once per failure; the launcher will report the missing beats.
    spdlog::warn("hang doctor: rank {} could not write its heartbeat {}: {}", recorder_->rank(),
                 options_.heartbeat_file.string(), e.what());
  }
}

long long process_start_ticks(long long pid) {
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  // The command name (field 2) is in parentheses and may hold spaces: count from its end.
  const auto close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close_paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::atoll(field.c_str());
  }
  return 0;
}

void announce_doctor_dir(FlightRecorder& recorder, const std::filesystem::path& doctor_dir) {
  recorder.set_dump_dir(doctor_dir);
  try {
    std::filesystem::create_directories(doctor_dir);
    char host[256] = {0};
    gethostname(host, sizeof host - 1);
    const long long pid = getpid();
    write_atomically(doctor_dir / fmt::format("rank-{}.pid", recorder.rank()),
                     fmt::format("{} {} {}\n", pid, process_start_ticks(pid), host));
  } catch (const std::exception& e) {
    spdlog::warn("hang doctor: cannot prepare {}: {}", doctor_dir.string(), e.what());
  }
}

}  // namespace paratrain::comm
