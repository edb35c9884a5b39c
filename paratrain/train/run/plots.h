// Curves of finished or running training runs, for people: reads each run's
// metrics.jsonl and writes gnuplot data files plus one gnuplot script that
// draws several runs on one chart per metric (PNG). `paratrain plot` runs
// gnuplot on the script; the library itself never spawns a process.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace paratrain::train {

struct TrainPoint {
  double epoch = 0;    // epochs done, fractional (epoch + batches done / batches per epoch)
  int64_t step = 0;
  double samples = 0;  // training samples seen (step * global batch)
  double loss = 0;     // mean training loss over the logging window
};

struct EvalPoint {
  double epoch = 0;    // epochs done (1 after the first epoch)
  int64_t step = 0;
  double samples = 0;
  double loss = 0;
  double accuracy = 0;    // in [0, 1]; language models: next-token accuracy
  double perplexity = 0;  // 0 when the run does not report one
};

struct RunSeries {
  std::string label;  // the run directory's name
  std::vector<TrainPoint> train;
  std::vector<EvalPoint> eval;
};

// Reads RUN_DIR/metrics.jsonl. Throws Error naming the file when it is
// missing or a line is not JSON. Rows written before the "samples" and
// "epoch_progress" fields existed get them derived from the step and the
// eval rows where possible.
RunSeries read_run_series(const std::filesystem::path& run_dir);

struct PlotFiles {
  std::filesystem::path script;            // OUT/plot.gp
  std::vector<std::filesystem::path> pngs; // what running the script draws
};

// Writes OUT/data/<label>.{train,eval}.dat and OUT/plot.gp, which draws
// accuracy and loss against epochs and against samples seen, one line per
// run: OUT/accuracy_vs_epoch.png, accuracy_vs_samples.png, loss_vs_epoch.png,
// loss_vs_samples.png (plus perplexity_vs_epoch.png when a run reports it);
// a chart with no data in any run (accuracy before the first evaluation) is
// left out.
// Labels that repeat get a numeric suffix.
PlotFiles write_plot_script(const std::vector<RunSeries>& runs, const std::filesystem::path& out);

}  // namespace paratrain::train
