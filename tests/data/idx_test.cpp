// IDX reader: round trips on files written byte by byte (gzip and plain, all
// element types), and the errors a corrupt or truncated file must produce.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/torch.h>

#include <limits>

#include "expect_error.h"
#include "idx_files.h"
#include "paratrain/core/error.h"
#include "paratrain/data/idx.h"
#include "tests/support/multi_rank.h"

namespace paratrain::data {
namespace {

using testing::big_endian;
using testing::Bytes;
using testing::expect_error;
using testing::idx_file;
using testing::write_gz;
using testing::write_plain;

std::string dir() {
  static const std::string d = paratrain::testing::temp_dir("paratrain-idx");
  return d;
}

std::string path(const std::string& name) { return dir() + "/" + name; }

TEST(Idx, Uint8Rank3GzipRoundTrip) {
  Bytes body;
  for (int i = 0; i < 2 * 3 * 4; ++i) body.push_back(static_cast<uint8_t>(i * 11 + 3));
  write_gz(path("images.gz"), idx_file(0x08, {2, 3, 4}, body));

  const at::Tensor t = read_idx(path("images.gz"), {IdxType::kUInt8, 3});
  ASSERT_EQ(t.scalar_type(), at::kByte);
  ASSERT_EQ(t.sizes(), at::IntArrayRef({2, 3, 4}));
  // Row-major order: element [i][j][k] is body[i*12 + j*4 + k].
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(t[i][j][k].item<int>(), body[i * 12 + j * 4 + k]);
}

TEST(Idx, Uint8Rank1PlainFileIsAccepted) {
  write_plain(path("labels"), idx_file(0x08, {5}, {9, 0, 0, 3, 255}));
  const at::Tensor t = read_idx(path("labels"), {IdxType::kUInt8, 1});
  EXPECT_TRUE(t.equal(torch::tensor({9, 0, 0, 3, 255}, torch::kByte)));
}

TEST(Idx, MultiByteTypesAreBigEndian) {
  const std::vector<int32_t> ints = {1, -2, 0x01020304, std::numeric_limits<int32_t>::min()};
  write_gz(path("ints.gz"), idx_file(0x0C, {2, 2}, big_endian(ints)));
  EXPECT_TRUE(read_idx(path("ints.gz")).equal(torch::tensor(ints, torch::kInt).view({2, 2})));

  const std::vector<int16_t> shorts = {1, -1, 0x0102};
  write_gz(path("shorts.gz"), idx_file(0x0B, {3}, big_endian(shorts)));
  EXPECT_TRUE(read_idx(path("shorts.gz")).equal(torch::tensor({1, -1, 0x0102}, torch::kShort)));

  const std::vector<float> floats = {1.5f, -0.25f, 1e30f};
  write_plain(path("floats"), idx_file(0x0D, {3}, big_endian(floats)));
  EXPECT_TRUE(read_idx(path("floats")).equal(torch::tensor(floats)));

  const std::vector<double> doubles = {3.25, -1e-300};
  write_gz(path("doubles.gz"), idx_file(0x0E, {1, 2}, big_endian(doubles)));
  const at::Tensor d = read_idx(path("doubles.gz"));
  EXPECT_EQ(d.scalar_type(), at::kDouble);
  EXPECT_EQ(d[0][0].item<double>(), 3.25);
  EXPECT_EQ(d[0][1].item<double>(), -1e-300);

  write_gz(path("signed.gz"), idx_file(0x09, {2}, {0xff, 0x7f}));
  EXPECT_TRUE(read_idx(path("signed.gz")).equal(torch::tensor({-1, 127}, torch::kChar)));
}

RC_GTEST_PROP(Idx, RandomUint8ArraysRoundTrip, ()) {
  const auto rank = *rc::gen::inRange(1, 4);
  const auto dims = *rc::gen::container<std::vector<uint32_t>>(rank, rc::gen::inRange<uint32_t>(0, 7));
  size_t numel = 1;
  for (auto d : dims) numel *= d;
  const auto body = *rc::gen::container<Bytes>(numel, rc::gen::arbitrary<uint8_t>());
  const bool gz = *rc::gen::arbitrary<bool>();
  const std::string file = path(gz ? "prop.gz" : "prop");
  (gz ? write_gz : write_plain)(file, idx_file(0x08, dims, body));

  const at::Tensor t = read_idx(file, {IdxType::kUInt8, rank});
  RC_ASSERT(t.dim() == rank);
  for (int i = 0; i < rank; ++i) RC_ASSERT(t.size(i) == int64_t{dims[i]});
  const auto* data = t.contiguous().data_ptr<uint8_t>();
  RC_ASSERT(Bytes(data, data + numel) == body);
}

TEST(Idx, WrongMagicNamesFileAndBothValues) {
  write_gz(path("labels.gz"), idx_file(0x08, {3}, {1, 2, 3}));
  expect_error<DataError>([] { read_idx(path("labels.gz"), {IdxType::kUInt8, 3}); },
                          {path("labels.gz"), "bad magic number 0x00000801", "expected 0x00000803"});
  write_gz(path("ints3.gz"), idx_file(0x0C, {1}, big_endian(std::vector<int32_t>{7})));
  expect_error<DataError>([] { read_idx(path("ints3.gz"), {IdxType::kUInt8, 1}); },
                          {path("ints3.gz"), "0x00000c01", "int32", "expected 0x00000801"});
}

TEST(Idx, NonIdxFileIsRejected) {
  write_plain(path("text"), {'h', 'e', 'l', 'l', 'o', '\n', 0, 0});
  expect_error<DataError>([] { read_idx(path("text")); }, {path("text"), "not an IDX file", "0x68656c6c"});
  // Zero bytes but an unknown type code (0x0A) and rank 0.
  write_plain(path("type0a"), {0, 0, 0x0A, 1, 0, 0, 0, 0});
  expect_error<DataError>([] { read_idx(path("type0a")); }, {"not an IDX file", "0x00000a01"});
  write_plain(path("rank0"), {0, 0, 0x08, 0});
  expect_error<DataError>([] { read_idx(path("rank0")); }, {"not an IDX file"});
}

TEST(Idx, TruncatedBodySaysExpectedAndFoundBytes) {
  Bytes body(50, 7);  // header says 3*4*5 = 60 bytes
  write_gz(path("short.gz"), idx_file(0x08, {3, 4, 5}, body));
  expect_error<DataError>([] { read_idx(path("short.gz")); },
                          {path("short.gz"), "truncated", "needs 60 bytes", "found 50"});
  write_plain(path("short"), idx_file(0x08, {3, 4, 5}, body));
  expect_error<DataError>([] { read_idx(path("short")); },
                          {path("short"), "truncated", "needs 60 bytes", "found 50"});
  // Cut inside the header's dimensions.
  write_plain(path("short_header"), {0, 0, 8, 3, 0, 0, 0, 2, 0});
  expect_error<DataError>([] { read_idx(path("short_header")); },
                          {path("short_header"), "truncated", "12 bytes of dimensions, found 5"});
  write_plain(path("empty"), {});
  expect_error<DataError>([] { read_idx(path("empty")); }, {path("empty"), "truncated", "found 0"});
}

TEST(Idx, CutGzipStreamIsTruncated) {
  Bytes body(4000);
  for (size_t i = 0; i < body.size(); ++i) body[i] = static_cast<uint8_t>((i * 7919) >> 3);
  write_gz(path("whole.gz"), idx_file(0x08, {4000}, body));
  Bytes gz = testing::read_plain(path("whole.gz"));
  ASSERT_GT(gz.size(), 200u);
  gz.resize(gz.size() / 2);
  write_plain(path("cut.gz"), gz);
  expect_error<DataError>([] { read_idx(path("cut.gz")); }, {path("cut.gz"), "truncated", "needs 4000 bytes"});
}

TEST(Idx, GzipChecksumMismatchIsCorrupt) {
  write_gz(path("crc.gz"), idx_file(0x08, {6}, {1, 2, 3, 4, 5, 6}));
  Bytes gz = testing::read_plain(path("crc.gz"));
  gz[gz.size() - 8] ^= 0xff;  // the trailer is CRC32 then ISIZE, 4 bytes each
  write_plain(path("crc.gz"), gz);
  expect_error<DataError>([] { read_idx(path("crc.gz")); }, {path("crc.gz"), "corrupt gzip stream"});
}

TEST(Idx, TrailingBytesAreRejected) {
  write_gz(path("long.gz"), idx_file(0x08, {2}, {1, 2, 3, 4, 5}));
  expect_error<DataError>([] { read_idx(path("long.gz")); },
                          {path("long.gz"), "3 extra bytes", "after the 2 bytes"});
}

TEST(Idx, ImpossibleHeaderFailsBeforeAllocating) {
  // 2^32-1 cubed: overflows any size.
  write_plain(path("huge"), idx_file(0x08, {0xffffffffu, 0xffffffffu, 0xffffffffu}, {}));
  expect_error<DataError>([] { read_idx(path("huge")); }, {path("huge"), "impossible shape"});
  // 4 GB claimed by a tiny gzip file: refused from the compressed size.
  write_gz(path("claims.gz"), idx_file(0x08, {65536, 65536}, {1, 2, 3}));
  expect_error<DataError>([] { read_idx(path("claims.gz")); },
                          {path("claims.gz"), "needs 4294967296 bytes"});
  // Same claim in a plain file: refused from the file size.
  write_plain(path("claims"), idx_file(0x08, {65536, 65536}, {1, 2, 3}));
  expect_error<DataError>([] { read_idx(path("claims")); },
                          {path("claims"), "truncated", "needs 4294967296 bytes", "found 3"});
}

TEST(Idx, MissingFileIsNamed) {
  expect_error<DataError>([] { read_idx(path("nope.gz")); }, {path("nope.gz"), "does not exist"});
  expect_error<DataError>([] { read_idx(dir()); }, {dir(), "is a directory"});
}

TEST(Idx, MagicNumberLayout) {
  EXPECT_EQ(idx_magic(IdxType::kUInt8, 3), 0x00000803u);
  EXPECT_EQ(idx_magic(IdxType::kUInt8, 1), 0x00000801u);
  EXPECT_EQ(idx_magic(IdxType::kFloat64, 2), 0x00000E02u);
}

}  // namespace
}  // namespace paratrain::data
