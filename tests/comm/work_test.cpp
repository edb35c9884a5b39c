// Work semantics of the Gloo backend: the finishing step runs once when two
// threads wait, completion time stamped by the backend, wait() without an
// argument uses the group's timeout, and abort() wakes waiters on this rank
// and fails peers' operations. Ranks are threads; no wall-clock bounds.
#include <atomic>
#include <csignal>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "paratrain/core/error.h"
#include "paratrain/core/running_deadline.h"
#include "tests/support/multi_rank.h"

using paratrain::CommError;
using paratrain::TimeoutError;
using paratrain::comm::ProcessGroup;
using paratrain::comm::ReduceOp;
using paratrain::comm::Work;
using paratrain::testing::run_ranks;

namespace {

// For the abort tests: longer than ctest's per-test limit (300 s). If abort
// left this rank's Gloo worker blocked in its receive, tearing the group down
// would wait for the group timeout, so the test would be killed rather than
// pass late.
constexpr std::chrono::milliseconds kLongerThanCtest = std::chrono::minutes(10);

void spin_until(const std::atomic<bool>& flag) {
  while (!flag) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

bool contains(const std::exception& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

// Rank 0 has two threads blocked in wait() on one AVG all-reduce before its
// peers even join, so both are inside wait when the data arrives. Dividing
// twice would leave sum / world^2; a thread returning before the division ran
// would see the sum.
TEST(Work, TwoWaitersRunTheFinishingStepOnce) {
  for (int world : {2, 3}) {
    std::atomic<int> waiting{0};
    std::atomic<bool> joined{false};
    run_ranks(world, [&](ProcessGroup& pg) {
      const int64_t n = 9;
      auto t = torch::full({n}, static_cast<float>(pg.rank() + 1));
      const auto mean = torch::full({n}, (world + 1) / 2.0f);
      if (pg.rank() != 0) {
        while (waiting < 2 && !joined) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        // Let both waiters get from the counter into wait() proper.
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        pg.all_reduce(t, ReduceOp::kAvg)->wait();
        EXPECT_TRUE(torch::allclose(t, mean));
        return;
      }
      auto work = pg.all_reduce(t, ReduceOp::kAvg);
      std::vector<at::Tensor> seen(2);
      std::vector<std::thread> waiters;
      for (int i = 0; i < 2; ++i) {
        waiters.emplace_back([&, i] {
          ++waiting;
          work->wait();
          seen[i] = t.clone();
        });
      }
      for (auto& w : waiters) w.join();
      joined = true;
      for (int i = 0; i < 2; ++i) {
        EXPECT_TRUE(torch::allclose(seen[i], mean)) << "world " << world << " waiter " << i << ": " << seen[i];
      }
    });
  }
}

// The stamp comes from the backend: it exists before anyone calls wait(), is
// absent while the operation is in flight, and lies in [issue, observed done].
TEST(Work, CompletedAtIsStampedByTheBackend) {
  std::atomic<bool> checked_pending{false};
  run_ranks(2, [&](ProcessGroup& pg) {
    auto t = torch::ones({4});
    if (pg.rank() == 1) {
      spin_until(checked_pending);
      pg.all_reduce(t)->wait();
      auto in = torch::zeros({3});
      pg.recv(in, 0)->wait();
      return;
    }
    const auto before_issue = Work::Clock::now();
    auto work = pg.all_reduce(t);
    EXPECT_FALSE(work->completed_at().has_value());  // rank 1 has not joined yet
    EXPECT_FALSE(work->is_completed());
    checked_pending = true;
    while (!work->is_completed()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto seen_done = Work::Clock::now();
    ASSERT_TRUE(work->completed_at().has_value());  // before any wait()
    work->wait();
    const auto returned = Work::Clock::now();
    auto at = work->completed_at();
    ASSERT_TRUE(at.has_value());
    EXPECT_LE(before_issue, *at);
    EXPECT_LE(*at, seen_done);
    EXPECT_LE(*at, returned);
    EXPECT_TRUE(torch::equal(t, torch::full({4}, 2.0f)));

    // send has no c10d future: stamped when wait() saw it finish.
    auto s = pg.send(torch::ones({3}), 1);
    s->wait();
    ASSERT_TRUE(s->completed_at().has_value());
    EXPECT_LE(*s->completed_at(), Work::Clock::now());
  });
}

// A group built with a short timeout: wait() without an argument throws
// TimeoutError naming the operation when the peer never joins. With a
// constant default (minutes) this test would not finish in time.
TEST(Work, WaitWithoutArgumentUsesTheGroupTimeout) {
  std::atomic<bool> rank0_done{false};
  try {
    run_ranks(
        2,
        [&](ProcessGroup& pg) {
          if (pg.rank() == 1) {
            spin_until(rank0_done);  // alive, never joins
            return;
          }
          auto t = torch::ones({4});
          try {
            pg.all_reduce(t)->wait();
          } catch (...) {
            rank0_done = true;
            throw;
          }
          rank0_done = true;
        },
        std::chrono::seconds(2));
    FAIL() << "expected a TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_TRUE(contains(e, "all_reduce")) << e.what();
  }
}

// Rank 1 never joins; rank 0 blocks in wait() and another thread aborts.
// The waiter must come back with CommError naming the abort (not a
// TimeoutError at the group timeout), and new operations are refused.
TEST(Work, AbortWakesABlockedWaiterAndRefusesNewOperations) {
  std::atomic<bool> rank0_done{false};
  run_ranks(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      spin_until(rank0_done);
      return;
    }
    auto t = torch::ones({4});
    auto work = pg.all_reduce(t);
    std::atomic<bool> waiting{false};
    std::thread aborter([&] {
      spin_until(waiting);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let it block
      pg.abort();
    });
    try {
      waiting = true;
      work->wait();
      ADD_FAILURE() << "wait() returned after abort";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "abort did not wake the waiter: " << e.what();
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e, "group aborted")) << e.what();
    }
    aborter.join();
    EXPECT_TRUE(work->is_completed());
    EXPECT_THROW(work->wait(), CommError);  // same outcome again
    try {
      pg.all_reduce(t);
      ADD_FAILURE() << "a new operation was accepted after abort";
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e, "group aborted")) << e.what();
    }
    pg.abort();  // idempotent
    rank0_done = true;
  }, kLongerThanCtest);
}

