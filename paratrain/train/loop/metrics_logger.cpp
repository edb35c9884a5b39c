// The Trainer's log lines and metrics.jsonl records (metrics_logger.h).
#include "paratrain/train/loop/metrics_logger.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/train/run/metrics.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {

MetricsLogger::MetricsLogger(Trainer::State& s, const RunPlan& plan) : s_(s), plan_(plan) {}

void MetricsLogger::on_train_batch_end(const StepInfo& info) {
  if (!s_.is_main() || std::isnan(info.loss)) return;
  const auto& c = s_.config;
  SyncStats st;
  ModelStateBytes mem;
  if (const auto* telemetry = facet<Telemetry>(*s_.strategy)) {
    st = telemetry->last_stats();
    mem = telemetry->memory(*s_.optimizer);
  }
  if (!s_.progress_bar) {
    spdlog::info("epoch {}/{} step {}/{} loss {:.4f} {:.0f} samples/s ETA {}", info.epoch + 1, c.train.epochs,
                 info.step, info.total_steps, info.loss, info.samples_per_s, format_duration(info.eta_s));
  }
  // samples and epoch_progress: the x axes of `paratrain plot`.
  const double progress = info.epoch + static_cast<double>(info.batch) / std::max<int64_t>(info.batches, 1);
  s_.log_record({{"kind", "train"}, {"epoch", info.epoch}, {"step", info.step},
                 {"samples", info.step * plan_.global_batch}, {"epoch_progress", progress},
                 {"loss", info.loss}, {"samples_per_s", info.samples_per_s},
                 {"lr", info.lr}, {"comm_ms", st.comm_ms},
                 {"hidden_share", st.hidden_share}, {"param_bytes", mem.params},
                 {"grad_bytes", mem.grads}, {"optimizer_bytes", mem.optimizer_state}});
}

void MetricsLogger::on_validation_end(const EvalInfo& eval) {
  if (!s_.is_main()) return;
  const auto& c = s_.config;
  const double loss = eval.get("test_loss").value_or(NAN);
  const double accuracy = eval.get("test_accuracy").value_or(NAN);
  const auto perplexity = eval.get("perplexity");
  const double progress = eval.epoch + static_cast<double>(s_.loader->state().next_batch) /
                                           std::max<int64_t>(s_.loader->num_batches(), 1);
  nlohmann::json record = {{"kind", "eval"}, {"epoch", eval.epoch}, {"step", eval.step},
                           {"samples", eval.step * plan_.global_batch}, {"epoch_progress", progress},
                           {"test_loss", loss}};
  if (eval.get("test_accuracy")) record["test_accuracy"] = accuracy;
  // A program's task logs its own figures beside (test_<name>).
  std::string others;
  for (const auto& [name, v] : eval.metrics) {
    if (name == "test_loss" || name == "test_accuracy" || name == "train_loss") continue;
    record[name] = v;
    if (name != "perplexity") others += fmt::format(" {} {:.4g}", name.substr(name.rfind("test_", 0) == 0 ? 5 : 0), v);
  }
  if (perplexity) {
    spdlog::info("epoch {}/{} step {} val loss {:.4f} perplexity {:.2f} next-token accuracy {:.2f}% ({} tokens)",
                 eval.epoch + 1, c.train.epochs, eval.step, loss, *perplexity, 100 * accuracy, eval.count);
  } else if (eval.get("test_accuracy")) {
    spdlog::info("epoch {}/{} test loss {:.4f} accuracy {:.2f}%{} ({} items)", eval.epoch + 1, c.train.epochs, loss,
                 100 * accuracy, others, eval.count);
  } else {
    spdlog::info("epoch {}/{} test loss {:.4f}{} ({} items)", eval.epoch + 1, c.train.epochs, loss, others,
                 eval.count);
  }
  s_.log_record(std::move(record));
}

}  // namespace paratrain::train
