// The ranks' own heartbeat watch (comm/peer_watch.h), ranks as threads: one
// rank stops beating (what a SIGSTOPped process looks like to its peers; a
// real SIGSTOP would stop every thread-rank of this process; the real-process
// case is tests/launch/peer_heartbeat_test.cpp) while the others block in a
// collective it never joins. Short heartbeats and a long collective timeout,
// so only the watch can end the wait quickly; nothing asserts on time.
#include <atomic>
#include <chrono>
#include <regex>
#include <string>
#include <thread>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/peer_watch.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/core/error.h"
#include "tests/support/multi_rank.h"

namespace paratrain::comm {
namespace {

using namespace std::chrono_literals;

struct Outcome {
  std::string error;
  bool timed_out = false;
};

// Three ranks: all finish one all_reduce (rank 1's last collective), then
// rank 1 stops beating and waits while ranks 0 and 2 start a second
// all_reduce. Returns what ranks 0 and 2 caught.
std::vector<Outcome> stop_rank_one(bool abort_group, std::chrono::milliseconds collective_timeout) {
  std::vector<Outcome> outcomes(3);
  std::atomic<int> finished{0};
  testing::run_ranks(
      3,
      [&](ProcessGroup& raw) {
        auto recorder = std::make_shared<FlightRecorder>(raw.rank(), 64);
        RecordingOptions ro;
        ro.timeout = collective_timeout;
        auto group = record_collectives(std::shared_ptr<ProcessGroup>(&raw, [](ProcessGroup*) {}), recorder, ro);
        PeerWatchOptions o;
        o.interval = 100ms;
        o.timeout = 1000ms;  // 10 beats: a watch thread starved on a loaded machine is not a verdict
        o.abort_group = abort_group;
        PeerWatch watch(*group, o);
        auto t = at::ones({4});
        group->all_reduce(t)->wait();
        if (group->rank() == 1) {
          // Wait (silent) until the others are done: leaving would tell them "exiting".
          while (watch.beats() < 2) std::this_thread::sleep_for(10ms);  // its last beat names the all_reduce
          watch.stop_beating_for_test();
          while (finished.load() < 2) std::this_thread::sleep_for(10ms);
          return;
        }
        try {
          group->all_reduce(t)->wait();
          outcomes[static_cast<std::size_t>(group->rank())].error = "(no error)";
        } catch (const TimeoutError& e) {
          outcomes[static_cast<std::size_t>(group->rank())] = {e.what(), true};
        } catch (const CommError& e) {
          outcomes[static_cast<std::size_t>(group->rank())] = {e.what(), false};
        }
        finished.fetch_add(1);
      },
      60s);
  return outcomes;
}

TEST(PeerWatch, ARankThatStopsBeatingFailsTheOthersCollectiveNamingItAndItsLastOp) {
  const auto outcomes = stop_rank_one(/*abort_group=*/true, /*collective_timeout=*/60s);
  static const std::regex named(
      R"(peer heartbeats: rank 1 \(pid \d+ on host [^,]+, 127\.0\.0\.1\) sent no heartbeat for [0-9.]+ s )"
      R"(\(world\.heartbeat_timeout_s = 1 s; a rank of this very process .*\); its last collective: all_reduce #\d+ )"
      R"(on world \[0,1,2\] Float\[4\]: done)");
  for (int r : {0, 2}) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    EXPECT_FALSE(o.timed_out) << o.error;
    EXPECT_TRUE(std::regex_search(o.error, named)) << "rank " << r << ": " << o.error;
    EXPECT_NE(o.error.find("rank " + std::to_string(r) + ": peer heartbeats"), std::string::npos) << o.error;
  }
}

// Negative control: the same silence with the abort off leaves the others
// waiting until the collective's own timeout (short here), which names nobody.
TEST(PeerWatch, ControlWithoutTheAbortTheOthersWaitForTheCollectiveTimeout) {
  const auto outcomes = stop_rank_one(/*abort_group=*/false, /*collective_timeout=*/3s);
  for (int r : {0, 2}) {
    const auto& o = outcomes[static_cast<std::size_t>(r)];
    EXPECT_TRUE(o.timed_out) << o.error;
    EXPECT_EQ(o.error.find("peer heartbeats"), std::string::npos) << o.error;
  }
}

// A slow rank (its main thread busy for many heartbeat timeouts) still
// beats from the watch's thread: nobody is blamed, the collective completes.
TEST(PeerWatch, ASlowButLiveRankIsNeverBlamed) {
  std::atomic<int> verdicts{0};
  testing::run_ranks(
      2,
      [&](ProcessGroup& group) {
        PeerWatchOptions o;
        o.interval = 100ms;
        o.timeout = 500ms;
        PeerWatch watch(group, o);
        if (group.rank() == 1) std::this_thread::sleep_for(3s);  // 6 timeouts of "computing"
        auto t = at::ones({4});
        group.all_reduce(t)->wait();
        if (watch.verdict()) verdicts.fetch_add(1);
      },
      60s);
  EXPECT_EQ(verdicts.load(), 0);
}

TEST(PeerWatch, ATimeoutShorterThanTwoIntervalsIsRefused) {
  testing::run_ranks(1, [](ProcessGroup& group) {
    PeerWatchOptions o;
    o.interval = 1000ms;
    o.timeout = 1500ms;
    EXPECT_THROW(PeerWatch(group, o), ConfigError);
  });
}

}  // namespace
}  // namespace paratrain::comm
