// Checks that tests of the Trainer's layouts share: a config refused with a
// ConfigError naming given fragments, a figure of the last train record in
// metrics.jsonl, and a run's checkpoint consolidated equal to a reference.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/checkpoint/compare.h"
#include "paratrain/checkpoint/sharded.h"
#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "tests/support/gpt_run.h"

namespace paratrain::testing {

// validate_config(cfg) throws a ConfigError whose message holds every fragment.
inline void expect_config_error(const train::TrainConfig& cfg, const std::vector<std::string>& fragments) {
  try {
    train::validate_config(cfg);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    for (const auto& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

// Rank 0's `key` in the last train record of the run's metrics.jsonl (-1
// when none has it; the run must log: run.log_every > 0).
inline int64_t last_train_record(const RunOutput& run, const std::string& key) {
  std::ifstream in(run.result.run_dir / "metrics.jsonl");
  int64_t value = -1;
  for (std::string line; std::getline(in, line);) {
    const auto record = nlohmann::json::parse(line);
    if (record.value("kind", "") == "train") value = record.at(key).get<int64_t>();
  }
  return value;
}

// The run's last checkpoint consolidated into `file` equals `reference` (a
// one-process checkpoint): parameters and optimizer state, each by its
// single-process name, none missing on either side.
inline void expect_consolidates(const RunOutput& run, const std::filesystem::path& reference,
                                const std::filesystem::path& file) {
  ASSERT_FALSE(run.result.last_checkpoint.empty());
  checkpoint::consolidate_checkpoint(run.result.last_checkpoint, file);
  checkpoint::CompareOptions options;
  options.prefix = "";
  const checkpoint::CompareReport report = checkpoint::compare_checkpoints(file, reference, options);
  std::printf("%s\n", report.format().c_str());
  EXPECT_TRUE(report.ok());
  EXPECT_TRUE(report.only_in_a.empty());
  EXPECT_TRUE(report.only_in_b.empty());
}

}  // namespace paratrain::testing
