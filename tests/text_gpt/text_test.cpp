// The text dataset: the token cache round trip, the windows, the corpus
// listing, and what happens to a damaged cache.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "paratrain/core/error.h"
#include "paratrain/data/text.h"

namespace paratrain::data {
namespace {
namespace fs = std::filesystem;

class TextTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("paratrain_text_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_ / "corpus" / "sub");
  }
  void TearDown() override { fs::remove_all(dir_); }

  static void write(const fs::path& p, const std::string& bytes) {
    std::ofstream(p, std::ios::binary) << bytes;
  }
  static std::string bytes_of(const at::Tensor& t) {
    auto c = t.contiguous();
    return std::string(reinterpret_cast<const char*>(c.data_ptr<uint8_t>()), c.numel());
  }

  fs::path dir_;
};

TEST_F(TextTest, ListingIsSortedRecursiveAndSkipsBinariesAndLinks) {
  write(dir_ / "corpus" / "b", "second\n");
  write(dir_ / "corpus" / "a", "first\n");
  write(dir_ / "corpus" / "sub" / "c", "third\n");
  write(dir_ / "corpus" / "a.dat", std::string("\0\0\0\2idx", 7));
  fs::create_symlink("a", dir_ / "corpus" / "a.u8");
  const auto files = list_text_files(dir_ / "corpus");
  ASSERT_EQ(files.size(), 3u);
  EXPECT_EQ(files[0].filename(), "a");
  EXPECT_EQ(files[1].filename(), "b");
  EXPECT_EQ(files[2], dir_ / "corpus" / "sub" / "c");
  EXPECT_THROW(list_text_files(dir_ / "missing"), DataError);
  fs::create_directories(dir_ / "empty");
  EXPECT_THROW(list_text_files(dir_ / "empty"), DataError);
}

TEST_F(TextTest, TokensAreTheBytesOfTheFilesInOrder) {
  std::string all_bytes;
  for (int i = 0; i < 256; ++i) all_bytes.push_back(static_cast<char>(255 - i));  // 255 down to 0
  write(dir_ / "corpus" / "a", "Hello, world.\n");
  write(dir_ / "corpus" / "b", all_bytes.substr(0, 255) + "\xc3\xa9t\xc3\xa9");  // no NUL in the head: text
  const auto cache = build_token_cache(dir_ / "corpus", dir_ / "cache");
  EXPECT_EQ(cache.parent_path(), dir_ / "cache");
  const auto tokens = map_token_file(cache);
  EXPECT_EQ(tokens.scalar_type(), torch::kByte);
  EXPECT_EQ(bytes_of(tokens), "Hello, world.\n" + all_bytes.substr(0, 255) + "\xc3\xa9t\xc3\xa9");
  // A second build reuses the file; a changed corpus gets a new one.
  const auto before = fs::last_write_time(cache);
  EXPECT_EQ(build_token_cache(dir_ / "corpus", dir_ / "cache"), cache);
  EXPECT_EQ(fs::last_write_time(cache), before);
  write(dir_ / "corpus" / "a", "Hello, changed world.\n");
  const auto rebuilt = build_token_cache(dir_ / "corpus", dir_ / "cache");
  EXPECT_NE(rebuilt, cache);
  EXPECT_EQ(bytes_of(map_token_file(rebuilt)).substr(0, 22), "Hello, changed world.\n");
}

TEST_F(TextTest, WindowsCoverTheCorpusAndTargetsAreShiftedByOne) {
  auto tokens = torch::arange(0, 103, torch::kLong);
  const int64_t s = 10;
  auto windows = make_windows(tokens, s);
  ASSERT_EQ(windows.size(), (103 - 1) / s);
  // Every input token 0 .. rows*S-1 exactly once, in order, and each target
  // the token after its input.
  EXPECT_TRUE(torch::equal(windows.inputs.reshape({-1}), torch::arange(0, 100, torch::kLong)));
  EXPECT_TRUE(torch::equal(windows.targets, windows.inputs + 1));
  // Windows of a slice start at the slice.
  auto tail = make_windows(tokens.slice(0, 50), s);
  EXPECT_EQ(tail.inputs[0][0].item<int64_t>(), 50);
  EXPECT_EQ(tail.size(), (53 - 1) / s);
  // Gathering rows (what the Loader does) copies whole windows.
  auto batch = gather(windows, torch::tensor({3, 0}, torch::kLong));
  EXPECT_TRUE(torch::equal(batch.inputs[0], torch::arange(30, 40, torch::kLong)));
}

TEST_F(TextTest, LoadTextSplitsTheLastPartForValidation) {
  std::string text;
  for (int i = 0; i < 400; ++i) text += static_cast<char>('a' + i % 26);
  write(dir_ / "corpus" / "a", text);
  auto d = load_text({.source = dir_ / "corpus", .cache_dir = dir_ / "cache", .seq_len = 8,
                      .validation_fraction = 0.1});
  EXPECT_EQ(d.tokens, 400);
  EXPECT_EQ(d.train.size(), (360 - 1) / 8);
  EXPECT_EQ(d.validation.size(), (40 - 1) / 8);
  EXPECT_EQ(bytes_of(d.validation.inputs[0]), text.substr(360, 8));
  EXPECT_EQ(bytes_of(d.train.targets[2]), text.substr(17, 8));
  // Too small for the window length: a clear error, not an empty split.
  EXPECT_THROW(load_text({.source = dir_ / "corpus", .cache_dir = dir_ / "cache", .seq_len = 64,
                          .validation_fraction = 0.1}),
               DataError);
}

TEST_F(TextTest, TruncatedOrCorruptCacheIsReportedAndRebuilt) {
  write(dir_ / "corpus" / "a", std::string(1000, 'x') + "the end");
  const auto cache = build_token_cache(dir_ / "corpus", dir_ / "cache");
  const auto full_size = fs::file_size(cache);
  fs::resize_file(cache, full_size - 100);
  try {
    map_token_file(cache);
    FAIL() << "a truncated cache was mapped";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  // Loading rebuilds it from the corpus.
  auto d = load_text({.source = dir_ / "corpus", .cache_dir = dir_ / "cache", .seq_len = 16});
  EXPECT_EQ(fs::file_size(cache), full_size);
  EXPECT_EQ(d.tokens, 1007);

  // A flipped token byte: same size, checksum mismatch.
  {
    std::fstream f(cache, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('y');
  }
  try {
    map_token_file(cache);
    FAIL() << "a corrupt cache was mapped";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bytes_of(map_token_file(build_token_cache(dir_ / "corpus", dir_ / "cache"))).substr(490, 20),
            std::string(20, 'x'));
}

}  // namespace
}  // namespace paratrain::data
