// Tests of train/config: defaults, file values, `--set` overrides with type
// conversion, errors that name the key (unknown, wrong type, out of range),
// round trips through to_toml / to_json, and the shipped configs/*.toml.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/models/model.h"
#include "paratrain/train/config/config.h"
#include "tests/support/multi_rank.h"

namespace pt = paratrain::train;
using paratrain::ConfigError;

namespace {

// Runs `fn`, expects a ConfigError, and returns its message.
template <class Fn>
std::string config_error(Fn&& fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

}  // namespace

TEST(Config, EmptyFileGivesTheDocumentedDefaults) {
  const pt::TrainConfig c = pt::config_from_toml_string("");
  EXPECT_EQ(c, pt::TrainConfig{});
  EXPECT_EQ(c.model.kind, "mlp");
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{256, 128}));
  EXPECT_EQ(c.optimizer.kind, "sgd");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.05);
  EXPECT_EQ(c.data.batch_size, 64);
  EXPECT_EQ(c.train.epochs, 3);
  EXPECT_EQ(c.ddp.mode, "bucketed");
  EXPECT_DOUBLE_EQ(c.ddp.bucket_cap_mb, 25.0);
  EXPECT_FALSE(c.ddp.find_unused_parameters);
  EXPECT_TRUE(c.ddp.broadcast_buffers);
  EXPECT_EQ(c.world.backend, "auto");          // issue 23: the fastest backend that fits, logged
  EXPECT_EQ(c.train.preempt_signals, "auto");  // issue 28: SIGTERM and SIGINT checkpoint and exit 75
  EXPECT_TRUE(c.ps.staleness_aware_lr);        // issue 23: async and ssp at lr / staleness
  EXPECT_NO_THROW(pt::validate_config(c));
}

TEST(Config, FileValuesAreRead) {
  const auto c = pt::config_from_toml_string(R"(
    [run]
    name = "exp"
    seed = 17
    [model]
    kind = "cnn"
    channels = [8, 16, 32]
    [optimizer]
    kind = "adamw"
    lr = 3e-4
    betas = [0.8, 0.99]
    weight_decay = 1    # an integer is fine where a number is expected
    [data]
    dataset = "synthetic"
    shuffle = false
    [ddp]
    mode = "naive"
    bucket_cap_mb = 4
    first_bucket_cap_mb = 0.5
  )");
  EXPECT_EQ(c.run.name, "exp");
  EXPECT_EQ(c.run.seed, 17);
  EXPECT_EQ(c.model.kind, "cnn");
  EXPECT_EQ(c.model.channels, (std::vector<int64_t>{8, 16, 32}));
  EXPECT_EQ(c.optimizer.kind, "adamw");
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.8, 0.99}));
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 1.0);
  EXPECT_EQ(c.data.dataset, "synthetic");
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.ddp.mode, "naive");
  EXPECT_DOUBLE_EQ(c.ddp.bucket_cap_mb, 4.0);
  // Untouched keys keep their defaults.
  EXPECT_EQ(c.data.batch_size, 64);
}

TEST(Config, OverridesApplyWithTypeConversionAndWinOverTheFile) {
  const auto c = pt::config_from_toml_string("[optimizer]\nlr = 0.5\n",
                                             {"optimizer.lr=0.01", "model.hidden=[512, 64, 32]",
                                              "data.batch_size=32", "data.shuffle=false",
                                              "run.name=my run", "train.resume=\"auto\"",
                                              "optimizer.betas=0.5,0.9", " ddp.bucket_cap_mb = 2 "});
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 0.01);
  EXPECT_EQ(c.model.hidden, (std::vector<int64_t>{512, 64, 32}));
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_FALSE(c.data.shuffle);
  EXPECT_EQ(c.run.name, "my run");
  EXPECT_EQ(c.train.resume, "auto");
  EXPECT_EQ(c.optimizer.betas, (std::vector<double>{0.5, 0.9}));
  EXPECT_DOUBLE_EQ(c.ddp.bucket_cap_mb, 2.0);
  // Later overrides win over earlier ones; an empty list is allowed.
  const auto d = pt::config_from_toml_string("", {"model.hidden=[1]", "model.hidden=[]"});
  EXPECT_TRUE(d.model.hidden.empty());
}

