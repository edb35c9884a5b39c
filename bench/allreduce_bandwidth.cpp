// How fast one all-reduce is on this group, with nothing else running: times
// ProcessGroup::all_reduce (sum, float32) over a range of sizes and, for
// scale, a local memcpy of the same size. Rank 0 prints one JSON line.
// Not a DDP benchmark (ddp_throughput.cpp): no model, no overlap; it gives
// the communication cost that DDP's step has to hide or pay.
//
//   paratrain launch --nproc-per-node 2 -- allreduce_bandwidth --sizes-mb 1,4,7.1,16
//   mpirun -np 2 allreduce_bandwidth --backend mpi
//   paratrain launch --nproc-per-node 2 -- allreduce_bandwidth --backend shm --sizes-mb 0.00390625,1,16,64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"

namespace {

using Clock = std::chrono::steady_clock;
namespace comm = paratrain::comm;

struct BandwidthOptions {
  // MiB per all-reduce; 7.1 MiB is the MLP's gradient (1,863,690 floats).
  std::vector<double> sizes_mb{0.25, 1, 4, 7.1, 16};
  int iters = 30;  // timed all-reduces per size (the median is reported)
  int warmup = 5;
  std::string backend = "gloo";  // or "shm", "auto"; "mpi": run under mpirun instead of paratrain launch
};

double median_ms(comm::ProcessGroup& group, at::Tensor& buffer, int iters, int warmup);
double memcpy_ms(const at::Tensor& src, int iters);

int run(const BandwidthOptions& o) {
  if (o.iters < 1 || o.warmup < 0 || o.sizes_mb.empty()) {
    throw paratrain::ConfigError("need --iters >= 1, --warmup >= 0 and at least one --sizes-mb");
  }
  at::set_num_threads(1);
  const comm::WorldInfo world = comm::world_from_env();
  comm::InitOptions init;
  init.backend = o.backend;
  auto group = comm::init_process_group(world, init);
  nlohmann::json rows = nlohmann::json::array();
  for (double mb : o.sizes_mb) {
    if (mb <= 0) throw paratrain::ConfigError(fmt::format("--sizes-mb: {} is not positive", mb));
    const int64_t numel = std::max<int64_t>(1, static_cast<int64_t>(mb * 1024 * 1024 / 4));
    at::Tensor buffer = torch::ones({numel});
    const double ms = median_ms(*group, buffer, o.iters, o.warmup);
    const double bytes = static_cast<double>(numel) * 4;
    const int n = world.world_size;
    rows.push_back({
        {"mib", bytes / (1024 * 1024)},
        {"ms", ms},
        // Algorithm bandwidth: the buffer's size over the time. Bus bandwidth
        // scales it by 2(n-1)/n, the bytes each rank actually sends in a ring.
        {"algbw_gb_s", bytes / (ms * 1e6)},
        {"busbw_gb_s", n > 1 ? bytes * 2.0 * (n - 1) / n / (ms * 1e6) : 0.0},
    });
    const double copy_ms = memcpy_ms(buffer, o.iters);
    rows.back()["memcpy_ms"] = copy_ms;
    rows.back()["memcpy_gb_s"] = bytes / (copy_ms * 1e6);
    // The target is busbw >= 50% of memcpy bandwidth.
    rows.back()["busbw_over_memcpy"] = rows.back()["busbw_gb_s"].get<double>() / (bytes / (copy_ms * 1e6));
  }
  if (world.rank == 0) {
    const nlohmann::json j = {{"benchmark", "allreduce_bandwidth"},
                              {"backend", group->backend()},
                              {"world", world.world_size},
                              {"iters", o.iters},
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
  CLI11_PARSE(app, argc, argv);
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "allreduce_bandwidth: error: %s\n", e.what());
    return 1;
  }
}

namespace {

// Each iteration starts together (barrier) and counts the slowest rank, so a
// rank that arrives late does not make the other's all-reduce look slow.
double median_ms(comm::ProcessGroup& group, at::Tensor& buffer, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) group.all_reduce(buffer)->wait();
  std::vector<double> times;
  at::Tensor t = torch::zeros({1}, torch::kDouble);
  for (int i = 0; i < iters; ++i) {
    group.barrier()->wait();
    const auto start = Clock::now();
    group.all_reduce(buffer)->wait();
    t.fill_(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    group.all_reduce(t, comm::ReduceOp::kMax)->wait();
    times.push_back(t.item<double>());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

double memcpy_ms(const at::Tensor& src, int iters) {
  at::Tensor dst = torch::empty_like(src);
  dst.copy_(src);
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    dst.copy_(src);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace
