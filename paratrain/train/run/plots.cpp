#include "paratrain/train/run/plots.h"

#include <fstream>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paratrain/core/atomic_file.h"
#include "paratrain/train/run/run_dir.h"
#include "paratrain/core/error.h"

namespace paratrain::train {
namespace {

using json = nlohmann::json;

double number_or(const json& row, const char* key, double fallback) {
  auto it = row.find(key);
  return it != row.end() && it->is_number() ? it->get<double>() : fallback;
}

// Rows of runs older than the "samples"/"epoch_progress" fields: samples per
// step follow from any row that has both, epochs per step from eval rows
// (an eval row closes epoch e at its step).
void fill_missing_axes(RunSeries& run, const std::vector<json>& rows) {
  double samples_per_step = 0;
  double steps_per_epoch = 0;
  for (const auto& row : rows) {
    if (row.contains("samples") && number_or(row, "step", 0) > 0) {
      samples_per_step = row["samples"].get<double>() / row["step"].get<double>();
    }
  }
  if (!run.eval.empty() && run.eval.front().step > 0) {
    steps_per_epoch = static_cast<double>(run.eval.front().step) / run.eval.front().epoch;
  }
  for (auto& p : run.train) {
    if (p.samples < 0) p.samples = samples_per_step > 0 ? p.step * samples_per_step : 0;
    if (p.epoch < 0) p.epoch = steps_per_epoch > 0 ? p.step / steps_per_epoch : 0;
  }
  for (auto& p : run.eval) {
    if (p.samples < 0) p.samples = samples_per_step > 0 ? p.step * samples_per_step : 0;
  }
}

std::string unique_label(const std::string& label, std::set<std::string>& used) {
  std::string name = label.empty() ? "run" : label;
  for (int n = 2; used.count(name) > 0; ++n) name = fmt::format("{}_{}", label, n);
  used.insert(name);
  return name;
}

// gnuplot string literal (single quotes: only '' needs escaping).
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (char ch : text) out += ch == '\'' ? std::string("''") : std::string(1, ch);
  return out + "'";
}

}  // namespace

RunSeries read_run_series(const std::filesystem::path& given) {
  // runs/<name> means its newest version_N.
  const auto run_dir = resolve_run_dir(given);
  const auto path = run_dir / "metrics.jsonl";
  std::ifstream in(path);
  if (!in) {
    throw Error(fmt::format("cannot read {}: is {} a run directory (it holds metrics.jsonl once training has "
                            "logged a step)?",
                            path.string(), run_dir.string()));
  }
  RunSeries run;
  auto normal = std::filesystem::absolute(run_dir).lexically_normal();
  if (normal.filename().empty()) normal = normal.parent_path();
  run.label = normal.filename().string();
  // "job/version_1", not a column of "version_0" labels.
  if (parse_version_name(run.label)) run.label = normal.parent_path().filename().string() + "/" + run.label;
  std::vector<json> rows;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    json row = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object()) {
      throw Error(fmt::format("{} line {} is not a JSON object; was the file edited by hand or cut short?",
                              path.string(), number));
    }
    const std::string kind = row.value("kind", "");
    const auto step = static_cast<int64_t>(number_or(row, "step", 0));
    if (kind == "train" && row.contains("loss")) {
      run.train.push_back({number_or(row, "epoch_progress", -1), step, number_or(row, "samples", -1),
                           number_or(row, "loss", 0)});
    } else if (kind == "eval") {
      // epoch_progress: an evaluation when a run stops mid-epoch sits there.
      run.eval.push_back({number_or(row, "epoch_progress", number_or(row, "epoch", 0) + 1), step,
                          number_or(row, "samples", -1),
                          number_or(row, "test_loss", 0), number_or(row, "test_accuracy", 0),
                          number_or(row, "perplexity", 0)});
    }
    rows.push_back(std::move(row));
  }
  fill_missing_axes(run, rows);
  return run;
}

PlotFiles write_plot_script(const std::vector<RunSeries>& runs, const std::filesystem::path& out) {
  if (runs.empty()) throw Error("no runs to plot: name at least one run directory");
  PlotFiles files;
  files.script = out / "plot.gp";
  std::set<std::string> used;
  std::vector<std::pair<std::string, const RunSeries*>> named;
  bool any_perplexity = false;
  for (const auto& run : runs) {
    const auto label = unique_label(run.label, used);
    named.emplace_back(label, &run);
    std::string train = "# epoch step samples loss\n";
    for (const auto& p : run.train) train += fmt::format("{} {} {} {}\n", p.epoch, p.step, p.samples, p.loss);
    std::string eval = "# epoch step samples loss accuracy_percent perplexity\n";
    for (const auto& p : run.eval) {
      eval += fmt::format("{} {} {} {} {} {}\n", p.epoch, p.step, p.samples, p.loss, 100 * p.accuracy, p.perplexity);
      any_perplexity = any_perplexity || p.perplexity > 0;
    }
    write_file_atomically(out / "data" / (label + ".train.dat"), train, {.sync = false});
    write_file_atomically(out / "data" / (label + ".eval.dat"), eval, {.sync = false});
  }

  // One chart per (metric, x axis); every run is one line (train loss
  // dashed beside test loss on the loss charts).
  std::string gp =
      "# Written by `paratrain plot`; run `gnuplot plot.gp` in this folder to redraw.\n"
      "set terminal pngcairo size 1000,640 noenhanced font ',11'\n"
      "set grid\nset key outside right top\n";
  // A chart no run has data for is left out (gnuplot refuses empty plots).
  auto chart = [&](const std::string& file, const std::string& title, const std::string& xlabel,
                   const std::string& ylabel, int xcol, bool loss, int eval_col) {
    std::vector<std::string> lines;
    int color = 1;
    for (const auto& [label, run] : named) {
      if (!run->eval.empty()) {
        lines.push_back(fmt::format("{} using {}:{} with linespoints lc {} title {}",
                                    quoted("data/" + label + ".eval.dat"), xcol, eval_col, color,
                                    quoted(loss ? label + " test" : label)));
      }
      if (loss && !run->train.empty()) {
        lines.push_back(fmt::format("{} using {}:4 with lines dt 2 lc {} title {}",
                                    quoted("data/" + label + ".train.dat"), xcol, color, quoted(label + " train")));
      }
      ++color;
    }
    if (lines.empty()) return;
    files.pngs.push_back(out / file);
    gp += fmt::format("set output {}\nset title {}\nset xlabel {}\nset ylabel {}\n", quoted(file), quoted(title),
                      quoted(xlabel), quoted(ylabel));
    gp += xcol == 3 ? "set format x '%.1s%c'\n" : "set format x '%g'\n";
    gp += "plot ";
    for (size_t i = 0; i < lines.size(); ++i) gp += (i ? ", \\\n     " : "") + lines[i];
    gp += "\n";
  };
  chart("accuracy_vs_epoch.png", "test accuracy", "epoch", "accuracy (%)", 1, false, 5);
  chart("accuracy_vs_samples.png", "test accuracy", "training samples seen", "accuracy (%)", 3, false, 5);
  chart("loss_vs_epoch.png", "loss (test: solid, train: dashed)", "epoch", "loss", 1, true, 4);
  chart("loss_vs_samples.png", "loss (test: solid, train: dashed)", "training samples seen", "loss", 3, true, 4);
  if (any_perplexity) chart("perplexity_vs_epoch.png", "validation perplexity", "epoch", "perplexity", 1, false, 6);
  write_file_atomically(files.script, gp, {.sync = false});
  return files;
}

}  // namespace paratrain::train
