// TensorBoard event files: CRC-32C against its published check value, a
// written file read back with every record's CRCs verified, a damaged byte
// caught, and a Trainer run's scalars equal to its metrics.jsonl.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "paratrain/core/error.h"
#include "paratrain/train/config/config.h"
#include "paratrain/train/run/tensorboard.h"
#include "paratrain/train/trainer.h"
#include "tests/support/multi_rank.h"
#include "tests/train/tiny_run.h"

namespace {

namespace fs = std::filesystem;
using namespace paratrain::train;

TEST(TensorBoard, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);  // RFC 3720, B.4
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(TensorBoard, WrittenScalarsReadBackAndDamageIsCaught) {
  const auto dir = fs::path(paratrain::testing::temp_dir("tb"));
  fs::path file;
  {
    TensorBoardWriter w(dir);
    w.add_scalar("train/loss", 0.25, 3, 100.5);
    w.add_scalar("eval/test_accuracy", 0.875, 7, 101.0);
    file = w.path();
  }
  ASSERT_EQ(list_event_files(dir), std::vector<fs::path>{file});
  const auto events = read_scalar_events(file);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].tag, "train/loss");
  EXPECT_EQ(events[0].value, 0.25);
  EXPECT_EQ(events[0].step, 3);
  EXPECT_EQ(events[0].wall_time, 100.5);
  EXPECT_EQ(events[1].tag, "eval/test_accuracy");
  EXPECT_EQ(events[1].step, 7);

  // Flip one byte in the last record's data: its data CRC no longer matches.
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 8] ^= 0x40;
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  try {
    read_scalar_events(file);
    FAIL() << "expected a CRC error";
  } catch (const paratrain::Error& e) {
    EXPECT_NE(std::string(e.what()).find("record 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data CRC"), std::string::npos) << e.what();
  }
}

TEST(TensorBoard, TrainerScalarsEqualMetricsJsonl) {
  const auto dir = paratrain::testing::temp_dir("tb_run");
  auto c = paratrain::testing::tiny_run_config(dir, "tb", /*epochs=*/2, /*log_every=*/2);
  c.log.tensorboard = true;
  std::vector<TrainResult> results(2);
  paratrain::testing::run_ranks(2, [&](paratrain::comm::ProcessGroup& g) {
    Trainer t(c, g);
    results[g.rank()] = t.fit();
  });
  const TrainResult& result = results[0];
  const auto files = list_event_files(result.run_dir / "tensorboard");
  ASSERT_EQ(files.size(), 1u);  // rank 0 only
  std::map<std::pair<std::string, int64_t>, double> scalars;
  for (const auto& e : read_scalar_events(files[0])) scalars[{e.tag, e.step}] = e.value;

  int64_t checked = 0;
  std::ifstream in(result.run_dir / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line);
    const std::string kind = row["kind"];
    for (const std::string key : {"loss", "lr", "test_loss", "test_accuracy"}) {
      if (!row.contains(key)) continue;
      auto it = scalars.find({kind + "/" + key, row["step"].get<int64_t>()});
      ASSERT_NE(it, scalars.end()) << kind << "/" << key << " at step " << row["step"];
      // TensorBoard's simple_value is a float32.
      EXPECT_EQ(it->second, static_cast<double>(static_cast<float>(row[key].get<double>()))) << key;
      ++checked;
    }
  }
  // 8 steps logged every 2 (loss, lr) and 2 evaluations (loss, accuracy).
  EXPECT_EQ(checked, 4 * 2 + 2 * 2);
}

}  // namespace
