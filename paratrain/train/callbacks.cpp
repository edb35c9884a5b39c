// The built-in callbacks: metric tracking, early stopping, best checkpoint
// (see callbacks.h).
#include "paratrain/train/callbacks.h"

#include <unistd.h>

#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "paratrain/core/atomic_file.h"
#include "paratrain/core/error.h"

namespace paratrain::train {

namespace fs = std::filesystem;

std::optional<double> EvalInfo::get(const std::string& name) const {
  for (const auto& [k, v] : metrics)
    if (k == name) return v;
  return std::nullopt;
}

std::string resolve_monitor_mode(const std::string& metric, const std::string& mode) {
  if (mode == "min" || mode == "max") return mode;
  return metric.find("accuracy") != std::string::npos ? "max" : "min";
}

MetricTracker::MetricTracker(std::string metric, std::string mode, double min_delta)
    : metric_(std::move(metric)), maximize_(resolve_monitor_mode(metric_, mode) == "max"), min_delta_(min_delta) {}

bool MetricTracker::update(double value) {
  if (std::isnan(value)) return false;
  const bool improved = std::isnan(best_) || (maximize_ ? value > best_ + min_delta_ : value < best_ - min_delta_);
  if (improved) best_ = value;
  return improved;
}

namespace {

// The monitored value of one validation; a metric the run never logs is a
// configuration mistake, named with the ones it does log.
double monitored(const EvalInfo& eval, const std::string& metric) {
  if (auto v = eval.get(metric)) return *v;
  std::vector<std::string> names;
  for (const auto& [k, v] : eval.metrics) names.push_back(k);
  throw ConfigError(fmt::format("train.monitor = \"{}\" is not a metric this run logs; use one of: {}", metric,
                                fmt::join(names, ", ")));
}

}  // namespace

EarlyStopping::EarlyStopping(std::string metric, std::string mode, int64_t patience, double min_delta)
    : tracker_(std::move(metric), std::move(mode), min_delta), patience_(patience) {}

void EarlyStopping::on_validation_end(const EvalInfo& eval) {
  if (tracker_.update(monitored(eval, tracker_.metric()))) {
    bad_ = 0;
    return;
  }
  if (++bad_ >= patience_ && !stop_) {
    stop_ = true;
    stopped_epoch_ = eval.epoch;
    spdlog::info("early stopping at epoch {}: {} has not improved on {:.6g} for {} evaluation(s) (train.patience)",
                 eval.epoch + 1, tracker_.metric(), tracker_.best(), bad_);
  }
}

BestCheckpoint::BestCheckpoint(std::string metric, std::string mode, double min_delta)
    : tracker_(std::move(metric), std::move(mode), min_delta) {}

void BestCheckpoint::on_fit_start(const FitInfo& fit) {
  run_dir_ = fit.run_dir;
  is_main_ = fit.is_main;
  // A resumed run competes with the best of its earlier part.
  const auto record = run_dir_ / "checkpoints" / "best.json";
  std::error_code ec;
  if (fs::exists(record, ec) && best_checkpoint(run_dir_)) {
    std::ifstream in(record);
    auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("metric", "") == tracker_.metric() && j.contains("value") && j["value"].is_number()) {
      tracker_.update(j["value"].get<double>());
      best_step_ = j.value("step", int64_t{-1});
    }
  }
}

void BestCheckpoint::on_validation_end(const EvalInfo& eval) {
  const double value = monitored(eval, tracker_.metric());
  if (tracker_.update(value)) {
    pending_ = eval.step;
    pending_value_ = value;
  }
}

void BestCheckpoint::on_checkpoint(int64_t step, const fs::path& checkpoint) {
  if (!pending_ || *pending_ != step) return;
  pending_.reset();
  best_step_ = step;
  if (!is_main_) return;
  // A relative link survives moving the run folder; the swap by rename is
  // atomic, so `best` always names a whole checkpoint.
  const auto folder = checkpoint.parent_path();
  const auto tmp = folder / fmt::format("best.tmp.{}", ::getpid());
  std::error_code ec;
  fs::remove(tmp, ec);
  fs::create_symlink(checkpoint.filename(), tmp, ec);
  if (!ec) fs::rename(tmp, folder / "best", ec);
  if (ec) {
    spdlog::warn("could not point {} at {}: {}", (folder / "best").string(), checkpoint.string(), ec.message());
    return;
  }
  nlohmann::json record = {{"step", step}, {"metric", tracker_.metric()}, {"value", pending_value_},
                           {"checkpoint", checkpoint.filename().string()}};
  write_file_atomically(folder / "best.json", record.dump(2) + "\n", {.sync = false});
  spdlog::info("best checkpoint so far: {} ({} = {:.6g})", checkpoint.filename().string(), tracker_.metric(),
               pending_value_);
}

std::optional<fs::path> best_checkpoint(const fs::path& run_dir) {
  const auto link = run_dir / "checkpoints" / "best";
  std::error_code ec;
  if (!fs::is_symlink(link, ec)) return std::nullopt;
  const auto target = fs::read_symlink(link, ec);
  if (ec) return std::nullopt;
  const auto resolved = target.is_absolute() ? target : link.parent_path() / target;
  if (!fs::exists(resolved, ec)) return std::nullopt;
  return resolved;
}

}  // namespace paratrain::train
