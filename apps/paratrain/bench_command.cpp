// `paratrain bench comm|ddp`: the communication benchmarks as a command.
// Under a launcher (`paratrain launch --nproc-per-node 2 [--backend X] --
// paratrain bench comm`, or mpirun) every rank measures and rank 0 prints
// JSON lines and a summary. Started alone, the command launches itself on
// --nproc ranks: `bench comm` once per backend in --backends (then one
// summary compares them), `bench ddp` once. The measurements are
// paratrain/bench/*.h's (shared with bench/allreduce_bandwidth and
// bench/ddp_throughput); this file parses, spawns and summarizes.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "apps/paratrain/commands.h"
#include "paratrain/bench/comm_bench.h"
#include "paratrain/bench/ddp_bench.h"
#include "paratrain/comm/mpi/mpi_group.h"
#include "paratrain/comm/rendezvous.h"
#include "paratrain/core/error.h"
#include "paratrain/launch/launcher.h"

extern char** environ;

namespace paratrain::cli {
namespace {

struct Common {
  int nproc = 2;             // ranks when the command launches itself
  std::string backend;       // under a launcher: the one measured ("" = $PARATRAIN_BACKEND, else gloo)
  std::string out;           // also append every JSON line here (rank 0)
  bool no_summary = false;   // a self-launched worker leaves the summary to its parent
};

bool launched() { return comm::world_from_env().source != "default"; }

std::string worker_backend(const Common& c) {
  if (!c.backend.empty()) return c.backend;
  const char* env = std::getenv("PARATRAIN_BACKEND");
  return env != nullptr && *env != '\0' ? env : "gloo";
}

// Rank 0's output: stdout, and --out when given.
void emit(const Common& c, const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  if (c.out.empty()) return;
  std::ofstream f(c.out, std::ios::app);
  if (!f) throw Error(fmt::format("cannot open --out file '{}' for appending", c.out));
  f << line << '\n';
}

std::string self_exe() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

// Runs `args` on `nproc` ranks of `backend`: the launcher for gloo/shm/auto,
// mpirun for mpi (OpenMPI refuses root without its two variables, and 2
// ranks may exceed the cores: --oversubscribe). Returns the exit code.
int spawn_ranks(const std::vector<std::string>& args, int nproc, const std::string& backend) {
  std::vector<std::string> command{self_exe()};
  command.insert(command.end(), args.begin(), args.end());
  if (backend != "mpi") {
    launch::LaunchOptions o;
    o.nproc_per_node = nproc;
    o.command = command;
    o.backend = backend;
    o.prefix_output = false;  // rank 0's JSON lines as they are
    return launch::launch(o);
  }
  std::vector<std::string> argv{"mpirun", "-np", std::to_string(nproc), "--oversubscribe"};
  argv.insert(argv.end(), command.begin(), command.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  }
  pid_t pid = 0;
  if (posix_spawnp(&pid, "mpirun", nullptr, nullptr, cargv.data(), environ) != 0) {
    std::fprintf(stderr, "paratrain bench: mpirun not found; skipping the mpi backend\n");
    return 0;
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string temp_file(const std::string& what) {
  return (std::filesystem::temp_directory_path() / fmt::format("paratrain-bench-{}-{}.jsonl", what, getpid())).string();
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::string size_name(int64_t bytes) {
  return bytes >= (1 << 20) ? fmt::format("{:g} MiB", bytes / 1048576.0) : fmt::format("{:g} KiB", bytes / 1024.0);
}

// One line over every backend's rows: per size, latency (small) or busbw
// (large) per backend, the fastest backend's busbw as a share of memcpy, and
// its ratio to gloo.
std::string comm_summary(const std::vector<nlohmann::json>& rows) {
  std::map<int64_t, std::vector<const nlohmann::json*>> by_size;
  for (const auto& r : rows)
    if (r.value("benchmark", "") == "allreduce") by_size[r["bytes"].get<int64_t>()].push_back(&r);
  std::vector<std::string> parts;
  for (const auto& [bytes, rs] : by_size) {
    const nlohmann::json* gloo = nullptr;
    const nlohmann::json* best = rs.front();
    std::vector<std::string> each;
    for (const auto* r : rs) {
      if ((*r)["backend"] == "gloo") gloo = r;
      if ((*r)["ms"].get<double>() < (*best)["ms"].get<double>()) best = r;
      each.push_back(bytes < (1 << 20) ? fmt::format("{} {:.0f} us", (*r)["backend"].get<std::string>(),
                                                     (*r)["latency_us"].get<double>())
                                       : fmt::format("{} {:.2f} GB/s", (*r)["backend"].get<std::string>(),
                                                     (*r)["busbw_gb_s"].get<double>()));
    }
    std::string part = fmt::format("{}: {}", size_name(bytes), fmt::join(each, ", "));
    if (bytes >= (1 << 20))
      part += fmt::format(" ({} busbw = {:.2f} x memcpy {:.1f} GB/s)", (*best)["backend"].get<std::string>(),
                          (*best)["busbw_over_memcpy"].get<double>(), (*best)["memcpy_gb_s"].get<double>());
    if (gloo != nullptr && gloo != best)
      part += fmt::format(" {} {:.1f}x gloo", (*best)["backend"].get<std::string>(),
                          (*gloo)["ms"].get<double>() / (*best)["ms"].get<double>());
    parts.push_back(part);
  }
  const int world = rows.empty() ? 0 : rows.front()["world"].get<int>();
  return fmt::format("summary: all-reduce at {} ranks; {}", world, fmt::join(parts, "; "));
}

int run_comm(const Common& c, const bench::AllReduceBenchOptions& o, const std::string& backends) {
  if (launched()) {
    at::set_num_threads(1);
    comm::InitOptions init;
    init.backend = worker_backend(c);
    auto group = comm::init_process_group(comm::world_from_env(), init);
    std::vector<nlohmann::json> rows;
    for (const auto& row : bench::bench_all_reduce(*group, o)) {
      nlohmann::json j = {{"benchmark", "allreduce"},
                          {"backend", group->backend() + (row.symmetric ? "-symmetric" : "")},
                          {"world", group->size()}};
      j.update(bench::to_json(row));
      rows.push_back(j);
    }
    if (group->rank() != 0) return 0;
    for (const auto& j : rows) emit(c, j.dump());
    if (!c.no_summary) std::printf("%s\n", comm_summary(rows).c_str());
    return 0;
  }
  // Alone: launch this command once per backend, then summarize them all.
  std::vector<std::string> list;
  for (std::string b; const char ch : backends + ",") {
    if (ch != ',') {
      b += ch;
    } else if (!b.empty()) {
      list.push_back(b);
      b.clear();
    }
  }
  // The workers append to a file of this run's own, so the summary sees
  // exactly this run's rows (an --out file may hold earlier runs').
  const std::string file = temp_file("comm");
  std::vector<std::string> args{"bench", "comm", "--no-summary", "--out", file, "--iters", std::to_string(o.iters),
                                "--warmup", std::to_string(o.warmup)};
  std::string sizes;
  for (int64_t b : o.sizes_bytes) sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
  args.insert(args.end(), {"--sizes-bytes", sizes});
  for (const std::string& b : list) {
    if (b == "mpi" && !comm::mpi_compiled()) {
      std::fprintf(stderr, "paratrain bench comm: this build has no MPI; skipping mpi\n");
      continue;
    }
    auto worker_args = args;
    worker_args.insert(worker_args.end(), {"--backend", b});
    if (int rc = spawn_ranks(worker_args, c.nproc, b); rc != 0) {
      std::filesystem::remove(file);
      return rc;
    }
  }
  const std::vector<nlohmann::json> rows = read_lines(file);
  std::filesystem::remove(file);
  if (!c.out.empty()) {
    std::ofstream f(c.out, std::ios::app);
    for (const auto& r : rows) f << r.dump() << '\n';
  }
  std::printf("%s\n", comm_summary(rows).c_str());
  return 0;
}

std::string join_numbers(const std::vector<double>& v) {
  std::vector<std::string> parts;
  for (double x : v) parts.push_back(fmt::format("{:g}", x));
  return fmt::format("{}", fmt::join(parts, ","));
}

// DDP samples/s per bucket cap, `rounds` times over the caps in turn (so a
// change in the machine's load hits every cap alike); the median per cap
// decides the best. With `nocomm`, the same model without communication
// each round: the ceiling the caps approach.
int run_ddp(const Common& c, bench::DdpBenchOptions o, std::vector<double> caps, int rounds, bool nocomm) {
  bench::validate(o);
  if (caps.empty()) caps = {o.bucket_cap_mb};
  for (double cap : caps)
    if (!(cap > 0)) throw ConfigError(fmt::format("--sweep-bucket-mb: {} is not a positive MiB count", cap));
  if (rounds < 1) throw ConfigError(fmt::format("--rounds must be >= 1, got {}", rounds));
  if (!launched()) {
    std::vector<std::string> args{"bench", "ddp", "--model", o.model, "--mode", o.mode, "--steps",
                                  std::to_string(o.steps), "--warmup", std::to_string(o.warmup), "--batch",
                                  std::to_string(o.batch), "--lr", fmt::format("{:g}", o.lr), "--sweep-bucket-mb",
                                  join_numbers(caps), "--first-bucket-cap-mb", fmt::format("{:g}", o.first_bucket_cap_mb),
                                  "--rounds", std::to_string(rounds), "--compression", o.compression,
                                  "--powersgd-rank", std::to_string(o.powersgd_rank), "--seed", std::to_string(o.seed)};
    if (nocomm) args.push_back("--with-nocomm");
    if (o.gradient_as_bucket_view) args.push_back("--gradient-as-bucket-view");
    if (!o.symmetric_buffers) args.push_back("--no-symmetric-buffers");
    if (!c.out.empty()) args.insert(args.end(), {"--out", c.out});
    return spawn_ranks(args, c.nproc, c.backend.empty() ? "auto" : c.backend);
  }
  at::set_num_threads(1);
  comm::InitOptions init;
  init.backend = worker_backend(c);
  auto group = comm::init_process_group(comm::world_from_env(), init);
  std::map<double, std::vector<double>> samples;  // cap -> samples/s per round
  std::map<double, int64_t> buckets;              // cap -> buckets the reducer planned
  std::vector<double> ceiling;
  for (int round = 0; round < rounds; ++round) {
    for (double cap : caps) {
      o.bucket_cap_mb = cap;
      nlohmann::json j = bench::run_ddp_bench(*group, o);
      j["round"] = round;
      samples[cap].push_back(j["samples_per_s"].get<double>());
      if (j.contains("comm")) buckets[cap] = j["comm"]["buckets"].get<int64_t>();
      if (group->rank() == 0) emit(c, j.dump());
    }
    if (nocomm) {
      bench::DdpBenchOptions n = o;
      n.mode = "nocomm";
      n.compression = "none";
      nlohmann::json j = bench::run_ddp_bench(*group, n);
      j["round"] = round;
      ceiling.push_back(j["samples_per_s"].get<double>());
      if (group->rank() == 0) emit(c, j.dump());
    }
  }
  if (group->rank() != 0) return 0;
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  nlohmann::json medians = nlohmann::json::object(), plans = nlohmann::json::object();
  std::set<int64_t> distinct;
  double best_cap = caps.front(), best = 0, worst = 0;
  for (double cap : caps) {
    const double m = median(samples[cap]);
    medians[fmt::format("{:g}", cap)] = m;
    plans[fmt::format("{:g}", cap)] = buckets[cap];
    distinct.insert(buckets[cap]);
    if (m > best) {
      best = m;
      best_cap = cap;
    }
    if (worst == 0 || m < worst) worst = m;
  }
  nlohmann::json sweep = {{"benchmark", "ddp_bucket_sweep"}, {"backend", group->backend()},
                          {"world", group->size()},         {"model", o.model},
                          {"rounds", rounds},               {"median_samples_per_s", medians},
                          {"buckets", plans},
                          {"best_bucket_cap_mb", best_cap}};
  std::string ceiling_text;
  if (!ceiling.empty()) {
    sweep["nocomm_samples_per_s"] = median(ceiling);
    ceiling_text = fmt::format("; {:.2f} of the nocomm ceiling ({:.0f})", best / median(ceiling), median(ceiling));
  }
  emit(c, sweep.dump());
  // Caps that give the same number of buckets (a bucket closes after the
  // parameter that reaches the cap, so a model of few large tensors has few
  // distinct plans) differ only by noise: say so instead of crowning one.
  if (distinct.size() < caps.size())
    ceiling_text += fmt::format("; NOTE only {} distinct bucket plan(s) among the {} caps (buckets per cap: {}): "
                                "differences between caps with the same plan are noise",
                                distinct.size(), caps.size(), plans.dump());
  std::printf("summary: best bucket cap %g MiB on %s x%d (%s): %.0f samples/s, median of %d; the worst cap %.2fx "
              "slower%s\n",
              best_cap, group->backend().c_str(), group->size(), o.model.c_str(), best, rounds,
              worst > 0 ? best / worst : 1.0, ceiling_text.c_str());
  return 0;
}

void add_common(CLI::App* sub, Common& c) {
  sub->add_option("--nproc", c.nproc, "ranks to launch when run alone (not under a launcher)")->capture_default_str();
  sub->add_option("--backend", c.backend,
                  "under a launcher: the backend measured (default $PARATRAIN_BACKEND, else gloo); `bench ddp` "
                  "run alone: the backend it launches with (default auto)");
  sub->add_option("--out", c.out, "also append every JSON line to this file");
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  struct Args {
    Common comm_common, ddp_common;
    bench::AllReduceBenchOptions allreduce;
    std::vector<int64_t> sizes_bytes;
    std::string backends = "gloo,shm,mpi";
    bench::DdpBenchOptions ddp;
    std::vector<double> caps;
    int rounds = 3;
    bool nocomm = false;
  };
  auto a = std::make_shared<Args>();
  a->ddp.steps = 100;
  a->ddp.warmup = 10;
  auto* sub = app.add_subcommand("bench", "Measure communication: all-reduce per backend, DDP throughput per bucket cap");
  sub->require_subcommand(1);

  auto* comm_cmd = sub->add_subcommand(
      "comm",
      "All-reduce latency and bus bandwidth (busbw = algbw x 2(n-1)/n) per size next to memcpy bandwidth measured "
      "in the same run: JSON lines, then a one-line summary. Alone it launches itself on --nproc ranks once per "
      "backend in --backends; under `paratrain launch [--backend X]` or mpirun it measures that backend");
  add_common(comm_cmd, a->comm_common);
  comm_cmd->add_option("--backends", a->backends, "backends to launch, comma-separated (mpi: when built with MPI)")
      ->capture_default_str();
  comm_cmd->add_option("--sizes-bytes", a->sizes_bytes, "bytes per all-reduce (default 4 KiB, 1, 16 and 64 MiB)")
      ->delimiter(',');
  comm_cmd->add_option("--iters", a->allreduce.iters, "timed all-reduces per size, at least")->capture_default_str();
  comm_cmd->add_option("--warmup", a->allreduce.warmup, "untimed all-reduces per size")->capture_default_str();
  comm_cmd->add_flag("--no-summary", a->comm_common.no_summary, "print only the JSON lines (a launched worker)");

  auto* ddp_cmd = sub->add_subcommand(
      "ddp",
      "DDP samples/s of the MLP or CNN on synthetic batches per bucket cap (--sweep-bucket-mb 1,4,25), --rounds "
      "times over the caps in turn; prints each run as JSON, the medians, and the best cap");
  add_common(ddp_cmd, a->ddp_common);
  auto& d = a->ddp;
  ddp_cmd->add_option("--model", d.model, "mlp (784-1024-1024-10), cnn or gpt (4 layers, d 256, seq 128)")->capture_default_str();
  ddp_cmd->add_option("--mode", d.mode, "bucketed (DDP) or naive (its twin)")->capture_default_str();
  ddp_cmd->add_option("--steps", d.steps, "timed steps per run")->capture_default_str();
  ddp_cmd->add_option("--warmup", d.warmup, "untimed steps first")->capture_default_str();
  ddp_cmd->add_option("--batch", d.batch, "examples per rank and step")->capture_default_str();
  ddp_cmd->add_option("--lr", d.lr, "SGD learning rate")->capture_default_str();
  ddp_cmd->add_option("--sweep-bucket-mb,--bucket-cap-mb", a->caps, "bucket caps to measure, MiB (default 25)")
      ->delimiter(',');
  ddp_cmd->add_option("--first-bucket-cap-mb", d.first_bucket_cap_mb, "first bucket's cap, MiB")->capture_default_str();
  ddp_cmd->add_option("--rounds", a->rounds, "passes over the caps; the median decides")->capture_default_str();
  ddp_cmd->add_option("--compression", d.compression, "none, fp16, bf16 or powersgd")->capture_default_str();
  ddp_cmd->add_option("--powersgd-rank", d.powersgd_rank, "PowerSGD's r")->capture_default_str();
  ddp_cmd->add_option("--seed", d.seed, "seeds the model and each rank's data")->capture_default_str();
  ddp_cmd->add_flag("--gradient-as-bucket-view", d.gradient_as_bucket_view, "let .grad alias the bucket buffers");
  ddp_cmd->add_flag("--no-symmetric-buffers{false}", d.symmetric_buffers,
                    "bucket buffers in ordinary memory even on shm (the A/B of the in-place all-reduce)");
  ddp_cmd->add_flag("--with-nocomm", a->nocomm, "also run DDP without communication each round (the ceiling)");

  auto run = [a, comm_cmd, ddp_cmd]() -> int {
    if (comm_cmd->parsed()) {
      if (!a->sizes_bytes.empty()) a->allreduce.sizes_bytes = a->sizes_bytes;
      a->allreduce.max_iters = std::max(a->allreduce.max_iters, a->allreduce.iters);
      return run_comm(a->comm_common, a->allreduce, a->backends);
    }
    if (ddp_cmd->parsed()) return run_ddp(a->ddp_common, a->ddp, a->caps, a->rounds, a->nocomm);
    return 2;
  };
  return Command{sub, run};
}

}  // namespace paratrain::cli