// Same for a blocked recv (c10d has no future for it: the waiter sits in c10d).
TEST(Work, AbortWakesABlockedRecv) {
  std::atomic<bool> rank0_done{false};
  run_ranks(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      spin_until(rank0_done);  // never sends
      return;
    }
    auto in = torch::zeros({4});
    auto work = pg.recv(in, 1);
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      pg.abort();
    });
    try {
      work->wait();
      ADD_FAILURE() << "recv returned after abort";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "abort did not wake the recv: " << e.what();
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e, "group aborted")) << e.what();
    }
    aborter.join();
    rank0_done = true;
  }, kLongerThanCtest);
}

// What a peer sees: rank 0 aborts while rank 1 waits in an all-reduce rank 0
// never joins. Rank 1's operation fails with CommError when the connection
// closes, not with a TimeoutError after the group's 60 s. Rank 0 keeps its
// group alive until then, so only the abort can have closed the connection.
TEST(Work, AbortFailsThePeersOperations) {
  std::atomic<bool> rank1_waiting{false};
  std::atomic<bool> rank1_done{false};
  run_ranks(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 0) {
      spin_until(rank1_waiting);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      pg.abort();
      spin_until(rank1_done);
      return;
    }
    auto t = torch::ones({4});
    auto work = pg.all_reduce(t);
    rank1_waiting = true;
    try {
      work->wait();
      ADD_FAILURE() << "the peer's all_reduce completed without rank 0";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << "the peer only timed out: " << e.what();
    } catch (const CommError& e) {
      EXPECT_TRUE(contains(e, "all_reduce")) << e.what();
    }
    rank1_done = true;
  });
}

// Aborting a group aborts the sub-groups built from it.
TEST(Work, AbortReachesSubgroups) {
  run_ranks(2, [&](ProcessGroup& pg) {
    auto sub = pg.new_subgroup({0, 1});
    ASSERT_TRUE(sub);
    // Both ends connected before rank 1 leaves: without it rank 0 could still
    // be connecting the sub-group when rank 1's closes (seen once under load).
    sub->barrier()->wait();
    if (pg.rank() != 0) return;
    pg.abort();
    auto t = torch::ones({2});
    EXPECT_THROW(sub->all_reduce(t), CommError);
    EXPECT_THROW(pg.new_subgroup({0, 1}), CommError);
  });
}

}  // namespace

