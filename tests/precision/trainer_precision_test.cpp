// Mixed precision and SyncBatchNorm through the whole Trainer (config ->
// strategy -> autocast -> loss scaler), ranks as threads. Oracles: fp32
// training of the same model (bf16 stays close, but not bitwise equal: the
// negative control that autocast really ran), and one process with the
// whole global batch (SyncBatchNorm at 2 ranks equals it; plain BatchNorm,
// whose statistics are per rank, does not).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <thread>

#include "paratrain/core/autocast.h"
#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {

using Params = std::vector<std::pair<std::string, at::Tensor>>;

TrainConfig mlp_config(const std::string& dir, const std::string& name) {
  TrainConfig c;
  c.run.name = name;
  c.run.output_dir = dir;
  c.run.seed = 5;
  c.run.log_every = 10;
  c.model.kind = "mlp";
  c.model.hidden = {64, 32};
  c.data.dataset = "synthetic";
  c.data.synthetic_train_size = 1600;
  c.data.synthetic_test_size = 256;
  c.data.synthetic_image_size = 8;
  c.data.global_batch_size = 32;
  c.optimizer.kind = "sgd";
  c.optimizer.lr = 0.05;
  c.train.epochs = 1;
  c.train.max_steps = 50;
  c.train.eval_every_epochs = 0;
  return c;
}

struct RunOutcome {
  Params params;
  std::vector<std::pair<std::string, at::Tensor>> buffers;
  TrainResult result;
  double test_loss_before = 0;
  double test_loss_after = 0;
};

RunOutcome train(const TrainConfig& c, int world_size) {
  RunOutcome run;
  testing::run_ranks(world_size, [&](comm::ProcessGroup& g) {
    Trainer t(c, g);
    const double before = t.evaluate().loss;
    auto result = t.fit();
    const double after = t.evaluate().loss;
    auto params = t.full_parameters();
    if (g.rank() == 0) {
      run.params = params;
      for (const auto& b : t.model()->named_buffers()) run.buffers.emplace_back(b.key(), b.value().clone());
      run.result = result;
      run.test_loss_before = before;
      run.test_loss_after = after;
    }
  });
  return run;
}

// max over tensors of max|a - b| / max|b|.
double relative_diff(const std::vector<std::pair<std::string, at::Tensor>>& a,
                     const std::vector<std::pair<std::string, at::Tensor>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const at::Tensor x = a[i].second.to(at::kDouble), y = b[i].second.to(at::kDouble);
    const double ref = std::max(y.abs().max().item<double>(), 1e-12);
    worst = std::max(worst, (x - y).abs().max().item<double>() / ref);
  }
  return worst;
}

bool bitwise_equal(const Params& a, const Params& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i].second, b[i].second)) return false;
  }
  return true;
}

TEST(Bf16, MlpTracksFp32Over50StepsAndLearns) {
  const auto dir = testing::temp_dir("bf16");
  TrainConfig fp32 = mlp_config(dir, "fp32");
  TrainConfig bf16 = mlp_config(dir, "bf16");
  bf16.precision.compute = "bf16";
  const RunOutcome ref = train(fp32, 1);
  const RunOutcome low = train(bf16, 2);
  const double diff = relative_diff(low.params, ref.params);
  std::printf("bf16 (2 ranks) vs fp32 (1 process) after 50 steps: max relative parameter diff %.3g; test loss "
              "%.4f -> %.4f (fp32 %.4f -> %.4f)\n",
              diff, low.test_loss_before, low.test_loss_after, ref.test_loss_before, ref.test_loss_after);
  // bf16 keeps 8 mantissa bits: each matmul's inputs round by up to 2^-9
  // relative, so one step's update differs by ~0.5%, and 50 momentum-SGD
  // steps compound it. Measured: 0.098 on the worst tensor (max |diff| over
  // its largest element), while the test loss stays within 0.3% of fp32.
  EXPECT_LT(diff, 0.2);
  EXPECT_NEAR(low.test_loss_after, ref.test_loss_after, 0.05 * ref.test_loss_after);
  EXPECT_LT(low.test_loss_after, 0.95 * low.test_loss_before) << "bf16 training did not learn";
  // Negative control: autocast really changed the numerics.
  EXPECT_FALSE(bitwise_equal(low.params, ref.params));
  EXPECT_GT(diff, 1e-6);
}

