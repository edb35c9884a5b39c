// A parameter-server worker's push and pull: see worker.h.
#include "paratrain/param_server/worker.h"

#include <torch/torch.h>

#include <fmt/format.h>

#include "paratrain/core/error.h"
#include "paratrain/param_server/server.h"

namespace paratrain::param_server {
namespace {

constexpr const char* kServerHint =
    "the parameter server probably died or stalled: check its log, then restart the job (train.resume = auto "
    "continues from the last checkpoint)";

std::vector<at::Tensor> grads_or_zeros(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> out;
  for (const auto& p : params) out.push_back(p.grad().defined() ? p.grad() : torch::zeros_like(p));
  return out;
}

}  // namespace

Worker::Worker(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan, std::vector<at::Tensor> params,
               std::chrono::milliseconds timeout)
    : world_(world), roles_(roles), params_(std::move(params)), timeout_(timeout), versions_(roles.servers, 0) {
  TORCH_CHECK(!roles.is_server(world.rank()), "Worker built on rank ", world.rank(), ", a server");
  for (int s = 0; s < roles.servers; ++s) {
    ranges_.push_back(plan.ranges_of(s));
    int64_t n = 0;
    for (const auto& r : ranges_.back()) n += r.numel();
    numel_.push_back(n);
  }
}

int64_t Worker::push_pull() {
  ++clock_;
  const auto grads = grads_or_zeros(params_);
  std::vector<at::Tensor> replies(roles_.servers);
  std::vector<comm::WorkHandle> receives(roles_.servers);
  std::vector<at::Tensor> pushes(roles_.servers);
  std::vector<comm::WorkHandle> sends(roles_.servers);
  // Answers are posted before the pushes leave, so a server's reply never
  // waits for this worker to get round to receiving it.
  for (int s = 0; s < roles_.servers; ++s) {
    replies[s] = torch::empty({kHeader + numel_[s]}, torch::kFloat);
    receives[s] = world_.recv(replies[s], roles_.server_rank(s), kReplyTag);
  }
  for (int s = 0; s < roles_.servers; ++s) {
    auto header = torch::tensor({static_cast<float>(clock_), static_cast<float>(versions_[s])}, torch::kFloat);
    pushes[s] = torch::cat({header, pack_ranges(grads, ranges_[s])});
    sends[s] = world_.send(pushes[s], roles_.server_rank(s), kPushTag);
  }
  int64_t staleness = 0;
  for (int s = 0; s < roles_.servers; ++s) {
    const int rank = roles_.server_rank(s);
    try {
      sends[s]->wait(timeout_);
      receives[s]->wait(timeout_);
    } catch (const CommError&) {
      rethrow_naming(fmt::format("worker {} (rank {}): push/pull of clock {} with parameter server {} (rank {})",
                                 world_.rank(), world_.rank(), clock_, s, rank), kServerHint);
    }
    versions_[s] = static_cast<int64_t>(replies[s][0].item<float>());
    staleness = std::max(staleness, static_cast<int64_t>(replies[s][1].item<float>()));
    unpack_ranges(replies[s].slice(0, kHeader), params_, ranges_[s]);
  }
  ++histogram_[staleness];
  return staleness;
}

void refresh_parameters(comm::ProcessGroup& world, Roles roles, const KeyRangePlan& plan,
                        const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& own_pieces,
                        std::chrono::milliseconds timeout) {
  const int me = world.rank();
  std::vector<std::pair<at::Tensor, comm::WorkHandle>> sends;
  if (roles.is_server(me)) {
    auto flat = own_pieces.empty() ? torch::empty({0}, torch::kFloat) : torch::cat(own_pieces);
    unpack_ranges(flat, params, plan.ranges_of(roles.server_index(me)));
    for (int r = 0; r < world.size(); ++r) {
      if (r != me) sends.emplace_back(flat, world.send(flat, r, kRefreshTag));
    }
  }
  for (int s = 0; s < roles.servers; ++s) {
    const int rank = roles.server_rank(s);
    if (rank == me) continue;
    const auto ranges = plan.ranges_of(s);
    int64_t n = 0;
    for (const auto& r : ranges) n += r.numel();
    auto flat = torch::empty({n}, torch::kFloat);
    try {
      world.recv(flat, rank, kRefreshTag)->wait(timeout);
    } catch (const CommError&) {
      rethrow_naming(fmt::format("rank {}: pulling the parameters of parameter server {} (rank {})", me, s, rank),
                     kServerHint);
    }
    unpack_ranges(flat, params, ranges);
  }
  for (auto& [tensor, work] : sends) work->wait(timeout);
}

}  // namespace paratrain::param_server
