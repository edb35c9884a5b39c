// What the hang doctor's recording costs: small all-reduces on the world
// group, bare and through RecordingGroup, alternating in rounds so that a
// noisy machine hits both alike; plus the recorder alone (begin + finish,
// no communication) in nanoseconds. Rank 0 prints one JSON line.
//
//   paratrain launch --nproc-per-node 2 -- build/bench/doctor_overhead
//   paratrain launch --nproc-per-node 2 -- build/bench/doctor_overhead --backend shm
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/doctor/recording_group.h"
#include "paratrain/comm/rendezvous.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = paratrain::comm;

struct Options {
  std::vector<int64_t> floats{1, 256, 16384};  // 4 B, 1 KiB, 64 KiB per all-reduce
  int rounds = 15;   // alternations bare / recorded; the median round is reported
  int per_round = 200;  // all-reduces per round and variant
  std::string backend = "gloo";
};

double round_us(comm::ProcessGroup& g, at::Tensor& t, int n) {
  g.barrier()->wait();  // both ranks start the round together
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) g.all_reduce(t, comm::ReduceOp::kSum)->wait();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / n;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The recorder alone: what RecordingGroup adds to each collective besides a
// virtual call and a shared_ptr for the Work.
double recorder_ns() {
  comm::FlightRecorder recorder(0, 256);
  const int g = recorder.add_group("world", {0, 1});
  auto t = torch::ones({256});
  const int n = 1'000'000;
  const auto start = Clock::now();
  for (int i = 0; i < n; ++i) recorder.finish(recorder.begin(g, "all_reduce", &t, -1), comm::RecordState::kDone, i);
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / n;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Hang doctor recording overhead on small all-reduces");
  app.add_option("--floats", o.floats, "elements per all-reduce (float32)");
  app.add_option("--rounds", o.rounds, "alternating rounds");
  app.add_option("--per-round", o.per_round, "all-reduces per round and variant");
  app.add_option("--backend", o.backend, "gloo | shm | auto");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);
  const auto world = comm::world_from_env();
  comm::InitOptions init;
  init.backend = o.backend;
  init.doctor_records = 0;  // the bare group; the recorded one wraps it below
  auto bare = comm::init_process_group(world, init);
  auto recorded = comm::record_collectives(bare, std::make_shared<comm::FlightRecorder>(world.rank, 256));

  nlohmann::json rows = nlohmann::json::array();
  for (int64_t n : o.floats) {
    auto t = torch::ones({n});
    round_us(*bare, t, o.per_round / 4 + 1);  // warm-up
    round_us(*recorded, t, o.per_round / 4 + 1);
    std::vector<double> b, r;
    for (int i = 0; i < o.rounds; ++i) {
      b.push_back(round_us(*bare, t, o.per_round));
      r.push_back(round_us(*recorded, t, o.per_round));
    }
    const double bm = median(b), rm = median(r);
    rows.push_back({{"floats", n},
                    {"bytes", n * 4},
                    {"bare_us", bm},
                    {"recorded_us", rm},
                    {"overhead_pct", 100.0 * (rm - bm) / bm}});
  }
  if (world.rank == 0) {
    nlohmann::json out{{"bench", "doctor_overhead"},
                       {"backend", bare->backend()},
                       {"world_size", world.world_size},
                       {"rounds", o.rounds},
                       {"per_round", o.per_round},
                       {"recorder_ns_per_collective", recorder_ns()},
                       {"rows", rows}};
    std::printf("%s\n", out.dump().c_str());
  }
  bare->barrier()->wait();
  return 0;
}
