// PreemptionSignals: see preemption.h.
#include "paratrain/train/run/preemption.h"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {
namespace {

const std::map<std::string, int>& known_signals() {
  static const std::map<std::string, int> known = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT}, {"SIGHUP", SIGHUP}, {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2}};
  return known;
}

std::atomic<int> g_received{0};
std::mutex g_mutex;
std::map<int, int> g_installed;                   // signal -> how many PreemptionSignals want it
std::map<int, struct sigaction> g_previous;       // the handler before the first of them
// The same, readable in a signal handler (a map lookup is not
// async-signal-safe); written under g_mutex before the handler is installed.
struct sigaction g_before[NSIG];

std::atomic<int64_t> g_received_at_ms{0};
constexpr int64_t kRepeatWindowMs = 2000;

int64_t monotonic_ms() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);  // async-signal-safe
  return static_cast<int64_t>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
}

// Note [A signal that insists]
// Only async-signal-safe calls here. The first preemption signal sets the
// flag. Another one ends the process at once (the user or the scheduler
// insists), except the same request arriving twice, as when a scheduler
// signals every process of the job and `paratrain launch` passes its own
// copy on to the workers: the same signal again within two seconds, or the
// same signal sent (kill, SI_USER) by the process that forwards signals to
// this one, at any time: `paratrain launch` (PARATRAIN_LAUNCHER_PID) or
// torchrun's agent (the parent). The launcher's copy can come late (it
// forwards from its event loop, which a loaded machine delays: a CI run once
// saw it after the window), and a launcher asked again stops its workers
// itself (SIGKILL), so its repeats never mean "now". Repeats from anyone
// else (slurmstepd, a shell, a container runtime: si_pid 0) still insist.
std::atomic<pid_t> g_forwarder{0};

void on_signal(int sig, siginfo_t* info, void* context) {
  int first = 0;
  if (g_received.compare_exchange_strong(first, sig)) {
    g_received_at_ms.store(monotonic_ms());
    return;
  }
  const pid_t forwarder = g_forwarder.load();
  if (sig == first && info != nullptr && info->si_code == SI_USER && forwarder > 0 && info->si_pid == forwarder)
    return;
  if (sig == first && monotonic_ms() - g_received_at_ms.load() < kRepeatWindowMs) return;
  // It insists. A handler that was there before (`paratrain train`'s, which
  // records "stopped" in run.json and then ends the process by the signal:
  // apps/paratrain/stop_status.h) ends it; without one, end it here. Only
  // for the stopping signals: SIGUSR1's earlier handler is the hang
  // doctor's, which would not end anything.
  if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP) {
    const struct sigaction& before = g_before[sig];
    if ((before.sa_flags & SA_SIGINFO) != 0 && before.sa_sigaction != nullptr) {
      before.sa_sigaction(sig, info, context);
      return;
    }
    if ((before.sa_flags & SA_SIGINFO) == 0 && before.sa_handler != SIG_DFL && before.sa_handler != SIG_IGN) {
      before.sa_handler(sig);
      return;
    }
  }
  ::_exit(128 + sig);
}

// The process whose signals are copies of a request this one already got:
// the launcher's pid it exported, else under torchrun the agent (the parent).
pid_t signal_forwarder() {
  if (const char* pid = std::getenv("PARATRAIN_LAUNCHER_PID"); pid != nullptr && *pid != '\0') {
    char* end = nullptr;
    const long value = std::strtol(pid, &end, 10);
    if (end != nullptr && *end == '\0' && value > 0) return static_cast<pid_t>(value);
  }
  if (std::getenv("TORCHELASTIC_RUN_ID") != nullptr) return ::getppid();
  return 0;
}

}  // namespace

std::vector<int> parse_preempt_signals(const std::string& text) {
  if (text == "auto") return {SIGTERM, SIGINT};
  std::vector<int> out;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    std::string name = text.substr(begin, end - begin);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    if (name.rfind("SIG", 0) != 0) name = "SIG" + name;
    const auto it = known_signals().find(name);
    if (it == known_signals().end())
      throw ConfigError(fmt::format("train.preempt_signals: '{}' is not one of SIGTERM, SIGINT, SIGHUP, SIGUSR1, "
                                    "SIGUSR2 (comma-separated, e.g. \"SIGTERM,SIGUSR2\")",
                                    text.substr(begin, end - begin)));
    out.push_back(it->second);
    begin = end + 1;
  }
  return out;
}

std::string preemption_unavailable(const TrainConfig& c) {
  if (c.elastic.in_job)
    return "elastic.in_job = true: in-job recovery re-forms the world the preemption agreement runs on";
  if (c.ps.servers > 0 && c.ps.mode == "async" && c.ps.dynamic_batches)
    return "asynchronous parameter servers taking dynamic batches (ps.mode = \"async\", ps.dynamic_batches = "
           "true): their ranks meet only at epoch ends and checkpoints, too late to stop before the scheduler's kill";
  return "";
}

std::string preemption_auto_off(const TrainConfig& c) {
  if (auto why = preemption_unavailable(c); !why.empty()) return why;
  // Their ranks meet only through pushes and pulls: a world all-reduce each
  // step would hold every worker to the slowest (ssp, async) and change how
  // a server's death is seen. A list of signals still asks for it.
  if (c.ps.servers > 0)
    return "parameter servers (ps.servers > 0): their ranks meet only through pushes and pulls, and the "
           "agreement would add a world all-reduce to every step; name the signals to have it";
  return "";
}

std::vector<int> preempt_signals_of(const TrainConfig& c) {
  if (c.train.preempt_signals == "auto" && !preemption_auto_off(c).empty()) return {};
  return parse_preempt_signals(c.train.preempt_signals);
}

std::string preempt_signal_name(int signal) {
  for (const auto& [name, number] : known_signals())
    if (number == signal) return name;
  return fmt::format("signal {}", signal);
}

PreemptionSignals::PreemptionSignals(const std::vector<int>& signals) : signals_(signals) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_forwarder.store(signal_forwarder());
  for (int sig : signals_) {
    if (g_installed[sig]++ > 0) continue;
    struct sigaction action {};
    action.sa_sigaction = on_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_SIGINFO;
    ::sigaction(sig, &action, &g_previous[sig]);
    g_before[sig] = g_previous[sig];
  }
}

PreemptionSignals::~PreemptionSignals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int sig : signals_) {
    if (--g_installed[sig] > 0) continue;
    ::sigaction(sig, &g_previous[sig], nullptr);
    g_previous.erase(sig);
  }
}

int PreemptionSignals::received() { return g_received.load(); }

void PreemptionSignals::clear() { g_received.store(0); }

}  // namespace paratrain::train
