// Tests of the safetensors reader/writer: round trips over dtypes and shapes,
// the exact byte layout (checked by hand, not by our reader), files written by
// hand the way other writers lay them out, every kind of corruption, and that
// a write failing midway leaves the previous file intact.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/checkpoint/safetensors.h"
#include "tests/support/multi_rank.h"

namespace ck = paratrain::checkpoint;
namespace fs = std::filesystem;
using paratrain::CheckpointError;

namespace {

// A fresh folder per test, removed when the test binary exits.
struct TempDir {
  fs::path path = paratrain::testing::temp_dir("paratrain_st");
};

std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A safetensors file assembled by hand: length, JSON as given, data.
std::vector<uint8_t> make_file(const std::string& json, const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(n >> (8 * i)));
  out.insert(out.end(), json.begin(), json.end());
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::string parse_error(const std::vector<uint8_t>& bytes) {
  try {
    ck::parse_safetensors(bytes, "bad.safetensors");
  } catch (const CheckpointError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a CheckpointError";
  return "";
}

// Two tensors, 8 bytes each: a = F32 [1.0, 2.0], b = I64 [-1].
const std::vector<uint8_t> kData = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40,
                                    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};

}  // namespace

TEST(Safetensors, RoundTripsManyDtypesShapesAndMetadata) {
  TempDir dir;
  torch::manual_seed(3);
  ck::SafetensorsContents in;
  in.tensors["f32"] = torch::randn({2, 3});
  in.tensors["f64"] = torch::randn({5}, torch::kDouble);
  in.tensors["i64_scalar"] = torch::scalar_tensor(-123456789012345, torch::kLong);
  in.tensors["i32_empty"] = torch::empty({0, 4}, torch::kInt);
  in.tensors["u8"] = torch::arange(7, torch::kByte);
  in.tensors["i8"] = torch::arange(-3, 3, torch::kChar);
  in.tensors["i16"] = torch::arange(-300, 300, 7, torch::kShort);
  in.tensors["bf16"] = torch::randn({3, 1}).to(torch::kBFloat16);
  in.tensors["f16"] = torch::randn({4}).to(torch::kHalf);
  in.tensors["bool"] = torch::tensor({true, false, true});
  in.tensors["transposed"] = torch::randn({3, 4}).t();  // non-contiguous input
  in.tensors["nested/name.with dots"] = torch::ones({1, 1, 2});
  in.metadata = {{"format", "test"}, {"json", R"({"a": [1, 2]})"}, {"unicode", "αβγ"}};
  const fs::path file = dir.path / "x.safetensors";
  ck::write_safetensors(file, in);
  const auto bytes = read_bytes(file);
  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(bytes.at(i)) << (8 * i);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "the data section must start 8-byte aligned";

  const auto out = ck::read_safetensors(file);
  auto metadata = out.metadata;
  EXPECT_EQ(metadata.erase(ck::kDataChecksumKey), 1u) << "written by default";
  EXPECT_EQ(metadata, in.metadata);
  ASSERT_EQ(out.tensors.size(), in.tensors.size());
  for (const auto& [name, t] : in.tensors) {
    const auto& u = out.tensors.at(name);
    EXPECT_EQ(u.scalar_type(), t.scalar_type()) << name;
    EXPECT_EQ(u.sizes(), t.sizes()) << name;
    EXPECT_TRUE(torch::equal(u, t)) << name;
  }
  EXPECT_EQ(ck::read_safetensors_metadata(file), out.metadata);
  // Equal contents give identical bytes (sorted names, no timestamps).
  ck::write_safetensors(dir.path / "y.safetensors", in);
  EXPECT_EQ(read_bytes(file), read_bytes(dir.path / "y.safetensors"));
}

TEST(Safetensors, WritesTheDocumentedByteLayout) {
  TempDir dir;
  ck::SafetensorsContents in;
  in.tensors["b"] = torch::tensor({int64_t{-1}});
  in.tensors["a"] = torch::tensor({1.0f, 2.0f});
  in.metadata["k"] = "v";
  const fs::path file = dir.path / "layout.safetensors";
  ck::SafetensorsWriteOptions plain;
  plain.data_checksum = false;  // the format alone, without our metadata key
  ck::write_safetensors(file, in, plain);
  const auto bytes = read_bytes(file);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(bytes[i]) << (8 * i);  // little-endian u64
  ASSERT_EQ(bytes.size(), 8 + n + 16);
  EXPECT_EQ((8 + n) % 8, 0u);
  const std::string header(bytes.begin() + 8, bytes.begin() + 8 + n);
  EXPECT_EQ(header.front(), '{');
  const auto last = header.find_last_not_of(' ');
  EXPECT_EQ(header[last], '}');
  EXPECT_LT(header.size() - last - 1, 8u) << "padding is under 8 spaces";
  const auto j = nlohmann::json::parse(header);
  EXPECT_EQ(j, nlohmann::json::parse(R"({
      "__metadata__": {"k": "v"},
      "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]}})"));
  EXPECT_EQ(std::vector<uint8_t>(bytes.end() - 16, bytes.end()), kData);
}

