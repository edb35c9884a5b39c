// What paratrain's Gloo send and receive cost on top of c10d's own: a
// ping-pong between two ranks (threads of this process, over loopback TCP,
// as pipeline stages on one machine exchange activations), timed through
// paratrain's Gloo group and through a c10d ProcessGroupGloo built beside it
// from the same store, alternately in one run. c10d 1.13's send and receive
// have no future, so paratrain waits for each on a thread of its own (Note
// [Gloo's deadline is ours], paratrain/comm/gloo/gloo_work.h); this is the
// price of that, per message size. Prints one JSON line: per size the
// median round trip of each and their ratio.
//
//   build/bench/sendrecv_latency --sizes-kb 4,64,1024 --iters 400
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/torch.h>

#include "paratrain/comm/gloo/gloo_group.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = paratrain::comm;

struct Options {
  std::vector<double> sizes_kb{4, 64, 1024};  // 16 KiB is a tiny GPT's micro-batch activation
  int iters = 400;                            // round trips per size and group (the median is reported)
  int rounds = 4;                             // alternations of the two groups per size
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One rank's side of `iters` round trips on `exchange` (rank 0 sends first);
// rank 0 records each round trip in microseconds.
template <class Exchange>
void ping_pong(int rank, int iters, std::vector<double>& out, Exchange&& exchange) {
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    exchange(rank == 0);
    exchange(rank != 0);
    if (rank == 0) out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
}

int run(const Options& o) {
  at::set_num_threads(1);
  auto store = c10::make_intrusive<c10d::HashStore>();
  nlohmann::json rows = nlohmann::json::array();
  std::vector<std::vector<double>> ours(o.sizes_kb.size()), theirs(o.sizes_kb.size());
  auto rank_main = [&](int rank) {
    auto ours_group = comm::make_gloo_group(c10::make_intrusive<c10d::PrefixStore>("ours", store), rank, 2, {});
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto raw = c10::make_intrusive<c10d::ProcessGroupGloo>(c10::make_intrusive<c10d::PrefixStore>("raw", store),
                                                          rank, 2, opts);
    for (size_t s = 0; s < o.sizes_kb.size(); ++s) {
      auto t = torch::ones({static_cast<int64_t>(o.sizes_kb[s] * 256)});  // floats
      std::vector<at::Tensor> ts{t};
      const int peer = 1 - rank;
      for (int round = 0; round < o.rounds; ++round) {
        ping_pong(rank, o.iters / o.rounds, ours[s], [&](bool sending) {
          (sending ? ours_group->send(t, peer) : ours_group->recv(t, peer))->wait();
        });
        ping_pong(rank, o.iters / o.rounds, theirs[s], [&](bool sending) {
          (sending ? raw->send(ts, peer, 0) : raw->recv(ts, peer, 0))->wait();
        });
      }
    }
    ours_group->barrier()->wait();
  };
  std::thread peer(rank_main, 1);
  rank_main(0);
  peer.join();
  for (size_t s = 0; s < o.sizes_kb.size(); ++s) {
    const double a = median(ours[s]), b = median(theirs[s]);
    rows.push_back({{"size_kb", o.sizes_kb[s]},
                    {"paratrain_round_trip_us", a},
                    {"c10d_round_trip_us", b},
                    {"ratio", a / b},
                    {"round_trips", ours[s].size()}});
  }
  const nlohmann::json j = {{"benchmark", "sendrecv_latency"},
                            {"transport", "gloo tcp, loopback, 2 ranks as threads"},
                            {"rows", rows}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Gloo send/recv round trips: paratrain's group against c10d's ProcessGroupGloo"};
  Options o;
  app.add_option("--sizes-kb", o.sizes_kb, "message sizes in KiB");
  app.add_option("--iters", o.iters, "round trips per size and group");
  app.add_option("--rounds", o.rounds, "alternations of the two groups per size");
  CLI11_PARSE(app, argc, argv);
  if (o.iters < o.rounds || o.rounds < 1) {
    std::fprintf(stderr, "sendrecv_latency: --iters must be at least --rounds (>= 1)\n");
    return 2;
  }
  return run(o);
}
