// The [user] table of a config (TrainConfig::user): a program's own keys of
// every type, read with get<T>(), overridden with --set, saved with the run
// and read back, and a mistyped or mistyped-kind key named in the error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"

namespace paratrain::train {
namespace {

TEST(UserTable, KeysOfEveryTypeParseOverrideRoundTripAndNameMistakes) {
  TrainConfig c = config_from_toml_string(
      "[user]\nhidden = 16\nrate = 0.5\nuse_bias = true\nactivation = \"gelu\"\nwidths = [8, 4]\n"
      "scales = [0.5, 2]\nhead.width = 3\n[user.tail]\ndepth = 2\n",
      {"user.hidden=32", "user.tag=exp1", "user.extra=[1.5, 2.5]"});
  EXPECT_EQ(c.user.get<int64_t>("hidden"), 32);
  EXPECT_EQ(c.user.get<int>("hidden"), 32);
  EXPECT_DOUBLE_EQ(c.user.get<double>("rate"), 0.5);
  EXPECT_DOUBLE_EQ(c.user.get<double>("hidden"), 32.0);  // an integer reads as a float
  EXPECT_TRUE(c.user.get<bool>("use_bias"));
  EXPECT_EQ(c.user.get<std::string>("activation"), "gelu");
  EXPECT_EQ(c.user.get<std::string>("tag"), "exp1");  // a bare word is a string
  EXPECT_EQ(c.user.get<std::vector<int64_t>>("widths"), (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(c.user.get<std::vector<double>>("scales"), (std::vector<double>{0.5, 2.0}));
  EXPECT_EQ(c.user.get<std::vector<double>>("extra"), (std::vector<double>{1.5, 2.5}));
  EXPECT_EQ(c.user.get<int64_t>("head.width"), 3);
  EXPECT_EQ(c.user.get<int64_t>("tail.depth"), 2);
  EXPECT_EQ(c.user.get<int64_t>("missing", 9), 9);
  // Saved with the run and read back unchanged, from TOML and from JSON.
  EXPECT_EQ(config_from_toml_string(to_toml(c)), c);
  EXPECT_EQ(config_from_json(to_json(c)), c);
  auto error_of = [&](auto&& f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of([&] { c.user.get<int64_t>("hiden"); }).find("user.hiden is not set"), std::string::npos);
  EXPECT_NE(error_of([&] { c.user.get<int64_t>("hiden"); }).find("hidden"), std::string::npos);
  EXPECT_NE(error_of([&] { c.user.get<int64_t>("activation"); }).find("user.activation = \"gelu\" is not an integer"),
            std::string::npos);
  // Lists of strings too; a list that mixes strings and numbers is refused.
  const TrainConfig named = config_from_toml_string("[user]\nnames = [\"a\", \"b\"]\n");
  EXPECT_EQ(named.user.get<std::vector<std::string>>("names"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(config_from_toml_string(to_toml(named)), named);
  EXPECT_EQ(config_from_json(to_json(named)), named);
  EXPECT_NE(error_of([&] { named.user.get<std::vector<int64_t>>("names"); }).find("is not a list of integers"),
            std::string::npos);
  EXPECT_NE(error_of([&] { config_from_toml_string("[user]\nnames = [\"a\", 1]\n"); })
                .find("lists of integers, floats or strings"),
            std::string::npos);
}

}  // namespace
}  // namespace paratrain::train