TEST(Safetensors, ReadsFilesLaidOutByOtherWriters) {
  // No padding, data of `b` before `a`, keys in another order, extra spaces.
  const std::string json =
      R"({ "b" : {"shape":[1],"dtype":"I64","data_offsets":[0,8]},)"
      R"("a":{"data_offsets":[8,16],"dtype":"F32","shape":[2]}, "__metadata__":{"x":"1"}})";
  std::vector<uint8_t> data(kData.begin() + 8, kData.end());
  data.insert(data.end(), kData.begin(), kData.begin() + 8);
  const auto c = ck::parse_safetensors(make_file(json, data), "handmade");
  EXPECT_TRUE(torch::equal(c.tensors.at("a"), torch::tensor({1.0f, 2.0f})));
  EXPECT_TRUE(torch::equal(c.tensors.at("b"), torch::tensor({int64_t{-1}})));
  EXPECT_EQ(c.metadata.at("x"), "1");
  // An empty file body (no tensors) is valid too.
  EXPECT_TRUE(ck::parse_safetensors(make_file("{}", {}), "empty").tensors.empty());
}

TEST(Safetensors, CorruptFilesAreRejectedWithTheProblemNamed) {
  const std::string good = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}})";
  ASSERT_NO_THROW(ck::parse_safetensors(make_file(good, kData), "good"));

  auto truncated = make_file(good, kData);
  truncated.resize(truncated.size() - 4);
  auto msg = parse_error(truncated);
  EXPECT_NE(msg.find("bad.safetensors"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated: header says 16 bytes of data, file has 12"), std::string::npos) << msg;

  EXPECT_NE(parse_error({1, 2, 3}).find("fewer than the 8-byte header length"), std::string::npos);

  auto huge = make_file(good, kData);
  huge[6] = 0x7f;  // header length ~ 2^54
  EXPECT_NE(parse_error(huge).find("corrupt header length"), std::string::npos);
  auto long_by_one = make_file(good, kData);
  long_by_one[0] += static_cast<uint8_t>(kData.size() + 1);  // points past the end of the file
  EXPECT_NE(parse_error(long_by_one).find("corrupt header length"), std::string::npos);

  msg = parse_error(make_file(R"({"a":{"dtype":"F32",)", kData));
  EXPECT_NE(msg.find("not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(parse_error(make_file("[1, 2]", {})).find("must be a JSON object"), std::string::npos);

  auto with = [&](const std::string& from, const std::string& to) {
    std::string j = good;
    j.replace(j.find(from), from.size(), to);
    return parse_error(make_file(j, kData));
  };
  msg = with("[8,16]", "[8,24]");  // end past the data
  EXPECT_NE(msg.find("tensor 'b': shape [1] of I64 needs 8 bytes, data_offsets [8, 24] give 16"), std::string::npos)
      << msg;
  msg = with(R"("shape":[1],"data_offsets":[8,16])", R"("shape":[2],"data_offsets":[8,24])");
  EXPECT_NE(msg.find("truncated: header says 24 bytes of data, file has 16"), std::string::npos) << msg;
  msg = with("[8,16]", "[16,8]");
  EXPECT_NE(msg.find("end before they begin"), std::string::npos) << msg;
  msg = with("[8,16]", "[4,12]");  // overlaps a
  EXPECT_NE(msg.find("overlapping or a hole"), std::string::npos) << msg;
  msg = with(R"("dtype":"I64")", R"("dtype":"Q7")");
  EXPECT_NE(msg.find("tensor 'b': unknown dtype 'Q7'"), std::string::npos) << msg;
  msg = with(R"("dtype":"I64")", R"("dtype":"U64")");
  EXPECT_NE(msg.find("dtype U64 has no LibTorch equivalent"), std::string::npos) << msg;
  msg = with(R"("shape":[1])", R"("shape":[-1])");
  EXPECT_NE(msg.find("non-negative integer"), std::string::npos) << msg;
  msg = with(R"("shape":[1])", R"("shape":[4294967296,4294967296,16])");
  EXPECT_NE(msg.find("overflows"), std::string::npos) << msg;
  msg = with(R"(,"data_offsets":[8,16])", "");
  EXPECT_NE(msg.find("tensor 'b' must have exactly dtype, shape and data_offsets"), std::string::npos) << msg;
  msg = with(R"("b":{)", R"("__metadata__":{"k":1},"b":{)");
  EXPECT_NE(msg.find("__metadata__['k'] must be a string"), std::string::npos) << msg;

  auto trailing = kData;
  trailing.push_back(0);
  EXPECT_NE(parse_error(make_file(good, trailing)).find("1 trailing bytes"), std::string::npos);
  // A hole: b starts at 12 after 4 unused bytes.
  auto holey = kData;
  holey.insert(holey.begin() + 8, 4, 0);
  std::string j = good;
  j.replace(j.find("[8,16]"), 6, "[12,20]");
  EXPECT_NE(parse_error(make_file(j, holey)).find("overlapping or a hole"), std::string::npos);

  TempDir dir;
  try {
    ck::read_safetensors(dir.path / "missing.safetensors");
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.safetensors"), std::string::npos) << e.what();
  }
  std::ofstream(dir.path / "cut.safetensors", std::ios::binary)
      .write(reinterpret_cast<const char*>(truncated.data()), static_cast<std::streamsize>(truncated.size()));
  EXPECT_THROW(ck::read_safetensors_metadata(dir.path / "cut.safetensors"), CheckpointError);
}

TEST(Safetensors, AFailedWriteLeavesThePreviousFileIntact) {
  TempDir dir;
  const fs::path file = dir.path / "ckpt.safetensors";
  ck::SafetensorsContents v1;
  v1.tensors["w"] = torch::full({64}, 1.0f);
  v1.tensors["z"] = torch::full({64}, 1.0f);
  ck::write_safetensors(file, v1);
  const auto before = read_bytes(file);

  ck::SafetensorsContents v2;
  v2.tensors["w"] = torch::full({64}, 2.0f);
  v2.tensors["z"] = torch::full({64}, 2.0f);
  std::vector<std::string> seen;
  ck::SafetensorsWriteOptions crash;
  crash.after_write = [&](std::string_view what) {
    seen.emplace_back(what);
    if (what == "w") throw std::runtime_error("simulated crash after tensor w");
  };
  EXPECT_THROW(ck::write_safetensors(file, v2, crash), std::runtime_error);
  EXPECT_EQ(seen, (std::vector<std::string>{"header", "w"}));
  EXPECT_EQ(read_bytes(file), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1)
      << "the temporary file must be removed";

  // Unsupported dtype: fails before any file is created.
  ck::SafetensorsContents bad;
  bad.tensors["c"] = torch::zeros({2}, torch::kComplexFloat);
  EXPECT_THROW(ck::write_safetensors(file, bad), CheckpointError);
  EXPECT_EQ(read_bytes(file), before);

  // A folder that does not exist, and a target that is a folder.
  try {
    ck::write_safetensors(dir.path / "no" / "such" / "x.safetensors", v2);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/x.safetensors"), std::string::npos) << e.what();
  }
  fs::create_directory(dir.path / "is_a_dir");
  EXPECT_THROW(ck::write_safetensors(dir.path / "is_a_dir", v2), CheckpointError);
  EXPECT_TRUE(fs::is_directory(dir.path / "is_a_dir"));

  ck::write_safetensors(file, v2);  // and a successful write replaces it
  EXPECT_TRUE(torch::equal(ck::read_safetensors(file).tensors.at("w"), v2.tensors.at("w")));
}

TEST(Safetensors, EveryTruncationAndRandomHeaderDamageIsACleanError) {
  // What a fuzzer would try first: every prefix of a valid file, and random
  // byte changes in the length and header. Each must parse or throw
  // CheckpointError: never crash, hang or throw anything else.
  TempDir dir;
  ck::SafetensorsContents in;
  in.tensors["a"] = torch::arange(6, torch::kFloat).reshape({2, 3});
  in.tensors["b"] = torch::arange(3, torch::kLong);
  in.metadata["m"] = "x";
  ck::write_safetensors(dir.path / "v.safetensors", in);
  const auto valid = read_bytes(dir.path / "v.safetensors");
  for (size_t n = 0; n < valid.size(); ++n)
    EXPECT_THROW(ck::parse_safetensors(std::span(valid.data(), n), "prefix"), CheckpointError) << n;

  uint64_t header_len = 0;
  for (int i = 0; i < 8; ++i) header_len |= uint64_t(valid[i]) << (8 * i);
  std::mt19937 rng(1234);
  int rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto bytes = valid;
    const int changes = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < changes; ++c) bytes[rng() % (8 + header_len)] = static_cast<uint8_t>(rng());
    try {
      ck::parse_safetensors(bytes, "mutated");
    } catch (const CheckpointError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 1500);  // most damage is caught; the rest is harmless (e.g. a changed metadata value)
}

TEST(Safetensors, DataChecksumCatchesABitFlipInTensorData) {
  TempDir dir;
  ck::SafetensorsContents in;
  in.tensors["w"] = torch::arange(64, torch::kFloat);
  for (bool checksum : {true, false}) {
    ck::SafetensorsWriteOptions options;
    options.data_checksum = checksum;
    const fs::path file = dir.path / (checksum ? "sum.safetensors" : "plain.safetensors");
    ck::write_safetensors(file, in, options);
    auto bytes = read_bytes(file);
    bytes[bytes.size() - 7] ^= 0x04;  // one bit of one float
    if (checksum) {
      try {
        ck::parse_safetensors(bytes, "flipped");
        ADD_FAILURE() << "a flipped data bit must be an error";
      } catch (const CheckpointError& e) {
        EXPECT_NE(std::string(e.what()).find("checksum mismatch"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("flipped"), std::string::npos) << e.what();
      }
    } else {
      // Control: without the checksum the same damage loads silently.
      EXPECT_FALSE(torch::equal(ck::parse_safetensors(bytes, "flipped").tensors.at("w"), in.tensors.at("w")));
    }
  }
}
