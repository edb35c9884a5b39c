#include "paratrain/bench/comm_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "paratrain/core/error.h"

namespace paratrain::bench {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double all_reduce_ms(comm::ProcessGroup& group, at::Tensor& buffer, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) group.all_reduce(buffer)->wait();
  std::vector<double> times;
  at::Tensor t = at::zeros({1}, at::kDouble);
  for (int i = 0; i < iters; ++i) {
    group.barrier()->wait();
    const auto start = Clock::now();
    group.all_reduce(buffer)->wait();
    t.fill_(ms_since(start));
    group.all_reduce(t, comm::ReduceOp::kMax)->wait();
    times.push_back(t.item<double>());
  }
  return median(std::move(times));
}

double memcpy_ms(const at::Tensor& src, int iters) {
  at::Tensor dst = at::empty_like(src);
  dst.copy_(src);  // first touch of dst's pages is not a copy's cost
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto start = Clock::now();
    dst.copy_(src);
    times.push_back(ms_since(start));
  }
  return median(std::move(times));
}

}  // namespace

std::vector<AllReduceRow> bench_all_reduce(comm::ProcessGroup& group, const AllReduceBenchOptions& o) {
  if (o.iters < 1 || o.max_iters < o.iters || o.warmup < 0 || o.sizes_bytes.empty())
    throw ConfigError(fmt::format("all-reduce bench: need iters >= 1 (got {}), max_iters >= iters (got {}), "
                                  "warmup >= 0 (got {}) and at least one size",
                                  o.iters, o.max_iters, o.warmup));
  std::vector<AllReduceRow> rows;
  const int n = group.size();
  for (const int64_t bytes : o.sizes_bytes) {
    if (bytes <= 0) throw ConfigError(fmt::format("all-reduce bench: size {} bytes is not positive", bytes));
    const int64_t numel = std::max<int64_t>(1, bytes / 4);
    // Collective, so every rank gets one or none alike.
    at::Tensor symmetric = group.allocate_symmetric(numel, at::kFloat);
    for (at::Tensor buffer : {at::ones({numel}), symmetric}) {
      if (!buffer.defined()) continue;
      buffer.fill_(1.0f);
      AllReduceRow r;
      r.symmetric = buffer.is_same(symmetric);
      r.bytes = numel * 4;
      constexpr double kBytesPerSize = 256.0 * 1024 * 1024;
      r.iters =
          static_cast<int>(std::clamp<double>(kBytesPerSize / static_cast<double>(r.bytes), o.iters, o.max_iters));
      r.ms = all_reduce_ms(group, buffer, r.iters, o.warmup);
      r.algbw_gb_s = static_cast<double>(r.bytes) / (r.ms * 1e6);
      r.busbw_gb_s = n > 1 ? r.algbw_gb_s * 2.0 * (n - 1) / n : 0.0;
      r.memcpy_ms = memcpy_ms(buffer, r.iters);
      r.memcpy_gb_s = static_cast<double>(r.bytes) / (r.memcpy_ms * 1e6);
      rows.push_back(r);
    }
  }
  return rows;
}

nlohmann::json to_json(const AllReduceRow& r) {
  return {{"bytes", r.bytes},
          {"mib", static_cast<double>(r.bytes) / (1024.0 * 1024.0)},
          {"iters", r.iters},
          {"ms", r.ms},
          {"latency_us", r.ms * 1000.0},
          {"algbw_gb_s", r.algbw_gb_s},
          {"busbw_gb_s", r.busbw_gb_s},
          {"memcpy_ms", r.memcpy_ms},
          {"memcpy_gb_s", r.memcpy_gb_s},
          // The target: busbw >= 50% of memcpy bandwidth.
          {"busbw_over_memcpy", r.memcpy_gb_s > 0 ? r.busbw_gb_s / r.memcpy_gb_s : 0.0},
          {"symmetric", r.symmetric}};
}

}  // namespace paratrain::bench
