// `paratrain config --list`: every schema key is listed with a type, a
// default and a meaning (a key added without a doc line fails here), the
// CLI prints them all, and docs/config-reference.md is the current output.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>

#include "paratrain/train/config/config.h"
#include "paratrain/train/config/config_reference.h"
#include "tests/support/multi_rank.h"

namespace pt = paratrain::train;

TEST(ConfigReference, EveryKeyHasTypeDefaultAndMeaning) {
  const auto reference = pt::config_reference();
  const auto keys = pt::config_keys();
  ASSERT_EQ(reference.size(), keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const auto& k = reference[i];
    EXPECT_EQ(k.key, keys[i]);
    EXPECT_FALSE(k.type.empty()) << k.key;
    EXPECT_FALSE(k.default_value.empty()) << k.key;
    // A meaning, not a placeholder: at least a few words.
    EXPECT_GE(k.doc.size(), 8u) << k.key << " has no documentation: add its doc line in its section's schema rows (train/config/<group>_section.cpp)";
  }
}

TEST(ConfigReference, CliListsEveryKey) {
  const auto result = paratrain::testing::run_cli({"config", "--list"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const auto& key : pt::config_keys()) EXPECT_NE(result.output.find(key), std::string::npos) << key;
  EXPECT_NE(result.output.find("optimizer.lr  "), std::string::npos);
}

TEST(ConfigReference, DocsPageIsGenerated) {
  std::ifstream in(std::string(PARATRAIN_SOURCE_DIR) + "/docs/config-reference.md");
  ASSERT_TRUE(in) << "docs/config-reference.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), pt::config_reference_markdown())
      << "docs/config-reference.md is out of date: build/paratrain config --list --markdown > docs/config-reference.md";
}
