// How fast one all-reduce is on this group, with nothing else running: times
// ProcessGroup::all_reduce (sum, float32) over a range of sizes and, for
// scale, a local memcpy of the same size. Rank 0 prints one JSON line.
// The measurement is paratrain/bench/comm_bench.h's (also behind `paratrain
// bench comm`, which runs every backend and summarizes); this file maps
// flags onto it.
// Not a DDP benchmark (ddp_throughput.cpp): no model, no overlap; it gives
// the communication cost that DDP's step has to hide or pay.
//
//   paratrain launch --nproc-per-node 2 -- allreduce_bandwidth --sizes-mb 1,4,7.1,16
//   mpirun -np 2 allreduce_bandwidth --backend mpi
//   paratrain launch --nproc-per-node 2 -- allreduce_bandwidth --backend shm --sizes-mb 0.00390625,1,16,64
//   paratrain launch --nproc-per-node 2 -- allreduce_bandwidth --wire int8 --sizes-mb 0.9,7.1
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/bench/comm_bench.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"

namespace {

namespace comm = paratrain::comm;

struct BandwidthOptions {
  // MiB per all-reduce; 7.1 MiB is the MLP's gradient (1,863,690 floats).
  std::vector<double> sizes_mb{0.25, 1, 4, 7.1, 16};
  int iters = 30;  // timed all-reduces per size (the median is reported)
  int warmup = 5;
  std::string backend = "gloo";  // or "shm", "auto"; "mpi": run under mpirun instead of paratrain launch
  std::string wire = "fp32";     // or "bf16", "int8": the gradient wires of precision.comm_dtype / ddp.compression
};

int run(const BandwidthOptions& o) {
  paratrain::bench::AllReduceBenchOptions bench;
  bench.iters = o.iters;
  bench.max_iters = o.iters;  // exactly --iters, as this program always did
  bench.warmup = o.warmup;
  bench.wire = o.wire;
  bench.sizes_bytes.clear();
  for (double mb : o.sizes_mb) {
    if (mb <= 0) throw paratrain::ConfigError(fmt::format("--sizes-mb: {} is not positive", mb));
    bench.sizes_bytes.push_back(static_cast<int64_t>(mb * 1024 * 1024));
  }
  at::set_num_threads(1);
  const comm::WorldInfo world = comm::world_from_env();
  comm::InitOptions init;
  init.backend = o.backend;
  auto group = comm::init_process_group(world, init);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : paratrain::bench::bench_all_reduce(*group, bench)) rows.push_back(paratrain::bench::to_json(row));
  if (world.rank == 0) {
    const nlohmann::json j = {{"benchmark", "allreduce_bandwidth"},
                              {"backend", group->backend()},
                              {"world", world.world_size},
                              {"iters", o.iters},
                              {"wire", o.wire},
                              {"statistic", "median over iterations of the slowest rank"},
                              {"sizes", rows}};
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  BandwidthOptions o;
  CLI::App app{"Times one all-reduce per size on the world group; rank 0 prints JSON. "
               "Run under `paratrain launch --nproc-per-node N --`."};
  app.add_option("--sizes-mb", o.sizes_mb, "MiB per all-reduce")->delimiter(',')->capture_default_str();
  app.add_option("--iters", o.iters, "timed all-reduces per size")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed all-reduces per size")->capture_default_str();
  app.add_option("--backend", o.backend, "gloo or shm (under paratrain launch), mpi (under mpirun) or auto")
      ->capture_default_str();
  app.add_option("--wire", o.wire, "fp32, bf16 (16-bit wire, fp32 sums) or int8 (int8 blocks, error feedback)")
      ->check(CLI::IsMember({"fp32", "bf16", "int8"}))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bandwidth: error: %s\n", e.what());
    return 1;
  }
}
