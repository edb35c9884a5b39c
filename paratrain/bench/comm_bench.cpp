#include "paratrain/bench/comm_bench.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "paratrain/comm/low_precision_all_reduce.h"
#include "paratrain/core/error.h"
#include "paratrain/data_parallel/ddp/compress_hook.h"
#include "paratrain/data_parallel/ddp/int8_all_reduce.h"

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

// One all-reduce of `buffer` over the chosen wire, waited for.
class Wire {
 public:
  Wire(comm::ProcessGroup& group, const std::string& wire, int64_t numel) : group_(group), wire_(wire) {
    if (wire_ == "fp32") return;
    second_ = &follow_up_.of(group);
    if (wire_ == "int8")
      residuals_ = {at::zeros({numel}), at::zeros({ddp::int8_slice_numel(numel, group.size())})};
    else if (wire_ != "bf16")
      throw ConfigError(fmt::format("all-reduce bench: the wire is fp32, bf16 or int8, not \"{}\"", wire_));
  }
  void all_reduce(at::Tensor& buffer) {
    if (wire_ == "fp32") group_.all_reduce(buffer)->wait();
    else if (wire_ == "bf16") comm::all_reduce_low_precision(group_, buffer, at::kBFloat16, second_)->wait();
    else ddp::all_reduce_int8(group_, buffer, residuals_, *second_, ddp::kInt8WireBlock, scratch_)->wait();
  }

 private:
  comm::ProcessGroup& group_;
  std::string wire_;
  ddp::FollowUpGroup follow_up_;
  comm::ProcessGroup* second_ = nullptr;
  ddp::Int8Residuals residuals_;
  std::shared_ptr<ddp::Int8Scratch> scratch_ = std::make_shared<ddp::Int8Scratch>();
};

double all_reduce_ms(comm::ProcessGroup& group, Wire& wire, at::Tensor& buffer, int iters, int warmup) {
  for (int i = 0; i < warmup; ++i) wire.all_reduce(buffer);
  std::vector<double> times;
  at::Tensor t = at::zeros({1}, at::kDouble);
  for (int i = 0; i < iters; ++i) {
    group.barrier()->wait();
    const auto start = Clock::now();
    wire.all_reduce(buffer);
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
    // The 16-bit and int8 wires copy the buffer into their own messages:
    // symmetric memory makes no difference to them.
    at::Tensor symmetric = o.wire == "fp32" ? group.allocate_symmetric(numel, at::kFloat) : at::Tensor();
    for (at::Tensor buffer : {at::ones({numel}), symmetric}) {
      if (!buffer.defined()) continue;
      buffer.fill_(1.0f);
      Wire wire(group, o.wire, numel);
      AllReduceRow r;
      r.wire = o.wire;
      r.symmetric = buffer.is_same(symmetric);
      r.bytes = numel * 4;
      constexpr double kBytesPerSize = 256.0 * 1024 * 1024;
      r.iters =
          static_cast<int>(std::clamp<double>(kBytesPerSize / static_cast<double>(r.bytes), o.iters, o.max_iters));
      r.ms = all_reduce_ms(group, wire, buffer, r.iters, o.warmup);
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
          {"symmetric", r.symmetric},
          {"wire", r.wire}};
}

}  // namespace paratrain::bench