// A power-of-two scale is exact in bf16 (fp32's exponent range) as long as
// nothing overflows: scaled bf16 training equals unscaled bf16 training, no
// step skipped, and the scale grows every growth_interval steps.
TEST(Bf16, DynamicLossScaleIsTransparentWithoutOverflow) {
  const auto dir = testing::temp_dir("bf16_scaled");
  TrainConfig plain = mlp_config(dir, "plain");
  plain.precision.compute = "bf16";
  plain.train.max_steps = 20;
  TrainConfig scaled = plain;
  scaled.run.name = "scaled";
  scaled.precision.loss_scale = "dynamic";
  scaled.precision.scaler.init_scale = 256;
  scaled.precision.scaler.growth_interval = 10;
  const RunOutcome a = train(plain, 2);
  const RunOutcome b = train(scaled, 2);
  EXPECT_EQ(b.result.skipped_steps, 0);
  EXPECT_EQ(b.result.loss_scale, 1024);  // grew twice in 20 steps
  EXPECT_LT(relative_diff(b.params, a.params), 1e-6);
  EXPECT_NEAR(b.result.last_train_loss, a.result.last_train_loss, 1e-6);
}

// The scale and the count of good steps travel in the checkpoint: a run
// stopped at step 15 and resumed to 20 grows the scale at step 20 like the
// uninterrupted run (1024). Restarting from the initial scale would end at
// 256 (5 good steps since the resume, below the interval of 10).
TEST(Bf16, LossScalerStateResumesFromTheCheckpoint) {
  const auto dir = testing::temp_dir("bf16_scaler_resume");
  TrainConfig whole = mlp_config(dir, "whole");
  whole.precision.compute = "bf16";
  whole.precision.loss_scale = "dynamic";
  whole.precision.scaler.init_scale = 256;
  whole.precision.scaler.growth_interval = 10;
  whole.train.max_steps = 20;
  TrainConfig first = whole;
  first.run.name = "stopped";
  first.train.max_steps = 15;
  TrainConfig resumed = first;
  resumed.train.max_steps = 20;
  resumed.train.resume = "auto";
  const RunOutcome a = train(whole, 2);
  const RunOutcome b1 = train(first, 2);
  EXPECT_EQ(b1.result.loss_scale, 512);
  const RunOutcome b = train(resumed, 2);
  EXPECT_EQ(a.result.loss_scale, 1024);
  EXPECT_EQ(b.result.loss_scale, 1024);
  EXPECT_LT(relative_diff(b.params, a.params), 1e-6);
}

TEST(Bf16, AutocastStateIsPerThread) {
  // Ranks are threads: one rank's region must not leak into another's.
  const auto x = torch::randn({4, 4});
  at::ScalarType inside = at::kFloat, other = at::kBFloat16;
  {
    core::AutocastGuard guard(at::kBFloat16);
    inside = torch::mm(x, x).scalar_type();
    std::thread t([&] { other = torch::mm(x, x).scalar_type(); });
    t.join();
  }
  EXPECT_EQ(inside, at::kBFloat16);
  EXPECT_EQ(other, at::kFloat);
  EXPECT_EQ(torch::mm(x, x).scalar_type(), at::kFloat) << "the guard did not restore the state";
}

TEST(PrecisionConfig, RejectsWhatCannotRunHere) {
  TrainConfig c = mlp_config("/tmp", "x");
  c.precision.compute = "fp16";
  if (!at::hasCUDA()) {
    try {
      validate_config(c);
      ADD_FAILURE() << "fp16 accepted on a CPU-only build";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("CUDA build"), std::string::npos) << e.what();
    }
  }
  c = mlp_config("/tmp", "x");
  EXPECT_THROW(apply_override(c, "precision.loss_scale=\"huge\""), ConfigError);
  EXPECT_THROW(apply_override(c, "precision.compute=\"fp8\""), ConfigError);
  apply_override(c, "precision.loss_scale=\"1024\"");
  validate_config(c);
  c.model.sync_batchnorm = true;  // without model.batchnorm
  EXPECT_THROW(validate_config(c), ConfigError);
  c = mlp_config("/tmp", "x");
  c.model.batchnorm = true;  // the MLP has no BatchNorm
  EXPECT_THROW(validate_config(c), ConfigError);
}

