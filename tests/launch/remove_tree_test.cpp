// core::remove_tree (the launcher's and the checkpoints' replacement for
// std::filesystem::remove_all, see remove_tree.h): deletes a whole tree,
// never follows a symbolic link out of it, and a missing path is no error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "paratrain/core/remove_tree.h"
#include "tests/support/multi_rank.h"

namespace paratrain {
namespace {

namespace fs = std::filesystem;

TEST(RemoveTree, DeletesNestedFilesAndFoldersButNotWhatALinkPointsTo) {
  const fs::path base = testing::temp_dir("remove-tree");
  const fs::path root = base / "run";
  fs::create_directories(root / "a" / "b" / "c");
  std::ofstream(root / "top.txt") << "x";
  std::ofstream(root / "a" / "b" / "c" / "deep.bin") << "y";
  const fs::path outside = base / "keep";
  fs::create_directories(outside);
  std::ofstream(outside / "precious.txt") << "z";
  fs::create_directory_symlink(outside, root / "a" / "link");

  std::error_code ec;
  core::remove_tree(root, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(fs::symlink_status(root)));
  // The link went, its target stayed: the walk did not follow it.
  EXPECT_TRUE(fs::exists(outside / "precious.txt"));

  core::remove_tree(root, ec);  // gone already
  EXPECT_FALSE(ec) << ec.message();
  core::remove_tree(outside, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(outside));
}

TEST(RemoveTree, DeletesASingleFile) {
  const fs::path file = fs::path(testing::temp_dir("remove-tree-file")) / "one.txt";
  std::ofstream(file) << "x";
  std::error_code ec;
  core::remove_tree(file, ec);
  EXPECT_FALSE(ec) << ec.message();
  EXPECT_FALSE(fs::exists(file));
}

}  // namespace
}  // namespace paratrain
