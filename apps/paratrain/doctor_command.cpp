// `paratrain doctor --run RUN_DIR`: asks the run's live ranks on this host
// for their hang-doctor records (SIGUSR1), waits for the fresh dumps, then
// says which rank is behind and on which collective, and writes a Chrome
// trace of the last seconds. Finding processes and waiting only; the
// analysis is paratrain/comm/doctor/dump_reader.h.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "apps/paratrain/commands.h"
#include "paratrain/comm/doctor/doctor_watchdog.h"
#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"
#include "paratrain/comm/doctor/dump_reader.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::cli {
namespace {

namespace fs = std::filesystem;

// A rank of the run that still runs on this host: its pid file names it, and
// the start time in the file tells it from a later process that got the same pid.
struct LiveRank {
  int rank = -1;
  long long pid = 0;
};

std::vector<LiveRank> live_ranks(const fs::path& doctor_dir) {
  std::vector<LiveRank> out;
  char here[256] = {0};
  gethostname(here, sizeof here - 1);
  static const std::regex name(R"(rank-(\d+)\.pid)");
  std::smatch m;
  if (!fs::is_directory(doctor_dir)) return out;
  for (const auto& entry : fs::directory_iterator(doctor_dir)) {
    const std::string file = entry.path().filename().string();
    if (!std::regex_match(file, m, name)) continue;
    std::ifstream in(entry.path());
    long long pid = 0, start = 0;
    std::string host;
    if (!(in >> pid >> start >> host) || host != here || pid <= 0) continue;
    if (comm::process_start_ticks(pid) != start || start == 0) continue;  // gone, or the pid was reused
    out.push_back({std::stoi(m[1].str()), pid});
  }
  return out;
}

}  // namespace

Command add_doctor_command(CLI::App& app) {
  struct Args {
    std::string run_dir;
    std::string output;
    double wait_s = 10;
    double trace_s = 10;
    double min_lag_s = 1;
    bool no_signal = false;
  };
  auto args = std::make_shared<Args>();
  auto* sub = app.add_subcommand(
      "doctor",
      "Hang doctor: ask the run's live ranks (on this host) for their last collectives (SIGUSR1), then say which "
      "rank is behind and which collective diverged, and write a Chrome trace of the last seconds. Reads "
      "RUN_DIR/doctor/rank-N.json, also those written at a collective timeout or by `paratrain launch` when a "
      "rank stopped sending heartbeats");
  sub->add_option("--run", args->run_dir, "the run directory, e.g. runs/job/version_0 (runs/job: its newest version)")
      ->required();
  sub->add_option("-o,--output", args->output, "the Chrome trace to write (default: RUN_DIR/doctor/trace.json)");
  sub->add_option("--wait", args->wait_s, "seconds to wait for the signalled ranks' fresh dumps (default 10)")
      ->check(CLI::Range(0.0, 3600.0));
  sub->add_option("--trace-seconds", args->trace_s, "seconds before the newest dump the trace shows (default 10)")
      ->check(CLI::Range(0.001, 1e6));
  sub->add_option("--min-lag", args->min_lag_s,
                  "a rank is behind only when a peer had waited this many seconds in the collective it lacks "
                  "(default 1: shorter is a healthy job's normal skew)")
      ->check(CLI::Range(0.0, 1e6));
  sub->add_flag("--no-signal", args->no_signal, "only read the dumps already there; signal no process");

  auto run = [args]() -> int {
    const fs::path run_dir = train::resolve_run_dir(args->run_dir);
    const fs::path doctor_dir = run_dir / "doctor";
    if (!args->no_signal) {
      const auto ranks = live_ranks(doctor_dir);
      std::map<int, fs::file_time_type> before;
      for (const auto& r : ranks) {
        const fs::path dump = doctor_dir / fmt::format("rank-{}.json", r.rank);
        std::error_code ec;
        before[r.rank] = fs::exists(dump) ? fs::last_write_time(dump, ec) : fs::file_time_type::min();
        if (kill(static_cast<pid_t>(r.pid), SIGUSR1) != 0) before.erase(r.rank);
      }
      std::cout << fmt::format("paratrain doctor: asked {} live rank{} for their records (SIGUSR1)\n", before.size(),
                               before.size() == 1 ? "" : "s");
      // A dump is fresh when its file changed after the request; ranks write
      // it from their watchdog thread, so even a rank blocked in a collective does.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(args->wait_s);
      while (!before.empty() && std::chrono::steady_clock::now() < deadline) {
        for (auto it = before.begin(); it != before.end();) {
          std::error_code ec;
          const auto t = fs::last_write_time(doctor_dir / fmt::format("rank-{}.json", it->first), ec);
          it = !ec && t > it->second ? before.erase(it) : std::next(it);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      for (const auto& [rank, t] : before)
        std::cout << fmt::format("paratrain doctor: rank {} did not answer within {:g} s; using its older dump, if any\n",
                                 rank, args->wait_s);
    }
    const auto dumps = comm::read_dumps(doctor_dir);
    const auto report = comm::diagnose(dumps, 0, args->min_lag_s);
    std::cout << report.text() << "\n";
    const fs::path out = args->output.empty() ? doctor_dir / "trace.json" : fs::path(args->output);
    write_file_atomically(out, comm::doctor_trace(dumps, args->trace_s).dump());
    std::cout << fmt::format("paratrain doctor: Chrome trace of the last {:g} s: {} (open in ui.perfetto.dev)\n",
                             args->trace_s, out.string());
    return report.diverged ? 1 : 0;
  };
  return {sub, run};
}

}  // namespace paratrain::cli