// precision.comm_dtype = "bf16": DDP's buckets cross the wire as bf16 and are
// added in fp32. Oracle: fp32 training on one process with the whole batch.
// The only difference is the rounding of each averaged gradient to bf16
// (2^-8 relative per step), so 50 SGD steps stay close; fp32 DDP at 2 ranks
// is the control, equal to one process far more tightly.
TEST(CommDtype, Bf16GradientCommunicationTracksFp32) {
  const auto dir = testing::temp_dir("comm_bf16");
  TrainConfig one = mlp_config(dir, "one");
  one.ddp.mode = "none";
  TrainConfig fp32 = mlp_config(dir, "fp32");
  TrainConfig bf16 = mlp_config(dir, "bf16");
  bf16.precision.comm_dtype = "bf16";
  const RunOutcome ref = train(one, 1);
  const RunOutcome plain = train(fp32, 2);
  const RunOutcome low = train(bf16, 2);
  const double d_plain = relative_diff(plain.params, ref.params);
  const double d_low = relative_diff(low.params, ref.params);
  std::printf("[ measured ] after 50 steps vs 1 process: fp32 DDP %.3g, bf16-comm DDP %.3g; test loss %.4f "
              "(fp32 %.4f)\n",
              d_plain, d_low, low.test_loss_after, ref.test_loss_after);
  EXPECT_LT(d_plain, 1e-4);
  EXPECT_GT(d_low, 10 * d_plain) << "bf16 communication changed nothing: was the hook used?";
  EXPECT_LT(d_low, 0.08);  // measured 0.035 (deterministic: same data, same roundings)
  EXPECT_NEAR(low.test_loss_after, ref.test_loss_after, 0.02 * ref.test_loss_after);
}

TEST(CommDtype, OnlyBucketedDdpCompresses) {
  TrainConfig c = mlp_config("/tmp", "x");
  apply_override(c, "precision.comm_dtype=\"fp16\"");
  validate_config(c);
  EXPECT_THROW(apply_override(c, "precision.comm_dtype=\"fp8\""), ConfigError);
  c.zero.stage = 2;
  validate_config(c);  // ZeRO-1/2 compress their reduce-scatter / all-reduce too
  c.zero.stage = 3;
  try {
    validate_config(c);
    ADD_FAILURE() << "comm_dtype accepted with FSDP";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero.stage = 3"), std::string::npos) << e.what();
  }
}

// ddp.compression through the Trainer: "bf16" is the same wire as
// precision.comm_dtype = "bf16" (bitwise the same run); "powersgd" at rank 2
// sends the 64x64 and 32x64 weights as factors (~14x fewer floats for
// them) with error feedback. Oracle: one process, fp32. PowerSGD must differ
// from fp32 DDP (the hook ran) yet reach a test loss within 5% of the
// oracle's after 50 steps (measured: see the printed line).
TEST(Compression, DdpCompressionKeyThroughTheTrainer) {
  const auto dir = testing::temp_dir("compression");
  TrainConfig one = mlp_config(dir, "one");
  one.ddp.mode = "none";
  const RunOutcome ref = train(one, 1);
  const RunOutcome plain = train(mlp_config(dir, "fp32"), 2);

  TrainConfig by_dtype = mlp_config(dir, "dtype");
  by_dtype.precision.comm_dtype = "bf16";
  TrainConfig by_key = mlp_config(dir, "key");
  apply_override(by_key, "ddp.compression=\"bf16\"");
  EXPECT_EQ(relative_diff(train(by_key, 2).params, train(by_dtype, 2).params), 0.0);

  TrainConfig psgd = mlp_config(dir, "powersgd");
  apply_override(psgd, "ddp.compression=\"powersgd\"");
  apply_override(psgd, "ddp.powersgd_rank=2");
  const RunOutcome low = train(psgd, 2);
  const double d_plain = relative_diff(plain.params, ref.params);
  const double d_low = relative_diff(low.params, ref.params);
  std::printf("[ measured ] after 50 steps vs 1 process: fp32 DDP %.3g, PowerSGD rank 2 %.3g; test loss %.4f "
              "(1 process %.4f, before training %.4f)\n",
              d_plain, d_low, low.test_loss_after, ref.test_loss_after, ref.test_loss_before);
  EXPECT_GT(d_low, 10 * d_plain) << "PowerSGD changed nothing: was the hook used?";
  EXPECT_NEAR(low.test_loss_after, ref.test_loss_after, 0.05 * ref.test_loss_after);
  EXPECT_LT(low.test_loss_after, ref.test_loss_before - 0.5 * (ref.test_loss_before - ref.test_loss_after));
}