TEST(Config, UnknownKeysAndSectionsAreNamedWithAHint) {
  auto msg = config_error([] { pt::config_from_toml_string("[optimizer]\nlrr = 0.1\n", {}, "x.toml"); });
  EXPECT_NE(msg.find("x.toml:2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("unknown key 'optimizer.lrr'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'optimizer.lr'"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("[optimiser]\nlr = 0.1\n"); });
  EXPECT_NE(msg.find("unknown section [optimiser]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'optimizer'"), std::string::npos) << msg;

  // A key in the wrong section points to the one it belongs to.
  msg = config_error([] { pt::config_from_toml_string("[data]\nepochs = 2\n"); });
  EXPECT_NE(msg.find("unknown key 'data.epochs'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'train.epochs'"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("", {"ddp.bucket_cap=5"}); });
  EXPECT_NE(msg.find("--set ddp.bucket_cap=5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'ddp.bucket_cap_mb'"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.lr"}); });
  EXPECT_NE(msg.find("expected key=value"), std::string::npos) << msg;
}

TEST(Config, WrongTypesNameKeyExpectedTypeAndWhatWasGiven) {
  auto msg = config_error([] { pt::config_from_toml_string("[optimizer]\nlr = \"fast\"\n"); });
  EXPECT_NE(msg.find("optimizer.lr expects a number, got string 'fast'"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("[data]\nbatch_size = 6.5\n"); });
  EXPECT_NE(msg.find("data.batch_size expects an integer, got float 6.5"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("[model]\nhidden = [256, \"x\"]\n"); });
  EXPECT_NE(msg.find("model.hidden expects a list of integers"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("[run]\nname = [1]\n"); });
  EXPECT_NE(msg.find("run.name expects a string, got array [ 1 ]"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("", {"data.shuffle=1"}); });
  EXPECT_NE(msg.find("data.shuffle expects a boolean (true or false), got integer 1"), std::string::npos)
      << msg;

  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.lr=abc"}); });
  EXPECT_NE(msg.find("optimizer.lr expects a number, got 'abc'"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("optimizer = 3\n"); });
  EXPECT_NE(msg.find("'optimizer' must be a section"), std::string::npos) << msg;

  msg = config_error([] { pt::config_from_toml_string("[run\nname = 1", {}, "bad.toml"); });
  EXPECT_NE(msg.find("bad.toml:1:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("not valid TOML"), std::string::npos) << msg;
}

TEST(Config, OutOfRangeValuesNameKeyAndAllowedValues) {
  auto msg = config_error([] { pt::config_from_toml_string("[optimizer]\nlr = -0.1\n"); });
  EXPECT_NE(msg.find("optimizer.lr = -0.1 is not allowed: must be a finite number > 0"), std::string::npos)
      << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.lr=0"}); });
  EXPECT_NE(msg.find("optimizer.lr = 0.0 is not allowed"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("[data]\nbatch_size = 0\n"); });
  EXPECT_NE(msg.find("data.batch_size = 0 is not allowed: must be in [1, 1099511627776]"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("[model]\nkind = \"rnn\"\n"); });
  EXPECT_NE(msg.find("model.kind = \"rnn\" is not allowed: allowed values are \"mlp\", \"cnn\""),
            std::string::npos)
      << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"ddp.mode=fast"}); });
  EXPECT_NE(msg.find("\"bucketed\", \"naive\", \"none\""), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.betas=[0.9]"}); });
  EXPECT_NE(msg.find("optimizer.betas = [0.9] is not allowed: needs exactly 2"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"model.hidden=[128,0]"}); });
  EXPECT_NE(msg.find("model.hidden"), std::string::npos) << msg;

  // Cross-key rules are checked after overrides (an override may fix them).
  msg = config_error([] { pt::config_from_toml_string("[optimizer]\nkind = \"adam\"\nnesterov = true\n"); });
  EXPECT_NE(msg.find("optimizer.nesterov"), std::string::npos) << msg;
  EXPECT_NO_THROW(pt::config_from_toml_string("[optimizer]\nkind = \"adam\"\nnesterov = true\n",
                                              {"optimizer.nesterov=false"}));

  // validate_config catches values set in code.
  pt::TrainConfig c;
  c.data.batch_size = -3;
  msg = config_error([&] { pt::validate_config(c); });
  EXPECT_NE(msg.find("data.batch_size = -3"), std::string::npos) << msg;
}

TEST(Config, MissingFileNamesThePath) {
  const auto msg = config_error([] { pt::load_config("/nonexistent/dir/cfg.toml", {}); });
  EXPECT_NE(msg.find("'/nonexistent/dir/cfg.toml' does not exist"), std::string::npos) << msg;
}

TEST(Config, ToTomlAndToJsonRoundTrip) {
  pt::TrainConfig c;
  c.run.name = "quote\" and \\ backslash";
  c.model.kind = "cnn";
  c.model.hidden = {};
  c.optimizer.lr = 0.1 + 0.2;  // not exactly representable in short decimal
  c.optimizer.betas = {0.5, 0.999999};
  c.optimizer.eps = 1e-12;
  c.ddp.bucket_cap_mb = 25;  // integral double: must print as 25.0 to stay a float
  c.train.resume = "auto";
  const std::string text = pt::to_toml(c);
  EXPECT_NE(text.find("[optimizer]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("bucket_cap_mb = 25.0"), std::string::npos) << text;
  EXPECT_EQ(pt::config_from_toml_string(text), c) << text;

  const nlohmann::json j = pt::to_json(c);
  EXPECT_EQ(j["optimizer"]["lr"].get<double>(), 0.1 + 0.2);
  EXPECT_EQ(j["model"]["kind"], "cnn");
  EXPECT_EQ(pt::config_from_json(j), c);
  EXPECT_EQ(pt::config_from_json(nlohmann::json::parse(j.dump())), c);
  nlohmann::json bad = j;
  bad["optimizer"]["lrr"] = 1;
  EXPECT_THROW(pt::config_from_json(bad), ConfigError);
  // Every key appears in both forms.
  for (const auto& key : pt::config_keys()) {
    const auto dot = key.find('.');
    EXPECT_TRUE(j[key.substr(0, dot)].contains(key.substr(dot + 1))) << key;
    EXPECT_NE(text.find("\n" + key.substr(dot + 1) + " = "), std::string::npos) << key;
  }
}

TEST(Config, ShippedConfigsParseAndBuildTheirModels) {
  const std::filesystem::path dir = std::filesystem::path(PARATRAIN_SOURCE_DIR) / "configs";
  const auto mlp = pt::load_config(dir / "fashion_mnist_mlp.toml", {});
  EXPECT_EQ(mlp.model.kind, "mlp");
  EXPECT_EQ(mlp.data.dataset, "fashion_mnist");
  const auto cnn = pt::load_config(dir / "fashion_mnist_cnn.toml", {"train.epochs=1"});
  EXPECT_EQ(cnn.model.kind, "cnn");
  EXPECT_EQ(cnn.train.epochs, 1);
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    ++files;
    const auto c = pt::load_config(entry.path(), {});
    auto model = pt::make_model(c);
    if (c.model.kind == "gpt") {  // token windows in, next-byte logits per position out
      EXPECT_EQ(model->forward(torch::zeros({2, c.model.seq_len}, torch::kLong)).sizes(),
                (std::vector<int64_t>{2, c.model.seq_len, 256}))
          << entry.path();
      continue;
    }
    EXPECT_EQ(model->forward(torch::zeros({2, 1, 28, 28})).sizes(), (std::vector<int64_t>{2, 10}))
        << entry.path();
  }
  EXPECT_GE(files, 2);
}

TEST(Config, MakeModelUsesTheSyntheticDataShape) {
  const auto c = pt::config_from_toml_string(
      "[data]\ndataset = \"synthetic\"\nsynthetic_channels = 3\nsynthetic_image_size = 8\n"
      "synthetic_classes = 5\n[model]\nhidden = [16]\n");
  auto mlp = pt::make_model(c);
  EXPECT_EQ(mlp->forward(torch::zeros({4, 3, 8, 8})).sizes(), (std::vector<int64_t>{4, 5}));
  auto cnn_config = c;
  cnn_config.model.kind = "cnn";
  auto cnn = pt::make_model(cnn_config);
  EXPECT_EQ(cnn->forward(torch::zeros({4, 3, 8, 8})).sizes(), (std::vector<int64_t>{4, 5}));
}

// ---- Bad inputs found by trying the tool as a new user would.

// Note [Numeric bounds] in config_ranges.h: a value that would overflow
// where the code converts it is refused at config time, naming the key.
TEST(ConfigBadInput, NumericKeysHaveBoundsNamedInTheError) {
  auto msg = config_error([] { pt::config_from_toml_string("[ddp]\nbucket_cap_mb = 1e300\n", {}, "x.toml"); });
  EXPECT_NE(msg.find("x.toml:2: ddp.bucket_cap_mb = 1e+300 is not allowed: must be a number in ["),
            std::string::npos) << msg;
  EXPECT_NE(msg.find("1 byte to 1 TiB"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"ddp.first_bucket_cap_mb=1e-300"}); });
  EXPECT_NE(msg.find("ddp.first_bucket_cap_mb = 1e-300 is not allowed"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("[optimizer]\nlr = inf\n"); });
  EXPECT_NE(msg.find("optimizer.lr = inf is not allowed: must be a finite number > 0"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.lr=nan"}); });
  EXPECT_NE(msg.find("optimizer.lr = nan is not allowed"), std::string::npos) << msg;
  // Seconds that would not fit as milliseconds in a 32-bit timeout.
  msg = config_error([] { pt::config_from_toml_string("", {"world.timeout_s=9223372036854775807"}); });
  EXPECT_NE(msg.find("world.timeout_s = 9223372036854775807 is not allowed: must be in [1, 604800]"),
            std::string::npos) << msg;
  // Every integer key but the seed refuses the largest int64, by name.
  for (const char* key : {"run.log_every", "model.cnn_hidden", "data.batch_size", "data.global_batch_size",
                          "data.prefetch", "data.synthetic_train_size", "data.synthetic_test_size",
                          "data.synthetic_channels", "data.synthetic_image_size", "data.synthetic_classes",
                          "train.epochs", "train.max_steps", "train.eval_every_epochs",
                          "train.checkpoint_every_steps", "train.keep_checkpoints", "parallel.dp", "parallel.tp",
                          "parallel.pp", "parallel.cp", "zero.unit_min_params"}) {
    const std::string set = std::string(key) + "=9223372036854775807";
    msg = config_error([&] { pt::config_from_toml_string("", {set}); });
    EXPECT_NE(msg.find(std::string(key) + " = 9223372036854775807 is not allowed: must be in"), std::string::npos)
        << msg;
  }
  msg = config_error([] { pt::config_from_toml_string("", {"model.hidden=[16777217, 4]"}); });
  EXPECT_NE(msg.find("model.hidden = [16777217, 4] is not allowed: every entry must be in [1, 16777216]"),
            std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.momentum=1.5"}); });
  EXPECT_NE(msg.find("optimizer.momentum = 1.5 is not allowed"), std::string::npos) << msg;
  EXPECT_NO_THROW(pt::config_from_toml_string("", {"run.seed=9223372036854775807", "ddp.bucket_cap_mb=1048576"}));
}

// Note [Float32 keys] in config_ranges.h: keys that become float32 tensors
// refuse what float32 cannot hold, at config time and by name (issue 23
// item 10: optimizer.lr = 1e300 failed mid-run naming no key).
TEST(ConfigBadInput, KeysThatBecomeFloat32TensorsStayInFloat32Range) {
  for (const char* key : {"optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "optimizer.clip_grad_norm",
                          "lr.min_lr"}) {
    for (const char* value : {"1e300", "1e39", "1e-300", "-1e300"}) {
      const std::string set = std::string(key) + "=" + value;
      const auto msg = config_error([&] { pt::config_from_toml_string("", {set}); });
      EXPECT_NE(msg.find(std::string(key) + " = "), std::string::npos) << msg;
      EXPECT_NE(msg.find("is not allowed: must be a finite number"), std::string::npos) << msg;
      if (value[0] != '-')
        EXPECT_NE(msg.find("within float32's range [1.17549e-38, 3.40282e+38]"), std::string::npos) << msg;
    }
  }
  auto msg = config_error([] { pt::config_from_toml_string("[optimizer]\nlr = 1e300\n", {}, "x.toml"); });
  EXPECT_NE(msg.find("x.toml:2: optimizer.lr = 1e+300 is not allowed: must be a finite number > 0 within "
                     "float32's range"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"precision.loss_scale=1e300"}); });
  EXPECT_NE(msg.find("precision.loss_scale = \"1e300\" is not allowed: a static scale must be within float32's "
                     "range"), std::string::npos) << msg;
  // The edges themselves and ordinary values pass; 0 stays "off".
  EXPECT_NO_THROW(pt::config_from_toml_string("", {"optimizer.lr=3.4e38", "optimizer.eps=1.2e-38",
                                                   "optimizer.weight_decay=0", "optimizer.clip_grad_norm=1e30",
                                                   "precision.loss_scale=65536"}));
}

TEST(ConfigBadInput, RunNameIsOneFolderInsideTheOutputDir) {
  for (const char* name : {"../../x", "..", ".", "/tmp/abs", "a/b", ".hidden", "./x"}) {
    const std::string set = std::string("run.name=") + name;
    const auto msg = config_error([&] { pt::config_from_toml_string("", {set}); });
    EXPECT_NE(msg.find("run.name = \"" + std::string(name) + "\" is not allowed: must be one folder name inside "
                       "run.output_dir"), std::string::npos) << msg;
  }
  const auto msg = config_error([] { pt::config_from_toml_string("[run]\nname = \"../escape\"\n"); });
  EXPECT_NE(msg.find("run.name"), std::string::npos) << msg;
  EXPECT_EQ(pt::config_from_toml_string("", {"run.name=exp-1.v2 (lr 0.1)"}).run.name, "exp-1.v2 (lr 0.1)");
}

TEST(ConfigBadInput, AScalarWhereAListBelongsShowsTheListSyntax) {
  auto msg = config_error([] { pt::config_from_toml_string("[model]\nhidden = 256\n", {}, "m.toml"); });
  EXPECT_NE(msg.find("m.toml:2: model.hidden expects a list of integers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("hidden = [256, 128] under [model] (one entry: [256])"), std::string::npos) << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"model.hidden=256"}); });
  EXPECT_NE(msg.find("--set model.hidden=256: model.hidden expects a list of integers"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--set model.hidden=[256,128] (one entry: --set model.hidden=[256])"), std::string::npos)
      << msg;
  msg = config_error([] { pt::config_from_toml_string("", {"optimizer.betas=0.9"}); });
  EXPECT_NE(msg.find("--set optimizer.betas=[0.9,0.999]"), std::string::npos) << msg;
  // Bracketed, and the comma form, still work.
  EXPECT_EQ(pt::config_from_toml_string("", {"model.hidden=[256]"}).model.hidden, (std::vector<int64_t>{256}));
  EXPECT_EQ(pt::config_from_toml_string("", {"model.hidden=64,32"}).model.hidden, (std::vector<int64_t>{64, 32}));
}

TEST(ConfigBadInput, ZeroKeysAreCheckedWithTheKeysTheyDependOn) {
  auto msg = config_error([] { pt::config_from_toml_string("[zero]\nstage = 2\n[ddp]\nmode = \"naive\"\n"); });
  EXPECT_NE(msg.find("zero.stage = 2 reduce-scatters gradients through the bucketed reducer, but ddp.mode = "
                     "\"naive\": set ddp.mode = \"bucketed\""), std::string::npos) << msg;
  EXPECT_NO_THROW(pt::config_from_toml_string("[zero]\nstage = 2\n"));
  EXPECT_NO_THROW(pt::config_from_toml_string("[ddp]\nmode = \"none\"\n"));

  EXPECT_EQ(pt::config_from_toml_string("", {"zero.unit_modules=fc0, fc1,conv_0"}).zero.unit_modules,
            "fc0, fc1,conv_0");
  for (const char* bad : {"fc0,,fc1", "fc0;fc1", "fc0,", "fc-1", "fc0,fc0"}) {
    const std::string set = std::string("zero.unit_modules=") + bad;
    msg = config_error([&] { pt::config_from_toml_string("", {set}); });
    EXPECT_NE(msg.find("zero.unit_modules = \"" + std::string(bad) + "\" is not allowed"), std::string::npos)
        << msg;
  }
}

// `paratrain train --log-level bogus` used to mute every line (spdlog reads
// an unknown level as "off"); it is a usage error now, exit code 2.
TEST(ConfigBadInput, AnUnknownLogLevelIsAUsageErrorListingTheLevels) {
  const auto dir = paratrain::testing::temp_dir("log-level");
  const auto config = dir + "/c.toml";
  std::ofstream(config) << "[data]\ndataset = \"synthetic\"\n[train]\nmax_steps = 1\n";
  const auto r = paratrain::testing::run_cli({"train", "-c", config, "--log-level", "bogus"});
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--log-level 'bogus' is not a log level; use one of: trace, debug, info, warn, error, "
                          "critical, off"), std::string::npos) << r.output;
  // The environment variable that overrides the flag is checked the same way.
  setenv("PARATRAIN_LOG_LEVEL", "loud", 1);
  const auto e = paratrain::testing::run_cli({"train", "-c", config});
  unsetenv("PARATRAIN_LOG_LEVEL");
  EXPECT_EQ(e.exit_code, 2) << e.output;
  EXPECT_NE(e.output.find("PARATRAIN_LOG_LEVEL 'loud' is not a log level"), std::string::npos) << e.output;
}