// A receive whose peer never sends fails at the wait's timeout, counted in
// running time, and the group torn down afterwards ends the receive still
// in flight in Gloo (Note [Gloo's deadline is ours]): with Gloo's own
// deadline now a week, a teardown that left it there would hang, and ctest
// would kill the test.
TEST(Work, ARecvThatTimedOutIsEndedWhenTheGroupGoes) {
  std::atomic<bool> rank0_done{false};
  run_ranks(2, [&](ProcessGroup& pg) {
    if (pg.rank() == 1) {
      spin_until(rank0_done);  // alive, never sends
      return;
    }
    auto in = torch::zeros({4});
    auto work = pg.recv(in, 1);
    try {
      work->wait(std::chrono::milliseconds(300));
      ADD_FAILURE() << "recv returned without a sender";
    } catch (const TimeoutError& e) {
      EXPECT_TRUE(contains(e, "recv")) << e.what();
    }
    EXPECT_FALSE(work->is_completed());  // still in flight: nothing closed the connections
    rank0_done = true;
  }, kLongerThanCtest);
}

// Note [Deadlines that stop with the process], on a clock given by hand: a
// gap between two looks longer than kPause moves the deadline by the gap;
// looks at least every kSlice never do.
TEST(RunningDeadline, AGapBetweenLooksIsTimeTheProcessDidNotRun) {
  using paratrain::RunningDeadline;
  using namespace std::chrono_literals;
  const RunningDeadline::Clock::time_point t0{};
  RunningDeadline steady(1000ms, t0);
  for (auto t = 0ms; t < 1000ms; t += RunningDeadline::kSlice) {
    EXPECT_FALSE(steady.passed(t0 + t));
    EXPECT_LE(steady.next_look(t0 + t), t0 + t + RunningDeadline::kSlice);
  }
  EXPECT_TRUE(steady.passed(t0 + 1000ms));
  EXPECT_EQ(steady.stopped(), 0ms);

  RunningDeadline stopped(1000ms, t0);
  EXPECT_FALSE(stopped.passed(t0 + 400ms));
  EXPECT_FALSE(stopped.passed(t0 + 60400ms));  // a minute stopped, woke 59 s past the deadline
  EXPECT_EQ(stopped.stopped(), 60000ms);
  EXPECT_EQ(stopped.left(t0 + 60400ms), 600ms);  // the 600 ms it had not yet waited
  EXPECT_FALSE(stopped.passed(t0 + 60900ms));
  EXPECT_TRUE(stopped.passed(t0 + 61000ms));
}

// Note [Gloo's deadline is ours], its one exception: Gloo's error path
// (tcp Pair::signalException) wakes the buffers waiting for a message and
// those sending, not the one whose payload is being read. A rank that
// aborts while a message comes in (what its heartbeats do when the link is
// cut mid-message) leaves that receive waiting for Gloo's own deadline, a
// week, in one of c10d's worker threads, which c10d's destructor joins: the
// group's teardown would hang. The same for a send cut mid-message by the
// peer's close. Rank 1 receives a 256 MiB broadcast (a leaf only receives,
// so nothing else wakes it) and aborts once the message has begun to
// arrive; both teardowns must return, and say what they left behind.
TEST(Work, AnAbortInTheMiddleOfAMessageDoesNotHoldTheTeardown) {
  std::signal(SIGPIPE, SIG_IGN);  // Gloo writes with writev: a closed peer raises it
  std::ostringstream log;
  // The previous logger comes back however the test ends (the captured
  // stream dies with it).
  struct RestoreLogger {
    std::shared_ptr<spdlog::logger> previous = spdlog::default_logger();
    ~RestoreLogger() { spdlog::set_default_logger(previous); }
  } restore;
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "capture", std::make_shared<spdlog::sinks::ostream_sink_mt>(log)));
  constexpr int64_t kFloats = int64_t{64} << 20;  // 256 MiB
  bool cut_mid_message = false;
  run_ranks(2, [&](ProcessGroup& pg) {
    auto sub = pg.new_subgroup({0, 1});
    sub->barrier()->wait();
    auto t = pg.rank() == 0 ? torch::ones({kFloats}) : torch::zeros({kFloats});
    auto work = sub->broadcast(t, 0);
    if (pg.rank() == 1) {
      const auto* first = reinterpret_cast<const volatile float*>(t.data_ptr<float>());
      while (first[0] == 0.0f && !work->is_completed()) std::this_thread::sleep_for(std::chrono::microseconds(50));
      sub->abort();
      // Once closed nothing more is read: the last float never came.
      cut_mid_message = t[kFloats - 1].item<float>() == 0.0f;
    }
    // Rank 0's send, cut mid-message by rank 1's close, is not woken by
    // Gloo either: it fails at its timeout.
    EXPECT_THROW(work->wait(std::chrono::seconds(2)), paratrain::Error);
    sub.reset();  // the teardown: must return
  }, kLongerThanCtest);
  ASSERT_TRUE(cut_mid_message) << "the whole message had arrived before the abort: the case was not made";
  EXPECT_NE(log.str().find("its connections were closed, but Gloo does not wake"), std::string::npos) << log.str();
}