TEST(Compression, OnlyBucketedDdpCompressesAndOneWireFormat) {
  TrainConfig c = mlp_config("/tmp", "x");
  apply_override(c, "ddp.compression=\"powersgd\"");
  validate_config(c);
  EXPECT_THROW(apply_override(c, "ddp.compression=\"topk\""), ConfigError);
  EXPECT_THROW(apply_override(c, "ddp.powersgd_rank=0"), ConfigError);
  c.zero.stage = 1;
  try {
    validate_config(c);
    ADD_FAILURE() << "powersgd accepted with ZeRO";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("zero.stage = 1"), std::string::npos) << e.what();
  }
  c.zero.stage = 0;
  c.precision.comm_dtype = "fp16";
  try {
    validate_config(c);
    ADD_FAILURE() << "ddp.compression and precision.comm_dtype disagreeing were accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("precision.comm_dtype"), std::string::npos) << e.what();
  }
  // The int8 wire: DDP and ZeRO-1/2, not ZeRO-3, pipelines or in-job elasticity.
  c.precision.comm_dtype = "fp32";
  apply_override(c, "ddp.compression=\"int8\"");
  for (int64_t stage : {0, 1, 2}) {
    c.zero.stage = stage;
    validate_config(c);
  }
  c.zero.stage = 3;
  EXPECT_THROW(validate_config(c), ConfigError);
  c.zero.stage = 0;
  c.precision.loss_scale = "dynamic";  // residuals in loss-scaled units
  EXPECT_THROW(validate_config(c), ConfigError);
  c.precision.loss_scale = "none";
  c.elastic.in_job = true;
  try {
    validate_config(c);
    ADD_FAILURE() << "the int8 wire accepted with elastic.in_job";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"int8\""), std::string::npos) << e.what();
  }
}

TrainConfig cnn_config(const std::string& dir, const std::string& name) {
  TrainConfig c = mlp_config(dir, name);
  c.model.kind = "cnn";
  c.model.channels = {4, 8};
  c.model.cnn_hidden = 16;
  c.model.batchnorm = true;
  c.data.synthetic_train_size = 256;
  c.data.global_batch_size = 16;
  c.optimizer.lr = 0.02;
  c.train.max_steps = 8;
  return c;
}

TEST(SyncBatchNorm, TwoRanksEqualOneProcessWithTheWholeBatch) {
  const auto dir = testing::temp_dir("syncbn");
  const RunOutcome oracle = train(cnn_config(dir, "one"), 1);
  TrainConfig sync = cnn_config(dir, "sync");
  sync.model.sync_batchnorm = true;
  const RunOutcome synced = train(sync, 2);
  const RunOutcome plain = train(cnn_config(dir, "plain"), 2);
  const double d_sync = relative_diff(synced.params, oracle.params);
  const double d_stats = relative_diff(synced.buffers, oracle.buffers);
  const double d_plain = relative_diff(plain.params, oracle.params);
  std::printf("CNN+BN 8 steps vs 1 process: sync_batchnorm params %.3g, running stats %.3g; plain BN params %.3g\n",
              d_sync, d_stats, d_plain);
  // Float32 sums in another order (per-rank sums of the statistics, the
  // gradient average): a few ulps per step.
  EXPECT_LT(d_sync, 1e-4);
  EXPECT_LT(d_stats, 1e-4);
  // Negative control: per-rank statistics (8 rows instead of 16) change the
  // training.
  EXPECT_GT(d_plain, 1e-3);
}

}  // namespace
}  // namespace paratrain::train
