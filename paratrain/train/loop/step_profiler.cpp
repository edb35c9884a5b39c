// StepProfiler: see step_profiler.h.
#include "paratrain/train/loop/step_profiler.h"

#include <algorithm>
#include <numeric>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/profile/rank_profile.h"
#include "paratrain/profile/step_recorder.h"
#include "paratrain/train/trainer_state.h"

namespace paratrain::train {
namespace {

double mean(const std::vector<double>& v) {
  return v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

StepProfiler::StepProfiler(Trainer::State& s) : s_(s), range_(profile_step_range(s.config.profile)) {
  if (!range_) return;
  const auto& ranks = s.config.profile.ranks;
  for (int64_t r : ranks)
    if (r >= s.world->size())
      throw ConfigError(fmt::format("profile.ranks names rank {}, but the world has {} ranks (0 to {})", r,
                                    s.world->size(), s.world->size() - 1));
  this_rank_ = ranks.empty() || std::find(ranks.begin(), ranks.end(), s.world->rank()) != ranks.end();
  clock_ = profile::align_clocks(*s.world, s.timeout());
  if (s.is_main())
    spdlog::info("profile: steps {}-{} on {}; clocks: {} (measured skew {} us); files in {}", range_->first,
                 range_->second, ranks.empty() ? std::string("every rank") : fmt::format("ranks {}", fmt::join(ranks, ", ")),
                 clock_.method, clock_.skew_us, profile::profile_dir(s.run_dir).string());
}

StepProfiler::~StepProfiler() = default;

void StepProfiler::begin_step(int64_t step) {
  if (!range_ || !this_rank_) return;
  step_start_ = std::chrono::steady_clock::now();
  if (!recorder_ && step >= range_->first && step <= range_->second) {
    profile::StepRecorderOptions options;
    options.rank = s_.world->rank();
    options.world_size = s_.world->size();
    options.ops = {s_.config.profile.record_shapes, s_.config.profile.memory, s_.device.is_cuda()};
    options.clock = clock_;
    options.recorder = comm::recorder_of(*s_.world);
    recorder_ = std::make_unique<profile::StepRecorder>(std::move(options));
  }
  if (recorder_) recorder_->begin_step(step);
}

void StepProfiler::end_step(int64_t step) {
  if (!range_ || !this_rank_) return;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - step_start_).count();
  if (!recorder_) {
    // The steps just before the range: what a step costs unprofiled.
    const auto count = static_cast<size_t>(range_->second - range_->first + 1);
    before_ms_.push_back(ms);
    if (before_ms_.size() > count) before_ms_.erase(before_ms_.begin());
    return;
  }
  during_ms_.push_back(ms);
  recorder_->end_step(step);
  if (step >= range_->second) write();
}

void StepProfiler::finish() {
  if (recorder_) write();
}

void StepProfiler::write() {
  profile::ProfileOverhead overhead{mean(during_ms_), mean(before_ms_), static_cast<int64_t>(before_ms_.size())};
  profile::RankProfile p = recorder_->finish(overhead);
  recorder_.reset();
  const auto dir = profile::profile_dir(s_.run_dir);
  profile::write_rank_profile(dir, p);
  spdlog::info("profile: rank {} wrote {} steps ({} events, {} collectives, {} profiler) to {}/rank_{}.json; "
               "{:.2f} ms per profiled step vs {:.2f} ms before",
               p.rank, p.steps.size(), p.events.size(), p.collectives.size(), p.profiler, dir.string(), p.rank,
               overhead.profiled_step_ms, overhead.unprofiled_step_ms);
  range_.reset();  // one range per run
}

}  // namespace paratrain::train
