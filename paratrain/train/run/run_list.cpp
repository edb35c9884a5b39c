// Summaries of run folders for `paratrain runs` (see run_list.h).
#include "paratrain/train/run/run_list.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/checkpoint_files.h"
#include "paratrain/train/run/run_dir.h"

namespace paratrain::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return json::object();
  auto j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  return j.is_object() ? j : json::object();
}

bool process_alive(int64_t pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

std::string this_host() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  return host;
}

// The monitored metric of the run's config when it names one, else test
// accuracy (higher is better) or, without it, test loss.
void fill_from_metrics(const fs::path& dir, RunSummary& r) {
  std::ifstream in(dir / "metrics.jsonl");
  std::string line;
  std::optional<double> best_acc, best_loss;
  while (std::getline(in, line)) {
    auto row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!row.is_object()) continue;
    if (row.contains("step") && row["step"].is_number()) r.steps = std::max(r.steps, row["step"].get<int64_t>());
    if (row.value("kind", "") != "eval") continue;
    if (row.contains("test_accuracy") && row["test_accuracy"].is_number()) {
      const double v = row["test_accuracy"].get<double>();
      best_acc = best_acc ? std::max(*best_acc, v) : v;
    }
    if (row.contains("test_loss") && row["test_loss"].is_number()) {
      const double v = row["test_loss"].get<double>();
      best_loss = best_loss ? std::min(*best_loss, v) : v;
    }
  }
  if (best_acc) {
    r.metric = "test_accuracy";
    r.best = *best_acc;
  } else if (best_loss) {
    r.metric = "test_loss";
    r.best = *best_loss;
  }
}

RunSummary summarize(const fs::path& dir, std::string name, std::optional<int64_t> version) {
  RunSummary r;
  r.name = std::move(name);
  r.version = version;
  r.dir = dir;
  const json status = read_json(dir / "run.json");
  r.status = status.value("status", "unknown");
  if (r.status == "running" && status.value("host", "") == this_host() && !process_alive(status.value("pid", int64_t{0})))
    r.status = "died";
  r.started = status.value("started", 0.0);
  fill_from_metrics(dir, r);
  r.steps = std::max(r.steps, status.value("steps", int64_t{0}));
  r.checkpoints = static_cast<int64_t>(checkpoint::list_checkpoints(dir).size());
  return r;
}

}  // namespace

std::vector<RunSummary> list_runs(const fs::path& root) {
  std::vector<RunSummary> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  std::vector<fs::path> names;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    std::error_code ignored;
    const auto name = e.path().filename().string();
    if (e.is_directory(ignored) && !name.empty() && name[0] != '.') names.push_back(e.path());
  }
  std::sort(names.begin(), names.end());
  for (const auto& run : names) {
    const auto name = run.filename().string();
    // A run folder of the layout before versions holds its files directly.
    if (fs::exists(run / "config.toml", ec) || fs::exists(run / "metrics.jsonl", ec))
      out.push_back(summarize(run, name, std::nullopt));
    for (int64_t v : list_versions(run)) out.push_back(summarize(version_dir(run, v), name, v));
  }
  return out;
}

std::string format_runs(const std::vector<RunSummary>& runs) {
  if (runs.empty()) return "no runs\n";
  std::string out = fmt::format("{:<32} {:<9} {:<9} {:>8} {:>6}  {:<22} {}\n", "RUN", "VERSION", "STATUS", "STEPS",
                                "CKPTS", "BEST", "STARTED");
  for (const auto& r : runs) {
    std::string started = "-";
    if (r.started > 0) {
      const std::time_t t = static_cast<std::time_t>(r.started);
      std::tm tm{};
      localtime_r(&t, &tm);
      char buf[32];
      std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
      started = buf;
    }
    const std::string best = r.metric.empty() ? "-"
                             : r.metric == "test_accuracy" ? fmt::format("accuracy {:.2f}%", 100 * r.best)
                                                           : fmt::format("{} {:.4f}", r.metric, r.best);
    out += fmt::format("{:<32} {:<9} {:<9} {:>8} {:>6}  {:<22} {}\n", r.name,
                       r.version ? fmt::format("{}", *r.version) : "-", r.status, r.steps, r.checkpoints, best,
                       started);
  }
  return out;
}

}  // namespace paratrain::train
