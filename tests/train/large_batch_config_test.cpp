// The large-batch keys of the config: train.accumulate, the [lr] section and
// the LARS/LAMB optimizer keys. Bad values and combinations are ConfigErrors
// naming the key; the batch arithmetic (global = per-rank x dp x accumulate)
// holds in both directions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/batch_size.h"
#include "paratrain/train/config/config.h"

namespace pt = paratrain::train;
using paratrain::ConfigError;

namespace {

std::string config_error(const std::string& toml) {
  try {
    pt::config_from_toml_string(toml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError for:\n" << toml;
  return "";
}

void expect_names(const std::string& toml, const std::vector<std::string>& keys) {
  const std::string message = config_error(toml);
  for (const auto& key : keys) EXPECT_NE(message.find(key), std::string::npos) << key << " not in: " << message;
}

TEST(LargeBatchConfig, KeysParseAndRoundTrip) {
  const auto c = pt::config_from_toml_string(R"(
[optimizer]
kind = "lamb"
trust_coefficient = 0.01
exclude_from_adaptation = false
[lr]
base_batch = 256
scaling = "sqrt"
warmup_epochs = 2.5
warmup_start_factor = 0.1
decay = "cosine"
min_lr = 0.001
[train]
accumulate = 8
)");
  EXPECT_EQ(c.train.accumulate, 8);
  EXPECT_EQ(c.optimizer.kind, "lamb");
  EXPECT_FALSE(c.optimizer.exclude_from_adaptation);
  EXPECT_EQ(c.lr.scaling, "sqrt");
  EXPECT_DOUBLE_EQ(c.lr.warmup_epochs, 2.5);
  EXPECT_EQ(pt::config_from_toml_string(pt::to_toml(c)), c);
  EXPECT_EQ(pt::config_from_json(pt::to_json(c)), c);
  EXPECT_EQ(pt::TrainConfig{}.train.accumulate, 1);
  EXPECT_EQ(pt::TrainConfig{}.lr.scaling, "none");
}

TEST(LargeBatchConfig, BadValuesNameTheKey) {
  expect_names("[train]\naccumulate = 0", {"train.accumulate"});
  expect_names("[lr]\nscaling = \"cubic\"", {"lr.scaling", "linear"});
  expect_names("[lr]\ndecay = \"exp\"", {"lr.decay"});
  expect_names("[lr]\nwarmup_start_factor = 1.5", {"lr.warmup_start_factor"});
  expect_names("[lr]\ngamma = 0.0", {"lr.gamma"});
  expect_names("[optimizer]\nkind = \"lion\"", {"optimizer.kind", "lars", "lamb"});
}

TEST(LargeBatchConfig, InconsistentCombinationsNameTheKeys) {
  expect_names("[lr]\nscaling = \"linear\"", {"lr.scaling", "lr.base_batch"});
  expect_names("[lr]\nwarmup_steps = 5\nwarmup_epochs = 1.0", {"lr.warmup_steps", "lr.warmup_epochs"});
  expect_names("[lr]\ndecay = \"step\"", {"lr.step_size", "lr.step_epochs"});
  expect_names("[lr]\nstep_size = 10", {"lr.step_size", "lr.decay"});
  expect_names("[lr]\nmin_lr = 0.01", {"lr.min_lr", "cosine"});
  expect_names("[optimizer]\nkind = \"lars\"\nmomentum = 1.0", {"optimizer.momentum"});
}

TEST(LargeBatchConfig, GlobalBatchIsPerRankTimesDpTimesAccumulate) {
  pt::TrainConfig c;
  c.data.batch_size = 8;
  c.train.accumulate = 4;
  auto b = pt::resolve_batch_sizes(c, 2);
  EXPECT_EQ(b.per_rank, 8);
  EXPECT_EQ(b.accumulate, 4);
  EXPECT_EQ(b.global, 64);

  c.data.global_batch_size = 96;  // over 2 ranks x 4 micro-batches: 12 each
  b = pt::resolve_batch_sizes(c, 2);
  EXPECT_EQ(b.per_rank, 12);
  EXPECT_EQ(b.global, 96);

  c.data.global_batch_size = 100;  // 100 / 8 is not whole
  try {
    pt::resolve_batch_sizes(c, 2);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.accumulate"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data.global_batch_size"), std::string::npos) << e.what();
  }
}

}  // namespace
