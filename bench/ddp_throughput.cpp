// One rank of the DDP throughput benchmark: trains the MLP or the CNN on
// synthetic in-memory batches with SGD under paratrain's bucketed DDP, its
// naive twin, or no data parallelism at all, and rank 0 prints one JSON line.
// The measurement is paratrain/bench/ddp_bench.h's (also behind `paratrain
// bench ddp`); this file maps flags onto it.
// --mode nocomm is for analysis only: DDP whose buckets skip the all-reduce
// (gradients are not averaged), i.e. the ceiling if communication were free.
// --comm picks the process group's backend: gloo (TCP), shm (shared memory,
// paratrain/comm/shm) or mpi (under mpirun).
// Not a driver: bench/run_ddp.sh launches it (and bench/ddp_pytorch.py, the
// same work under PyTorch's DDP) at 1 and 2 ranks, repeats and compares.
//
//   paratrain launch --nproc-per-node 2 -- ddp_throughput --model mlp --steps 200
#include <cstdio>
#include <fstream>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "paratrain/bench/ddp_bench.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"

namespace {

namespace comm = paratrain::comm;

int run(const paratrain::bench::DdpBenchOptions& o, const std::string& backend, const std::string& out) {
  paratrain::bench::validate(o);
  // One compute thread per rank, as torchrun / `paratrain launch` do for
  // several ranks; set here too so a 1-rank run does the same work per core.
  at::set_num_threads(1);
  const comm::WorldInfo world = comm::world_from_env();
  comm::InitOptions init;
  init.backend = backend;
  std::shared_ptr<comm::ProcessGroup> group = comm::init_process_group(world, init);
  const nlohmann::json result = paratrain::bench::run_ddp_bench(*group, o);
  if (world.rank != 0) return 0;
  const std::string line = result.dump();
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (!out.empty()) {
    std::ofstream f(out, std::ios::app);
    if (!f) throw paratrain::Error(fmt::format("cannot open --out file '{}' for appending", out));
    f << line << '\n';
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  paratrain::bench::DdpBenchOptions o;
  std::string backend = "gloo", out;
  CLI::App app{"One rank of the DDP throughput benchmark; rank 0 prints one JSON line. "
               "Run under `paratrain launch --nproc-per-node N --`."};
  app.add_option("--model", o.model, "mlp (784-1024-1024-10), cnn or gpt (4 layers, d 256, seq 128)")->capture_default_str();
  app.add_option("--mode", o.mode,
                 "bucketed (DDP), naive (NaiveDataParallel), local (no DDP) or nocomm (DDP "
                 "without all-reduce: analysis only)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps before")->capture_default_str();
  app.add_option("--batch", o.batch, "examples per rank and step")->capture_default_str();
  app.add_option("--lr", o.lr, "SGD learning rate")->capture_default_str();
  app.add_option("--bucket-cap-mb", o.bucket_cap_mb, "bucket cap, MiB")->capture_default_str();
  app.add_option("--first-bucket-cap-mb", o.first_bucket_cap_mb, "first bucket's cap, MiB")
      ->capture_default_str();
  app.add_flag("--gradient-as-bucket-view", o.gradient_as_bucket_view,
               "let .grad alias the bucket buffers");
  bool ordinary_buffers = false;
  app.add_flag("--no-symmetric-buffers", ordinary_buffers,
               "bucket buffers in ordinary memory even on shm (the A/B of the in-place all-reduce)");
  app.add_option("--seed", o.seed, "seeds the model and this rank's data (+rank)")->capture_default_str();
  app.add_option("--comm", backend, "process group backend: gloo, shm (shared memory, one host) or mpi (under mpirun)")
      ->capture_default_str();
  app.add_option("--compression", o.compression, "none, fp16, bf16 or powersgd (DDP comm hook)")
      ->capture_default_str();
  app.add_option("--powersgd-rank", o.powersgd_rank, "PowerSGD's r")->capture_default_str();
  app.add_option("--out", out, "also append the JSON line to this file");
  CLI11_PARSE(app, argc, argv);
  o.symmetric_buffers = !ordinary_buffers;
  try {
    if (backend != "gloo" && backend != "shm" && backend != "mpi")
      throw paratrain::ConfigError(fmt::format("--comm must be gloo, mpi or shm, got '{}'", backend));
    return run(o, backend, out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_throughput: error: %s\n", e.what());
    return 1;
  }
}
