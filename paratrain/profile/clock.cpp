// align_clocks: see Note [Profile clocks] in clock.h.
#include "paratrain/profile/clock.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "paratrain/comm/doctor/flight_recorder.h"
#include "paratrain/comm/process_group.h"
#include "paratrain/core/process_state.h"
#include "paratrain/profile/op_profiler.h"

namespace paratrain::profile {
namespace {

// Every rank's value of `mine`, by rank.
std::vector<int64_t> gather(comm::ProcessGroup& world, int64_t mine, std::chrono::milliseconds timeout) {
  at::Tensor in = at::tensor({mine}, at::kLong);
  at::Tensor out = at::empty({world.size()}, at::kLong);
  world.all_gather(out, in)->wait(timeout);
  return std::vector<int64_t>(out.data_ptr<int64_t>(), out.data_ptr<int64_t>() + world.size());
}

// The system time as this rank leaves a barrier.
int64_t after_barrier(comm::ProcessGroup& world, std::chrono::milliseconds timeout) {
  world.barrier()->wait(timeout);
  return system_now_us();
}

}  // namespace

ClockAlignment align_clocks(comm::ProcessGroup& world, std::chrono::milliseconds timeout) {
  ClockAlignment out;
  out.steady_to_system_us = system_now_us() - comm::FlightRecorder::now_us();
  if (world.size() == 1) return out;
  // One host: one clock. The name's hash stands for it (a collision only
  // costs the barrier's precision).
  const auto hosts = gather(world, static_cast<int64_t>(std::hash<std::string>{}(host_name()) >> 1), timeout);
  const bool one_host = std::all_of(hosts.begin(), hosts.end(), [&](int64_t h) { return h == hosts[0]; });
  if (!one_host) {
    out.method = "barrier";
    const auto exits = gather(world, after_barrier(world, timeout), timeout);
    out.offset_us = exits[0] - exits[static_cast<size_t>(world.rank())];
  }
  const auto check = gather(world, after_barrier(world, timeout) + out.offset_us, timeout);
  out.skew_us = *std::max_element(check.begin(), check.end()) - *std::min_element(check.begin(), check.end());
  return out;
}

}  // namespace paratrain::profile
