// The hang doctor end to end on threads: ranks record through RecordingGroup,
// one skips a collective, the others time out and dump, and diagnose() names
// the rank and the sequence number (control: nobody skips, no divergence).
// Also diagnose() and doctor_trace() on hand-written dumps.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "paratrain/comm/doctor/dump_reader.h"
#include "tests/support/multi_rank.h"

namespace paratrain::train {
namespace {

using namespace paratrain::comm;  // the dump reader (comm/doctor/dump_reader.h)

namespace fs = std::filesystem;

// Three ranks all-reduce five times (#0..#4). Then, with `skip`, rank 2
// leaves out #5: ranks 0 and 1 block in it until the group timeout, which
// makes their recorders dump ("collective timeout"); rank 2 waits for that
// and dumps too, the way SIGUSR1 would make a live rank dump. Without
// `skip` all three finish #5 and dump.
void run_job(const fs::path& dir, bool skip) {
  std::atomic<int> timed_out{0};
  testing::run_ranks(
      3,
      [&](comm::ProcessGroup& group) {
        auto recorder = std::make_shared<comm::FlightRecorder>(group.rank(), 64);
        recorder->set_dump_dir(dir);
        comm::RecordingOptions options;
        options.name = "world";
        options.timeout = std::chrono::seconds(2);  // only how long #5 blocks; nothing asserts on time
        comm::RecordingGroup g(std::shared_ptr<comm::ProcessGroup>(&group, [](comm::ProcessGroup*) {}), recorder,
                               options);
        auto t = torch::ones({4, 3});
        for (int i = 0; i < 5; ++i) g.all_reduce(t, comm::ReduceOp::kSum)->wait();
        if (skip && g.rank() == 2) {
          // Stay alive (closed sockets would turn the others' timeout into a
          // connection error) until both have dumped.
          while (timed_out.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(20));
          recorder->dump("test: rank 2 skipped #5");
          return;
        }
        try {
          g.all_reduce(t, comm::ReduceOp::kSum)->wait();
        } catch (const TimeoutError&) {
          ++timed_out;
          return;  // RecordingGroup dumped already
        }
        recorder->dump("test: finished");
      },
      std::chrono::seconds(2));
}

const GroupVerdict* verdict_for(const DoctorReport& report, const std::string& group) {
  for (const auto& v : report.groups) {
    if (v.group == group) return &v;
  }
  return nullptr;
}

TEST(HangDoctor, ARankThatSkipsACollectiveIsNamedWithTheSequenceNumber) {
  const fs::path dir = testing::temp_dir("doctor_skip");
  run_job(dir, /*skip=*/true);
  const auto dumps = read_dumps(dir);
  ASSERT_EQ(dumps.size(), 3u);
  EXPECT_EQ(dumps[0].reason, "collective timeout");  // written by RecordingGroup itself
  EXPECT_EQ(dumps[1].reason, "collective timeout");
  const auto report = diagnose(dumps, 3);
  EXPECT_TRUE(report.diverged) << report.text();
  const auto* v = verdict_for(report, "world [0,1,2]");
  ASSERT_NE(v, nullptr) << report.text();
  EXPECT_EQ(v->behind, std::vector<int>({2})) << report.text();
  EXPECT_EQ(v->ahead, std::vector<int>({0, 1})) << report.text();
  EXPECT_NE(v->message.find("rank 2 finished all_reduce #4"), std::string::npos) << v->message;
  EXPECT_NE(v->message.find("ranks 0,1 wait in all_reduce #5"), std::string::npos) << v->message;
}

TEST(HangDoctor, ControlWithoutTheSkipReportsNoDivergence) {
  const fs::path dir = testing::temp_dir("doctor_control");
  run_job(dir, /*skip=*/false);
  const auto dumps = read_dumps(dir);
  ASSERT_EQ(dumps.size(), 3u);
  const auto report = diagnose(dumps, 3);
  EXPECT_FALSE(report.diverged) << report.text();
  EXPECT_TRUE(report.groups.empty()) << report.text();
  EXPECT_NE(report.text().find("no divergence"), std::string::npos) << report.text();
}

// --- diagnose() on hand-written dumps -------------------------------------

DumpRecord rec(int group, int64_t seq, const std::string& op, int64_t numel, const std::string& state,
               int64_t start = 0) {
  DumpRecord r;
  r.group = group;
  r.seq = seq;
  r.op = op;
  r.dtype = "Float";
  r.shape = {numel};
  r.numel = numel;
  r.start_us = start;
  r.end_us = state == "done" ? start + 10 : -1;
  r.state = state;
  return r;
}

// Four ranks, world plus two dp groups {0,2} {1,3}; rank 3 is still in dp
// all_reduce #1042 while rank 1 waits in #1043 (the example).
std::vector<RankDump> four_ranks() {
  std::vector<RankDump> dumps(4);
  for (int r = 0; r < 4; ++r) {
    auto& d = dumps[static_cast<std::size_t>(r)];
    d.rank = r;
    d.reason = "SIGUSR1";
    d.dumped_at_us = 5'000'000;
    d.groups.push_back(DumpGroup{"world", {0, 1, 2, 3}, 0, 7});
    d.groups.push_back(DumpGroup{"dp", r % 2 == 0 ? std::vector<int>{0, 2} : std::vector<int>{1, 3}, 0, 1044});
    d.records.push_back(rec(0, 6, "broadcast", 8, "done", 100));
    d.records.push_back(rec(1, 1041, "all_reduce", 1000, "done", 1000));
    d.records.push_back(rec(1, 1042, "all_reduce", 1000, "done", 2000));
    d.records.push_back(rec(1, 1043, "all_reduce", 1000, "done", 3000));
  }
  auto& three = dumps[3];
  three.groups[1].next_seq = 1043;
  three.records.pop_back();
  three.records.back().state = "in_flight";
  three.records.back().end_us = -1;
  auto& one = dumps[1];
  one.records.back().state = "in_flight";
  one.records.back().end_us = -1;
  return dumps;
}

TEST(HangDoctorDiagnose, NamesTheRankBehindAndTheCollectiveOnTheSubGroup) {
  const auto report = diagnose(four_ranks(), 4);
  EXPECT_TRUE(report.diverged);
  ASSERT_EQ(report.groups.size(), 1u) << report.text();
  const auto& v = report.groups[0];
  EXPECT_EQ(v.group, "dp [1,3]");
  EXPECT_EQ(v.behind, std::vector<int>({3}));
  EXPECT_EQ(v.message,
            "rank 3 is in all_reduce #1042 Float[1000] on dp [1,3] (in_flight) while rank 1 waits in "
            "all_reduce #1043 Float[1000] (in_flight)")
      << report.text();
}

TEST(HangDoctorDiagnose, AgreeingRanksAreNotDiverged) {
  auto dumps = four_ranks();
  dumps[3] = dumps[2];
  dumps[3].rank = 3;
  dumps[3].groups[1].ranks = {1, 3};
  dumps[1].records.back().state = "done";
  const auto report = diagnose(dumps, 4);
  EXPECT_FALSE(report.diverged) << report.text();
  EXPECT_TRUE(report.groups.empty()) << report.text();
}

TEST(HangDoctorDiagnose, DifferentOpsAtOneSequenceNumberAreAMismatch) {
  auto dumps = four_ranks();
  dumps[3] = dumps[2];
  dumps[3].rank = 3;
  dumps[3].groups[1].ranks = {1, 3};
  dumps[1].records.back().state = "done";
  dumps[2].records[0].op = "all_reduce";  // world #6: rank 2 all-reduces where the others broadcast
  const auto report = diagnose(dumps, 4);
  EXPECT_TRUE(report.diverged) << report.text();
  ASSERT_EQ(report.groups.size(), 1u) << report.text();
  EXPECT_EQ(report.groups[0].mismatch_seq, 6);
  EXPECT_NE(report.groups[0].message.find("different collectives at #6"), std::string::npos) << report.text();
  EXPECT_NE(report.groups[0].message.find("rank 2 issued all_reduce #6"), std::string::npos) << report.text();
}

TEST(HangDoctorDiagnose, ASendPairedWithARecvIsNoMismatch) {
  auto dumps = four_ranks();
  dumps[3] = dumps[2];
  dumps[3].rank = 3;
  dumps[3].groups[1].ranks = {1, 3};
  dumps[1].records.back().state = "done";
  // world #6: a pipeline's sends on ranks 0 and 1 are their peers' recvs.
  for (int r = 0; r < 4; ++r) dumps[static_cast<std::size_t>(r)].records[0].op = r < 2 ? "send" : "recv";
  EXPECT_FALSE(diagnose(dumps, 4).diverged) << diagnose(dumps, 4).text();
}

TEST(HangDoctorDiagnose, ARankWithoutADumpIsNamed) {
  auto dumps = four_ranks();
  dumps.erase(dumps.begin() + 3);
  const auto report = diagnose(dumps, 4);
  EXPECT_TRUE(report.diverged);
  EXPECT_NE(report.text().find("rank 3: no dump"), std::string::npos) << report.text();
  const auto* v = verdict_for(report, "dp [1,3]");
  ASSERT_NE(v, nullptr) << report.text();
  EXPECT_EQ(v->missing, std::vector<int>({3}));
}

// Two ranks, dumped one after the other: rank 0 dumped at t = 3 s with 5
// collectives issued, rank 1 entered #5 at t = `entered` (microseconds).
std::vector<RankDump> skewed(int64_t entered) {
  std::vector<RankDump> dumps(2);
  for (int r = 0; r < 2; ++r) {
    auto& d = dumps[static_cast<std::size_t>(r)];
    d.rank = r;
    d.reason = "SIGUSR1";
    d.groups.push_back(DumpGroup{"world", {0, 1}, 0, 5 + r});
    d.records.push_back(rec(0, 4, "all_reduce", 10, "done", 100));
  }
  dumps[0].dumped_at_us = 3'000'000;
  dumps[1].dumped_at_us = 3'001'000;
  dumps[1].records.push_back(rec(0, 5, "all_reduce", 10, "in_flight", entered));
  return dumps;
}

TEST(HangDoctorDiagnose, ARankOnlyMomentarilyBehindItsPeerIsNotBehind) {
  // Rank 1 entered #5 after rank 0 dumped, or 10 ms before: a healthy job.
  EXPECT_FALSE(diagnose(skewed(/*entered=*/3'000'500), 2).diverged);
  const auto report = diagnose(skewed(/*entered=*/2'990'000), 2);
  EXPECT_FALSE(report.diverged) << report.text();
  // Control: the peer had waited in #5 for 2.5 s (> min_lag_s = 1) when rank 0 dumped.
  const auto late = diagnose(skewed(/*entered=*/500'000), 2);
  EXPECT_TRUE(late.diverged) << late.text();
  ASSERT_EQ(late.groups.size(), 1u) << late.text();
  EXPECT_EQ(late.groups[0].behind, std::vector<int>({0}));
}

TEST(HangDoctorDiagnose, TheTraceHasOneRowPerRankAndMarksCollectivesInFlight) {
  const auto trace = doctor_trace(four_ranks(), 10.0);
  int rows = 0, in_flight = 0, slices = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") ++rows;
    if (e.at("ph") != "X") continue;
    ++slices;
    if (e.at("args").at("state") == "in_flight") ++in_flight;
    EXPECT_GE(e.at("ts").get<int64_t>(), 0);
  }
  EXPECT_EQ(rows, 4);
  EXPECT_EQ(slices, 15);  // 4 records on ranks 0-2, 3 on rank 3
  EXPECT_EQ(in_flight, 2);  // rank 1's #1043, rank 3's #1042
}

TEST(HangDoctorDiagnose, ParsesWhatTheRecorderWrites) {
  comm::FlightRecorder recorder(5, 4);
  const int world = recorder.add_group("world", {4, 5});
  auto t = torch::zeros({2, 3});
  for (int i = 0; i < 6; ++i) recorder.finish(recorder.begin(world, "all_reduce", &t, -1), comm::RecordState::kDone, 1);
  recorder.begin(world, "broadcast", &t, 0);
  const auto dump = parse_dump(nlohmann::json::parse(recorder.to_json("test")), "test");
  EXPECT_EQ(dump.rank, 5);
  ASSERT_EQ(dump.groups.size(), 1u);
  EXPECT_EQ(dump.groups[0].next_seq, 7);
  ASSERT_EQ(dump.records.size(), 4u);  // the ring keeps the newest 4 of 7
  EXPECT_EQ(dump.records.front().seq, 3);
  EXPECT_EQ(dump.records.back().op, "broadcast");
  EXPECT_EQ(dump.records.back().state, "in_flight");
  EXPECT_EQ(dump.records.back().shape, std::vector<int64_t>({2, 3}));
  EXPECT_EQ(dump.records.back().end_us, -1);
  EXPECT_NE(dump.last_op.find("broadcast #6 on world [4,5] (peer 0) Float[2,3]: in_flight"), std::string::npos)
      << dump.last_op;
}

}  // namespace
}  // namespace paratrain::train
