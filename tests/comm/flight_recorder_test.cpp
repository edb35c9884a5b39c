// The hang doctor's recording side: the ring buffer, RecordingGroup on real
// Gloo groups (sequence numbers per group, sub-groups wrapped and named, ends
// stamped), the SIGUSR1 dump from the watchdog thread, and heartbeat files as
// the launcher reads them.
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "paratrain/comm/doctor/doctor_watchdog.h"
#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/launch/heartbeat_monitor.h"
#include "tests/support/multi_rank.h"

namespace paratrain::comm {
namespace {

namespace fs = std::filesystem;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::shared_ptr<ProcessGroup> not_owned(ProcessGroup& g) {
  return std::shared_ptr<ProcessGroup>(&g, [](ProcessGroup*) {});
}

TEST(FlightRecorder, KeepsTheNewestNRecordsAndCountsEveryGroupApart) {
  FlightRecorder recorder(0, 4);
  const int a = recorder.add_group("world", {0, 1});
  const int b = recorder.add_group("dp", {0});
  auto t = torch::zeros({3});
  for (int i = 0; i < 5; ++i) recorder.finish(recorder.begin(a, "all_reduce", &t, -1), RecordState::kDone, 7);
  const uint64_t last = recorder.begin(b, "broadcast", &t, 0);
  const auto recs = recorder.records();
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_EQ(recs.front().seq, 2);  // a's #0 and #1 left the ring
  EXPECT_EQ(recs.back().seq, 0);   // b counts from 0
  EXPECT_EQ(recs.back().state, RecordState::kInFlight);
  EXPECT_EQ(recs.back().end_us, -1);
  recorder.finish(last, RecordState::kDone, 42);
  EXPECT_EQ(recorder.records().back().end_us, 42);
  // A ticket whose record left the ring changes nothing.
  recorder.finish(0, RecordState::kFailed, 1);
  for (const auto& r : recorder.records()) EXPECT_EQ(r.state, RecordState::kDone);
  EXPECT_EQ(recorder.groups()[static_cast<std::size_t>(a)].next_seq, 5);
}

TEST(RecordingGroup, RecordsEveryCollectiveOfTheGroupAndItsSubGroups) {
  testing::run_ranks(4, [](ProcessGroup& inner) {
    auto recorder = std::make_shared<FlightRecorder>(inner.rank(), 64);
    RecordingGroup world(not_owned(inner), recorder, RecordingOptions{});
    auto t = torch::full({5}, static_cast<float>(inner.rank()));
    world.all_reduce(t, ReduceOp::kSum)->wait();
    EXPECT_FLOAT_EQ(t[0].item<float>(), 6.0f);  // forwarded: the real reduction happened
    auto even = world.new_subgroup({0, 2});
    auto odd = world.new_subgroup({1, 3});
    auto mine = inner.rank() % 2 == 0 ? even : odd;
    ASSERT_NE(mine, nullptr);
    name_group(*mine, "dp");
    EXPECT_EQ(recorder_of(*mine), recorder);
    mine->broadcast(t, 0)->wait();
    mine->barrier()->wait();
    world.barrier()->wait();

    const auto groups = recorder->groups();
    ASSERT_EQ(groups.size(), 2u);
    EXPECT_EQ(groups[0].name, "world");
    EXPECT_EQ(groups[0].next_seq, 4);  // all_reduce, two new_subgroup, barrier
    EXPECT_EQ(groups[1].name, "dp");
    EXPECT_EQ(groups[1].ranks, inner.rank() % 2 == 0 ? std::vector<int>({0, 2}) : std::vector<int>({1, 3}));
    EXPECT_EQ(groups[1].next_seq, 2);
    const auto recs = recorder->records();
    ASSERT_EQ(recs.size(), 6u);
    EXPECT_STREQ(recs[0].op, "all_reduce");
    EXPECT_STREQ(recs[0].dtype, "Float");
    EXPECT_EQ(recs[0].numel, 5);
    EXPECT_STREQ(recs[3].op, "broadcast");
    EXPECT_EQ(recs[3].peer, 0);
    for (const auto& r : recs) {
      EXPECT_EQ(r.state, RecordState::kDone) << r.op;
      EXPECT_GE(r.end_us, r.start_us) << r.op;
    }
  });
}

TEST(DoctorWatchdog, SigusrOneMakesEveryLiveRecorderDump) {
  const fs::path dir = testing::temp_dir("watchdog_dump");
  auto recorder = std::make_shared<FlightRecorder>(3, 8);
  register_recorder(recorder);
  recorder->set_dump_dir(dir);
  const int g = recorder->add_group("world", {3});
  recorder->begin(g, "all_reduce", nullptr, -1);  // in flight, as in a hang
  {
    DoctorWatchdog watchdog(recorder, WatchdogOptions{});
    std::raise(SIGUSR1);
    // The watchdog thread writes it; no time bound (ctest's timeout is the backstop).
    while (!fs::exists(dir / "rank-3.json")) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::string dump = slurp(dir / "rank-3.json");
  EXPECT_NE(dump.find("\"reason\": \"SIGUSR1\""), std::string::npos) << dump;
  EXPECT_NE(dump.find("\"last_op\": \"all_reduce #0 on world [3]: in_flight"), std::string::npos) << dump;
}

TEST(DoctorWatchdog, HeartbeatsAreWhatTheLauncherReadsAndEndWithExiting) {
  const fs::path dir = testing::temp_dir("watchdog_beat");
  auto recorder = std::make_shared<FlightRecorder>(1, 8);
  recorder->set_dump_dir(dir / "doctor");
  const int g = recorder->add_group("world", {0, 1});
  recorder->finish(recorder->begin(g, "all_reduce", nullptr, -1), RecordState::kDone, 5);
  WatchdogOptions options;
  options.heartbeat_file = dir / "beats" / "rank-1.json";
  options.interval = std::chrono::milliseconds(5);
  options.timeout = std::chrono::milliseconds(1234);
  {
    DoctorWatchdog watchdog(recorder, options);
    while (watchdog.beats() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // beats() counts a beat before its file is renamed into place: read until
    // the file shows the third (no time bound; ctest's timeout is the backstop).
    auto hb = launch::read_heartbeat(options.heartbeat_file);
    while (!hb || hb->beat < 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      hb = launch::read_heartbeat(options.heartbeat_file);
    }
    ASSERT_TRUE(hb.has_value()) << slurp(options.heartbeat_file);
    EXPECT_GE(hb->beat, 3);
    EXPECT_EQ(hb->timeout_ms, 1234);
    EXPECT_EQ(hb->pid, static_cast<long long>(getpid()));
    EXPECT_EQ(hb->state, "running");
    EXPECT_EQ(hb->doctor_dir, (dir / "doctor").string());
    EXPECT_EQ(hb->last_op, "all_reduce #0 on world [0,1]: done");
  }
  EXPECT_EQ(launch::read_heartbeat(options.heartbeat_file)->state, "exiting");
}

TEST(HeartbeatWatch, ASilentWorkerIsOnlyOneWhoseCounterStoppedForLongerThanItsTimeout) {
  const fs::path dir = testing::temp_dir("heartbeat_watch");
  const fs::path file = dir / "rank-0.json";
  auto write = [&](int beat, const char* state) {
    std::ofstream(file) << "{\n\"pid\": 1,\n\"last_op\": \"barrier #2 on world [0]: done\",\n\"beat\": " << beat
                        << ",\n\"timeout_ms\": 1000,\n\"state\": \"" << state << "\",\n\"doctor_dir\": \"\",\n}\n";
  };
  launch::HeartbeatWatch watch(file);
  using std::chrono::milliseconds;
  const auto t0 = launch::HeartbeatWatch::Clock::time_point{} + std::chrono::hours(1);
  EXPECT_FALSE(watch.silent(t0));  // no file yet: not beating, not silent
  write(1, "running");
  EXPECT_FALSE(watch.silent(t0));
  EXPECT_FALSE(watch.silent(t0 + milliseconds(900)));
  write(2, "running");  // a new beat restarts the clock
  EXPECT_FALSE(watch.silent(t0 + milliseconds(1500)));
  EXPECT_TRUE(watch.silent(t0 + milliseconds(2600)));
  EXPECT_EQ(watch.last()->last_op, "barrier #2 on world [0]: done");
  write(2, "exiting");  // a clean shutdown is never a hang
  EXPECT_FALSE(watch.silent(t0 + milliseconds(9000)));
}

}  // namespace
}  // namespace paratrain::comm
